"""Multi-device: simulated step time against the number of accelerators for graphs
that do not fit on one.

Every accelerator gets the same budget: `--fraction` (default 0.5) of
keep-everything's peak on one accelerator, raised to the graph's memory lower
bound where that is higher (no schedule goes below it), so keep-everything
never fits on one. The cluster is N accelerators and the host, each
accelerator joined to the host by 16 GB/s PCIe both ways (`single_accelerator`)
and to every other accelerator by a direct link at `--peer-bandwidth`
(default 16 GB/s, PCIe peer to peer; 0: none, copies go through the host).
Graphs: the shipped GNMT and BERT (3 layers) and a random training graph.

    .venv/bin/python experiments/multi_device.py [--jobs 2] [--time-limit 60]   # about 5 min on 2 cores
    .venv/bin/python experiments/multi_device.py --quick                        # smoke test, seconds

Writes experiments/results/multi_device.csv (first line: machine, settings,
command, wall time) and multi_device.png (step time against accelerators, one
line per solver, one panel per graph); `--quick` writes under the system's
temporary directory unless `--out` says otherwise.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "experiments")]

from sweep_budget import machine  # noqa: E402

from optsched.cluster import DEFAULT_PCIE_LATENCY, Cluster, Link, check_cluster, single_accelerator  # noqa: E402
from optsched.compare import Problem, grid, run_solver  # noqa: E402
from optsched.formats.importers import example_graph_path, import_graph  # noqa: E402
from optsched.generate import random_training_graph  # noqa: E402
from optsched.graph import Graph, memory_lower_bound  # noqa: E402
from optsched.plot import PALETTE, save  # noqa: E402
from optsched.solvers import SolveOptions  # noqa: E402
from optsched.units import format_size  # noqa: E402

SOLVERS = ("heuristic", "metf", "milp")
PEER_BANDWIDTH = 16e9
MARKERS = ("o", "s", "^", "D", "v")
STYLES = ("-", "--", ":", "-.")     # with shrinking markers, so a solver that ties another stays visible


def cluster(budget: int, accelerators: int, peer_bandwidth: float = PEER_BANDWIDTH) -> Cluster:
    """`accelerators` devices of `budget` bytes each plus the host, every pair of accelerators linked directly."""
    base = single_accelerator(budget, gpus=accelerators)
    names = [d.name for d in base.accelerators]
    peers = [Link(a, b, peer_bandwidth, DEFAULT_PCIE_LATENCY) for a in names for b in names
             if a != b and peer_bandwidth > 0]
    return check_cluster(Cluster(base.devices, base.links + tuple(peers)))


def problems(graphs: list[Graph], counts: list[int], fraction: float,
             peer_bandwidth: float) -> tuple[list[Problem], pd.DataFrame]:
    """One problem per (graph, accelerator count), each accelerator with the graph's budget, and per graph
    keep-everything's one-accelerator peak and step time with unlimited memory (the base of every overhead)."""
    out, info = [], []
    for g in graphs:
        keep = run_solver(g, single_accelerator(2**62), "keep-everything").result
        peak = keep.peak["gpu0"]
        budget = max(int(fraction * peak), memory_lower_bound(g))
        info.append({"graph": g.name, "budget_fraction": round(budget / peak, 4), "keep_peak_bytes": peak,
                     "unlimited_step_s": keep.makespan})
        out += [Problem({"graph": g.name, "accelerators": n, "budget_bytes": budget}, g,
                        cluster(budget, n, peer_bandwidth), keep.makespan) for n in counts]
    return out, pd.DataFrame(info)


def with_speedup(df: pd.DataFrame) -> pd.DataFrame:
    """Adds speedup: the solver's own step time on one accelerator over this one (NaN without a 1-device row)."""
    one = df[df["accelerators"] == 1].set_index(["graph", "solver"])["step_time_s"]
    single = [one.get((g, s), float("nan")) for g, s in zip(df["graph"], df["solver"], strict=True)]
    return df.assign(speedup=pd.Series(single, index=df.index) / df["step_time_s"])


def figure(df: pd.DataFrame):
    """Step time (ms) against accelerators, one panel per graph, one line per solver (valid schedules only),
    and keep-everything's step time with unlimited memory for scale."""
    import matplotlib.pyplot as plt

    names = list(dict.fromkeys(df["graph"]))
    fig, axes = plt.subplots(1, len(names), figsize=(4.2 * len(names), 3.8), layout="constrained", squeeze=False)
    for ax, name in zip(axes[0], names, strict=True):
        part = df[df["graph"] == name]
        for i, solver in enumerate(dict.fromkeys(part["solver"])):
            rows = part[(part["solver"] == solver) & part["valid"].astype(bool)].sort_values("accelerators")
            ax.plot(rows["accelerators"], rows["step_time_s"] * 1e3, marker=MARKERS[i % len(MARKERS)],
                    ms=max(9 - 2 * i, 3), ls=STYLES[i % len(STYLES)], color=PALETTE[i % len(PALETTE)], label=solver)
        ax.axhline(part["unlimited_step_s"].iloc[0] * 1e3, color="grey", ls=":", lw=1,
                   label="keep-everything, unlimited memory")
        ax.set_title(f"{name}: {format_size(int(part['budget_bytes'].iloc[0]))} per accelerator\n"
                     f"({part['budget_fraction'].iloc[0]:.0%} of keep-everything's peak)", fontsize="medium")
        ax.set_xlabel("accelerators (+ host)")
        ax.set_xticks(sorted(set(part["accelerators"])))
        ax.set_ylabel("simulated step time (ms)")
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
    axes[0][-1].legend(loc="lower left", fontsize="small")
    return fig


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true",
                    help="smoke test: a 12-layer random graph, 1-2 accelerators, 5 s MILP")
    ap.add_argument("--graphs", help="comma-separated: example names and random-N (default gnmt,bert_l3,random-40)")
    ap.add_argument("--accelerators", help="comma-separated counts (default 1,2,3,4)")
    ap.add_argument("--solvers", default=",".join(SOLVERS), help="default " + ",".join(SOLVERS))
    ap.add_argument("--fraction", type=float, default=0.5,
                    help="per-accelerator budget, fraction of keep-everything's one-device peak (default 0.5)")
    ap.add_argument("--peer-bandwidth", type=float, default=PEER_BANDWIDTH,
                    help="bytes/s of each accelerator-to-accelerator link, 0 for none (default 16e9)")
    ap.add_argument("--time-limit", type=float, help="seconds per MILP solve (default 60; 5 with --quick)")
    ap.add_argument("--jobs", type=int, default=2, help="parallel solves (default 2)")
    ap.add_argument("--out", help="output stem (default experiments/results/multi_device)")
    args = ap.parse_args(argv)
    quick = args.quick
    graph_names = (args.graphs or ("random-12" if quick else "gnmt,bert_l3,random-40")).split(",")
    counts = [int(n) for n in (args.accelerators or ("1,2" if quick else "1,2,3,4")).split(",")]
    time_limit = args.time_limit or (5.0 if quick else 60.0)
    stem = Path(args.out or (Path(tempfile.gettempdir()) / "multi_device_quick" if quick
                             else ROOT / "experiments" / "results" / "multi_device"))
    graphs = [random_training_graph(int(n.split("-", 1)[1]), 0) if n.startswith("random-")
              else import_graph(example_graph_path(n)) for n in graph_names]

    t0 = time.perf_counter()
    todo, info = problems(graphs, counts, args.fraction, args.peer_bandwidth)
    df = grid(todo, args.solvers.split(","), SolveOptions(time_limit=time_limit), processes=args.jobs)
    df = with_speedup(df.merge(info, on="graph", how="left"))
    first = ["graph", "accelerators", "budget_bytes", "budget_fraction", "keep_peak_bytes", "unlimited_step_s",
             "solver", "status", "valid", "step_time_s", "speedup"]
    peaks = sorted((c for c in df if c.startswith("peak_")), key=lambda c: (c == "peak_host_bytes", c))
    df = df[first + peaks + [c for c in df if c not in first and c not in peaks]]
    wall = time.perf_counter() - t0

    stem.parent.mkdir(parents=True, exist_ok=True)
    settings = {"graphs": graph_names, "accelerators": counts, "solvers": args.solvers, "fraction": args.fraction,
                "peer_bandwidth": args.peer_bandwidth, "time_limit": time_limit, "jobs": args.jobs}
    command = "python experiments/multi_device.py " + " ".join(sys.argv[1:] if argv is None else argv)
    with open(stem.with_suffix(".csv"), "w", newline="") as f:
        f.write(f"# machine: {json.dumps(machine())}; settings: {json.dumps(settings)}; "
                f"command: {command.strip()}; wall: {wall:.0f} s\n")
        df.to_csv(f, index=False)
    save(figure(df), str(stem.with_suffix(".png")))
    cols = ["graph", "accelerators", "solver", "status", "step_time_s", "speedup", "transfer_bytes", "solve_s", "gap"]
    print(df[cols].to_string(index=False), file=sys.stderr)
    print(f"wrote {stem.with_suffix('.csv')} and .png in {wall:.0f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
