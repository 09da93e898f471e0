"""Exhaustive optimum of the MILP's model, for tests on tiny graphs.

Dynamic programming over the stages of the same `ModelSpec` the MILP uses
(same order, window, devices, links and variable domains), written from the
model's meaning rather than from its matrix: the state at a stage boundary is
what each device holds and which nodes were ever computed; a stage chooses
each device's computations, each link's copies and what each device keeps.
Cost = sum over stages of the slowest device or link. Memory: the peak within
the stage, each value released after its last use there unless kept or copied
out (`spec.instage`), or the whole-stage sum. Exponential: graphs of up to
about 6 nodes on 1-2 devices.
"""

from __future__ import annotations

from itertools import combinations, product

import numpy as np

from ..cluster import Cluster
from ..graph import Graph
from .milp_model import TIME_SCALE, ModelSpec, late_outputs, spec_for
from .options import SolveOptions


def _subsets(items):
    for k in range(len(items) + 1):
        yield from combinations(items, k)


def _within_peak(held, comp, stay, ins, bytes_, ws) -> float:
    """Peak bytes on a device during a stage that starts holding `held` and computes `comp` in stage order:
    each value is released after its last use in the stage unless it stays (kept into the next stage, or
    copied out during this one)."""
    last = {}
    for idx, k in enumerate(comp):
        for i in ins[k]:
            last[i] = idx
        last[k] = idx
    cur = peak = sum(bytes_[v] for v in held)
    for idx, k in enumerate(comp):
        cur += bytes_[k]
        peak = max(peak, cur + ws[k])
        cur -= sum(bytes_[i] for i, j in last.items() if j == idx and i not in stay)
    return peak


def bruteforce_optimum(spec: ModelSpec) -> float | None:
    """Optimal objective in seconds, or None if the model is infeasible."""
    n, T, nD, nL = spec.n, spec.T, spec.nD, spec.nL
    ins = [spec.in_idx[spec.in_ptr[v]:spec.in_ptr[v + 1]].tolist() for v in range(n)]
    runn = ~np.isnan(spec.ccost)
    into = runn.copy()
    for _, _, b in spec.links:
        into[b] = True
    bytes_ = spec.nbytes.tolist()
    ws = spec.ws.tolist()
    order = spec.order.tolist()
    # an op's other output is computed with the node that makes it: always with a window (K > 0), after its
    # window where it may come late (K = 0); there the node's workspace row leaves it out (K > 0)
    maker = [-1] * n if spec.output_of is None else spec.output_of.tolist()
    late = late_outputs(spec.output_of, spec.once, spec.required)
    due_at = [int(spec.r_hi[v]) if late[v] else int(spec.pos[v]) + spec.K for v in range(n)]

    def with_maker(v: int, t: int) -> bool:
        return maker[v] >= 0 and (spec.K > 0 or (late[v] and t > spec.pos[v]))

    def workspace(Rd) -> float:
        made = {v: sum(bytes_[o] for o in Rd if maker[o] == v) if spec.K > 0 else 0.0 for v in Rd}
        return max([ws[v] - made[v] for v in Rd if ws[v] > 0] + [0.0])

    start = (tuple(frozenset() for _ in range(nD)), frozenset())
    states = {start: 0.0}
    for t in range(T):
        nxt: dict = {}
        due = {v for v in range(n) if due_at[v] == t}
        for (res, done), cost in states.items():
            # computations per device
            rc = []
            for d in range(nD):
                cand = [v for v in order if spec.r_lo[v] <= t <= spec.r_hi[v] and runn[d, v] and v not in res[d]
                        and not (spec.once[v] and v in done)]
                opts = []
                for sub in _subsets(cand):
                    have = set(res[d])
                    ok = True
                    for v in sub:            # `cand` is in stage order, so are the subsets
                        if any(u not in have for u in ins[v]) or (with_maker(v, t) and maker[v] not in sub):
                            ok = False
                            break
                        have.add(v)
                    if ok:
                        opts.append(frozenset(sub))
                rc.append(opts)
            for Rs in product(*rc):
                seen = [v for Rd in Rs for v in Rd]
                if any(spec.once[v] and seen.count(v) > 1 for v in seen):
                    continue
                done2 = done | set(seen)
                if not due <= done2:
                    continue
                # copies per link
                cc = []
                for _, a, b in spec.links:
                    cand = [v for v in order if spec.s_lo[v] <= t <= min(spec.s_hi[v] - 1, T - 1) and v in res[a]
                            and into[b, v] and v not in res[b] and v not in Rs[b]]
                    cc.append([frozenset(s) for s in _subsets(cand)])
                for Cs in product(*cc):
                    incoming = [set() for _ in range(nD)]
                    clash = False
                    for k, (_, _, b) in enumerate(spec.links):
                        if incoming[b] & Cs[k]:
                            clash = True
                            break
                        incoming[b] |= Cs[k]
                    if clash:
                        continue
                    over = False
                    for d in range(nD):
                        if not spec.mem_row[d] or spec.instage:
                            continue
                        held = res[d] | Rs[d] | incoming[d]
                        mem = sum(bytes_[v] for v in held) + workspace(Rs[d])
                        if mem > spec.budget[d]:
                            over = True
                            break
                    if over:
                        continue
                    out = [set() for _ in range(nD)]
                    for k, (_, a, _b) in enumerate(spec.links):
                        out[a] |= Cs[k]
                    loads = [sum(spec.ccost[d, v] for v in Rs[d]) for d in range(nD)]
                    for k, (_, a, b) in enumerate(spec.links):
                        for d in (a, b):
                            loads[d] += spec.lissue[k] * len(Cs[k])
                    loads += [sum(spec.lcost[k, v] for v in Cs[k]) for k in range(nL)]
                    c2 = cost + max(loads, default=0.0)
                    keep_opts = []
                    for d in range(nD):
                        pool = [v for v in sorted(res[d] | Rs[d] | incoming[d])
                                if spec.s_lo[v] <= t + 1 <= spec.s_hi[v]]
                        keep_opts.append([frozenset(s) for s in _subsets(pool)])
                    for keep in product(*keep_opts):
                        if spec.instage and any(
                                spec.mem_row[d] and _within_peak(res[d] | incoming[d], sorted(Rs[d], key=order.index),
                                                                 keep[d] | out[d], ins, bytes_, ws) > spec.budget[d]
                                for d in range(nD)):
                            continue
                        key = (tuple(keep), frozenset(done2))
                        if c2 < nxt.get(key, np.inf):
                            nxt[key] = c2
        states = nxt
    best = None
    req = set(np.flatnonzero(spec.required).tolist())
    for (res, _done), cost in states.items():
        if req <= set().union(*res) and (best is None or cost < best):
            best = cost
    return None if best is None else best / TIME_SCALE


def bruteforce(graph: Graph, cluster: Cluster, options: SolveOptions = SolveOptions(), order=None) -> float | None:
    return bruteforce_optimum(spec_for(graph, cluster, options, order=order))
