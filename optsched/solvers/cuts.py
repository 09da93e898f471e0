"""Recomputation-chain cuts: valid inequalities that the MILP's LP relaxation
(`milp_model`) misses, added in rounds at the root before branch and bound.

Why: the relaxation recomputes a value in small fractions over several stages,
each fraction "supported" by the same small fraction of its input kept resident
(R[t,c] <= S[t,u] + R[t,u] holds stage by stage, so 0.08 of u kept from the
forward pass pays for 0.08 of c in each of five stages, 0.4 of c in all). An
integer schedule cannot: c present on device d in stage t' (S + R) was resident
there at some earlier stage t, or was gained since (recomputed, or copied in);
recomputing it needs its input u present then, which was resident at t or gained
since; and so on along a path c <- u <- w of inputs. Hence, for every such path
P = (c, u, w, ...) and stages t <= t' (`depth` inputs deep):

    S[t',c] + R[t',c] <= sum_{p in P} S[t,p] + sum_{s=t}^{t'} R[s,last(P)]
                         + sum_{p in P} sum_{s=t}^{t'-1} Cin[s,p]

where Cin sums the copies of p into d (usable from the next stage). Every
integer point of the model satisfies them (exact: the model's optimum does not
change; the warm start is checked against them). The model has one per path and
stage pair, far too many to add, so `separate` finds the most violated one per
path at an LP solution (a running minimum over t, vectorised over the paths) and
`root_cuts` repeats LP and separation until none is violated or its time is up.

Measured on 2 cores (one device, recompute only): GPT-2 (236 nodes) at 50% of
keep-everything's peak, LP 1.081x -> 1.115x keep-everything's step time in 80
rounds (~26 s), about what HiGHS's own root cuts reach without them; a 69-node
MLP at 70%, LP 1.069x -> 1.148x in under a second, and proven within 1% in 7 s
of the 60 s benchmark, which does not prove it without them
(`experiments/results/milp_checkmate_cuts.csv`). Off by default in the MILP.
"""

from __future__ import annotations

import time

import numpy as np

from .milp_model import MilpArrays, column_values, links_into

_EPS = 1e-3           # smallest violation worth a row
_MAX_PER_ROUND = 4000


def chain_paths(model: MilpArrays, depth: int = 2) -> np.ndarray:
    """(P, depth + 1) node indices (c, u, w, ...), -1 where the path is shorter: c a value that may be
    recomputed, u one of its inputs, w one of u's, and so on."""
    spec = model.spec
    ip, ii = spec.in_ptr, spec.in_idx
    tip = np.flatnonzero(~spec.once)[:, None]
    out = []
    for _ in range(depth):               # extend the longest paths by one input of their last node
        v = tip[:, -1]
        rep = np.repeat(np.arange(tip.shape[0]), ip[v + 1] - ip[v])
        nxt = ii[np.concatenate([np.arange(ip[k], ip[k + 1]) for k in v.tolist()] or [np.zeros(0, np.int64)])]
        tip = np.concatenate([tip[rep], nxt[:, None]], axis=1)
        out.append(tip)
    padded = [np.pad(p, ((0, 0), (0, depth + 1 - p.shape[1])), constant_values=-1) for p in out]
    return np.concatenate(padded).astype(np.int64)


def separate(model: MilpArrays, paths: np.ndarray, x: np.ndarray, limit: int = _MAX_PER_ROUND):
    """CSR rows (start, index, value) of the most violated chain cut of each path on each device at the LP point
    `x`, most violated first, at most `limit`; every row reads `... <= 0`."""
    spec = model.spec
    T = spec.T
    cin = links_into(spec)
    member = paths >= 0
    last = paths[np.arange(paths.shape[0]), member.sum(axis=1) - 1]
    cuts = []
    for d in range(spec.nD):
        Rd, Sd = model.R[d], model.S[d, :T]
        if not (Rd >= 0).any():
            continue
        Rv, Sv = column_values(x, Rd), column_values(x, Sd)
        Gv = sum((column_values(x, model.C[k]) for k in cin[d]), np.zeros((T, spec.n)))
        safe = np.where(member, paths, 0)
        Ssum = (Sv[:, safe] * member[None]).sum(axis=2)                   # (T, P)
        Gsum = (Gv[:, safe] * member[None]).sum(axis=2)
        cumR = np.cumsum(Rv[:, last], axis=0)
        cumG = np.cumsum(Gsum, axis=0)
        zero = np.zeros((1, paths.shape[0]))
        before_R = np.vstack([zero, cumR[:-1]])                           # sum over s < t
        before_G = np.vstack([zero, cumG[:-1]])
        A = Ssum - before_R - before_G                                    # the t side
        Bv = Sv[:, paths[:, 0]] + Rv[:, paths[:, 0]] - cumR - before_G    # the t' side
        viol = Bv - np.minimum.accumulate(A, axis=0)
        t2 = viol.argmax(axis=0)
        best = viol[t2, np.arange(paths.shape[0])]
        for j in np.flatnonzero(best > _EPS).tolist():
            t1 = int(np.argmin(A[:t2[j] + 1, j]))
            if t1 < t2[j]:            # t = t' is implied by the input rows
                cuts.append((best[j], d, j, t1, int(t2[j])))
    cuts.sort(key=lambda z: -z[0])
    start, index, value = [0], [], []
    for _, d, j, t1, t2 in cuts[:limit]:
        cols = [model.S[d, t2, paths[j, 0]], model.R[d, t2, paths[j, 0]]]
        vals = [1.0, 1.0]
        p = paths[j][member[j]]
        cols += model.S[d, t1, p].tolist() + model.R[d, t1:t2 + 1, last[j]].tolist()
        for k in cin[d]:
            cols += model.C[k, t1:t2, :][:, p].ravel().tolist()
        vals += [-1.0] * (len(cols) - 2)
        cols, vals = np.asarray(cols), np.asarray(vals)
        keep = cols >= 0
        u, inv = np.unique(cols[keep], return_inverse=True)
        coef = np.bincount(inv, weights=vals[keep], minlength=u.size)
        nz = coef != 0
        index.append(u[nz])
        value.append(coef[nz])
        start.append(start[-1] + int(nz.sum()))
    if not index:
        return np.zeros(1, np.int64), np.zeros(0, np.int64), np.zeros(0)
    return np.asarray(start, np.int64), np.concatenate(index), np.concatenate(value)


def root_cuts(h, model: MilpArrays, seconds: float, x0: np.ndarray | None = None, depth: int = 2,
              stop=lambda: False) -> dict:
    """Rounds of LP and `separate` on the HiGHS object `h` (holding `model`), adding the violated cuts as rows,
    for at most `seconds`; leaves `h` ready for its MIP solve. `x0` (an integer point of the model, the warm start)
    must satisfy every cut: one it violates is a bug, raised as RuntimeError.
    Returns {rounds, cuts, lp (first and last LP objective, model units), seconds}."""
    import highspy

    t0 = time.perf_counter()
    info = {"rounds": 0, "cuts": 0, "lp": [], "seconds": 0.0}
    paths = chain_paths(model, depth)
    if not paths.size or seconds <= 0:
        return info
    h.setOptionValue("solve_relaxation", True)
    h.setOptionValue("time_limit", float(seconds))
    try:
        while not stop():
            if h.run() != highspy.HighsStatus.kOk or h.getModelStatus() != highspy.HighsModelStatus.kOptimal:
                break
            info["lp"].append(h.getInfo().objective_function_value)
            if time.perf_counter() - t0 > seconds:
                break
            x = np.asarray(h.getSolution().col_value)[:model.ncol]
            start, index, value = separate(model, paths, x)
            m = start.size - 1
            if not m:
                break
            if x0 is not None:
                act = np.add.reduceat(value * x0[index], start[:-1])
                if (act > 1e-6).any():
                    raise RuntimeError("a chain cut cuts off the warm start, an integer point: a bug in the cuts")
            h.addRows(m, np.full(m, -np.inf), np.zeros(m), index.size, start[:-1].astype(np.int32),
                      index.astype(np.int32), value)
            info["rounds"] += 1
            info["cuts"] += m
            h.setOptionValue("time_limit", float(max(seconds - (time.perf_counter() - t0), 0.01)))
    finally:
        h.setOptionValue("solve_relaxation", False)
        info["seconds"] = time.perf_counter() - t0
    return info
