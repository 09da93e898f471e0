"""Baseline schedules on one device, to compare every other solver against.

- keep-everything: every node once, in topological order, each value freed
  after its last reader: what a framework needs without checkpointing.
- chen-greedy: Chen's greedy segmenting by a memory budget per segment,
  the budget searched for the fastest schedule that fits the device.
- articulation: checkpoints restricted to articulation points of the
  forward graph (Checkmate's AP baseline), same greedy search.
- chen-sqrt: Chen et al. (2016) sqrt(n) checkpointing: of the forward nodes
  (topological order) keep every ceil(n/k)-th with k = round(sqrt(n)) segments;
  the rest are dropped after their last forward reader and recomputed, from
  the nearest kept ancestors, when the backward pass first needs them. A node that reads
  a backward node (directly or not) belongs to the backward pass, whatever its kind.
"""

from __future__ import annotations

import math
import time

import numpy as np

from ..cluster import Cluster, check_cluster, single_accelerator
from ..errors import OptschedError
from ..graph import KINDS, Graph
from ..schedule import Schedule, SolveReport
from ..units import format_size
from .nofit import not_found
from .options import SolveOptions, recomputing
from .sequential import pick_device, sequential_instructions

_FORWARD = KINDS.index("forward")
_BACKWARD = (KINDS.index("backward"), KINDS.index("optimizer"))
_SOURCES = (KINDS.index("param"), KINDS.index("input"))


def keep_everything(graph: Graph, cluster: Cluster, options: SolveOptions = SolveOptions()) -> Schedule:
    t0 = time.perf_counter()
    dev = pick_device(graph, cluster, options.device)
    ins = sequential_instructions(graph, dev.name, graph.arrays.topo.tolist())
    return Schedule(tuple(ins), SolveReport("keep-everything", "heuristic", solve_time=time.perf_counter() - t0),
                    graph=graph.name)


def unbounded(graph: Graph) -> Cluster:
    """One accelerator (or the host, for a cpu-only graph) with room for anything."""
    big = 2**62
    cuda = graph.arrays.cost.get("cuda")
    kind = "cuda" if cuda is not None and not (cuda != cuda).any() else "cpu"
    return single_accelerator(big, host_memory=big) if kind == "cuda" else \
        check_cluster(Cluster((single_accelerator(big).devices[-1],)))


def keep_everything_peak(graph: Graph) -> int:
    """Bytes keep-everything holds at its peak on one device with room for anything: what a budget of "50%" is
    half of (`units.parse_size`), as budgets are given in the benchmarks and by a user who wants half the memory."""
    from ..simulate import simulate

    cluster = unbounded(graph)
    return max(simulate(graph, cluster, keep_everything(graph, cluster)).peak.values())


def chen_sqrt(graph: Graph, cluster: Cluster, options: SolveOptions = SolveOptions()) -> Schedule:
    t0 = time.perf_counter()
    recomputing("chen-sqrt", options)
    dev = pick_device(graph, cluster, options.device)
    a = graph.arrays
    topo = a.topo.tolist()
    kind = a.kind.tolist()
    if not any(kind[v] in _BACKWARD for v in topo):
        raise OptschedError("chen-sqrt needs a graph whose nodes are tagged forward and backward; this one has no "
                            "backward node", hint="use keep-everything, or tag the nodes' kind")
    late = backward_phase(graph)
    forward = [v for v in topo if kind[v] == _FORWARD and a.recomputable[v] and not late[v]]
    k = int(options.params.get("segments", max(1, round(math.sqrt(len(forward))))))
    if k < 1:
        raise OptschedError("chen-sqrt: segments must be at least 1")
    step = max(1, math.ceil(len(forward) / k)) if forward else 1
    dropped = set(forward) - set(forward[step - 1::step])

    computes = checkpoint_computes(graph, dropped, late)
    ins = sequential_instructions(graph, dev.name, computes)
    return Schedule(tuple(ins), SolveReport("chen-sqrt", "heuristic", solve_time=time.perf_counter() - t0,
                                            extra={"segments": k, "checkpoints": len(forward) - len(dropped)}),
                    graph=graph.name)


def backward_phase(graph: Graph) -> list[bool]:
    """Per node: does it belong to the backward pass (a backward or optimizer
    node, or anything that reads one, directly or not)?"""
    a = graph.arrays
    kind = a.kind.tolist()
    in_ptr, in_idx = a.in_ptr.tolist(), a.in_idx.tolist()
    late = [t in _BACKWARD for t in kind]
    for v in a.topo.tolist():
        if not late[v] and any(late[in_idx[j]] for j in range(in_ptr[v], in_ptr[v + 1])):
            late[v] = True
    return late


def memory_order(graph: Graph) -> list[int]:
    """A topological order that, among the operations ready to run, takes the one adding the fewest bytes (its
    output less the inputs it reads last; ties in topological order): the readers that release a value run before
    those that start new ones (an 8-layer MLP's backward pass computes a layer's weight gradient before the next
    layer's input gradient, which releases the value both read). Sources come first: the plans load them when
    first read."""
    import heapq

    a = graph.arrays
    n = len(a.ids)
    nb, req = a.bytes.tolist(), a.required.tolist()
    in_ptr, in_idx = a.in_ptr.tolist(), a.in_idx.tolist()
    out_ptr, out_idx = a.out_ptr.tolist(), a.out_idx.tolist()
    rank = [0] * n
    for k, v in enumerate(a.topo.tolist()):
        rank[v] = k
    readers = [out_ptr[v + 1] - out_ptr[v] for v in range(n)]
    waiting = [in_ptr[v + 1] - in_ptr[v] for v in range(n)]

    def key(v: int) -> tuple[int, int]:
        freed = sum(nb[u] for u in set(in_idx[in_ptr[v]:in_ptr[v + 1]]) if readers[u] == 1 and not req[u])
        return (nb[v] - freed, rank[v])

    order = [v for v in a.topo.tolist() if waiting[v] == 0]
    heap: list[tuple[tuple[int, int], int]] = []

    def done(v: int) -> None:
        for u in out_idx[out_ptr[v]:out_ptr[v + 1]]:
            waiting[u] -= 1
            if waiting[u] == 0:
                heapq.heappush(heap, (key(u), u))

    for v in order:
        done(v)
    while heap:
        k, v = heapq.heappop(heap)
        if k != key(v):     # an input's readers changed since: its key is stale
            heapq.heappush(heap, (key(v), v))
            continue
        order.append(v)
        for u in in_idx[in_ptr[v]:in_ptr[v + 1]]:
            readers[u] -= 1
        done(v)
    return order


def checkpoint_computes(graph: Graph, dropped, late: list[bool] | None = None, transient: bool = False,
                        limit: int | None = None, order: list[int] | None = None) -> list[int] | None:
    """One-device computation order when the forward nodes in `dropped` are
    discarded after their last forward reader: the nodes in topological order,
    each backward node after recomputing, from the nearest kept ancestors,
    whatever of its inputs was discarded. Sources (parameters, inputs) are
    loaded when first needed. Following the topological order rather than the
    whole forward pass first keeps a graph whose backward nodes do not wait for
    the forward pass (gnmt) from holding every parameter at once.

    Recomputed values stay for the later backward nodes that read them (Chen's
    segments), or, `transient`, are discarded after the backward node they were
    recomputed for: each reader recomputes them again, for a peak of about one
    recomputation chain beside what must stay (an 8-layer MLP: 62% of
    keep-everything's peak, against 75% for the segments). None when that
    takes more than `limit` computations."""
    a = graph.arrays
    topo = a.topo.tolist() if order is None else order
    if late is None:
        late = backward_phase(graph)
    dropped = set(dropped)
    in_ptr, in_idx = a.in_ptr.tolist(), a.in_idx.tolist()
    out_ptr, out_idx = a.out_ptr.tolist(), a.out_idx.tolist()
    forward_left = {v: sum(not late[c] for c in out_idx[out_ptr[v]:out_ptr[v + 1]]) for v in dropped}
    computes: list[int] = []
    resident: set[int] = set()
    fresh: list[int] = []       # dropped values recomputed for the current node

    def ensure(root: int) -> None:
        """Compute `root` after its missing ancestors, depth first, iteratively."""
        stack = [(root, False)]
        while stack:
            v, expanded = stack.pop()
            if v in resident:
                continue
            if expanded:
                computes.append(v)
                resident.add(v)
                if v in dropped:
                    fresh.append(v)
                continue
            stack.append((v, True))
            for j in range(in_ptr[v + 1] - 1, in_ptr[v] - 1, -1):
                if in_idx[j] not in resident:
                    stack.append((in_idx[j], False))

    for v in topo:
        if in_ptr[v] == in_ptr[v + 1] and out_ptr[v] < out_ptr[v + 1]:
            continue                # a source with readers: loaded by the first of them
        ensure(v)
        if limit is not None and len(computes) > limit:
            return None
        if late[v]:
            if transient:
                resident.difference_update([u for u in fresh if forward_left[u] == 0])
            fresh.clear()
            continue
        fresh.clear()
        for u in in_idx[in_ptr[v]:in_ptr[v + 1]]:
            if u in forward_left:
                forward_left[u] -= 1
                if forward_left[u] == 0:
                    resident.discard(u)     # its forward readers are done: dropped
        if forward_left.get(v) == 0:
            resident.discard(v)
    return computes


def _need_backward(graph: Graph, name: str) -> None:
    if not any(int(k) in _BACKWARD for k in graph.arrays.kind.tolist()):
        raise OptschedError(f"{name} needs a graph whose nodes are tagged forward and backward; this one has no "
                            "backward node", hint="use keep-everything, or tag the nodes' kind")


def _forward_candidates(graph: Graph, late: list[bool]) -> list[int]:
    a = graph.arrays
    kind = a.kind.tolist()
    rec = a.recomputable.tolist()
    return [v for v in a.topo.tolist() if kind[v] == _FORWARD and rec[v] and not late[v]]


def _greedy_segments(graph: Graph, forward: list[int], candidates, budget: float) -> set[int]:
    """Chen et al. (2016), greedy: walk the forward nodes accumulating output
    bytes; when the running total passes `budget` at a candidate, keep that
    node as a checkpoint and restart the count. Returns the dropped nodes."""
    nb = graph.arrays.bytes.tolist()
    cand = set(candidates)
    kept, temp = set(), 0
    for v in forward:
        temp += nb[v]
        if temp > budget and v in cand:
            kept.add(v)
            temp = 0
    return set(forward) - kept


_TRANSIENT_LIMIT = 8    # computations per node, at most, for a transient plan (each reader recomputes its chain)


def _best_fitting(graph: Graph, cluster: Cluster, name: str, options: SolveOptions, candidates, t0: float,
                  extra=None) -> Schedule:
    """Try Chen's greedy segmenting over a grid of segment budgets; keep the
    fastest schedule whose simulated peak fits the device."""
    from ..simulate import simulate

    dev = pick_device(graph, cluster, options.device)
    late = backward_phase(graph)
    forward = _forward_candidates(graph, late)
    if candidates is None:
        candidates = forward
    nb = graph.arrays.bytes
    fwd_bytes = nb[forward] if forward else np.zeros(1, dtype=np.int64)
    total = max(1, int(fwd_bytes.sum()))
    lo = max(1, int(fwd_bytes.min()))
    grid = sorted({0.0, *np.geomspace(lo, total, int(options.params.get("grid", 16))).tolist(), float(total)})
    if "budget" in options.params:
        grid = [float(options.params["budget"])]
    best, best_peak, closest, tried, mem_order = None, None, None, set(), None
    n = len(graph.arrays.ids)
    # None: nothing dropped, in plain topological order; then the segments, kept for the backward pass once
    # recomputed; only where none fits, each recomputation discarded after its reader (`transient`)
    plans = [(None, False), *((b, False) for b in grid), *((b, True) for b in grid)]
    for b, transient in plans:
        if transient and best is not None:
            break
        dropped = frozenset() if b is None else frozenset(_greedy_segments(graph, forward, candidates, b))
        if b is not None and (dropped, transient) in tried or transient and not dropped:
            continue
        tried.add((dropped, transient))
        if transient and mem_order is None:
            mem_order = memory_order(graph)
        computes = graph.arrays.topo.tolist() if b is None else \
            checkpoint_computes(graph, dropped, late, transient, limit=_TRANSIENT_LIMIT * n if transient else None,
                                order=mem_order if transient else None)
        if computes is None:
            continue
        sched = Schedule(tuple(sequential_instructions(graph, dev.name, computes)), graph=graph.name)
        r = simulate(graph, cluster, sched)
        pk = r.peak[dev.name]
        if best_peak is None or pk < best_peak:
            best_peak, closest = pk, sched
        if r.valid and (best is None or (r.makespan, pk) < best[0]):
            best = ((r.makespan, pk), sched, b, len(dropped), r, transient)
    if best is None:
        raise not_found(graph, cluster, f"{name}: the smallest peak found is {format_size(best_peak)}, over the "
                        f"budget of {format_size(dev.memory)} on {dev.name}",
                        hint="raise the budget, or use a solver that swaps (offload-all, heuristic) or the milp",
                        closest=closest, found=best_peak)
    _, sched, b, ndrop, r, transient = best
    ex = dict(extra or {})
    ex.update(segment_budget=b if b is not None else float("inf"), checkpoints=len(forward) - ndrop, peak=r.peak,
              transient=transient)
    return Schedule(sched.instructions, SolveReport(name, "heuristic", objective=r.makespan,
                                                    solve_time=time.perf_counter() - t0, extra=ex),
                    graph=graph.name)


def chen_greedy(graph: Graph, cluster: Cluster, options: SolveOptions = SolveOptions()) -> Schedule:
    """Chen et al. (2016) greedy checkpointing; the per-segment budget is
    searched for the fastest schedule that fits the device (params["budget"]
    fixes it)."""
    t0 = time.perf_counter()
    recomputing("chen-greedy", options)
    _need_backward(graph, "chen-greedy")
    return _best_fitting(graph, cluster, "chen-greedy", options, None, t0)


def articulation_points(graph: Graph) -> list[int]:
    """Articulation points of the forward graph (undirected), topological order."""
    import networkx as nx

    a = graph.arrays
    fwd = set(np.flatnonzero(a.kind == _FORWARD).tolist())
    g = nx.Graph()
    g.add_nodes_from(fwd)
    owner = np.repeat(np.arange(len(a.ids)), np.diff(a.out_ptr))
    for u, v in zip(owner.tolist(), a.out_idx.tolist(), strict=True):
        if u in fwd and v in fwd:
            g.add_edge(u, v)
    aps = set(nx.articulation_points(g))
    return [v for v in a.topo.tolist() if v in aps]


def articulation(graph: Graph, cluster: Cluster, options: SolveOptions = SolveOptions()) -> Schedule:
    """Checkpoint articulation points of the forward graph (Checkmate's AP
    baseline): only cut vertices may be kept, chosen by Chen's greedy
    segmenting; keeping all of them is one of the candidates."""
    t0 = time.perf_counter()
    recomputing("articulation", options)
    _need_backward(graph, "articulation")
    aps = articulation_points(graph)
    return _best_fitting(graph, cluster, "articulation", options, aps, t0, extra={"articulation_points": len(aps)})
