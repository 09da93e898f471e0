"""Keep instead of recompute where the budget allows: a pass over any valid schedule.

A schedule that frees a value and recomputes it later can, where memory permits, keep the value instead: drop the
free and the recomputation (and the recomputations of its inputs that only served it; in a last round, where
nothing more fits, first computations freed unread too). Each such change is tried in the simulator and kept
only when the schedule stays valid and gets faster, so the result is never worse than the input. Solvers whose
memory model is coarser than the simulator's leave room this way: LP rounding solves its LP at a reduced budget
when the first rounding does not fit, and its schedules then sit well under the real one.

Where keeping a value overflows the budget, room is made for it (`_make_room`), as long as that costs less time
than the recomputation saves: at the overflow, one value resident there is moved out of the way, cheapest per byte
first, until the schedule fits:
- deferred: a computation not read until after the overflow moves past it, to just before its first reader (or,
  for a required result nobody reads, as late as its inputs allow), with whatever of its inputs is missing there
  computed again beside it. A schedule made over a fixed order computes a weight gradient where that order put
  it, and holds it through the peak; deferred, it costs nothing. An op's other output (a layer norm's
  statistics: `Node.output_of`) is not deferred: it is held from its op's run wherever it is computed;
- dropped: freed after its last use before the overflow and computed again (with its missing inputs) before its
  next reader;
- released: its readers after the overflow, where their inputs are all resident before it and their outputs
  smaller (a weight gradient of the activation it reads), run before it instead, and it is freed there.
Every free then moves up to the last use of its value (`_tighten`). The transformer at 45% of its keep-everything
memory (one device, recompute only), when the simulator counted an op's other outputs from their own compute:
the MILP's schedule after 60 s, 1.344x keep-everything's step time, became 1.232x with the first two moves, 1.224x
with all three (by deferring the layer norms' statistics, which is no longer a move: counted from their op's run,
that schedule is 31 kB over the budget); without making room the pass changes nothing.

First, an op's other output computed once is moved to right after its op's last run before anything reads it
(`remade_outputs`): the simulator counts it from that run, so where the op runs again (a recomputation of a layer norm
before its backward), the output is no longer held through everything between the two runs, and what that frees
lets more values be kept (the MILP's schedule for the 3-layer GPT-2 at 25% of its keep-everything memory after
60 s: 57 kB less at its peak; the pass then keeps one more value, 1.5510x -> 1.5478x keep-everything's step time).
The move is made again whenever nothing more fits: a kept value removes a run of an op, which may make an earlier
run its last before the reader.

Recomputations are tried in order of time saved per byte kept; one that does not fit is not tried again in the
same pass (later changes mostly keep more values resident), so a pass costs one simulation per recomputation and
one per change kept, and one per value moved out of the way. Passes repeat over the recomputations that failed
before the last change kept, until none is left: the values moved out of the way make room that an earlier failure
lacked (lp-rounding's schedule for the transformer at 45%, under that former count: 1.2737x keep-everything's step
time, 1.2318x after one pass, 1.2241x after two, in 0.4 s).

`drop_unread_copies` removes the copies whose value nothing reads where they land (a prefetch freed before its
reader and made again later, a swap-out of a value never needed back): each costs link time, memory where it lands
and, on a GPU, host time in the replay, for nothing. The memory planner leaves them where it swaps a value out and
later recomputes it instead, or prefetches ahead of a reader it then moves (the GPU-sized transformer at 70%, one
H100-like accelerator: 3 of the heuristic's 19 copies, and 0.86 ms of its predicted step).

`offload` moves computations between devices where the step gets faster: a model that counts time stage by stage
leaves a device idle that could take work off another's critical path.
"""

from __future__ import annotations

import bisect
import time

import numpy as np

from ..cluster import Cluster
from ..graph import Graph
from ..schedule import Compute, Copy, Free, Schedule, Sync
from ..simulate import SimResult, simulate

_MOVES = 40     # values moved out of the way, at most, to make room for one kept value
_ONE_BY_ONE = 100   # unread copies tried one at a time, at most, where removing them all fails (a simulation each)


def _recomputations(graph: Graph, cluster: Cluster, ins: list) -> list[tuple[int, int, float]]:
    """(index of the free, index of the recomputation, seconds saved per byte) of every recomputation on a device
    where the value was resident before and freed since."""
    a = graph.arrays
    last: dict[tuple[str, str], tuple[str, int]] = {}
    out = []
    for i, x in enumerate(ins):
        if isinstance(x, Compute):
            ev = last.get((x.node, x.device))
            if ev is not None and ev[0] == "free":
                cost = _seconds(graph, cluster, (x.node,), x.device)
                out.append((ev[1], i, cost / max(int(a.bytes[a.index[x.node]]), 1)))
            last[(x.node, x.device)] = ("res", i)
        elif isinstance(x, Copy):
            last[(x.node, x.dst)] = ("res", i)
        elif isinstance(x, Free):
            last[(x.node, x.device)] = ("free", i)
    return out


def _dead_computations(graph: Graph, ins: list, firsts: bool = False) -> set[int]:
    """Indices of recomputations freed before anything read them, with their frees; `firsts`: of first
    computations so too. A schedule over a fixed order computes each operation first where the order puts it,
    though its value may then be dropped unread and computed again where it is read: a GELU gradient in
    lp-rounding's schedule of the 3-layer GPT-2 at 25% of its keep-everything memory. A first computation of an
    op that makes other outputs, or of one of those (`Node.output_of`), stays: its run makes them."""
    a = graph.arrays
    idx = a.index
    if firsts:
        tied = a.output_of >= 0                 # the other outputs
        tied[a.output_of[tied]] = True          # and their makers
    open_: dict[tuple[str, str], int | None] = {}   # resident (node, device) -> index of an unread computation
    computed: set[str] = set()
    dead: set[int] = set()
    for i, x in enumerate(ins):
        kind = type(x)
        if kind is Compute:
            v = idx[x.node]
            for u in a.inputs[v]:
                open_[(u, x.device)] = None
            first = x.node not in computed
            open_[(x.node, x.device)] = None if first and (not firsts or tied[v]) else i
            computed.add(x.node)
        elif kind is Copy:
            open_[(x.node, x.src)] = None
            open_[(x.node, x.dst)] = None
        elif kind is Free:
            j = open_.pop((x.node, x.device), None)
            if j is not None:
                dead.update((j, i))
    return dead


def remade_outputs(graph: Graph, ins: list, first: np.ndarray | None = None) -> list | None:
    """The instructions with each op's other output (`Node.output_of`), computed once, moved to right after its
    maker's last run on that device before anything reads or frees it; None where none moves. The simulator
    counts such an output from its maker's latest run before its compute, so it is then held from that later run
    (a recomputation of the maker), not through everything in between: the same time, less memory. `first`
    (per node): those to right after the maker's first run instead, where the MILP's stage model counts them
    (`milp._stage`)."""
    a = graph.arrays
    maker = a.output_of.tolist()
    runs: dict[tuple[str, str], list[int]] = {}     # (node, device) -> its computes, in order
    uses: dict[tuple[str, str], list[int]] = {}     # (node, device) -> the instructions that read or free it there
    for i, x in enumerate(ins):
        if isinstance(x, Compute):
            runs.setdefault((x.node, x.device), []).append(i)
        elif isinstance(x, Free):
            uses.setdefault((x.node, x.device), []).append(i)
        dev = x.device if isinstance(x, Compute) else x.src if isinstance(x, Copy) else None
        for u in _reads(graph, x, dev) if dev is not None else ():
            uses.setdefault((u, dev), []).append(i)
    key: list[float] = list(range(len(ins)))   # sort keys: a moved output goes right after its maker's run
    moved = False
    for (node, dev), at in runs.items():
        p = maker[a.index[node]]
        if p < 0 or len(at) != 1:
            continue
        made = runs.get((a.ids[p], dev), [])
        now = bisect.bisect_left(made, at[0]) - 1      # the maker's run it is counted from
        if first is not None and first[a.index[node]]:
            to = 0
        else:
            use = uses.get((node, dev), [])
            j = bisect.bisect_right(use, at[0])
            to = bisect.bisect_left(made, use[j] if j < len(use) else len(ins)) - 1
        if now >= 0 and to >= 0 and to != now:
            key[at[0]] = made[to] + 0.5
            moved = True
    if not moved:
        return None
    return [ins[i] for i in sorted(range(len(ins)), key=lambda i: (key[i], i))]


def _keep(graph: Graph, ins: list, tags: list, f: int, c: int, firsts: bool = False) -> tuple[list, list]:
    drop = {f, c}
    while True:
        rest = [i for i in range(len(ins)) if i not in drop]
        dead = _dead_computations(graph, [ins[i] for i in rest], firsts)
        if not dead:
            return [ins[i] for i in rest], [tags[i] for i in rest]
        drop.update(rest[k] for k in dead)


def _reads(graph: Graph, x, dev: str) -> tuple[str, ...]:
    """The values instruction x reads on device dev."""
    kind = type(x)
    if kind is Compute and x.device == dev:
        a = graph.arrays
        return a.inputs[a.index[x.node]]
    if kind is Copy and x.src == dev:
        return (x.node,)
    return ()


def _makes(x, dev: str) -> str | None:
    """The value instruction x makes resident on device dev, if any."""
    kind = type(x)
    if kind is Compute and x.device == dev or kind is Copy and x.dst == dev:
        return x.node
    return None


def _tighten(graph: Graph, ins: list, tags: list) -> list:
    """`tags` (of `ins`) with every free moved up to right after the last instruction that makes or reads its
    value's instance."""
    last: dict[tuple[str, str], int] = {}
    after: dict[int, list[int]] = {}
    for i, x in enumerate(ins):
        kind = type(x)
        if kind is Free:
            after.setdefault(last.pop((x.node, x.device), i), []).append(i)
            continue
        for dev in ((x.device,) if kind is Compute else (x.src, x.dst) if kind is Copy else ()):
            made = _makes(x, dev)
            if made is not None:
                last[(made, dev)] = i
            for u in _reads(graph, x, dev):
                last[(u, dev)] = i
    order = []
    for i, x in enumerate(ins):
        if type(x) is not Free:
            order.append(i)
        order.extend(after.get(i, ()))
    return [tags[i] for i in order]


class _Residency:
    """Where each value is resident on one device along an instruction list: before instruction q, an instance
    made at s and freed at e (len(ins) if never) is there when s < q <= e."""

    def __init__(self, graph: Graph, ins: list, dev: str):
        self.spans: dict[str, list[tuple[int, int]]] = {}
        self.reads: dict[str, list[int]] = {}
        open_: dict[str, int] = {}
        for i, x in enumerate(ins):
            if type(x) is Free and x.device == dev:
                s = open_.pop(x.node, None)
                if s is not None:
                    self.spans.setdefault(x.node, []).append((s, i))
                continue
            for u in _reads(graph, x, dev):
                self.reads.setdefault(u, []).append(i)
            made = _makes(x, dev)
            if made is not None:
                open_[made] = i
        for u, s in open_.items():
            self.spans.setdefault(u, []).append((s, len(ins)))
        for spans in self.spans.values():
            spans.sort()

    def span_at(self, u: str, q: int) -> tuple[int, int] | None:
        """The instance of u resident before instruction q, as (made, freed)."""
        spans = self.spans.get(u, ())
        k = bisect.bisect_left(spans, (q, -1)) - 1
        if k >= 0 and spans[k][0] < q <= spans[k][1]:
            return spans[k]
        return None

    def next_read(self, u: str, q: int) -> int | None:
        """The first instruction at q or later that reads u."""
        r = self.reads.get(u, ())
        k = bisect.bisect_left(r, q)
        return r[k] if k < len(r) else None

    def read_between(self, u: str, lo: int, hi: int) -> bool:
        """Whether an instruction in [lo, hi] reads u."""
        k = self.next_read(u, lo)
        return k is not None and k <= hi


def _missing(graph: Graph, res: _Residency, w: str, q: int) -> list[str] | None:
    """w and whatever of its inputs is not resident before instruction q (recursively), in an order that computes
    each after its inputs; None when one of them may not be computed again."""
    a = graph.arrays
    out: list[str] = []
    seen: set[str] = set()

    def need(u: str) -> bool:
        if u in seen or (u != w and res.span_at(u, q) is not None):
            return True
        v = a.index[u]
        if u != w and not a.recomputable[v]:
            return False
        if not all(need(i) for i in a.inputs[v]):
            return False
        seen.add(u)
        out.append(u)
        return True

    return out if need(w) else None


def _moves(graph: Graph, ins: list, p: int, dev: str):
    """Per value resident on dev at instruction p that p does not use, each way to move it out of the way:
    (the computations it adds, its edit for `_apply`, the bytes it frees at p) (see the module docstring)."""
    a = graph.arrays
    res = _Residency(graph, ins, dev)
    x = ins[p]
    busy = set(_reads(graph, x, dev)) | ({_makes(x, dev)} - {None})
    n = len(ins)
    for w in res.spans:
        span = None if w in busy else res.span_at(w, p + 1)
        if span is None or span[1] <= p:
            continue
        made, freed = span
        nxt = res.next_read(w, p + 1)
        if nxt is not None and nxt > freed:
            nxt = None
        v = a.index[w]
        if nxt is None and not (a.required[v] and freed == n):
            continue        # dead after p: `_tighten` frees it
        if isinstance(ins[made], Compute) and not res.read_between(w, made + 1, p) and a.output_of[v] < 0:
            # deferred, to the latest point up to its reader where its missing inputs cost the least
            last = nxt if nxt is not None else n
            spots = {p + 1, last}
            for u in a.inputs[v]:
                for s, e in res.spans.get(u, ()):
                    spots.update(q for q in (s + 1, e) if p < q <= last)
            best = None
            for q in sorted(spots, reverse=True):
                chain = _missing(graph, res, w, q)
                if chain is not None and (best is None or len(chain) < len(best[1])):
                    best = (q, chain)
            if best is not None:
                yield best[1][:-1], ("defer", made, best[0], best[1], dev), int(a.bytes[v])
        if nxt is not None and a.recomputable[v] and not a.required[v]:
            # dropped: freed after its last use before p, computed again before its next reader
            k = max([i for i in res.reads.get(w, ()) if made < i < p], default=made)
            chain = _missing(graph, res, w, nxt)
            if chain is not None:
                yield chain, ("drop", k, nxt, chain, dev), int(a.bytes[v])
        if nxt is not None and not a.required[v]:
            # its readers after p hoisted before p: w is freed there, their outputs held instead
            later = [i for i in res.reads.get(w, ()) if p < i <= freed]
            if all(_hoistable(graph, res, ins[i], i, p, dev) for i in later):
                gain = int(a.bytes[v]) - sum(int(a.bytes[a.index[ins[i].node]]) for i in later)
                if gain > 0:
                    yield [], ("hoist", p, later, [], dev), gain


def _hoistable(graph: Graph, res: _Residency, x, i: int, p: int, dev: str) -> bool:
    """Whether instruction x (at i > p) can run just before p: a computation on dev whose inputs are all resident
    there and whose value is not, nor made again before i."""
    a = graph.arrays
    if not isinstance(x, Compute) or x.device != dev or res.span_at(x.node, p) is not None:
        return False
    return (all(res.span_at(u, p) is not None for u in a.inputs[a.index[x.node]])
            and not any(p < s < i for s, _ in res.spans.get(x.node, ())))


def _apply(pool: list, tags: list, edit: tuple) -> list:
    """`tags` with a `_moves` edit made; new instructions go to the end of `pool`."""
    kind, at, q, chain, dev = edit
    if kind == "hoist":
        moved = set(q)
        return tags[:at] + [tags[i] for i in q] + [t for i, t in enumerate(tags[at:], at) if i not in moved]

    def new(xs: list) -> list[int]:
        pool.extend(xs)
        return list(range(len(pool) - len(xs), len(pool)))

    added = new([Compute(u, dev) for u in chain] + [Free(u, dev) for u in chain[:-1]])
    if kind == "defer":
        return tags[:at] + tags[at + 1:q] + added + tags[q:]
    return tags[:at + 1] + new([Free(chain[-1], dev)]) + tags[at + 1:q] + added + tags[q:]


def _seconds(graph: Graph, cluster: Cluster, nodes, dev: str) -> float:
    """Seconds device dev takes to compute `nodes` once each."""
    d = cluster.devices[cluster.device_index[dev]]
    cost = graph.arrays.cost[d.kind]
    return float(sum(cost[graph.arrays.index[u]] for u in nodes)) / d.speed


def _make_room(graph: Graph, cluster: Cluster, pool: list, tags: list, allowance: float,
               deadline: float | None) -> tuple[list, SimResult]:
    """(tags, simulation): values moved out of the way at each overflow, the cheapest per byte first, while the
    computations added take less than `allowance` seconds, until the schedule fits or nothing more can go."""
    tags = _tighten(graph, [pool[t] for t in tags], tags)
    r = simulate(graph, cluster, Schedule(tuple(pool[t] for t in tags)))
    added = 0.0
    for _ in range(_MOVES):
        v = r.violation
        if r.valid or v.code != "over-budget" or (deadline is not None and time.perf_counter() > deadline):
            break
        ins = [pool[t] for t in tags]
        best = None
        for computed, edit, freed in _moves(graph, ins, v.index, v.device):
            cost = _seconds(graph, cluster, computed, v.device)
            room = min(freed, v.over)
            if added + cost < allowance and room > 0 and (best is None or (cost / room, -room) < best[0]):
                best = ((cost / room, -room), cost, edit)
        if best is None:
            break
        added += best[1]
        tags = _apply(pool, tags, best[2])
        tags = _tighten(graph, [pool[t] for t in tags], tags)
        r = simulate(graph, cluster, Schedule(tuple(pool[t] for t in tags)))
    return tags, r


def keep_instead_of_recompute(graph: Graph, cluster: Cluster, schedule: Schedule, deadline: float | None = None,
                              make_room: bool = True, remake: bool = True) -> tuple[Schedule, SimResult]:
    """The schedule with every recomputation that fits replaced by keeping the value, and its simulation.
    `make_room`: a kept value that overflows may move others out of the way (`_make_room`). When nothing more
    fits and the schedule computes something first only to free it unread, that goes, and the recomputations that
    failed are tried again with such computations going too (`_dead_computations`): the 3-layer GPT-2 at 25% of its
    keep-everything memory, lp-rounding's schedule, 1.5687x -> 1.5510x keep-everything's step time. Last, not
    throughout: on the same graph at 40%, the rounding of the bound's plans ended 0.6% slower that way.
    `deadline` (time.perf_counter() value) stops the pass early; what was accepted by then is returned. Before it
    all, and again when nothing more fits, with `remake`, the op's other outputs are computed after the op's last
    run before their readers (`remade_outputs`): a recomputation the pass kept moves that run."""
    pool = list(schedule.instructions)
    best = simulate(graph, cluster, schedule)
    if not best.valid:
        return schedule, best
    tags = list(range(len(pool)))
    failed: dict[int, int] = {}     # recomputation (its tag) -> the number of changes kept when it failed
    kept_changes = 0
    firsts = False

    def done() -> tuple[Schedule, SimResult]:
        return Schedule(tuple(pool[t] for t in tags), schedule.report, schedule.graph), best

    def remade() -> bool:
        """Moves the other outputs (`remade_outputs`) where that keeps the time; the room it frees makes every
        recomputation worth another try."""
        nonlocal pool, tags, best
        moved = remade_outputs(graph, [pool[t] for t in tags]) if remake else None
        if moved is None:
            return False
        r = simulate(graph, cluster, Schedule(tuple(moved)))
        if not (r.valid and r.makespan <= best.makespan):
            return False
        pool, tags, best = moved, list(range(len(moved))), r
        failed.clear()
        return True

    remade()

    while True:
        ins = [pool[t] for t in tags]
        cands = [(gain, f, c) for f, c, gain in _recomputations(graph, cluster, ins) if tags[c] not in failed]
        cands.sort(key=lambda x: -x[0])
        for _, f, c in cands:
            if deadline is not None and time.perf_counter() > deadline:
                return done()
            trial, trial_tags = _keep(graph, ins, tags, f, c, firsts)
            r = simulate(graph, cluster, Schedule(tuple(trial)))
            if not r.valid and make_room and r.violation.code == "over-budget":
                kept = set(trial_tags)
                saved = sum(_seconds(graph, cluster, (x.node,), x.device) for t, x in zip(tags, ins, strict=True)
                            if t not in kept and isinstance(x, Compute))
                trial_tags, r = _make_room(graph, cluster, pool, trial_tags, saved, deadline)
            if r.valid and r.makespan < best.makespan:
                tags, best, kept_changes = trial_tags, r, kept_changes + 1
                break
            failed[tags[c]] = kept_changes
        else:
            # what changed since a recomputation failed may have made room for it: another pass over those
            stale = [t for t, k in failed.items() if k < kept_changes]
            if not stale:
                if firsts or not (dead := _dead_computations(graph, ins, firsts=True)):
                    if remade():    # the maker's runs that were kept moved: its outputs may go later still
                        continue
                    return done()
                firsts, stale = True, list(failed)
                trial_tags = [t for k, t in enumerate(tags) if k not in dead]
                r = simulate(graph, cluster, Schedule(tuple(pool[t] for t in trial_tags)))
                if r.valid and r.makespan < best.makespan:
                    tags, best = trial_tags, r
            for t in stale:
                del failed[t]


def _unread_copies(graph: Graph, ins: list) -> list[tuple[int, int | None]]:
    """(copy, the free of what it made or None) for each copy whose value is not read where it lands before that
    free (by a compute there, or a copy from there), nor held to the end as a required result."""
    open_: dict[tuple[str, str], int] = {}      # (node, device) -> its latest copy there not yet read
    out = []
    for k, x in enumerate(ins):
        if isinstance(x, Compute):
            for u in graph.node(x.node).inputs:
                open_.pop((u, x.device), None)
        elif isinstance(x, Copy):
            open_.pop((x.node, x.src), None)
            open_[(x.node, x.dst)] = k
        elif isinstance(x, Free) and (x.node, x.device) in open_:
            out.append((open_.pop((x.node, x.device)), k))
    out += [(k, None) for (v, _), k in open_.items() if not graph.node(v).required]
    return sorted(out)


def drop_unread_copies(graph: Graph, cluster: Cluster, schedule: Schedule,
                       sim: SimResult | None = None) -> tuple[Schedule, SimResult]:
    """The schedule without its unread copies (`_unread_copies`) and their frees, and its simulation; the input
    where it has none, or where no removal keeps the schedule valid and no slower. All are removed together where
    that passes the simulator, else one at a time, the first `_ONE_BY_ONE` (fewer copies start the others earlier,
    which may move a peak)."""
    best = sim or simulate(graph, cluster, schedule)
    ins = list(schedule.instructions)
    cands = _unread_copies(graph, ins) if best.valid else []
    if not cands:
        return schedule, best

    def without(drop: set[int]) -> list:
        return [x for k, x in enumerate(ins) if k not in drop]

    everything = {k for pair in cands for k in pair if k is not None}
    r = simulate(graph, cluster, Schedule(tuple(without(everything))))
    if r.valid and r.makespan <= best.makespan:
        return Schedule(tuple(without(everything)), schedule.report, schedule.graph), r
    dropped: set[int] = set()
    for pair in cands[:_ONE_BY_ONE]:
        trial = dropped | {k for k in pair if k is not None}
        r = simulate(graph, cluster, Schedule(tuple(without(trial))))
        if r.valid and r.makespan <= best.makespan:
            dropped, best = trial, r
    return (Schedule(tuple(without(dropped)), schedule.report, schedule.graph) if dropped else schedule), best


def _offloaded(graph: Graph, ins: list, i: int, e: str, res: dict) -> list | None:
    """`ins` with its computation at i run on device e instead of d, or None where that cannot be written: each
    input not resident on e then is copied d -> e right after it was made on d (so the copy overlaps the work in
    between) and freed on e after the computation; the output is copied back e -> d right after it, and freed on
    e, where d reads it (or copies it on) before the instance is freed there, else it stays on e (a required
    result nobody reads: it exists at the end all the same) and the free on d goes. `res`: device -> `_Residency`
    of `ins`."""
    x = ins[i]
    d, v = x.device, x.node
    a = graph.arrays
    after: dict[int, list] = {}
    copied = []
    for u in dict.fromkeys(a.inputs[a.index[v]]):
        if res[e].span_at(u, i) is not None:
            continue
        made = res[d].span_at(u, i)
        if made is None:
            return None
        after.setdefault(made[0], []).append(Copy(u, d, e))
        copied.append(u)
    here = [Compute(v, e)]
    span = res[d].span_at(v, i + 1)
    end = span[1] if span is not None and span[0] == i else i
    back = res[d].read_between(v, i + 1, end) if end > i else False
    if back:
        here += [Copy(v, e, d), Free(v, e)]
    here += [Free(u, e) for u in copied]
    out = []
    for k, y in enumerate(ins):
        if k == i:
            out += here
            continue
        if k == end and not back and type(y) is Free:
            continue        # v never reaches d now
        out.append(y)
        out += after.get(k, ())
    return out


def offload(graph: Graph, cluster: Cluster, schedule: Schedule, devices: tuple[str, ...],
            deadline: float | None = None) -> tuple[Schedule, SimResult]:
    """The schedule with computations moved between `devices` where the step gets faster, and its simulation.
    A model that counts time stage by stage (the MILP's: every stage takes as long as its slowest device) cannot
    let one device work through several stages of another's, so it leaves a device idle that could take an
    operation off the critical path: `example:tiny` at 1.1 MB, one GPU and the host, where the host computes a
    weight gradient beside the GPU's backward pass, 85 us -> 77 us, the longest dependency chain, so optimal.
    Each move (`_offloaded`) is tried in the simulator and kept only when the schedule stays valid and gets
    faster, so the result is never worse than the input. A pass tries each computation once, longest first, and
    passes repeat until one moves nothing or `deadline` (time.perf_counter()) passes."""
    a = graph.arrays
    best = simulate(graph, cluster, schedule)
    if not best.valid or len(devices) < 2:
        return schedule, best
    ins = list(schedule.instructions)
    start = best

    def seconds(v: str, dev: str) -> float:      # inf where dev cannot run v
        t = _seconds(graph, cluster, (v,), dev) if cluster.device(dev).kind in a.cost else np.inf
        return t if np.isfinite(t) else np.inf

    makers = set(a.output_of[a.output_of >= 0].tolist())

    def movable(x) -> bool:
        """A computation on one of `devices` with inputs (not a load) that neither makes nor is an op's other
        output (held from its maker's run, wherever that is)."""
        k = a.index.get(x.node) if type(x) is Compute and x.device in devices else None
        return k is not None and a.in_ptr[k + 1] > a.in_ptr[k] and a.output_of[k] < 0 and k not in makers

    def tries(ins: list) -> dict:
        """(node, device, its k-th computation there) -> position, of each movable computation, longest first."""
        seen: dict = {}
        out = {}
        for i, x in enumerate(ins):
            if movable(x):
                k = seen[x.node, x.device] = seen.get((x.node, x.device), -1) + 1
                out[x.node, x.device, k] = i
        return dict(sorted(out.items(), key=lambda m: -seconds(m[0][0], m[0][1])))

    def late() -> bool:
        return deadline is not None and time.perf_counter() > deadline

    changed = True
    while changed and not late():
        changed = False
        # a model's stage barriers hold every device at the end of each stage: they go where the schedule stays
        # valid without them (no slower: a barrier only waits), tried again after each pass that moved something
        free_running = [x for x in ins if type(x) is not Sync]
        if len(free_running) < len(ins):
            r = simulate(graph, cluster, Schedule(tuple(free_running)))
            if r.valid and r.makespan <= best.makespan:
                ins, best = free_running, r
        res = {dev: _Residency(graph, ins, dev) for dev in devices}
        at = tries(ins)
        for (v, d, k) in list(at):
            i = at.get((v, d, k))
            for e in devices:
                if i is None or late():
                    break
                if e == d or seconds(v, e) == np.inf or not (cluster.link(d, e) and cluster.link(e, d)):
                    continue
                trial = _offloaded(graph, ins, i, e, res)
                r = None if trial is None else simulate(graph, cluster, Schedule(tuple(trial)))
                if r is not None and r.valid and r.makespan < best.makespan * (1 - 1e-12):
                    ins, best, changed = trial, r, True
                    res = {dev: _Residency(graph, ins, dev) for dev in devices}
                    at = tries(ins)
                    break
    if best.makespan >= start.makespan * (1 - 1e-12):
        return schedule, start
    return Schedule(tuple(ins), schedule.report, schedule.graph), best
