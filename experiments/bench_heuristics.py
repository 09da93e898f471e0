"""Benchmark of the heuristic scheduler and the baselines.

Scale: a random layered training DAG and a real graph (MSR bert_l-3)
replicated layer-wise, about 10,000 and 100,000 nodes, placed on 4
accelerators (plus the host) at a tight budget and given a schedule; the
solve time (placement + list schedule + memory planner, simulator check off)
is measured apart from the simulator's check of the result.

Quality: every baseline's simulated step time and peak at several budgets
(fractions of the keep-everything peak) on synthetic graphs and the MSR
graphs.

    .venv/bin/python experiments/bench_heuristics.py [--quick]

Writes experiments/results/heuristic_scale.csv and heuristic_quality.csv
(first line: the command and the load average when it started and when the
file was written: the machine is shared, and the scale timings depend on it).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from experiments.bench_quality import load  # noqa: E402
from optsched.cluster import single_accelerator  # noqa: E402
from optsched.errors import InfeasibleError  # noqa: E402
from optsched.generate import chain_graph, random_training_graph  # noqa: E402
from optsched.graph import Graph, Node, check_graph, memory_lower_bound  # noqa: E402
from optsched.simulate import simulate  # noqa: E402
from optsched.solvers import SOLVERS, SolveOptions, keep_everything  # noqa: E402

RESULTS = ROOT / "experiments" / "results"
MSR = Path("/work/shared/data/msr-dnn-partitioning")
COMMAND = "python experiments/bench_heuristics.py " + " ".join(sys.argv[1:])


def keep_peak(graph: Graph) -> tuple[int, float]:
    big = single_accelerator(10**16)
    r = simulate(graph, big, keep_everything(graph, big))
    return r.peak["gpu0"], r.makespan


def replicate(graph: Graph, copies: int) -> Graph:
    """`copies` copies of a training graph in sequence: the data inputs of
    copy r are read from copy r-1's loss (a zero-cost, non-recomputable node)."""
    loss = next((n.id for n in graph.nodes if n.kind == "loss"), None)
    nodes = []
    for r in range(copies):
        p = f"r{r}/"
        for nd in graph.nodes:
            ins = tuple(p + x for x in nd.inputs)
            if r > 0 and nd.kind == "input" and loss is not None:
                nodes.append(Node(p + nd.id, "from_prev", "forward", (f"r{r - 1}/{loss}",),
                                  {k: 0.0 for k in nd.cost}, nd.bytes, nd.workspace, False, False))
            else:
                nodes.append(Node(p + nd.id, nd.op, nd.kind, ins, dict(nd.cost), nd.bytes, nd.workspace,
                                  nd.recomputable, nd.required))
    return check_graph(Graph(tuple(nodes), name=f"{graph.name}x{copies}"))


def msr(name: str) -> Graph | None:
    try:
        from optsched.formats.importers import import_graph
    except ImportError:
        return None
    path = MSR / f"{name}.json"
    return import_graph(path) if path.exists() else None


def scale_rows(sizes, frac: float = 0.3, gpus: int = 4):
    rows = []
    graphs = []
    for target in sizes:
        graphs.append(("random-layered", lambda t=target: random_training_graph(max(2, t // 3), 0)))
        base = msr("bert_l-3_training")
        if base is not None:
            graphs.append(("bert_l-3-replicated", lambda t=target, b=base: replicate(b, max(1, t // len(b)))))
    for kind, make in graphs:
        t = time.perf_counter()
        g = make()
        _ = g.arrays   # index build counts as generation
        t_gen = time.perf_counter() - t
        pk, t_keep = keep_peak(g)
        budget = max(int(pk * frac), int(1.25 * memory_lower_bound(g)))
        cl = single_accelerator(budget, gpus=gpus)
        t = time.perf_counter()
        s = SOLVERS["heuristic"](g, cl, SolveOptions(params={"verify": False}))
        t_solve = time.perf_counter() - t
        t = time.perf_counter()
        r = simulate(g, cl, s)
        t_sim = time.perf_counter() - t
        row = dict(graph=kind, nodes=len(g), edges=g.num_edges, devices=gpus, budget_frac=round(budget / pk, 3),
                   budget_bytes=cl.devices[0].memory, solve_s=round(t_solve, 3), simulate_s=round(t_sim, 3),
                   total_s=round(t_solve + t_sim, 3), generate_s=round(t_gen, 3), valid=r.valid,
                   makespan=r.makespan, keep_everything_1gpu_makespan=t_keep,
                   peak_max=max(v for k, v in r.peak.items() if k != "host"), recomputed=r.recomputed,
                   transfer_bytes=r.transfer_bytes, instructions=len(s.instructions), command=COMMAND)
        print(row, flush=True)
        rows.append(row)
    return rows


def quality_rows(graphs, fracs, solvers):
    rows = []
    for g in graphs:
        pk, t_keep = keep_peak(g)
        for frac in fracs:
            for name, gpus in solvers:
                cl = single_accelerator(int(pk * frac), gpus=gpus)
                t = time.perf_counter()
                row = dict(graph=g.name, nodes=len(g), budget_frac=frac, budget_bytes=cl.devices[0].memory,
                           solver=name, gpus=gpus)
                try:
                    s = SOLVERS[name](g, cl, SolveOptions())
                    dt = time.perf_counter() - t
                    r = simulate(g, cl, s)
                    row.update(status="valid" if r.valid else "INVALID", solve_s=round(dt, 4), makespan=r.makespan,
                               vs_keep=r.makespan / t_keep,
                               peak=max(v for k, v in r.peak.items() if k != "host"),
                               recomputed=r.recomputed, transfer_bytes=r.transfer_bytes)
                except InfeasibleError as e:
                    row.update(status="infeasible", solve_s=round(time.perf_counter() - t, 4), message=str(e)[:120])
                row["command"] = COMMAND
                rows.append(row)
        print(g.name, "done", flush=True)
    return rows


LOAD_START = load()


def write(rows, name):
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / name
    with open(path, "w") as f:
        f.write(f"# command: {COMMAND}; load average (1, 5, 15 min) at the start: {LOAD_START}; "
                f"at the end: {load()}\n")
        pd.DataFrame(rows).to_csv(f, index=False)
    print("wrote", path)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="10k nodes only, fewer graphs")
    args = ap.parse_args()
    sizes = [10_000] if args.quick else [10_000, 100_000]
    write(scale_rows(sizes), "heuristic_scale.csv")
    graphs = [chain_graph(100), random_training_graph(200, 1), random_training_graph(500, 2, window=2)]
    if not args.quick:
        for nm in ("resnet50_training", "bert_l-3_training", "gnmt_training"):
            g = msr(nm)
            if g is not None:
                graphs.append(g)
    solvers = [("keep-everything", 1), ("chen-sqrt", 1), ("chen-greedy", 1), ("articulation", 1),
               ("offload-all", 1), ("dtr", 1), ("heuristic", 1), ("metf", 1), ("heuristic", 2), ("metf", 2),
               ("heuristic", 4)]
    write(quality_rows(graphs, [1.0, 0.7, 0.5, 0.35, 0.25], solvers), "heuristic_quality.csv")


if __name__ == "__main__":
    main()
