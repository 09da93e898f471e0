"""How far the recompute lower bound gets with moments chosen by hand (research aid for the open gaps of
bench_milp.py's Checkmate rows).

`bounds.lower_bounds` picks its moments itself (the grown chain, then the orders over `order_moments`,
`blocking_moments` or `tight_moments`). This takes a chain of first computations, each an ancestor of the next,
and more moments, and runs the same branch and bound over their orders (`bounds._orders`), so that one can see
whether the relaxation, given the right moments, proves a schedule within the gap: where it does, what is left is
choosing those moments, not a stronger relaxation. A moment is an operation's name (its first computation) or
"u<y" (u's last computation before y's first, u an ancestor of y). Graphs and budgets as bench_milp.py builds
them; the bound is printed, and appended to experiments/results/bound_moments.csv, as a multiple of
keep-everything's step time.

    .venv/bin/python experiments/bound_moments.py transformer 0.45 \\
        --chain _log_softmax_backward_data,threshold_backward,add_7,threshold_backward_1 \\
        --moments 'add_2<getitem_27,relu<mm_7,getitem_18<add_6,mm_7,add_6,add_1<getitem_30,getitem_10<mm_7' \\
        --target 1.29878
"""

from __future__ import annotations

import argparse
import csv
import os
import sys
import threading
import time

import numpy as np
from bench_milp import CAPTURED, baseline_peaks, captured, one

from optsched.solvers import SolveOptions
from optsched.solvers import bounds as B
from optsched.solvers.milp_model import TIME_SCALE, spec_for

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "results", "bound_moments.csv")


def moment(ids: list[str], text: str):
    if "<" in text:
        u, y = text.split("<")
        return ids.index(u), ids.index(y), 0
    return ids.index(text)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("graph", choices=[c[0] for c in CAPTURED])
    ap.add_argument("frac", type=float, help="budget, a fraction of keep-everything's peak")
    ap.add_argument("--chain", required=True, help="comma-separated first computations, each above the next")
    ap.add_argument("--moments", default="", help="comma-separated moments to take in every order")
    ap.add_argument("--target", type=float, help="stop where the bound reaches this (x keep-everything's time)")
    ap.add_argument("--seconds", type=float, default=600.0)
    a = ap.parse_args(argv)
    name, builder, kw = next(c for c in CAPTURED if c[0] == a.graph)
    g = captured(name, builder, kw)
    ke, _ = baseline_peaks(g, one)
    spec = spec_for(g, one(int(a.frac * ke.peak["gpu0"])), SolveOptions(swap=False))
    ids = list(g.arrays.ids)
    chain = [moment(ids, t) for t in a.chain.split(",")]
    extra = [moment(ids, t) for t in a.moments.split(",") if t]
    needed = B._needed(spec)
    d = B._sole_device(spec, needed)
    dst = np.repeat(np.arange(spec.n), np.diff(spec.in_ptr))
    lp, anc = B._ranked(spec, d, needed, dst, 5.0)
    single = {x: val for val, x, _ in lp}
    B._ancestors(spec, anc, chain + extra)
    work = float(np.nansum(np.where(needed, spec.ccost[d], 0.0)))
    base = ke.makespan * TIME_SCALE
    t0 = time.perf_counter()
    start = B._solve(B._coupled(spec, d, chain, needed, dst, anc, single)[0], True, 60.0)
    cutoff = None
    if a.target is not None:
        reach = a.target * base - work
        cutoff = reach + 1e-7 * (work + reach)      # as `bounds._recompute` sets it
    val, seq = B._orders(spec, d, needed, dst, anc, single, (start, tuple(chain)), extra, cutoff, a.seconds,
                         threading.Event())
    row = dict(graph=name, budget_frac=a.frac, chain=a.chain, moments=a.moments, target=a.target,
               chain_bound=round(float((work + start) / base), 5), bound=round(float((work + val) / base), 5),
               seconds=round(time.perf_counter() - t0, 1),
               weakest_order=" | ".join(B.moment_name(ids, m) for m in seq))
    print(row)
    new = not os.path.exists(OUT)
    with open(OUT, "a", newline="") as f:
        if new:
            f.write("# .venv/bin/python experiments/bound_moments.py GRAPH FRAC --chain ... --moments ... "
                    "[--target T]; one row per run\n")
        w = csv.DictWriter(f, fieldnames=list(row))
        if new:
            w.writeheader()
        w.writerow(row)


if __name__ == "__main__":
    sys.exit(main())
