"""How fast the simulator checks a large schedule.

Builds valid single-device schedules (keep-everything, and chen-sqrt with its
recomputations) for random training graphs from `optsched.generate` of about
6k, 60k and 300k nodes, i.e. about 10^4 to 10^6 instructions, and times
`optsched.simulate.simulate` on each: the median of 3 runs (after one run that
also checks that the schedule is valid). The requirement is under 2 s for a
schedule of 100,000 instructions on a 2-core machine.

    .venv/bin/python experiments/bench_simulate.py [--quick] [--sizes 2000,20000]

Prints a table and writes experiments/results/simulate_scale.csv with columns
graph, nodes, instructions, seconds, machine, command (plus solver and valid).
"""

from __future__ import annotations

import argparse
import csv
import os
import platform
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from machine import cpu_model  # noqa: E402

from optsched.cluster import single_accelerator  # noqa: E402
from optsched.generate import random_training_graph  # noqa: E402
from optsched.simulate import simulate  # noqa: E402
from optsched.solvers import chen_sqrt, keep_everything  # noqa: E402

RESULTS = ROOT / "experiments" / "results" / "simulate_scale.csv"
COMMAND = " ".join(["python", "experiments/bench_simulate.py", *sys.argv[1:]])


def machine() -> str:
    return f"{cpu_model()}, {os.cpu_count()} cores, Python {platform.python_version()}"


def time_simulate(graph, cluster, schedule, repeats: int = 3) -> tuple[float, bool]:
    first = simulate(graph, cluster, schedule)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        simulate(graph, cluster, schedule)
        times.append(time.perf_counter() - t0)
    return statistics.median(times), first.valid


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="only the 10^4 and 10^5 instruction sizes")
    ap.add_argument("--sizes", help="comma-separated forward-node counts (default 2000,20000,100000)")
    ap.add_argument("--out", default=str(RESULTS))
    args = ap.parse_args(argv)
    sizes = [int(x) for x in args.sizes.split(",")] if args.sizes else \
        ([2_000, 20_000] if args.quick else [2_000, 20_000, 100_000])

    cluster = single_accelerator(10**15)
    host = machine()
    rows = []
    print(f"{'graph':<22}{'solver':<17}{'nodes':>9}{'instructions':>14}{'seconds':>10}{'valid':>7}")
    for n in sizes:
        graph = random_training_graph(n, seed=0)
        for solver in (keep_everything, chen_sqrt):
            schedule = solver(graph, cluster)
            seconds, valid = time_simulate(graph, cluster, schedule)
            row = {"graph": graph.name, "solver": schedule.report.solver, "nodes": len(graph),
                   "instructions": len(schedule.instructions), "seconds": round(seconds, 4), "valid": valid,
                   "machine": host, "command": COMMAND}
            rows.append(row)
            print(f"{row['graph']:<22}{row['solver']:<17}{row['nodes']:>9}{row['instructions']:>14}"
                  f"{row['seconds']:>10.3f}{str(valid):>7}")
            if not valid:
                print("  the schedule is not valid: the benchmark measures nothing useful", file=sys.stderr)
                return 1

    cols = ["graph", "nodes", "instructions", "seconds", "machine", "command", "solver", "valid"]
    out = Path(args.out)
    tmp = out.with_suffix(".csv.tmp")
    with open(tmp, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=cols)
        w.writeheader()
        w.writerows(rows)
    os.replace(tmp, out)
    print(f"machine: {host}\nwrote {out}")
    at_100k = [r for r in rows if r["instructions"] >= 100_000]
    if at_100k:
        r = min(at_100k, key=lambda r: r["instructions"])
        print(f"{r['instructions']:,} instructions checked in {r['seconds']:.3f} s (requirement: < 2 s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
