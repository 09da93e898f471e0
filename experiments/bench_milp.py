"""Benchmark of the MILP scheduler (HiGHS, 2 cores).

1. Checkmate's problem: one device, recompute only, on real training graphs of
   37-350 nodes (PyTorch models captured with optsched, roofline costs of the
   H100 preset, so every run sees the same graph; and GNMT from
   ../shared/data) at budgets from 90% of keep-everything's simulated peak down
   in steps of 10% until the stage model is infeasible, then halfway
   back (near the minimum feasible fraction): solve time, proven gap, step time.
2. The joint problem: 2 GPUs + host, swapping on, with a 120 s limit, on the
   ../shared/data graphs and captured ones.

Also times the model build of a 500-node graph (goal: under 5 s), and gives each
graph's memory floor for Checkmate's problem (`bounds.least_budget`: below it no
schedule fits, whatever is recomputed) beside its largest operation, as fractions
of keep-everything's peak. Writes experiments/results/milp_build.csv,
milp_floor.csv, milp_checkmate.csv and milp_joint.csv, each with the command,
machine and load average on its first line (as a comment).

    .venv/bin/python experiments/bench_milp.py [--time-limit 60] [--joint-time-limit 120] [--quick]
    .venv/bin/python experiments/bench_milp.py --build-only      # milp_build.csv alone
"""

from __future__ import annotations

import argparse
import csv
import os
import platform
import sys
import time

from optsched.cluster import Cluster, Device, single_accelerator
from optsched.errors import InfeasibleError
from optsched.formats.importers import import_graph
from optsched.simulate import simulate
from optsched.solvers import SolveOptions, solve
from optsched.solvers import baselines as B

HERE = os.path.dirname(os.path.abspath(__file__))
DATA = os.path.join(HERE, "..", "..", "shared", "data", "msr-dnn-partitioning")

# (name, builder, keyword arguments): 37..328 nodes; batches large enough that activations, not parameters and
# their gradients (which every schedule holds at the end), make most of the keep-everything peak
CAPTURED = [("mlp", "mlp", {"batch": 1024}), ("mlp-8", "mlp", {"batch": 1024, "depth": 8}),
            ("cnn", "cnn", {"batch": 64}), ("transformer", "transformer", {"batch": 32}),
            ("bert", "bert", {"batch": 16}), ("gpt2", "gpt2", {"batch": 16}),
            ("gpt2-3", "gpt2", {"batch": 16, "layers": 3})]


def captured(name: str, builder: str, kw: dict):
    import torch

    from optsched.capture import capture
    from optsched.capture.models import BUILTIN

    torch.manual_seed(0)
    ex = BUILTIN[builder](**kw)
    return capture(ex["model"], ex["inputs"], ex["loss_fn"], targets=ex.get("targets"), name=name)


def graphs(quick: bool, which: str):
    out = []
    for name, builder, kw in CAPTURED[:2] if quick else CAPTURED:
        try:
            out.append((name, captured(name, builder, kw)))
        except ImportError as e:   # torch or transformers missing: the shipped graphs still run
            print(f"skipping {name}: {e}", file=sys.stderr)
    path = os.path.join(DATA, "gnmt_training.json")
    if os.path.exists(path):
        out.append(("gnmt", import_graph(path)))
    if which:
        out = [g for g in out if g[0] in which.split(",")]
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


NONE = ("infeasible", "model_infeasible", "no_incumbent")    # statuses without a schedule


def row(name, g, cl, frac, opts, base_time, problem):
    t0 = time.perf_counter()
    try:
        s = solve(g, cl, "milp", opts)
    except InfeasibleError as e:
        # the smallest budget that fits lies between the two, as fractions of keep-everything's peak
        per = frac / cl.devices[0].memory
        return dict(problem=problem, graph=name, nodes=len(g), budget_frac=round(frac, 3), status=e.status,
                    wall_s=round(time.perf_counter() - t0, 2), note=str(e)[:120],
                    least_frac=None if e.least is None else round(e.least * per, 4),
                    found_frac=None if e.found is None else round(e.found * per, 4))
    r = s.report
    sim = simulate(g, cl, s)
    assert sim.valid
    return dict(problem=problem, graph=name, nodes=len(g), budget_frac=round(frac, 3), status=r.status,
                build_s=round(r.extra["build_time"], 3), solve_s=round(r.solve_time, 2),
                wall_s=round(time.perf_counter() - t0, 2), objective_s=r.objective, bound_s=r.bound,
                gap=None if r.gap is None else round(r.gap, 5), makespan_s=sim.makespan,
                overhead=round(sim.makespan / base_time - 1, 5), cols=r.extra["columns"], rows=r.extra["rows"],
                recomputed=sim.recomputed, swap_out_bytes=sim.swap_out_bytes, fallback=r.extra.get("fallback", ""),
                warm=r.extra["warm_start"][:60],
                whole_stage_objective_s=r.extra.get("stage_models", {}).get("whole-stage", {}).get("objective"))


def write(path, rows, cmd):
    keys = []
    for r in rows:
        keys += [k for k in r if k not in keys]
    with open(path, "w", newline="") as f:
        f.write(f"# {cmd}; {platform.machine()} {os.cpu_count()} cores; "
                f"load average at the end {os.getloadavg()[0]:.1f}\n")
        w = csv.DictWriter(f, fieldnames=keys)
        w.writeheader()
        w.writerows(rows)


def floors(gs, peaks_of) -> list[dict]:
    """Per graph: the budget below which no one-device recompute-only schedule fits, and the largest operation's
    inputs, output and workspace, as fractions of keep-everything's peak."""
    from optsched.graph import memory_lower_bound
    from optsched.solvers.bounds import least_budget
    from optsched.solvers.milp_model import make_spec

    out = []
    for name, g in gs:
        kep = peaks_of(name, g)[1]["keep-everything"]
        t = time.perf_counter()
        least = least_budget(make_spec(g, one(kep), swap=False))
        out.append(dict(graph=name, nodes=len(g), keep_everything_bytes=kep,
                        largest_operation_frac=round(memory_lower_bound(g) / kep, 4),
                        floor_frac=None if least is None else round(least / kep, 4),
                        floor_bytes=least, floor_s=round(time.perf_counter() - t, 2)))
        print(out[-1], flush=True)
    return out


def build_times(repeats: int = 3) -> list[dict]:
    """Model build time (spec + arrays) of a 500-node graph on 2 GPUs + host: the goal is under 5 s."""
    from optsched.generate import random_training_graph
    from optsched.solvers.milp_model import build_model, make_spec

    g = random_training_graph(161)     # 500 operations
    cl = single_accelerator(10**7, gpus=2)
    out = []
    for k in range(repeats):
        t = time.perf_counter()
        m = build_model(make_spec(g, cl))
        out.append(dict(nodes=len(g), repeat=k, build_s=round(time.perf_counter() - t, 3), cols=m.ncol,
                        rows=m.nrow, nonzeros=int(m.index.size)))
        print(out[-1], flush=True)
    return out


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--time-limit", type=float, default=60)
    ap.add_argument("--joint-time-limit", type=float, default=120)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--graphs", default="", help="comma-separated names to run (default: all)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--skip-joint", action="store_true")
    ap.add_argument("--skip-checkmate", action="store_true")
    ap.add_argument("--build-only", action="store_true", help="write milp_build.csv alone")
    ap.add_argument("--cuts", type=int, default=0,
                    help="MILP params cuts=K (recomputation-chain cuts K inputs deep)")
    ap.add_argument("--tag", default="",
                    help="write milp_checkmate_TAG.csv and milp_joint_TAG.csv, and skip the build and floor tables "
                    "(default with --cuts: cuts)")
    args = ap.parse_args(argv)
    cmd = "cd /work/main && .venv/bin/python experiments/bench_milp.py " + " ".join(sys.argv[1:])
    tag = args.tag or ("cuts" if args.cuts else "")
    if not tag:
        write(os.path.join(HERE, "results", "milp_build.csv"), build_times(), cmd)
    if args.build_only:
        return
    params = {"cuts": args.cuts} if args.cuts else {}
    gs = graphs(args.quick, args.graphs)
    base = {}

    def peaks_of(name, g):      # the baselines once per graph, for every table
        if name not in base:
            base[name] = baseline_peaks(g, one)
        return base[name]

    if not tag:
        write(os.path.join(HERE, "results", "milp_floor.csv"), floors(gs, peaks_of), cmd)
    rows = []
    for name, g in [] if args.skip_checkmate else gs:
        ke, peaks = peaks_of(name, g)
        kep = peaks["keep-everything"]
        opts = SolveOptions(time_limit=args.time_limit, gap=0.01, threads=args.threads, swap=False, params=params)
        feasible, frac = None, 0.9
        while frac > 0.04:
            r = row(name, g, one(int(frac * kep)), frac, opts, ke.makespan, "checkmate")
            print(r, flush=True)
            rows.append(r)
            if r["status"] in NONE:
                break
            feasible, frac = frac, round(frac - 0.1, 3)
        for near in (0.95, 0.99) if feasible is None else ():   # feasible only close to keep-everything
            r = row(name, g, one(int(near * kep)), near, opts, ke.makespan, "checkmate")
            print(r, flush=True)
            rows.append(r)
            if r["status"] not in NONE:
                break
        if feasible is not None and frac > 0.04 and r["status"] in ("infeasible", "model_infeasible"):
            mid = round((feasible + frac) / 2, 3)
            r = row(name, g, one(int(mid * kep)), mid, opts, ke.makespan, "checkmate")
            print(r, flush=True)
            rows.append(r)
    if rows:
        write(os.path.join(HERE, "results", f"milp_checkmate_{tag}.csv" if tag else "milp_checkmate.csv"), rows, cmd)
    if args.skip_joint:
        return
    jrows = []
    joint = [(n, g) for n, g in gs if n in ("transformer", "gpt2", "gnmt")]
    path = os.path.join(DATA, "bert_l-3_training.json")
    if os.path.exists(path) and not args.quick:
        joint.append(("bert_l3", import_graph(path)))
    for name, g in joint:
        ke, peaks = peaks_of(name, g)
        for frac in (0.9, 0.5):
            cl = single_accelerator(int(frac * peaks["keep-everything"]), gpus=2)
            opts = SolveOptions(time_limit=args.joint_time_limit, gap=0.01, threads=args.threads, swap=True,
                                params=params)
            r = row(name, g, cl, frac, opts, ke.makespan, "joint-2gpu+host")
            print(r, flush=True)
            jrows.append(r)
    write(os.path.join(HERE, "results", f"milp_joint_{tag}.csv" if tag else "milp_joint.csv"), jrows, cmd)


if __name__ == "__main__":
    main()
