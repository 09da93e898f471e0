"""Measured versus predicted: replay schedules of the built-in models and compare peak memory and step time.

Runs on the CPU here (every schedule device mapped to the CPU, so "gpu0" is a budgeted region of host memory):
op costs are profiled on this CPU (`capture(..., profile=True)`) and used for the accelerator too, and the link
bandwidth is this CPU's copy bandwidth, so the simulator predicts this machine's step time. On a CUDA machine pass
--cuda to replay on cuda:0 with the roofline of --preset.

    .venv/bin/python experiments/bench_execute.py            # writes experiments/results/execute_cpu.csv
"""

from __future__ import annotations

import argparse
import csv
import os
import platform
import statistics
import sys
from dataclasses import replace

import torch

from optsched.capture import capture_step, measure_cpu
from optsched.capture.models import BUILTIN
from optsched.cluster import single_accelerator
from optsched.errors import InfeasibleError
from optsched.execute import Replayer
from optsched.graph import Graph
from optsched.simulate import simulate
from optsched.solvers import solve

RESULTS = os.path.join(os.path.dirname(__file__), "results")


def cpu_costs(graph: Graph) -> Graph:
    """The accelerator runs at this CPU's measured speed."""
    nodes = tuple(replace(n, cost={"cuda": n.cost["cpu"], "cpu": n.cost["cpu"]}) for n in graph.nodes)
    return Graph(nodes, graph.name, graph.meta)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--models", default="mlp,cnn,transformer,gpt2")
    ap.add_argument("--fractions", default="1.0,0.7,0.5")
    ap.add_argument("--solvers", default="heuristic,dtr,milp")
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--cuda", action="store_true")
    ap.add_argument("-o", "--output", default=os.path.join(RESULTS, "execute_cpu.csv"))
    args = ap.parse_args(argv)
    device = "cuda" if args.cuda else "cpu"
    rows = []
    for name in args.models.split(","):
        if name in ("gpt2", "bert"):
            try:
                import transformers  # noqa: F401
            except ImportError:
                continue
        torch.manual_seed(0)
        ex = BUILTIN[name]()
        model = ex["model"].to(device)
        inputs = tuple(t.to(device) for t in ex["inputs"])
        targets = tuple(t.to(device) for t in ex["targets"])
        step, graph = capture_step(model, inputs, ex["loss_fn"], targets=targets, profile=True)
        if not args.cuda:
            graph = cpu_costs(graph)
        bw = measure_cpu().bandwidth if not args.cuda else 16e9
        big = single_accelerator(2**40, bandwidth=bw)
        keep = simulate(graph, big, solve(graph, big, "keep-everything")).peak["gpu0"]
        for frac in map(float, args.fractions.split(",")):
            cluster = single_accelerator(int(keep * frac), bandwidth=bw)
            for solver in args.solvers.split(","):
                try:
                    schedule = solve(graph, cluster, solver, time_limit=30)
                except InfeasibleError:
                    rows.append({"model": name, "budget_fraction": frac, "solver": solver, "status": "infeasible"})
                    continue
                replay = Replayer(model, step, graph, cluster, schedule)
                runs = [replay.run(inputs, targets, allocator=(k == 0)) for k in range(args.steps)]
                model.zero_grad(set_to_none=True)
                pred = replay.predicted
                wall = statistics.median(r.wall_time for r in runs[1:])
                measured_peak = runs[0].peak["gpu0"]
                rows.append({
                    "model": name, "budget_fraction": frac, "solver": solver, "status": "ok",
                    "budget_bytes": cluster.device("gpu0").memory,
                    "predicted_peak_bytes": pred.peak["gpu0"], "measured_peak_bytes": measured_peak,
                    "peak_error": measured_peak / pred.peak["gpu0"] - 1,
                    "allocator_peak_all_devices_bytes": runs[0].allocator_peak.get("cpu", ""),
                    "predicted_total_peak_bytes": sum(pred.peak.values()),
                    "predicted_step_s": pred.makespan, "measured_step_s": wall,
                    "time_error": wall / pred.makespan - 1,
                    "recomputed": pred.recomputed, "swap_out_bytes": pred.swap_out_bytes,
                })
                r = rows[-1]
                print(f"{name:12s} {frac:4.2f} {solver:10s} peak {r['predicted_peak_bytes']:>9d} -> "
                      f"{r['measured_peak_bytes']:>9d} ({r['peak_error']:+.1%})  step {r['predicted_step_s']*1e3:8.2f}"
                      f" ms -> {r['measured_step_s']*1e3:8.2f} ms ({r['time_error']:+.1%})", file=sys.stderr)
    keys = sorted({k for r in rows for k in r}, key=lambda k: list(rows[0]).index(k) if k in rows[0] else 99)
    os.makedirs(os.path.dirname(args.output), exist_ok=True)
    with open(args.output, "w", newline="") as f:
        f.write(f"# device: {device} ({platform.processor() or platform.machine()}, {os.cpu_count()} cores); "
                f"torch {torch.__version__}; command: python experiments/bench_execute.py "
                f"{' '.join(argv or sys.argv[1:])}\n")
        w = csv.DictWriter(f, fieldnames=keys)
        w.writeheader()
        w.writerows(rows)
    print(f"wrote {args.output}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
