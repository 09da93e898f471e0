"""The MILP of `optsched.solvers.milp`, built once as arrays, plus the two
translations around it: a schedule -> variable values (warm start) and
variable values -> a schedule (emission).

See `optsched.solvers.milp` for the formulation and its reductions. Here:

- `ModelSpec` fixes the stage order, the devices and links in play, and the
  stage range of every variable family (the *domains*; the pruning lives here
  and is shared with the brute-force enumerator of `bruteforce.py`).
- `build_model(spec)` returns a `MilpArrays`: column cost/bounds/integrality,
  a row-wise CSR constraint matrix with row bounds, and dense index maps
  `R[d,t,v]`, `S[d,t,v]`, `C[l,t,v]`, `tau[t]`, `W[d,t]` (-1 where pruned).
  Everything is numpy; no Python object per variable.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..cluster import Cluster
from ..graph import Graph, attach_outputs, operation_memory
from ..schedule import Compute, Copy, Free, Schedule, Sync

TIME_SCALE = 1e3          # the model's time unit is the millisecond (better-scaled rows)
MEM_SAFETY = 0.0          # budgets and bytes are integers; the simulator re-checks every schedule


@dataclass
class ModelSpec:
    n: int
    order: np.ndarray        # order[p] = node index of rank p
    pos: np.ndarray          # pos[v] = first stage of v's window (its rank, plus the gap stages before it)
    T: int                   # number of stages
    K: int                   # first computation of v lies in stages pos[v] .. pos[v]+K
    dev: list[int]           # cluster device index of each model device
    dev_names: list[str]
    links: list[tuple[int, int, int]]   # (cluster link index, src model device, dst model device)
    ccost: np.ndarray        # (nD, n) model-time units per compute, nan = cannot run there (see `runs`)
    lcost: np.ndarray        # (nL, n) model-time units per copy
    lissue: np.ndarray       # (nL,) model-time units each copy also takes from both ends' compute streams
    nbytes: np.ndarray
    ws: np.ndarray
    budget: np.ndarray       # (nD,) bytes
    mem_row: np.ndarray      # (nD,) bool: memory can bind on this device
    r_lo: np.ndarray
    r_hi: np.ndarray         # inclusive
    s_lo: np.ndarray
    s_hi: np.ndarray         # inclusive, may be T (resident at the end)
    once: np.ndarray         # bool: computed exactly once (not recomputable, or recompute off)
    required: np.ndarray
    in_ptr: np.ndarray
    in_idx: np.ndarray
    out_ptr: np.ndarray
    out_idx: np.ndarray
    runs: np.ndarray         # (nD, n) bool: the device's kind has a cost for v (ccost is also nan where v's
                             # inputs, output and workspace exceed the device's budget)
    instage: bool = False    # memory tracked within the stage (Checkmate's FREE) rather than for the whole stage
    output_of: np.ndarray | None = None   # `GraphArrays.output_of`: with a window (K > 0), computed in a stage,
                                          # and on a device, that computes that node
    notes: dict = field(default_factory=dict)

    @property
    def nD(self) -> int:
        return len(self.dev)

    @property
    def nL(self) -> int:
        return len(self.links)


def rank_of(spec: ModelSpec) -> np.ndarray:
    """Each node's rank in the model's order (`spec.order` inverted)."""
    rank = np.empty(spec.n, dtype=np.int64)
    rank[spec.order] = np.arange(spec.n)
    return rank


def make_spec(graph: Graph, cluster: Cluster, *, order=None, recompute: bool = True, swap: bool = True,
              devices: int | None = None, host_compute: bool = True, window: int | None = None,
              gaps=None, instage: bool = False) -> ModelSpec:
    """The stages and variable domains. `gaps[p]` extra stages go before the node of rank p: stages where only
    recomputations (and copies) happen, so that a schedule recomputing one value at a time is counted one
    computation per stage, as the simulator counts it, not all of them in the next node's stage."""
    a = graph.arrays
    n = len(a.ids)
    # an op's other output right after the node that makes it, with no gap stage between: the simulator holds
    # it from that node's computation, which the whole-stage count of the stages between would leave out
    given = np.asarray(a.topo if order is None else order, dtype=np.int64)
    order = attach_outputs(graph, given)
    if gaps is not None:
        gaps = np.asarray(gaps, dtype=np.int64)
        if order is not given:
            rank = np.empty(n, dtype=np.int64)
            rank[given] = np.arange(n)
            gaps = gaps[rank[order]]
        gaps = np.where(a.output_of[order] >= 0, 0, gaps)
    rank_stage = np.arange(n) if gaps is None else np.arange(n) + np.cumsum(gaps)
    pos = np.empty(n, dtype=np.int64)
    pos[order] = rank_stage
    # devices in play
    accel_seen = 0
    dev = []
    for i, d in enumerate(cluster.devices):
        if d.kind == "cuda":
            if devices is not None and accel_seen >= devices:
                continue
            accel_seen += 1
        elif not (host_compute or swap):
            continue        # a host that neither computes nor holds copies has no part in the model
        dev.append(i)
    nD = len(dev)
    ccost = np.full((nD, n), np.nan)
    for k, i in enumerate(dev):
        d = cluster.devices[i]
        if d.kind == "cpu" and not host_compute:
            continue
        c = a.cost.get(d.kind)
        if c is not None:
            ccost[k] = c / d.speed * TIME_SCALE
    local = {i: k for k, i in enumerate(dev)}
    accel = [cluster.devices[i].kind == "cuda" for i in dev]
    links = []
    for li, lk in enumerate(cluster.links):
        s, t = cluster.device_index[lk.src], cluster.device_index[lk.dst]
        if s not in local or t not in local:
            continue
        if not swap and not accel[local[t]]:
            continue   # no copies into host memory
        links.append((li, local[s], local[t]))
    nL = len(links)
    lcost = np.zeros((nL, n))
    for k, (li, _, _) in enumerate(links):
        lk = cluster.links[li]
        lcost[k] = (lk.latency + a.bytes / lk.bandwidth) * TIME_SCALE
    lissue = np.array([cluster.links[li].issue * TIME_SCALE for li, _, _ in links], dtype=np.float64)
    runs = ~np.isnan(ccost)
    multi = int(runs.any(axis=1).sum()) > 1 or nL > 0
    K = (0 if not multi else 2) if window is None else int(window)
    T = int(rank_stage[-1]) + 1 + K if n else K
    if K > 0:       # an op's other output shares its maker's window, to be computed with it (`build_model`, 5b)
        made = np.flatnonzero(a.output_of >= 0)
        pos[made] = pos[a.output_of[made]]
    once = ~a.recomputable.copy() if recompute else np.ones(n, dtype=bool)
    required = a.required.copy()
    late = late_outputs(a.output_of, once, required)
    # liveness (exact under the model's rules): comp_end(v) = last stage where computing v can
    # serve anything; need_end(v) = last stage where some consumer of v can be computed.
    in_ptr, in_idx, out_ptr, out_idx = a.in_ptr, a.in_idx, a.out_ptr, a.out_idx
    r_hi = np.empty(n, dtype=np.int64)
    need_end = np.full(n, -1, dtype=np.int64)
    for p in range(n - 1, -1, -1):
        v = int(order[p])
        outs = out_idx[out_ptr[v]:out_ptr[v + 1]]
        ne = int(r_hi[outs].max()) if outs.size else -1
        need_end[v] = ne
        w_end = min(T - 1, int(pos[v]) + K)
        if (once[v] and not late[v]) or required[v]:
            r_hi[v] = w_end
        else:
            r_hi[v] = min(T - 1, max(w_end, ne))
    r_lo = pos.copy()
    s_lo = pos + 1
    s_hi = np.where(required, T, np.minimum(need_end, T))
    budget = np.array([cluster.devices[i].memory for i in dev], dtype=np.float64)
    total = float(a.bytes.sum() + a.workspace.max(initial=0))
    mem_row = budget < total
    # exact: the simulator refuses to run an operation on a device that cannot hold its inputs, output and
    # workspace at once, so no R column there (and the bounds see the slower device it must use)
    ccost[runs & (operation_memory(graph)[None, :] > budget[:, None])] = np.nan
    spec = ModelSpec(n=n, order=order, pos=pos, T=T, K=K, dev=dev, dev_names=[cluster.devices[i].name for i in dev],
                     links=links, ccost=ccost, lcost=lcost, lissue=lissue, nbytes=a.bytes.astype(np.float64),
                     ws=a.workspace.astype(np.float64), budget=budget, mem_row=mem_row, r_lo=r_lo, r_hi=r_hi,
                     s_lo=s_lo, s_hi=s_hi, once=once, required=required, in_ptr=in_ptr, in_idx=in_idx,
                     out_ptr=out_ptr, out_idx=out_idx, runs=runs, instage=instage, output_of=a.output_of)
    spec.notes["unrunnable"] = [a.ids[v] for v in np.flatnonzero(~runs.any(axis=0))]
    return spec


def late_outputs(output_of: np.ndarray | None, once: np.ndarray, required: np.ndarray) -> np.ndarray:
    """Per node: an op's other output that may be computed, once, in a later stage than its window, with a
    recomputation of the node that makes it (`build_model`, 5b): the simulator counts it from that run, so a
    schedule that needs a layer norm's statistics only in the backward pass makes them with the norm's
    recomputation there, not in the forward pass to hold them all the way (GPT-2 at 30% of its keep-everything
    memory: DTR's schedule, which does so, fits no model without it)."""
    if output_of is None:
        return np.zeros(once.shape, dtype=bool)
    late = (output_of >= 0) & once & ~required
    late[late] = ~once[output_of[late]]
    return late


def spec_for(graph: Graph, cluster: Cluster, options, *, order=None, window=None, gaps=None) -> ModelSpec:
    """`make_spec` with the problem `options` (SolveOptions) pose: recompute, swap, devices, and the params
    host_compute, window (unless `window` is given) and instage."""
    p = options.params
    return make_spec(graph, cluster, order=order, recompute=options.recompute, swap=options.swap,
                     devices=options.devices, host_compute=p.get("host_compute", True),
                     window=p.get("window") if window is None else window, gaps=gaps,
                     instage=p.get("instage", False))


@dataclass
class MilpArrays:
    spec: ModelSpec
    ncol: int
    cost: np.ndarray
    lb: np.ndarray
    ub: np.ndarray
    integ: np.ndarray        # uint8, 1 = integer
    row_lo: np.ndarray
    row_hi: np.ndarray
    start: np.ndarray        # CSR row pointers (int32 values, int64 array ok)
    index: np.ndarray
    value: np.ndarray
    R: np.ndarray            # (nD, T, n) column index or -1
    S: np.ndarray            # (nD, T+1, n)
    C: np.ndarray            # (nL, T, n)
    tau: np.ndarray          # (T,)
    W: np.ndarray            # (nD, T) or -1
    row_kind: list           # (first row, name) per block, for messages
    within: dict = field(default_factory=dict)   # device -> within-stage memory index lists (U, FREE columns)
    names: np.ndarray | None = None

    @property
    def nrow(self) -> int:
        return int(self.row_lo.size)

    def col_names(self) -> list[str]:
        names = np.empty(self.ncol, dtype=object)
        for tag, arr in (("R", self.R), ("S", self.S), ("C", self.C)):
            idx = np.argwhere(arr >= 0)
            cols = arr[arr >= 0]
            for (x, t, v), c in zip(idx.tolist(), cols.tolist(), strict=True):
                names[c] = f"{tag}_{x}_{t}_{v}"
        for t, c in enumerate(self.tau.tolist()):
            names[c] = f"tau_{t}"
        for (d, t), c in np.ndenumerate(self.W):
            if c >= 0:
                names[c] = f"W_{d}_{t}"
        for d, w in self.within.items():
            t_, k_ = w["t"].tolist(), w["k"].tolist()
            for e, c in enumerate(w["U"].tolist()):
                names[c] = f"U_{d}_{t_[e]}_{k_[e]}"
            for e, i, c in zip(w["fe"].tolist(), w["fi"].tolist(), w["F"].tolist(), strict=True):
                names[c] = f"F_{d}_{t_[e]}_{i}_{k_[e]}"
        return names.tolist()


def _domain(lo, hi, T):
    """(T, n) bool mask of lo[v] <= t <= hi[v]."""
    t = np.arange(T)[:, None]
    return (t >= lo[None, :]) & (t <= hi[None, :])


class _Rows:
    """COO accumulator; each block adds rows with given bounds."""

    def __init__(self):
        self.r, self.c, self.v, self.lo, self.hi, self.kind = [], [], [], [], [], []
        self.m = 0

    def block(self, name, nrows, rows, cols, vals, lo, hi):
        rows = np.asarray(rows, dtype=np.int64)
        cols = np.asarray(cols, dtype=np.int64)
        vals = np.broadcast_to(np.asarray(vals, dtype=np.float64), cols.shape)
        keep = cols >= 0
        self.r.append(rows[keep] + self.m)
        self.c.append(cols[keep])
        self.v.append(vals[keep])
        self.lo.append(np.broadcast_to(np.asarray(lo, dtype=np.float64), (nrows,)))
        self.hi.append(np.broadcast_to(np.asarray(hi, dtype=np.float64), (nrows,)))
        self.kind.append((self.m, name))
        self.m += nrows


def _within_entries(spec: ModelSpec, Rd: np.ndarray, Sd: np.ndarray) -> dict:
    """Index lists of the within-stage memory model on one device: entries e = (t[e], k[e]), the possible
    computations in stage order (t, then rank); and FREE candidates f = (entry fe[f], value fi[f]): after
    computing k[fe], free fi (an input of k, or k itself) if that was its last use in the stage and it is
    neither kept into the next stage nor copied out."""
    rank = rank_of(spec)
    t_, k_ = np.nonzero(Rd >= 0)
    o = np.lexsort((rank[k_], t_))
    t_, k_ = t_[o], k_[o]
    first = np.ones(t_.size, dtype=bool)
    first[1:] = t_[1:] != t_[:-1]
    deg = spec.in_ptr[k_ + 1] - spec.in_ptr[k_]
    rep = np.repeat(np.arange(t_.size), deg)
    offs = np.arange(rep.size) - np.repeat(np.cumsum(deg) - deg, deg)
    fi = spec.in_idx[np.repeat(spec.in_ptr[k_], deg) + offs]
    fe = np.concatenate([rep, np.arange(t_.size)])
    fi = np.concatenate([fi, k_])
    # an input that can be neither resident nor computed there never lets k run: no FREE for it
    ok = (fi == k_[fe]) | (Sd[t_[fe], fi] >= 0) | (Rd[t_[fe], fi] >= 0)
    fe, fi = fe[ok], fi[ok]
    o = np.argsort(fe, kind="stable")
    return {"t": t_, "k": k_, "first": first, "rank": rank, "fe": fe[o], "fi": fi[o]}


def _memory_within(rows: _Rows, spec: ModelSpec, d: int, w: dict, R, S, C, cin: list[int]) -> None:
    """Checkmate's within-stage memory accounting on device d (rows scaled by the budget):
    U[e] >= what is resident at the stage start (kept, or copied in during the stage) + the outputs computed so
    far in stage order - what FREE released after earlier computations; U[e] + workspace(k) R[e] <= 1.
    FREE[f] <= R[e], <= 1 - S[d,t+1,i], <= 1 - R[d,t,j] for every later consumer j of i in the stage,
    <= 1 - C[d->*,t,i]; and at most one FREE per value and stage, only where it is resident."""
    scale = 1.0 / max(spec.budget[d], 1.0)
    b = spec.nbytes * scale
    T = spec.T
    t_, k_, first, rank, fe, fi = w["t"], w["k"], w["first"], w["rank"], w["fe"], w["fi"]
    U, F = w["U"], w["F"]
    E = t_.size
    Re = R[d, t_, k_]
    # held at the start of each stage: S, and copies into d
    held = [S[d, :T]] + [C[k] for k in cin]
    st_t, st_c, st_v = [], [], []
    for arr in held:
        tt, vv = np.nonzero(arr >= 0)
        st_t.append(tt)
        st_c.append(arr[tt, vv])
        st_v.append(b[vv])
    st_t, st_c, st_v = np.concatenate(st_t), np.concatenate(st_c), np.concatenate(st_v)
    # recurrence rows, one per entry
    e_of_t = np.full(T, -1, dtype=np.int64)
    e_of_t[t_[first]] = np.flatnonzero(first)
    sel = e_of_t[st_t] >= 0
    prev = np.flatnonzero(~first)
    fprev = np.isin(fe, prev - 1)
    rr = [np.arange(E), np.arange(E), e_of_t[st_t[sel]], prev, fe[fprev] + 1]
    cc = [U, Re, st_c[sel], U[prev - 1], F[fprev]]
    vv = [np.ones(E), -b[k_], -st_v[sel], -np.ones(prev.size), b[fi[fprev]]]
    rows.block(f"memory-flow@{spec.dev_names[d]}", E, np.concatenate(rr), np.concatenate(cc), np.concatenate(vv),
               0.0, np.inf)
    rows.block(f"memory@{spec.dev_names[d]}", E, np.concatenate([np.arange(E), np.arange(E)]),
               np.concatenate([U, Re]), np.concatenate([np.ones(E), spec.ws[k_] * scale]), -np.inf, 1.0 - MEM_SAFETY)
    # stages without computations: what they hold at the start
    empty = np.flatnonzero(e_of_t < 0)
    if empty.size:
        pick = np.isin(st_t, empty)
        rows.block(f"memory-idle@{spec.dev_names[d]}", empty.size, np.searchsorted(empty, st_t[pick]),
                   st_c[pick], st_v[pick], -np.inf, 1.0 - MEM_SAFETY)
    # FREE bounds
    m = fe.size
    ar = np.arange(m)
    tf, kf = t_[fe], k_[fe]
    rows.block(f"free-computed@{spec.dev_names[d]}", m, np.concatenate([ar, ar]), np.concatenate([F, Re[fe]]),
               np.concatenate([np.ones(m), -np.ones(m)]), -np.inf, 0.0)
    nxt = S[d, tf + 1, fi]
    has = nxt >= 0
    rows.block(f"free-not-kept@{spec.dev_names[d]}", int(has.sum()), np.concatenate([np.arange(has.sum())] * 2),
               np.concatenate([F[has], nxt[has]]), 1.0, -np.inf, 1.0)
    deg = spec.out_ptr[fi + 1] - spec.out_ptr[fi]
    rep = np.repeat(ar, deg)
    offs = np.arange(rep.size) - np.repeat(np.cumsum(deg) - deg, deg)
    j_ = spec.out_idx[np.repeat(spec.out_ptr[fi], deg) + offs]
    later = (rank[j_] > rank[kf[rep]]) & (R[d, tf[rep], j_] >= 0)
    rep, j_ = rep[later], j_[later]
    rows.block(f"free-last-use@{spec.dev_names[d]}", rep.size, np.concatenate([np.arange(rep.size)] * 2),
               np.concatenate([F[rep], R[d, tf[rep], j_]]), 1.0, -np.inf, 1.0)
    for k, (_, a, _b) in enumerate(spec.links):
        if a != d:
            continue
        out = C[k, tf, fi]
        has = out >= 0
        rows.block(f"free-not-copied@{spec.dev_names[d]}", int(has.sum()), np.concatenate([np.arange(has.sum())] * 2),
                   np.concatenate([F[has], out[has]]), 1.0, -np.inf, 1.0)
    # one FREE per value and stage, of a resident value
    key = tf * spec.n + fi
    uk, grp = np.unique(key, return_inverse=True)
    gt, gi = uk // spec.n, uk % spec.n
    g = np.arange(uk.size)
    rows.block(f"free-once@{spec.dev_names[d]}", uk.size, np.concatenate([grp, g, g]),
               np.concatenate([F, S[d, gt, gi], R[d, gt, gi]]),
               np.concatenate([np.ones(m), -np.ones(uk.size), -np.ones(uk.size)]), -np.inf, 0.0)


def links_into(spec: ModelSpec) -> list[list[int]]:
    """Per model device, the model links that copy into it."""
    return [[k for k, (_, _, b) in enumerate(spec.links) if b == d] for d in range(spec.nD)]


def _made_with(spec: ModelSpec) -> list[tuple[int, int]]:
    """(an op's other output, the node that makes it) pairs the model computes together: with a window (K > 0)."""
    if spec.K == 0 or spec.output_of is None:
        return []
    return [(o, int(spec.output_of[o])) for o in np.flatnonzero(spec.output_of >= 0).tolist()]


def stage_workspace(spec: ModelSpec, Rd: np.ndarray) -> np.ndarray:
    """(T,) the largest workspace the model counts in each stage of one device, given its computations Rd (T, n):
    a node's, less its op's other outputs computed in the same stage (`build_model`'s workspace rows)."""
    w = Rd * spec.ws[None, :]
    for o, p in _made_with(spec):
        w[:, p] -= Rd[:, o] * spec.nbytes[o]
    return w.max(axis=1, initial=0.0)


def build_model(spec: ModelSpec) -> MilpArrays:
    n, T, nD, nL = spec.n, spec.T, spec.nD, spec.nL
    inf = np.inf
    # --- columns
    runn = ~np.isnan(spec.ccost)                                   # (nD, n)
    Rmask = _domain(spec.r_lo, spec.r_hi, T)[None, :, :] & runn[:, None, :]
    late = late_outputs(spec.output_of, spec.once, spec.required)
    inwin = _domain(spec.pos, spec.pos + spec.K, T)
    if late.any():      # after its window, an op's other output only where its maker may run (5b)
        lo = np.flatnonzero(late)
        Rmask[:, :, lo] &= inwin[None, :, lo] | Rmask[:, :, spec.output_of[lo]]
    Sdom = _domain(spec.s_lo, spec.s_hi, T + 1)                    # (T+1, n)
    into = np.zeros((nD, n), dtype=bool)                           # can v reach d at all
    into |= runn
    for _, _, b in spec.links:
        into[b] = True
    Smask = Sdom[None, :, :] & into[:, None, :]
    Cdom = _domain(spec.s_lo, np.minimum(spec.s_hi - 1, T - 1), T)
    Cmask = np.zeros((nL, T, n), dtype=bool)
    for k, (_, a, _b) in enumerate(spec.links):
        # source must be able to hold v, destination must be able to use it
        Cmask[k] = Cdom & into[a][None, :]
    ncol = 0

    def alloc(mask):
        nonlocal ncol
        idx = np.full(mask.shape, -1, dtype=np.int64)
        cnt = int(mask.sum())
        idx[mask] = np.arange(ncol, ncol + cnt)
        ncol += cnt
        return idx

    R = alloc(Rmask)
    S = alloc(Smask)
    C = alloc(Cmask)
    tau = np.arange(ncol, ncol + T)
    ncol += T
    has_ws = spec.ws > 0
    Wmask = np.zeros((nD, T), dtype=bool)
    if has_ws.any() and not spec.instage:
        Wmask = spec.mem_row[:, None] & (Rmask[:, :, has_ws]).any(axis=2)
    W = alloc(Wmask)
    within = {}
    if spec.instage:
        for d in np.flatnonzero(spec.mem_row).tolist():
            w = _within_entries(spec, R[d], S[d])
            w["U"] = alloc(np.ones(w["t"].size, dtype=bool))
            w["F"] = alloc(np.ones(w["fe"].size, dtype=bool))
            within[d] = w
    nbin = int(Rmask.sum() + Smask.sum() + Cmask.sum())
    cost = np.zeros(ncol)
    cost[tau] = 1.0
    lb = np.zeros(ncol)
    ub = np.ones(ncol)
    ub[tau] = inf
    ub[W[W >= 0]] = inf
    for w in within.values():
        ub[w["U"]] = inf
    integ = np.zeros(ncol, dtype=np.uint8)
    integ[:nbin] = 1

    rows = _Rows()
    Rpad = np.concatenate([R, np.full((nD, 1, n), -1)], axis=1)          # R[d, T] = -1
    # C into each device: (nD, T, n) list of link columns
    Cin = links_into(spec)

    # 1. inputs resident: R[d,t,v] <= S[d,t,u] + R[d,t,u]
    d_, t_, v_ = np.nonzero(R >= 0)
    deg = spec.in_ptr[v_ + 1] - spec.in_ptr[v_]
    rep = np.repeat(np.arange(d_.size), deg)
    starts = np.repeat(spec.in_ptr[v_], deg)
    offs = np.arange(rep.size) - np.repeat(np.cumsum(deg) - deg, deg)
    u_ = spec.in_idx[starts + offs]
    dd, tt, vv = d_[rep], t_[rep], v_[rep]
    m = rep.size
    ar = np.arange(m)
    rows.block("inputs", m, np.concatenate([ar, ar, ar]),
               np.concatenate([R[dd, tt, vv], S[dd, tt, u_], R[dd, tt, u_]]),
               np.concatenate([np.ones(m), -np.ones(m), -np.ones(m)]), -inf, 0.0)

    # 2. residency: S[d,t,v] <= S[d,t-1,v] + R[d,t-1,v] + sum C[l->d,t-1,v]
    d_, t_, v_ = np.nonzero(S >= 0)
    m = d_.size
    ar = np.arange(m)
    rr, cc, vals = [ar, ar, ar], [S[d_, t_, v_], S[d_, t_ - 1, v_], Rpad[d_, t_ - 1, v_]], [1.0, -1.0, -1.0]
    for d in range(nD):
        sel = d_ == d
        for k in Cin[d]:
            rr.append(ar[sel])
            cc.append(C[k, t_[sel] - 1, v_[sel]])
            vals.append(-1.0)
    rows.block("residency", m, np.concatenate(rr), np.concatenate(cc),
               np.concatenate([np.broadcast_to(x, c.shape) for x, c in zip(vals, cc, strict=True)]), -inf, 0.0)

    # 3. exclusive: S[d,t,v] + R[d,t,v] + sum C[l->d,t,v] <= 1 (no second copy on one device)
    cnt = (S[:, :T] >= 0).astype(np.int64) + (R >= 0)
    for d in range(nD):
        for k in Cin[d]:
            cnt[d] += C[k] >= 0
    d_, t_, v_ = np.nonzero(cnt >= 2)
    m = d_.size
    ar = np.arange(m)
    rr, cc = [ar, ar], [S[d_, t_, v_], R[d_, t_, v_]]
    for d in range(nD):
        sel = d_ == d
        for k in Cin[d]:
            rr.append(ar[sel])
            cc.append(C[k, t_[sel], v_[sel]])
    rows.block("exclusive", m, np.concatenate(rr), np.concatenate(cc), 1.0, -inf, 1.0)

    # 4. copy source resident at the start of the stage: C[l,t,v] <= S[a,t,v]
    for k, (_, a, _) in enumerate(spec.links):
        t_, v_ = np.nonzero(C[k] >= 0)
        m = t_.size
        ar = np.arange(m)
        rows.block("copy-source", m, np.concatenate([ar, ar]), np.concatenate([C[k, t_, v_], S[a, t_, v_]]),
                   np.concatenate([np.ones(m), -np.ones(m)]), -inf, 0.0)

    # 5. first computation inside the window [pos, pos+K]; exactly once where `once` (a late other output:
    #    once, in its window or after it, 5b)
    win = (inwin | late[None, :])[None, :, :] & (R >= 0)
    d_, t_, v_ = np.nonzero(win)
    lo = np.ones(n)
    hi = np.where(spec.once, 1.0, inf)
    rows.block("compute", n, v_, R[d_, t_, v_], 1.0, lo, hi)
    d_, t_, v_ = np.nonzero((R >= 0) & ~win)          # outside the window, `once` nodes have no R at all
    assert not spec.once[v_].any()

    # 5b. an op's other output is computed where and when the node that makes it is, R[d,t,o] <= R[d,t,p], so
    # it is counted from then; with K > 0 it shares that node's window (with K = 0, one device and no copies, it
    # comes in the stage right after that node's, which ends its stage: `make_spec`'s order); after its window,
    # a late one (`late_outputs`) comes with a recomputation of that node
    made = np.array([o for o, _ in _made_with(spec)], dtype=np.int64)
    pair = R[:, :, made] >= 0
    if not spec.K and late.any():
        made = np.flatnonzero(late)
        pair = (R[:, :, made] >= 0) & ~inwin[None, :, made]
    if made.size:
        d_, t_, j_ = np.nonzero(pair)
        o_ = made[j_]
        m = o_.size
        ar = np.arange(m)
        rows.block("made-with", m, np.concatenate([ar, ar]),
                   np.concatenate([R[d_, t_, o_], R[d_, t_, spec.output_of[o_]]]),
                   np.concatenate([np.ones(m), -np.ones(m)]), -inf, 0.0)

    # 6. required results resident somewhere at the end
    req = np.flatnonzero(spec.required)
    d_, j_ = np.nonzero(S[:, T, req] >= 0)
    rows.block("required", req.size, j_, S[d_, T, req[j_]], 1.0, 1.0, inf)

    # 7. memory per device and stage (scaled by the budget): within the stage (`_memory_within`), or all that is
    #    resident at the start, computed or copied in during the stage, plus the largest workspace.
    for d in range(nD):
        if not spec.mem_row[d]:
            continue
        if spec.instage:
            _memory_within(rows, spec, d, within[d], R, S, C, Cin[d])
            continue
        scale = 1.0 / max(spec.budget[d], 1.0)
        rr, cc, vv = [], [], []
        for arr in [S[d, :T], R[d]] + [C[k] for k in Cin[d]]:
            t_, v_ = np.nonzero(arr >= 0)
            rr.append(t_)
            cc.append(arr[t_, v_])
            vv.append(spec.nbytes[v_] * scale)
        rr.append(np.arange(T))
        cc.append(W[d])
        vv.append(np.ones(T))
        rows.block(f"memory@{spec.dev_names[d]}", T, np.concatenate(rr), np.concatenate(cc), np.concatenate(vv),
                   -inf, 1.0 - MEM_SAFETY)
        # workspace: W[d,t] >= ws[v] R[d,t,v], less the other outputs of v's op computed in the stage (K > 0):
        # the workspace held them while v ran, and the stage counts them already
        t_, v_ = np.nonzero((R[d] >= 0) & has_ws[None, :])
        m = t_.size
        ar = np.arange(m)
        rr, cc, vv = [ar, ar], [W[d, t_], R[d, t_, v_]], [np.ones(m), -spec.ws[v_] * scale]
        for o, p in _made_with(spec):
            at = np.flatnonzero(v_ == p)
            rr.append(at)
            cc.append(R[d, t_[at], o])
            vv.append(np.full(at.size, spec.nbytes[o] * scale))
        rows.block(f"workspace@{spec.dev_names[d]}", m, np.concatenate(rr), np.concatenate(cc),
                   np.concatenate(vv), 0.0, inf)

    # 8. stage time: tau[t] >= compute load of each device (with the issue time of the copies at either end of
    #    its links: emitted at the stage start, they hold its compute stream first), >= copy load of each link
    for d in range(nD):
        t_, v_ = np.nonzero(R[d] >= 0)
        rr, cc, vv = [np.arange(T), t_], [tau, R[d, t_, v_]], [np.ones(T), -spec.ccost[d, v_]]
        for k, (_, a, b) in enumerate(spec.links):
            if spec.lissue[k] > 0 and d in (a, b):
                tk, vk = np.nonzero(C[k] >= 0)
                rr.append(tk)
                cc.append(C[k, tk, vk])
                vv.append(np.full(tk.size, -spec.lissue[k]))
        rows.block(f"time@{spec.dev_names[d]}", T, np.concatenate(rr), np.concatenate(cc), np.concatenate(vv),
                   0.0, inf)
    for k in range(nL):
        t_, v_ = np.nonzero(C[k] >= 0)
        rows.block(f"time@link{k}", T, np.concatenate([np.arange(T), t_]),
                   np.concatenate([tau, C[k, t_, v_]]), np.concatenate([np.ones(T), -spec.lcost[k, v_]]), 0.0, inf)

    r = np.concatenate(rows.r)
    c = np.concatenate(rows.c)
    v = np.concatenate(rows.v)
    o = np.lexsort((c, r))
    r, c, v = r[o], c[o], v[o]
    start = np.zeros(rows.m + 1, dtype=np.int64)
    np.cumsum(np.bincount(r, minlength=rows.m), out=start[1:])
    return MilpArrays(spec=spec, ncol=ncol, cost=cost, lb=lb, ub=ub, integ=integ,
                      row_lo=np.concatenate(rows.lo).astype(np.float64),
                      row_hi=np.concatenate(rows.hi).astype(np.float64),
                      start=start, index=c, value=v, R=R, S=S, C=C, tau=tau, W=W, row_kind=rows.kind,
                      within=within)


def row_activity(model: MilpArrays, x: np.ndarray) -> np.ndarray:
    prod = model.value * x[model.index]
    act = np.zeros(model.nrow)
    rows = np.repeat(np.arange(model.nrow), np.diff(model.start))
    np.add.at(act, rows, prod)
    return act


def violated_rows(model: MilpArrays, x: np.ndarray, tol: float = 1e-9) -> list[str]:
    act = row_activity(model, x)
    bad = np.flatnonzero((act < model.row_lo - tol) | (act > model.row_hi + tol))
    bad_cols = np.flatnonzero((x < model.lb - tol) | (x > model.ub + tol))
    out = []
    starts = [s for s, _ in model.row_kind]
    for i in bad[:5]:
        k = int(np.searchsorted(starts, i, side="right") - 1)
        out.append(f"{model.row_kind[k][1]} row {i - starts[k]}")
    if bad_cols.size:
        out.append(f"{bad_cols.size} columns out of bounds")
    return out


# ----------------------------------------------------------------------------- decisions

@dataclass
class Decisions:
    """Integer decisions of one solution: sets of (device, stage, node) etc."""

    R: np.ndarray   # (nD, T, n) bool
    S: np.ndarray   # (nD, T+1, n) bool
    C: np.ndarray   # (nL, T, n) bool

    def stage_times(self, spec: ModelSpec) -> np.ndarray:
        cc = np.nan_to_num(spec.ccost)
        loads = [np.einsum("tn,n->t", self.R[d].astype(float), cc[d]) for d in range(spec.nD)]
        for k, (_, a, b) in enumerate(spec.links):
            for d in (a, b):
                loads[d] = loads[d] + spec.lissue[k] * self.C[k].sum(axis=1)
        loads += [np.einsum("tn,n->t", self.C[k].astype(float), spec.lcost[k]) for k in range(spec.nL)]
        return np.max(np.array(loads), axis=0) if loads else np.zeros(spec.T)

    def objective(self, spec: ModelSpec) -> float:
        """Seconds: sum over stages of the slowest device or link."""
        return float(self.stage_times(spec).sum()) / TIME_SCALE


def column_values(x: np.ndarray, idx: np.ndarray) -> np.ndarray:
    """x at the columns of an index map (R, S, C, ...), zero (False) where the map has none (-1)."""
    out = np.zeros(idx.shape, dtype=x.dtype)
    m = idx >= 0
    out[m] = x[idx[m]]
    return out


def decisions_from_x(model: MilpArrays, x: np.ndarray) -> Decisions:
    xb = np.asarray(x) > 0.5
    return Decisions(column_values(xb, model.R), column_values(xb, model.S), column_values(xb, model.C))


def x_from_decisions(model: MilpArrays, dec: Decisions) -> np.ndarray | None:
    """Column values for the decisions, or None if some decision has no column."""
    spec = model.spec
    x = np.zeros(model.ncol)
    for idx, val in ((model.R, dec.R), (model.S, dec.S), (model.C, dec.C)):
        if (val & (idx < 0)).any():
            return None
        x[idx[val]] = 1.0
    x[model.tau] = dec.stage_times(spec)
    for d in range(spec.nD):
        has = model.W[d] >= 0
        x[model.W[d, has]] = np.maximum(stage_workspace(spec, dec.R[d])[has], 0.0) / max(spec.budget[d], 1.0)
    for d, w in model.within.items():
        scale = 1.0 / max(spec.budget[d], 1.0)
        start = _held_at_start(spec, dec, d).astype(np.float64) @ spec.nbytes * scale
        freed = np.zeros((spec.T, spec.n), dtype=bool)          # freed[t, i]: released after its last use in t
        at = np.full((spec.T, spec.n), -1, dtype=np.int64)       # ... after computing this node
        for t in np.flatnonzero(dec.R[d].any(axis=1)).tolist():
            comp, frees = stage_frees(spec, dec, d, t)
            for k, fr in zip(comp, frees, strict=True):
                freed[t, fr] = True
                at[t, fr] = k
        t_, k_, fe, fi = w["t"], w["k"], w["fe"], w["fi"]
        fv = freed[t_[fe], fi] & (at[t_[fe], fi] == k_[fe])
        x[w["F"]] = fv
        released = np.bincount(fe, weights=fv * spec.nbytes[fi] * scale, minlength=t_.size)
        u = np.empty(t_.size)
        comp_b = dec.R[d, t_, k_] * spec.nbytes[k_] * scale
        for e in range(t_.size):
            u[e] = (start[t_[e]] if w["first"][e] else u[e - 1] - released[e - 1]) + comp_b[e]
        x[w["U"]] = u
    return x


def order_of(graph: Graph, schedule: Schedule) -> np.ndarray | None:
    """The schedule's first-computation order if it is a topological order of all nodes."""
    a = graph.arrays
    seen, order = set(), []
    for x in schedule.instructions:
        if type(x) is Compute:
            v = a.index.get(x.node)
            if v is not None and v not in seen:
                seen.add(v)
                order.append(v)
    if len(order) != len(a.ids):
        return None
    pos = np.empty(len(order), dtype=np.int64)
    pos[np.array(order)] = np.arange(len(order))
    for v in range(len(order)):
        ins = a.inputs_of(v)
        if ins.size and pos[ins].max() > pos[v]:
            return None
    return np.array(order, dtype=np.int64)


def late_computes(graph: Graph, instructions) -> dict[int, int]:
    """{i: j}: instruction i computes an op's other output for the first time, with its maker's latest run on
    that device, instruction j, a recomputation: staged with j (`late_outputs`), not as a first computation."""
    a = graph.arrays
    of = a.output_of
    if not (of >= 0).any():
        return {}
    runs: dict[int, int] = {}       # node -> how often computed so far
    latest: dict[tuple[int, str], int] = {}
    out = {}
    for i, x in enumerate(instructions):
        if type(x) is not Compute:
            continue
        v = a.index.get(x.node, -1)
        if v < 0:
            continue
        p = int(of[v])
        if p >= 0 and not runs.get(v) and not a.required[v]:
            j = latest.get((p, x.device))
            if j is not None and runs[p] > 1:
                out[i] = j
        runs[v] = runs.get(v, 0) + 1
        latest[(v, x.device)] = i
    return out


def recompute_gaps(graph: Graph, schedule: Schedule, order: np.ndarray) -> np.ndarray:
    """gaps[p]: the schedule's recomputations between the first computations of ranks p-1 and p (in `order`),
    so that `make_spec(gaps=...)` gives each of them a stage of its own."""
    index = graph.arrays.index
    rank = np.empty(len(order), dtype=np.int64)
    rank[order] = np.arange(len(order))
    gaps = np.zeros(len(order), dtype=np.int64)
    seen = np.zeros(len(order), dtype=bool)
    pending = 0
    late = late_computes(graph, schedule.instructions)
    for i, x in enumerate(schedule.instructions):
        if type(x) is Compute and i not in late:      # a late other output goes with its maker's run
            v = index[x.node]
            if seen[v]:
                pending += 1
            else:
                seen[v] = True
                gaps[rank[v]] = pending
                pending = 0
    return gaps


def decisions_from_schedule(graph: Graph, spec: ModelSpec, schedule: Schedule) -> tuple[Decisions | None, str, int]:
    """Stage a valid schedule (any devices, copies, recomputations) over the spec's
    order; returns (decisions, "", K) or (None, why it does not fit the model, K),
    K the smallest window that would hold its first computations and stages.

    With exactly T-1 syncs (our own emitted format) the syncs give each
    instruction's natural stage; otherwise a computation belongs to the stage of
    the next first computation in list order (recomputations go into the gap
    stages before it, one each, and the rest are pulled into the stage of the new
    node that needs them), a copy to the stage of the last
    first computation before it (so a prefetch issued just before its reader is
    usable in time). Each instruction then moves to the earliest stage the
    model's rules allow: inputs computed on the device in the same or an earlier
    stage, or copied there in an earlier one; a copy's source resident at the
    stage start; a value re-created only after the stage that freed it. A free
    goes to the last stage that reads (or creates) the value, wherever the list
    puts it: the simulator needs the value no longer than that either. Memory is
    not checked here (`stage_memory`)."""
    a = graph.arrays
    ins = schedule.instructions
    n, T, K = spec.n, spec.T, spec.K
    base = T - K                  # stages that hold first computations
    dloc = {spec.dev_names[k]: k for k in range(spec.nD)}
    lloc = {(spec.dev_names[s], spec.dev_names[t]): k for k, (_, s, t) in enumerate(spec.links)}
    ids, pos = a.ids, spec.pos
    m = len(ins)
    kind = [type(x) for x in ins]
    nodes = [a.index.get(x.node, -1) if kx is not Sync else -1 for x, kx in zip(ins, kind, strict=True)]
    may = late_outputs(spec.output_of, spec.once, spec.required)
    with_maker = {i: j for i, j in late_computes(graph, ins).items() if may[nodes[i]]}
    natural = np.zeros(m, dtype=np.int64)
    if kind.count(Sync) == T - 1:
        natural[:] = np.cumsum([kx is Sync for kx in kind])
    else:
        seen = np.zeros(n, dtype=bool)
        first = np.full(m, -1, dtype=np.int64)
        for i in range(m):
            if kind[i] is Compute and not seen[nodes[i]] and i not in with_maker:
                seen[nodes[i]] = True
                first[i] = pos[nodes[i]]
        # a recomputation takes one of the gap stages before the next first computation (the last ones, in
        # list order), or that computation's own stage when the gaps run out
        nxt, run = base - 1, 0
        upcoming = np.zeros(m, dtype=np.int64)
        for i in range(m - 1, -1, -1):
            if first[i] >= 0:
                nxt, run = int(first[i]), 0
            elif kind[i] is Compute and i not in with_maker:
                run += 1
            upcoming[i] = nxt
            natural[i] = nxt - run if kind[i] is Compute and first[i] < 0 else nxt
        prev, synced = 0, False
        for i in range(m):
            if first[i] >= 0:
                prev, synced = int(first[i]), False
            elif i in with_maker:     # in its maker's stage
                natural[i] = natural[with_maker[i]]
            elif kind[i] is Compute:
                natural[i] = max(natural[i], min(prev + 1, upcoming[i]))
                if natural[i] < upcoming[i]:       # in a gap stage: copies after it go there
                    prev, synced = int(natural[i]), False
            elif kind[i] is Sync:
                synced = True
            elif kind[i] is Copy:
                natural[i] = prev + synced
    created = np.full((spec.nD, n), -1, dtype=np.int64)   # stage the live instance appeared in
    ready = np.full((spec.nD, n), -1, dtype=np.int64)     # first stage a compute there may read it
    last_read = np.full((spec.nD, n), -1, dtype=np.int64)
    freed = np.full((spec.nD, n), -1, dtype=np.int64)
    done = np.zeros(n, dtype=bool)
    delay, late = 0, -1
    Rl, Cl, Sl = [], [], []     # (device, stage, node); (link, stage, node); (device, from, to, node)
    for i in range(m):
        kx, v, s = kind[i], nodes[i], int(natural[i])
        if kx is Sync:
            continue
        x = ins[i]
        if v < 0:
            return None, f"instruction {i} names an unknown node {x.node!r}", K
        if kx is Compute:
            d = dloc.get(x.device)
            if d is None:
                return None, f"{x.device!r} is not a device of the model (--devices, host computation off?)", K
            us = spec.in_idx[spec.in_ptr[v]:spec.in_ptr[v + 1]]
            s = max(s, int(freed[d, v]) + 1, int(ready[d, us].max(initial=0)))
            if not done[v]:
                done[v] = True
                if s - pos[v] > delay and i not in with_maker:
                    delay, late = int(s - pos[v]), v
            np.maximum.at(last_read[d], us, s)
            Rl.append((d, s, v))
            created[d, v] = ready[d, v] = last_read[d, v] = s
        elif kx is Copy:
            k = lloc.get((x.src, x.dst))
            if k is None:
                return None, f"the link {x.src}->{x.dst} is not in the model (swapping off?)", K
            src, dst = spec.links[k][1], spec.links[k][2]
            s = max(s, int(created[src, v]) + 1, int(freed[dst, v]) + 1)
            last_read[src, v] = max(last_read[src, v], s)
            Cl.append((k, s, v))
            created[dst, v] = last_read[dst, v] = s
            ready[dst, v] = s + 1
        else:
            d = dloc.get(x.device)
            if d is None:
                return None, f"{x.device!r} is not a device of the model", K
            s = max(int(last_read[d, v]), int(created[d, v]))     # released right after its last use
            Sl.append((d, int(created[d, v]) + 1, s, v))
            freed[d, v] = s
            created[d, v] = ready[d, v] = -1
    for d, v in zip(*np.nonzero(created >= 0), strict=True):
        Sl.append((int(d), int(created[d, v]) + 1, T, int(v)))
    last = max([t for _, t, _ in Rl + Cl] + [t for _, _, t, _ in Sl if t < T], default=0)
    need = max(delay, last - base + 1, 0)
    if need > K:
        where = f"{ids[late]!r} is first computed {delay} stages after its position" if delay > K else \
            f"its last instruction needs stage {last}"
        return None, f"{where}: needs a window of {need}, the model has {K}", need
    R = np.zeros((spec.nD, T, n), dtype=bool)
    S = np.zeros((spec.nD, T + 1, n), dtype=bool)
    C = np.zeros((spec.nL, T, n), dtype=bool)
    for arr, lst in ((R, Rl), (C, Cl)):
        if lst:
            z = np.array(lst, dtype=np.int64).T
            arr[z[0], z[1], z[2]] = True
    for d, lo, hi, v in Sl:
        S[d, lo:min(hi, T) + 1, v] = True
    # residency beyond a value's usefulness is not a decision of the model: drop it
    S &= _domain(spec.s_lo, spec.s_hi, T + 1)[None]
    return Decisions(R, S, C), "", K


def last_uses(spec: ModelSpec, seq: list[int]) -> dict[int, int]:
    """For computations `seq` in order: value -> index of the last one that reads it (an input) or makes it."""
    last = {}
    for idx, k in enumerate(seq):
        for i in spec.in_idx[spec.in_ptr[k]:spec.in_ptr[k + 1]].tolist():
            last[i] = idx
        last[k] = idx
    return last


def stage_frees(spec: ModelSpec, dec: Decisions, d: int, t: int) -> tuple[list[int], list[list[int]]]:
    """Device d's computations in stage t (stage order) and, after each, the values it releases: those whose
    last use in the stage it is (an input, or its own output) that are neither kept into stage t+1 nor copied
    out of d during stage t. The FREE of the within-stage memory rows, and where `emit` frees."""
    comp = spec.order[dec.R[d, t, spec.order]].tolist()
    last = last_uses(spec, comp)
    out = np.zeros(spec.n, dtype=bool)
    for k, (_, a, _b) in enumerate(spec.links):
        if a == d:
            out |= dec.C[k, t]
    keep = dec.S[d, t + 1] | out
    frees: list[list[int]] = [[] for _ in comp]
    for i, idx in last.items():
        if not keep[i]:
            frees[idx].append(i)
    return comp, frees


def _held_at_start(spec: ModelSpec, dec: Decisions, d: int) -> np.ndarray:
    """(T, n) bool: on d at the start of each stage, or copied in during it."""
    held = dec.S[d, :spec.T].copy()
    for k, (_, _, b) in enumerate(spec.links):
        if b == d:
            held |= dec.C[k]
    return held


def stage_memory(spec: ModelSpec, dec: Decisions) -> np.ndarray:
    """(nD, T) bytes the model's memory rows count for the decisions: the within-stage peak, or the
    whole-stage sum when `spec.instage` is off."""
    mem = np.zeros((spec.nD, spec.T))
    for d in range(spec.nD):
        held = _held_at_start(spec, dec, d)
        start = held.astype(np.float64) @ spec.nbytes
        if not spec.instage:
            mem[d] = (held | dec.R[d]).astype(np.float64) @ spec.nbytes + stage_workspace(spec, dec.R[d])
            continue
        for t in range(spec.T):
            comp, frees = stage_frees(spec, dec, d, t)
            cur, peak = start[t], start[t]
            for k, fr in zip(comp, frees, strict=True):
                cur += spec.nbytes[k]
                peak = max(peak, cur + spec.ws[k])
                cur -= spec.nbytes[fr].sum()
            mem[d, t] = peak
    return mem


def emit(graph: Graph, spec: ModelSpec, dec: Decisions) -> list:
    """Instructions: per stage, copies (they read only what was resident at the
    stage start), then each device's computations in stage order, each followed by
    the frees of the values it used last (`stage_frees`), then frees of whatever
    else is not kept into the next stage, then a sync."""
    ids = graph.arrays.ids
    names = spec.dev_names
    order = spec.order
    out = []
    T = spec.T
    resident = np.zeros((spec.nD, spec.n), dtype=bool)
    for t in range(T):
        for k, (_, s, d) in enumerate(spec.links):
            for v in order[dec.C[k, t, order]].tolist():
                out.append(Copy(ids[v], names[s], names[d]))
                resident[d, v] = True
        for d in range(spec.nD):
            for v, fr in zip(*stage_frees(spec, dec, d, t), strict=True):
                out.append(Compute(ids[v], names[d]))
                resident[d, v] = True
                for i in fr:
                    out.append(Free(ids[i], names[d]))
                    resident[d, i] = False
        keep = dec.S[:, t + 1]
        for d in range(spec.nD):
            drop = resident[d] & ~keep[d]
            for v in order[drop[order]].tolist():
                out.append(Free(ids[v], names[d]))
            resident[d] &= keep[d]
        if t < T - 1:
            out.append(Sync())
    return out
