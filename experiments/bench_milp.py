"""Benchmark of the MILP scheduler (HiGHS, 2 cores).

1. Checkmate's problem: one device, recompute only, on graphs of ~50-350
   nodes at budgets from 90% of keep-everything's simulated peak down to the
   smallest budget a baseline reaches (near the model's minimum): solve time,
   proven gap, step time.
2. The joint problem: 2 GPUs + host, swapping on, with a 120 s limit.

Writes experiments/results/milp_checkmate.csv and milp_joint.csv, each with
the command that made it on its first line (as a comment).

    .venv/bin/python experiments/bench_milp.py [--time-limit 60] [--joint-time-limit 120] [--quick]
"""

from __future__ import annotations

import argparse
import csv
import os
import sys
import time

from optsched import generate
from optsched.cluster import Cluster, Device, single_accelerator
from optsched.errors import InfeasibleError
from optsched.graph import memory_lower_bound
from optsched.simulate import simulate
from optsched.solvers import SolveOptions, solve
from optsched.solvers import baselines as B

HERE = os.path.dirname(os.path.abspath(__file__))
GNMT = "/work/shared/data/msr-dnn-partitioning/gnmt_training.json"


def graphs(quick: bool):
    out = [("random-15", generate.random_training_graph(15, 0))]
    try:
        from optsched.formats.importers import import_graph
        if os.path.exists(GNMT):
            out.append(("gnmt", import_graph(GNMT)))
    except ImportError:
        pass
    if not quick:
        out.append(("random-60", generate.random_training_graph(60, 0)))
        out.append(("random-115", generate.random_training_graph(115, 0)))
    return out


def one(mem):
    return Cluster((Device("gpu0", "cuda", int(mem)),))


def baseline_peaks(g, cl_fn):
    big = cl_fn(10**15)
    ke = simulate(g, big, B.keep_everything(g, big))
    peaks = {"keep-everything": ke.peak["gpu0"]}
    for nm in ("chen_sqrt", "chen_greedy", "articulation"):
        fn = getattr(B, nm, None)
        if fn is None:
            continue
        try:
            peaks[nm] = simulate(g, big, fn(g, big)).peak["gpu0"]
        except Exception:
            pass
    return ke, peaks


def row(name, g, cl, frac, opts, base_time, problem):
    t0 = time.perf_counter()
    try:
        s = solve(g, cl, "milp", opts)
    except InfeasibleError as e:
        st = "no_incumbent" if "no schedule found" in str(e) else "infeasible"
        return dict(problem=problem, graph=name, nodes=len(g), budget_frac=round(frac, 3), status=st,
                    wall_s=round(time.perf_counter() - t0, 2), note=str(e)[:120])
    r = s.report
    sim = simulate(g, cl, s)
    assert sim.valid
    return dict(problem=problem, graph=name, nodes=len(g), budget_frac=round(frac, 3), status=r.status,
                build_s=round(r.extra["build_time"], 3), solve_s=round(r.solve_time, 2),
                wall_s=round(time.perf_counter() - t0, 2), objective_s=r.objective, bound_s=r.bound,
                gap=None if r.gap is None else round(r.gap, 5), makespan_s=sim.makespan,
                overhead=round(sim.makespan / base_time - 1, 5), cols=r.extra["columns"], rows=r.extra["rows"],
                recomputed=sim.recomputed, swap_out_bytes=sim.swap_out_bytes, fallback=r.extra.get("fallback", ""),
                warm=r.extra["warm_start"][:60])


def write(path, rows, cmd):
    keys = []
    for r in rows:
        keys += [k for k in r if k not in keys]
    with open(path, "w", newline="") as f:
        f.write(f"# {cmd}\n")
        w = csv.DictWriter(f, fieldnames=keys)
        w.writeheader()
        w.writerows(rows)


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--time-limit", type=float, default=60)
    ap.add_argument("--joint-time-limit", type=float, default=120)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args(argv)
    cmd = "cd /work/main && .venv/bin/python experiments/bench_milp.py " + " ".join(sys.argv[1:])
    gs = graphs(args.quick)
    rows = []
    for name, g in gs:
        ke, peaks = baseline_peaks(g, one)
        kep = peaks["keep-everything"]
        lb_frac = memory_lower_bound(g) / kep
        fracs = sorted({max(f, round(lb_frac + 0.005, 3)) for f in (0.9, 0.6, 0.4)}, reverse=True)
        for frac in fracs:
            if frac > 1.0:
                continue
            opts = SolveOptions(time_limit=args.time_limit, gap=0.01, threads=args.threads, swap=False)
            r = row(name, g, one(int(frac * kep)), frac, opts, ke.makespan, "checkmate")
            print(r, flush=True)
            rows.append(r)
            if r["status"] == "infeasible":
                break
    write(os.path.join(HERE, "results", "milp_checkmate.csv"), rows, cmd)
    jrows = []
    for name, g in [x for x in gs if x[0] in ("random-15", "random-60")]:
        ke, peaks = baseline_peaks(g, one)
        frac = 0.9
        cl = single_accelerator(int(frac * peaks["keep-everything"]), gpus=2)
        opts = SolveOptions(time_limit=args.joint_time_limit, gap=0.01, threads=args.threads, swap=True)
        r = row(name, g, cl, frac, opts, ke.makespan, "joint-2gpu+host")
        print(r, flush=True)
        jrows.append(r)
    write(os.path.join(HERE, "results", "milp_joint.csv"), jrows, cmd)


if __name__ == "__main__":
    main()
