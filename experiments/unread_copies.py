"""What dropping the copies nothing reads (`polish.drop_unread_copies`) gives each solver's schedule.

The built-in models at their GPU sizes (`machine.GPU_SIZES`), captured on this machine with the H100 roofline
costs, on one accelerator with swapping over a 55 GB/s link (an H100's to pinned host memory, as measured there),
at 70% and 50% of the keep-everything peak: each solver's schedule with {"drop_unread": False} and as returned,
their copies, predicted step time and accelerator peak (from the simulator). Takes about 2 minutes on 2 cores.

    .venv/bin/python experiments/unread_copies.py      # writes experiments/results/unread_copies.csv
"""

from __future__ import annotations

import argparse
import csv
import os
import sys
import time

import torch
from machine import GPU_SIZES, cpu_model

from optsched.capture import capture_step
from optsched.capture.models import BUILTIN
from optsched.cluster import single_accelerator
from optsched.errors import InfeasibleError
from optsched.schedule import Copy
from optsched.simulate import simulate
from optsched.solvers import solve

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")
BANDWIDTH, LATENCY = 5.5e10, 1.3e-5


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--models", default="mlp,transformer")
    ap.add_argument("--fractions", default="0.7,0.5")
    ap.add_argument("--solvers", default="heuristic,dtr,offload-all,milp")
    ap.add_argument("--time-limit", type=float, default=10.0, help="MILP seconds per solve")
    ap.add_argument("-o", "--output", default=os.path.join(RESULTS, "unread_copies.csv"))
    args = ap.parse_args(argv)
    rows = []
    for name in args.models.split(","):
        torch.manual_seed(0)
        ex = BUILTIN[name](**GPU_SIZES[name])
        _, graph = capture_step(ex["model"], ex["inputs"], ex["loss_fn"], targets=ex["targets"])
        big = single_accelerator(2**40, bandwidth=BANDWIDTH, latency=LATENCY)
        keep = simulate(graph, big, solve(graph, big, "keep-everything")).peak["gpu0"]
        for frac in map(float, args.fractions.split(",")):
            cluster = single_accelerator(int(keep * frac), bandwidth=BANDWIDTH, latency=LATENCY)
            for solver in args.solvers.split(","):
                row = {"model": name, "nodes": len(graph.nodes), "budget_fraction": frac, "solver": solver}
                for side, drop in (("kept", False), ("dropped", True)):
                    try:
                        s = solve(graph, cluster, solver, time_limit=args.time_limit, params={"drop_unread": drop})
                    except InfeasibleError:
                        row[f"{side}_copies"] = "infeasible"
                        continue
                    r = simulate(graph, cluster, s)
                    row.update({f"{side}_copies": sum(isinstance(x, Copy) for x in s.instructions),
                                f"{side}_step_s": r.makespan, f"{side}_peak_bytes": r.peak["gpu0"],
                                f"{side}_transfer_bytes": r.transfer_bytes})
                rows.append(row)
                print(row, file=sys.stderr)
    with open(args.output, "w", newline="") as f:
        f.write(f"# machine: {cpu_model()}, {os.cpu_count()} cores; {time.strftime('%Y-%m-%d')}; command: "
                f".venv/bin/python experiments/unread_copies.py {' '.join(argv or sys.argv[1:])}\n")
        w = csv.DictWriter(f, fieldnames=list(dict.fromkeys(k for r in rows for k in r)))
        w.writeheader()
        w.writerows(rows)
    print(f"wrote {args.output}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
