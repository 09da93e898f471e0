"""Lower bounds on the step time that hold for every schedule, in or out of the MILP's stage model.

The MILP reports the larger of its solver's dual bound and these: they stand in when its root LP does not finish,
and at tight budgets they beat the LP relaxation, whose fractional keep-or-recompute choices leave a gap that
branch and bound closes slowly.

- chain: the longest dependency chain, each operation at its cheapest device;
- work: the total of those cheapest times spread over the devices, each counted at its best speed relative to
  the cheapest (r[d] = max over operations of cheapest / cost on d: in L seconds d does at most r[d] L of that
  total; a host 20 times slower adds 1/20 of a device, not a whole one);
- recompute (one device computes everything and nothing can be copied off it: Checkmate's problem): every
  computation runs on that device one after another, so the step takes at least the work plus the time of the
  recomputations. Take any operation x and the moment it is first computed. Each ancestor v of x was computed
  before; if something computed later reads v (a descendant of x, or a recomputed ancestor) or v is a required
  result, v is either resident at that moment or computed again afterwards. The resident ones, with x's
  inputs, output and workspace, fit in the budget. The cheapest such choice is a small integer programme (a
  knapsack with precedence), and its HiGHS dual bound, at the operations where keep-everything holds the most,
  bounds the recomputation time of every schedule.

Only operations that some required result depends on count: a schedule need not compute the others.
"""

from __future__ import annotations

import time

import numpy as np

from .milp_model import TIME_SCALE, ModelSpec

_CANDIDATES = 24    # operations x tried with the LP (where keep-everything holds the most bytes)
_INTEGER = 4        # of those, the best few solved as integer programmes (their dual bound)
_SECONDS = 2.0      # at most, for the whole recompute bound


def lower_bounds(spec: ModelSpec, seconds: float = _SECONDS) -> dict:
    """{"chain", "work", "recompute", "at", "floor"}: seconds every schedule of the graph on the model's devices
    needs (see the module docstring); recompute is None where it does not apply, `at` the index of the operation x
    it came from (None when no recomputation is forced), floor the largest."""
    needed = _needed(spec)
    runnable = ~np.isnan(spec.ccost)
    cheapest = np.where(runnable, spec.ccost, np.inf).min(axis=0, initial=np.inf)
    cheapest[~np.isfinite(cheapest) | ~needed] = 0.0
    done = np.zeros(spec.n)
    for v in spec.order.tolist():
        ins = spec.in_idx[spec.in_ptr[v]:spec.in_ptr[v + 1]]
        done[v] = cheapest[v] + (done[ins].max() if ins.size else 0.0)
    with np.errstate(divide="ignore", invalid="ignore"):     # free operations add nothing to the total
        rel = np.where(runnable & (spec.ccost > 0), cheapest[None, :] / spec.ccost, 0.0)
    speed = float(rel.max(axis=1, initial=0.0).sum())
    work = float(cheapest.sum()) / speed if speed > 0 else 0.0
    out = {"chain": float(done.max(initial=0.0)) / TIME_SCALE, "work": work / TIME_SCALE, "recompute": None,
           "at": None}
    d = _sole_device(spec, needed)
    if d is not None:
        extra, out["at"] = _recompute(spec, d, needed, seconds)
        out["recompute"] = (float(cheapest.sum()) + extra) / TIME_SCALE
    out["floor"] = max(v for k, v in out.items() if k in ("chain", "work", "recompute") and v is not None)
    return out


def _needed(spec: ModelSpec) -> np.ndarray:
    """Operations some required result depends on (or required themselves)."""
    need = spec.required.copy()
    for v in spec.order[::-1].tolist():
        if need[v]:
            need[spec.in_idx[spec.in_ptr[v]:spec.in_ptr[v + 1]]] = True
    return need


def _sole_device(spec: ModelSpec, needed: np.ndarray) -> int | None:
    """The model device that computes everything when no other computes anything and no copy leaves it."""
    devs = np.flatnonzero(~np.isnan(spec.ccost).all(axis=1))
    if devs.size != 1 or np.isnan(spec.ccost[devs[0]][needed]).any():
        return None
    d = int(devs[0])
    if any(src == d for _, src, _ in spec.links):
        return None
    return d


def _reach(ptr: np.ndarray, idx: np.ndarray, start: int, n: int) -> np.ndarray:
    """Nodes reachable from `start` along the CSR adjacency (ptr, idx), `start` excluded."""
    seen = np.zeros(n, dtype=bool)
    front = np.array([start], dtype=np.int64)
    while front.size:
        counts = ptr[front + 1] - ptr[front]
        if not counts.sum():
            break
        offs = np.arange(counts.sum()) - np.repeat(np.cumsum(counts) - counts, counts)
        nxt = idx[np.repeat(ptr[front], counts) + offs]
        nxt = np.unique(nxt[~seen[nxt]])
        seen[nxt] = True
        front = nxt
    return seen


def _candidates(spec: ModelSpec, needed: np.ndarray, dst: np.ndarray) -> np.ndarray:
    """The operations at which keeping everything (in the model's order) holds the most bytes; `dst[e]` reads
    the input `spec.in_idx[e]`."""
    n, order = spec.n, spec.order
    rank = np.empty(n, dtype=np.int64)
    rank[order] = np.arange(n)
    last = np.full(n, -1, dtype=np.int64)
    np.maximum.at(last, spec.in_idx, rank[dst])
    last = np.where(spec.required, n, last)
    held = last > rank
    diff = np.zeros(n + 2)
    np.add.at(diff, rank[held] + 1, spec.nbytes[held])
    np.add.at(diff, last[held] + 1, -spec.nbytes[held])
    score = np.cumsum(diff)[:n] + spec.nbytes[order] + spec.ws[order]
    best = np.argsort(-score, kind="stable")
    best = best[needed[order[best]]]      # a schedule computes the others, if at all, whenever it likes
    return order[best[:_CANDIDATES]]


def _recompute(spec: ModelSpec, d: int, needed: np.ndarray, seconds: float) -> tuple[float, int | None]:
    """(model time every schedule spends recomputing, at least; the operation x it was found at), or (0, None)."""
    t0 = time.perf_counter()
    dst = np.repeat(np.arange(spec.n), np.diff(spec.in_ptr))     # the reader of each input edge
    lp = []
    for x in _candidates(spec, needed, dst).tolist():
        if time.perf_counter() - t0 > seconds / 2:
            break
        problem = _at(spec, d, x, needed, dst)
        if problem is not None:
            lp.append((_solve(problem, False, seconds), x, problem))
    best, at = 0.0, None
    lp.sort(key=lambda z: -z[0])
    for k, (val, x, problem) in enumerate(lp):
        if k < _INTEGER and time.perf_counter() - t0 < seconds:
            val = max(val, _solve(problem, True, max(seconds - (time.perf_counter() - t0), 0.01) / (_INTEGER - k)))
        if val > best:
            best, at = val, x
    return best, at


def _at(spec: ModelSpec, d: int, x: int, needed: np.ndarray, dst: np.ndarray):
    """The integer programme at operation x, as arrays (see the module docstring), or None when it is empty or
    cannot hold (x's inputs, output and workspace over the budget: `nofit` says so)."""
    n = spec.n
    anc = _reach(spec.in_ptr, spec.in_idx, x, n)
    desc = _reach(spec.out_ptr, spec.out_idx, x, n) & needed     # computed after x (the others maybe never)
    A = np.flatnonzero(anc)
    na = A.size
    if not na:
        return None
    k = np.full(n, -1, dtype=np.int64)
    k[A] = np.arange(na)
    src = spec.in_idx
    # v read by a descendant of x, or required: resident at x or computed again
    later = np.zeros(n, dtype=bool)
    later[src[desc[dst] & anc[src]]] = True
    later |= spec.required & anc
    cover = np.flatnonzero(later[A])
    # v read by an ancestor c computed again: resident at x or computed again (s_v + r_v - r_c >= 0)
    e = anc[src] & anc[dst] & ~spec.once[dst]
    es, ed = k[src[e]], k[dst[e]]
    ncov, ne = cover.size, es.size
    rows_idx = np.concatenate([np.stack([cover, na + cover], 1).ravel(),
                               np.stack([es, na + es, na + ed], 1).ravel(), np.arange(na)])
    rows_val = np.concatenate([np.ones(2 * ncov), np.tile([1.0, 1.0, -1.0], ne), spec.nbytes[A]])
    start = np.concatenate([np.arange(ncov) * 2, 2 * ncov + np.arange(ne) * 3, [2 * ncov + 3 * ne],
                            [2 * ncov + 3 * ne + na]])
    inputs = spec.in_idx[spec.in_ptr[x]:spec.in_ptr[x + 1]]
    cap = spec.budget[d] - spec.nbytes[x] - spec.ws[x]
    lb = np.zeros(2 * na)
    lb[k[inputs]] = 1.0
    if spec.nbytes[inputs].sum() > cap:
        return None
    ub = np.ones(2 * na)
    ub[na:][spec.once[A] | ~needed[A]] = 0.0
    cost = np.concatenate([np.zeros(na), np.nan_to_num(spec.ccost[d, A])])
    row_lo = np.concatenate([np.ones(ncov), np.zeros(ne), [-np.inf]])
    row_hi = np.concatenate([np.full(ncov + ne, np.inf), [cap]])
    return cost, lb, ub, row_lo, row_hi, start, rows_idx, rows_val


def _solve(problem, integer: bool, seconds: float) -> float:
    """The LP optimum, or the integer programme's dual bound after at most `seconds`; 0 when nothing came of it
    (infeasible: the budget cannot hold what x needs resident, which the other checks report)."""
    import highspy

    from .milp import run_highs  # releases HiGHS's thread pool for the solves after this one

    cost, lb, ub, row_lo, row_hi, start, idx, val = problem
    h = highspy.Highs()
    h.setOptionValue("output_flag", False)
    h.setOptionValue("time_limit", float(max(seconds, 0.01)))
    ncol = cost.size
    h.passModel(ncol, row_lo.size, int(idx.size), 2, 1, 0.0, cost, lb, ub, row_lo, row_hi,
                start.astype(np.int32), idx.astype(np.int32), val,
                np.full(ncol, 1 if integer else 0, dtype=np.int32))
    run_highs(h)
    st = h.getModelStatus()
    info = h.getInfo()
    if integer:
        b = info.mip_dual_bound
        return float(b) if st != highspy.HighsModelStatus.kInfeasible and abs(b) < 1e30 else 0.0
    return float(info.objective_function_value) if st == highspy.HighsModelStatus.kOptimal else 0.0
