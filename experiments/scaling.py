"""Solver scaling: solve time and final gap against graph size for the MILP
started four ways (cold: `params={"warm": False}`; default: its own
warm-start candidates, the baselines and the heuristic; coarsened:
`params={"coarsen": True}`, chains of cheap operations folded first; user:
the heuristic's schedule as `SolveOptions.warm_start`), and the heuristic's
time up to 100k nodes. Random training graphs (`optsched.generate`, which have
no foldable chains) and two captured ones (transformer, GPT-2, which do), one
accelerator plus the host, budget a fraction of keep-everything's peak; every
schedule checked by the simulator (the rows come from
`optsched.compare.run_solver`).

    .venv/bin/python experiments/scaling.py [--time-limit 10] [--quick]

Writes experiments/results/scaling_milp.csv, scaling_heuristic.csv and
scaling_meta.json (machine, settings). About 2 minutes with the defaults on 2 cores.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import replace
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from experiments.sweep_budget import machine  # noqa: E402
from optsched.cluster import single_accelerator  # noqa: E402
from optsched.compare import reference_time, run_solver  # noqa: E402
from optsched.generate import random_training_graph  # noqa: E402
from optsched.solvers import SolveOptions  # noqa: E402

RESULTS = ROOT / "experiments" / "results"


def problem(n_forward: int, frac: float):
    g = random_training_graph(n_forward, 0)
    peak = run_solver(g, single_accelerator(2**62), "keep-everything").result.peak["gpu0"]
    return g, single_accelerator(int(frac * peak)), peak


def captured_problems(frac):
    """Captured training graphs (roofline costs), where chains of cheap operations fold; skipped without torch."""
    try:
        from experiments.bench_milp import CAPTURED, captured
        graphs = [captured(name, builder, kw) for name, builder, kw in CAPTURED if name in ("transformer", "gpt2")]
    except ImportError as e:
        print(f"captured graphs skipped: {e}", file=sys.stderr)
        return []
    out = []
    for g in graphs:
        peak = run_solver(g, single_accelerator(2**62), "keep-everything").result.peak["gpu0"]
        out.append((g.name, g, single_accelerator(int(frac * peak))))
    return out


def milp_rows(sizes, frac, options, extra_problems=()):
    rows = []
    problems = [(f"random-{n}", *problem(n, frac)[:2]) for n in sizes] + list(extra_problems)
    for name, g, cl in problems:
        base = reference_time(g, cl)
        heur = run_solver(g, cl, "heuristic", options, base)
        starts = {"cold": replace(options, params={"warm": False}), "default": options,
                  "coarsened": replace(options, params={"coarsen": True})}
        if heur.schedule is not None:
            starts["user: heuristic"] = replace(options, warm_start=heur.schedule)
        for start, opts in starts.items():
            run = run_solver(g, cl, "milp", opts, base)
            extra = run.schedule.report.extra if run.schedule is not None and run.schedule.report else {}
            rows.append({"graph": name, "nodes": len(g), "edges": g.num_edges, "budget_fraction": frac,
                         "start": start, "coarse_nodes": extra.get("coarse_nodes", ""),
                         "heuristic_step_time_s": heur.row["step_time_s"], "warm_start": extra.get("warm_start", ""),
                         **{k: run.row[k] for k in ("status", "valid", "step_time_s", "overhead", "bound_s", "gap",
                                                    "solve_s", "message")}})
            print(rows[-1], flush=True)
    return rows


def heuristic_rows(sizes, frac):
    rows = []
    for n in sizes:
        t0 = time.perf_counter()
        g, cl, peak = problem(n, frac)
        t_gen = time.perf_counter() - t0
        run = run_solver(g, cl, "heuristic", SolveOptions(), reference_time(g, cl))
        rows.append({"nodes": len(g), "edges": g.num_edges, "budget_fraction": frac, "generate_s": round(t_gen, 2),
                     **{k: run.row[k] for k in ("status", "valid", "step_time_s", "overhead", "solve_s")}})
        print(rows[-1], flush=True)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--time-limit", type=float, default=10.0, help="seconds per MILP solve (default 10)")
    ap.add_argument("--budget", type=float, default=0.6, help="budget, fraction of keep-everything's peak")
    ap.add_argument("--quick", action="store_true", help="smaller sizes")
    args = ap.parse_args()
    milp_sizes = [5, 10, 20] if args.quick else [5, 10, 20, 40, 80]
    heur_sizes = [300, 3000] if args.quick else [300, 3000, 33_000]      # forward nodes; about 3x as many in all
    options = SolveOptions(time_limit=args.time_limit, threads=1)
    t0 = time.perf_counter()
    RESULTS.mkdir(parents=True, exist_ok=True)
    extra = [] if args.quick else captured_problems(args.budget)
    pd.DataFrame(milp_rows(milp_sizes, args.budget, options, extra)).to_csv(RESULTS / "scaling_milp.csv",
                                                                          index=False)
    pd.DataFrame(heuristic_rows(heur_sizes, args.budget)).to_csv(RESULTS / "scaling_heuristic.csv", index=False)
    meta = {"command": "python experiments/scaling.py " + " ".join(sys.argv[1:]), "milp_time_limit_s": args.time_limit,
            "milp_threads": 1, "budget_fraction": args.budget,
            "graphs": "random_training_graph(n, seed=0); captured transformer and gpt2 (bench_milp sizes)",
            "cluster": "single_accelerator(budget): gpu0 + host (256 GB, may compute), 16 GB/s links",
            "wall_s": round(time.perf_counter() - t0, 1), "machine": machine()}
    (RESULTS / "scaling_meta.json").write_text(json.dumps(meta, indent=1) + "\n")
    print("wrote", RESULTS / "scaling_milp.csv", RESULTS / "scaling_heuristic.csv")


if __name__ == "__main__":
    main()
