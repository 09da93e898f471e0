"""Budget sweep: every solver's simulated step time against the memory budget
on the shipped BERT (3 layers) and GNMT graphs and a random training graph,
plus the MILP's three problems (joint, recompute-only, swap-only) and its
lower bound.

Budgets are fractions of keep-everything's peak on one accelerator (plus the
host, which may also compute and holds swapped tensors), so the left end is
below what any single-device schedule can reach.

    .venv/bin/python experiments/sweep_budget.py [--time-limit 5] [--steps 5] [--processes 2]

Writes experiments/results/sweep_<graph>.csv, sweep_<graph>.png and
sweep_<graph>.json (machine, settings, command, wall time). About 80 s
with the defaults on a 2-core machine.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from importlib.metadata import version
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from machine import cpu_model  # noqa: E402

from optsched.cluster import single_accelerator  # noqa: E402
from optsched.compare import MILP_VARIANTS, run_solver, sweep  # noqa: E402
from optsched.formats.importers import example_graph_path, import_graph  # noqa: E402
from optsched.generate import random_training_graph  # noqa: E402
from optsched.graph import Graph  # noqa: E402
from optsched.plot import pareto, save  # noqa: E402
from optsched.solvers import SolveOptions  # noqa: E402

RESULTS = ROOT / "experiments" / "results"
SOLVERS = [*MILP_VARIANTS, "heuristic", "chen-sqrt", "chen-greedy", "articulation", "offload-all", "dtr",
           "keep-everything"]


def graphs(random_size: int) -> list[Graph]:
    return [import_graph(example_graph_path("bert_l3")), import_graph(example_graph_path("gnmt")),
            random_training_graph(random_size, 0)]


def machine() -> dict:
    git = lambda *a: subprocess.run(["git", *a], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    return {"platform": platform.platform(), "cpu": cpu_model(), "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "numpy": version("numpy"), "highspy": version("highspy"), "pandas": version("pandas"),
            "commit": git("rev-parse", "HEAD"),
            "uncommitted_changes": git("status", "--porcelain", "--", "optsched").splitlines()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--time-limit", type=float, default=5.0, help="seconds per MILP solve (default 5)")
    ap.add_argument("--steps", type=int, default=5, help="budgets per graph (default 5)")
    ap.add_argument("--low", type=float, default=0.4, help="smallest budget, fraction of keep-everything's peak")
    ap.add_argument("--random-size", type=int, default=40, help="forward nodes of the random graph (default 40)")
    ap.add_argument("--processes", type=int, default=os.cpu_count(), help="parallel solves (default: CPUs)")
    args = ap.parse_args()
    RESULTS.mkdir(parents=True, exist_ok=True)
    options = SolveOptions(time_limit=args.time_limit, threads=1)
    for g in graphs(args.random_size):
        t0 = time.perf_counter()
        peak = run_solver(g, single_accelerator(2**62), "keep-everything").result.peak["gpu0"]
        fractions = np.linspace(args.low, 1.0, args.steps)
        budgets = [int(round(f * peak)) for f in fractions]
        df = sweep(g, budgets, SOLVERS, options, processes=args.processes)
        df.insert(1, "budget_fraction", [round(b / peak, 4) for b in df["budget_bytes"]])
        stem = RESULTS / f"sweep_{g.name}"
        df.to_csv(stem.with_suffix(".csv"), index=False)
        ax = pareto(df)
        ax.set_title(f"{g.name} ({len(g)} nodes), 1 accelerator + host; MILP {args.time_limit:g} s per solve")
        save(ax.figure, stem.with_suffix(".png"))
        meta = {"command": "python experiments/sweep_budget.py " + " ".join(sys.argv[1:]), "graph": g.name,
                "nodes": len(g), "keep_everything_peak_bytes": peak, "budgets_bytes": budgets,
                "cluster": "single_accelerator(budget): gpu0 + host (256 GB, may compute), 16 GB/s links",
                "solvers": SOLVERS, "milp_time_limit_s": args.time_limit, "milp_threads": 1,
                "processes": args.processes, "wall_s": round(time.perf_counter() - t0, 1), "machine": machine()}
        stem.with_suffix(".json").write_text(json.dumps(meta, indent=1) + "\n")
        print(f"{g.name}: {len(df)} rows in {meta['wall_s']} s -> {stem}.csv/.png/.json", flush=True)


if __name__ == "__main__":
    main()
