"""What the MILP's syncs cost a replayed step: its schedule with and without them, beside the heuristic's.

The MILP ends each of its stages with a sync; the replay issues ops from Python, so on a GPU a model of a few
hundred ops is bound by the host, and every call a sync makes is step time. At the keep-everything budget the
MILP's schedule has no copies, so it stays valid without its syncs (checked in the simulator), and the difference
is their cost alone. The three schedules run in turn, round after round, in one process, so that a change of the
host's speed meanwhile touches all alike (on the H100 VM that speed varied by up to 2x between runs a minute apart).

    python experiments/sync_cost.py --cuda        # the GPU-sized transformer on cuda:0 -> sync_cost_cuda.csv
    .venv/bin/python experiments/sync_cost.py     # its default size on the CPU -> sync_cost_cpu.csv

Measured this way on an H100 (torch 2.11, the GPU-sized transformer, 183 ops, 184 stages, 5 rounds of 8 steps):
with a mark on every stream that got work at each sync (b13f95e), 22.95 ms a step against 20.41 without syncs and
21.95 for the heuristic's schedule; with marks only for streams that another gets work after (e4aca28, another
machine of the same kind), 14.13 ms against 13.50 and 13.47.
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
from bench_execute import measured_case
from machine import GPU_SIZES, cpu_model, gpu_model

from optsched.cluster import single_accelerator
from optsched.execute import Replayer
from optsched.schedule import Sync
from optsched.simulate import simulate
from optsched.solvers import solve


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--model", default="transformer")
    ap.add_argument("--cuda", action="store_true", help="on cuda:0 at machine.GPU_SIZES (else the CPU, default size)")
    ap.add_argument("--time-limit", type=float, default=5.0)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=8, help="steps of each schedule per round")
    ap.add_argument("-o", "--output")
    args = ap.parse_args(argv)
    device = "cuda" if args.cuda else "cpu"
    output = args.output or os.path.join(os.path.dirname(__file__), "results", f"sync_cost_{device}.csv")
    model, inputs, targets, step, graph = measured_case(args.model, GPU_SIZES[args.model] if args.cuda else {},
                                                        device)
    big = single_accelerator(2**40)
    cluster = single_accelerator(simulate(graph, big, solve(graph, big, "keep-everything")).peak["gpu0"])
    schedules = {s: solve(graph, cluster, s, time_limit=args.time_limit) for s in ("heuristic", "milp")}
    plain = replace(schedules["milp"], instructions=tuple(x for x in schedules["milp"].instructions
                                                          if not isinstance(x, Sync)))
    if simulate(graph, cluster, plain).valid:
        schedules["milp without syncs"] = plain
    times: dict[str, list[float]] = {k: [] for k in schedules}
    replays = {k: Replayer(model, step, graph, cluster, s) for k, s in schedules.items()}
    for _ in range(args.rounds):
        for k, r in replays.items():
            for _ in range(args.steps):
                model.zero_grad(set_to_none=True)
                times[k].append(r.run(inputs, targets).wall_time)
    rows = [{"model": args.model, "ops": len(graph.nodes), "schedule": k,
             "syncs": sum(isinstance(x, Sync) for x in s.instructions),
             "predicted_step_s": simulate(graph, cluster, s).makespan,
             "median_step_s": statistics.median(times[k]), "fastest_step_s": min(times[k])}
            for k, s in schedules.items()]
    print(f"{args.model} on {device}: {len(graph.nodes)} ops, {rows[1]['syncs']} syncs in the MILP's schedule")
    for r in rows:
        print(f"  {r['schedule']:20s} predicted {r['predicted_step_s'] * 1e3:8.2f} ms, "
              f"median {r['median_step_s'] * 1e3:8.2f} ms, fastest {r['fastest_step_s'] * 1e3:8.2f} ms")
    where = f"cuda:0 ({gpu_model()})" if args.cuda else f"CPU ({cpu_model()}, {platform.machine()})"
    with open(output, "w", newline="") as f:
        f.write(f"# device: {where}; torch {torch.__version__}; {args.rounds} rounds of {args.steps} steps; "
                f"command: python experiments/sync_cost.py {' '.join(sys.argv[1:])}\n")
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    print(f"wrote {output}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
