"""Keep instead of recompute where the budget allows: a pass over any valid schedule.

A schedule that frees a value and recomputes it later can, where memory permits, keep the value instead: drop the
free and the recomputation (and the recomputations of its inputs that only served it). Each such change is tried
in the simulator and kept only when the schedule stays valid and gets faster, so the result is never worse than
the input. Solvers whose memory model is coarser than the simulator's leave room this way: LP rounding solves its
LP at a reduced budget when the first rounding does not fit, and its schedules then sit well under the real one.

Recomputations are tried in order of time saved per byte kept; one that does not fit is not tried again (later
changes mostly keep more values resident), so the pass costs one simulation per recomputation and one per change
kept.
"""

from __future__ import annotations

import time

from ..cluster import Cluster
from ..graph import Graph
from ..schedule import Compute, Copy, Free, Schedule
from ..simulate import SimResult, simulate


def _recomputations(graph: Graph, cluster: Cluster, ins: list) -> list[tuple[int, int, float]]:
    """(index of the free, index of the recomputation, seconds saved per byte) of every recomputation on a device
    where the value was resident before and freed since."""
    a = graph.arrays
    idx, dev = a.index, cluster.device_index
    last: dict[tuple[str, str], tuple[str, int]] = {}
    out = []
    for i, x in enumerate(ins):
        if isinstance(x, Compute):
            ev = last.get((x.node, x.device))
            if ev is not None and ev[0] == "free":
                v, d = idx[x.node], cluster.devices[dev[x.device]]
                cost = a.cost[d.kind][v] / d.speed
                out.append((ev[1], i, cost / max(int(a.bytes[v]), 1)))
            last[(x.node, x.device)] = ("res", i)
        elif isinstance(x, Copy):
            last[(x.node, x.dst)] = ("res", i)
        elif isinstance(x, Free):
            last[(x.node, x.device)] = ("free", i)
    return out


def _dead_recomputations(graph: Graph, ins: list) -> set[int]:
    """Indices of recomputations freed before anything read them, with their frees."""
    a = graph.arrays
    idx, ids = a.index, a.ids
    computed: set[str] = set()
    open_: dict[tuple[str, str], int | None] = {}   # resident (node, device) -> index of an unread recomputation
    dead: set[int] = set()
    for i, x in enumerate(ins):
        if isinstance(x, Compute):
            v = idx[x.node]
            for u in a.in_idx[a.in_ptr[v]:a.in_ptr[v + 1]]:
                open_[(ids[u], x.device)] = None
            open_[(x.node, x.device)] = i if x.node in computed else None
            computed.add(x.node)
        elif isinstance(x, Copy):
            open_[(x.node, x.src)] = None
            open_[(x.node, x.dst)] = None
        elif isinstance(x, Free):
            j = open_.pop((x.node, x.device), None)
            if j is not None:
                dead.update((j, i))
    return dead


def _keep(graph: Graph, ins: list, tags: list, f: int, c: int) -> tuple[list, list]:
    drop = {f, c}
    while True:
        rest = [i for i in range(len(ins)) if i not in drop]
        dead = _dead_recomputations(graph, [ins[i] for i in rest])
        if not dead:
            return [ins[i] for i in rest], [tags[i] for i in rest]
        drop.update(rest[k] for k in dead)


def keep_instead_of_recompute(graph: Graph, cluster: Cluster, schedule: Schedule,
                              deadline: float | None = None) -> tuple[Schedule, SimResult]:
    """The schedule with every recomputation that fits replaced by keeping the value, and its simulation.
    `deadline` (time.perf_counter() value) stops the pass early; what was accepted by then is returned."""
    ins = list(schedule.instructions)
    best = simulate(graph, cluster, schedule)
    if not best.valid:
        return schedule, best
    tags = list(range(len(ins)))
    failed: set[int] = set()
    while True:
        cands = [(gain, f, c) for f, c, gain in _recomputations(graph, cluster, ins) if tags[c] not in failed]
        cands.sort(key=lambda x: -x[0])
        for _, f, c in cands:
            if deadline is not None and time.perf_counter() > deadline:
                return Schedule(tuple(ins), schedule.report, schedule.graph), best
            trial, trial_tags = _keep(graph, ins, tags, f, c)
            r = simulate(graph, cluster, Schedule(tuple(trial)))
            if r.valid and r.makespan < best.makespan:
                ins, tags, best = trial, trial_tags, r
                break
            failed.add(tags[c])
        else:
            return Schedule(tuple(ins), schedule.report, schedule.graph), best
