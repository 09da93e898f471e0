"""Quality benchmark (issue 4): how close the heuristic comes to the MILP, and
what the warm start buys the MILP.

Graphs: the shipped examples (tiny, gnmt, bert_l3) and random training graphs
of about 30, 100 and 300 nodes (`optsched.generate`). Budgets: 90%, 70% and
50% of the keep-everything peak and near the memory lower bound (lower bound
+ 5% of the distance to the keep-everything peak), on one accelerator plus the
host (`single_accelerator`). For each: the simulated step time and solve time
of every baseline, of the heuristic and of the MILP (HiGHS, --time-limit,
default 60 s, warm start on); heuristic / MILP; the MILP's own incumbent,
bound and fallback; and the time at which the MILP's incumbent first came
within 1% of its final bound, with the warm start and, at the budgets of
--cold-budgets (default 70% and near the lower bound, to keep the default
run near 20 minutes on 2 cores), without it (or "not reached"; the final gap
is in the CSV). The bound is the stage model's (fixed order,
stage barriers), not a bound over all schedules.

With --devices N (N > 1): N accelerators, each with the budget, plus the host
(`single_accelerator(budget, gpus=N)`); the heuristic (ParDNN placement +
memory planner) and m-ETF (+ the same planner) against the MILP, beside the
heuristic held to one accelerator, and which devices each schedule uses. The
MILP runs warm only.

    .venv/bin/python experiments/bench_quality.py [--time-limit 60] [--threads 2] [--cold-budgets 70%,near-lb]
                                                  [--devices 1] [--quick]

Writes experiments/results/quality.csv (quality_{N}gpu.csv with --devices N;
first line: the command and the load average at the start and the end, since
the machine is shared and a loaded one reaches the MILP's time limit sooner)
and prints a markdown summary.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from optsched import generate  # noqa: E402
from optsched.cluster import single_accelerator  # noqa: E402
from optsched.errors import InfeasibleError  # noqa: E402
from optsched.formats.importers import example_graph_path, import_graph  # noqa: E402
from optsched.graph import memory_lower_bound  # noqa: E402
from optsched.schedule import Compute  # noqa: E402
from optsched.simulate import simulate  # noqa: E402
from optsched.solvers import SOLVERS, SolveOptions, keep_everything  # noqa: E402

RESULTS = ROOT / "experiments" / "results"
COMMAND = "cd /work/main && .venv/bin/python experiments/bench_quality.py " + " ".join(sys.argv[1:])
BASELINES = ("keep-everything", "chen-sqrt", "chen-greedy", "articulation", "offload-all", "dtr")


def graphs(quick: bool):
    out = [import_graph(example_graph_path("tiny"))]
    out += [generate.random_training_graph(nf, 0) for nf in ((8, 28) if quick else (8, 28, 85))]
    if not quick:
        out += [import_graph(example_graph_path(nm)) for nm in ("gnmt", "bert_l3")]
    return out


def run(graph, cluster, name, opts):
    """(schedule or None, simulated makespan or None, seconds, note)."""
    t = time.perf_counter()
    try:
        s = SOLVERS[name](graph, cluster, opts)
    except InfeasibleError as e:
        return None, None, time.perf_counter() - t, str(e)[:100]
    dt = time.perf_counter() - t
    r = simulate(graph, cluster, s)
    if not r.valid:     # baselines ignore the budget; the heuristic and the MILP never may
        assert name in BASELINES, (name, r.violation)
        return None, None, dt, r.violation.message[:100]
    return s, r.makespan, dt, ""


def time_to_gap(events, build_s, bound, tol=0.01):
    """Seconds from the call's start until the incumbent was within tol of the final bound."""
    if bound is None:
        return None
    for e in events:
        if e["incumbent"] is not None and e["incumbent"] <= bound * (1 + tol) + 1e-15:
            return round(build_s + e["elapsed"], 3)
    return None


def milp_row(graph, cluster, args, warm: bool):
    events = []
    opts = SolveOptions(time_limit=args.time_limit, gap=0.01, threads=args.threads, progress=events.append,
                        params={} if warm else {"warm": False})
    s, mk, dt, note = run(graph, cluster, "milp", opts)
    if s is None:
        return dict(makespan=None, solve_s=round(dt, 2), status="infeasible", note=note)
    r = s.report
    ex = r.extra
    own = ex.get("milp_objective", r.objective if "fallback" not in ex else None)
    ttg = time_to_gap(events, ex["build_time"], r.bound)
    final_gap = None if r.bound is None or own is None else max(0.0, (own - r.bound) / own)
    return dict(makespan=mk, solve_s=round(dt, 2), status=r.status, own=own, bound=r.bound, gap=final_gap,
                fallback=ex.get("fallback", ""), warm=str(ex.get("warm_start", ""))[:60],
                t1=ttg if ttg is not None else "not reached", columns=ex["columns"], note=r.message[:160])


def budgets(graph):
    """(label, bytes) per budget at or above the memory lower bound, and keep-everything's result on one device."""
    big = single_accelerator(10**16)
    ke = simulate(graph, big, keep_everything(graph, big))
    pk, lb = ke.peak["gpu0"], memory_lower_bound(graph)
    out = [("90%", int(0.9 * pk)), ("70%", int(0.7 * pk)), ("50%", int(0.5 * pk)),
           ("near-lb", int(lb + 0.05 * (pk - lb)))]
    return [(label, mem) for label, mem in out if mem >= lb], ke


def solver_cells(graph, cluster, names, opts=None, suffix=""):
    """Simulated step time and solve time of each named solver (and, with several
    accelerators, how many devices its schedule computes on)."""
    row = {}
    for name in names:
        s, mk, dt, _ = run(graph, cluster, name, opts or SolveOptions())
        row[f"{name}{suffix}_s"] = mk
        row[f"{name}{suffix}_solve_s"] = round(dt, 4)
        if len(cluster.accelerators) > 1:
            row[f"{name}{suffix}_devices"] = None if s is None else len(
                {x.device for x in s.instructions if isinstance(x, Compute)})
    return row


def ratio(a, b):
    return None if a is None or not b else round(a / b, 4)


def one_device_row(g, label, mem, ke, args):
    cl = single_accelerator(mem)
    row = dict(graph=g.name, nodes=len(g), budget=label, budget_bytes=mem, keep_everything_1x=ke.makespan)
    row.update(solver_cells(g, cl, BASELINES + ("heuristic",)))
    w = milp_row(g, cl, args, warm=True)
    c = milp_row(g, cl, args, warm=False) if label in args.cold_budgets.split(",") else {"solve_s": None}
    row.update({f"milp_{k}": v for k, v in w.items()})
    row.update(milp_cold_makespan=c.get("makespan"), milp_cold_own=c.get("own"), milp_cold_bound=c.get("bound"),
               milp_cold_gap=c.get("gap"), milp_cold_t1=c.get("t1"), milp_cold_solve_s=c["solve_s"])
    row["heur_over_milp"] = ratio(row["heuristic_s"], w["makespan"])
    row["heur_over_bound"] = ratio(row["heuristic_s"], w.get("bound"))
    return row


def multi_device_row(g, label, mem, ke, args):
    cl = single_accelerator(mem, gpus=args.devices)
    row = dict(graph=g.name, nodes=len(g), devices=args.devices, budget=label, budget_bytes=mem,
               keep_everything_1x=ke.makespan)
    row.update(solver_cells(g, cl, ("heuristic",), SolveOptions(devices=1), suffix="_1gpu"))
    row.update(solver_cells(g, cl, ("heuristic", "metf")))
    w = milp_row(g, cl, args, warm=True)
    row.update({f"milp_{k}": v for k, v in w.items()})
    row["heur_over_milp"] = ratio(row["heuristic_s"], w["makespan"])
    row["metf_over_milp"] = ratio(row["metf_s"], w["makespan"])
    row["heur_over_bound"] = ratio(row["heuristic_s"], w.get("bound"))
    return row


def load() -> str:
    return ", ".join(f"{x:.2f}" for x in os.getloadavg())


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--time-limit", type=float, default=60)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--quick", action="store_true", help="small graphs only")
    ap.add_argument("--devices", type=int, default=1, help="accelerators, each with the budget (default 1)")
    ap.add_argument("--cold-budgets", default="70%,near-lb", help="one device: budgets at which the MILP also runs "
                    "without a warm start (each such run costs up to --time-limit)")
    args = ap.parse_args()
    rows = []
    t_all = time.perf_counter()
    load_start = load()
    make_row = one_device_row if args.devices == 1 else multi_device_row
    for g in graphs(args.quick):
        points, ke = budgets(g)
        for label, mem in points:
            row = make_row(g, label, mem, ke, args)
            row["command"] = COMMAND
            rows.append(row)
            print({k: row.get(k) for k in ("graph", "budget", "heuristic_s", "metf_s", "milp_makespan", "milp_own",
                                           "milp_bound", "milp_t1", "milp_cold_t1", "milp_solve_s")}, flush=True)
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / ("quality.csv" if args.devices == 1 else f"quality_{args.devices}gpu.csv")
    df = pd.DataFrame(rows)
    with open(path, "w") as f:
        f.write(f"# command: {COMMAND}; load average (1, 5, 15 min) at the start: {load_start}; "
                f"at the end: {load()}\n")
        df.to_csv(f, index=False)
    print(f"wrote {path} in {time.perf_counter() - t_all:.0f} s\n")
    print(markdown(summary(df, args.devices)))


def summary(df: pd.DataFrame, devices: int) -> pd.DataFrame:
    if devices == 1:
        df = df.assign(best_baseline_s=df[[f"{b}_s" for b in BASELINES]].min(axis=1))

    def ms(col):    # 4 significant digits: tiny's steps take 0.085 ms, gnmt's 500 ms
        return (df[col] * 1e3).map(lambda x: float(f"{x:.4g}"))

    cols = {"graph": df.graph, "nodes": df.nodes, "budget": df.budget}
    if devices == 1:
        cols["best baseline ms"] = ms("best_baseline_s")
        cols["heuristic ms"] = ms("heuristic_s")
    else:
        cols["heuristic 1 GPU ms"] = ms("heuristic_1gpu_s")
        cols["heuristic ms"] = ms("heuristic_s")
        cols["devices used"] = df.heuristic_devices
        cols["m-ETF ms"] = ms("metf_s")
    cols.update({"MILP ms": ms("milp_makespan"), "MILP own ms": ms("milp_own"), "MILP bound ms": ms("milp_bound"),
                 "heur/MILP": df.heur_over_milp})
    if devices == 1:
        cols.update({"MILP s": df.milp_solve_s, "t to 1% warm": df.milp_t1, "t to 1% cold": df.milp_cold_t1})
    else:
        cols.update({"m-ETF/MILP": df.metf_over_milp, "MILP s": df.milp_solve_s, "MILP fallback": df.milp_fallback})
    return pd.DataFrame(cols)


def markdown(df: pd.DataFrame) -> str:
    """A markdown table (pandas' to_markdown needs tabulate, not a dependency here)."""
    cells = [[("" if pd.isna(v) else str(v)) for v in r] for r in df.itertuples(index=False)]
    lines = ["| " + " | ".join(df.columns) + " |", "|" + "---|" * len(df.columns)]
    return "\n".join(lines + ["| " + " | ".join(r) + " |" for r in cells])


if __name__ == "__main__":
    main()
