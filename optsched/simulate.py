"""The arbiter: checks a schedule against a graph and a cluster and computes
its time and memory under the stream semantics of DESIGN.md.

- Each device has one compute stream, each directed link one copy stream;
  instructions on a stream run in list order, each starting when its stream is
  free, its inputs are resident and the last `sync` before it has passed.
- `compute v @ d` allocates v's bytes and workspace on d when it starts and
  releases the workspace when it ends; an operation's other output
  (`Node.output_of` names the node whose computation makes it) is counted on
  d from the end of that node's latest computation on d, which must be where
  its value there came from (not a copy): the op made it then, and holding it
  until its own zero-cost compute takes that memory; `copy v a->b` allocates
  on b when it starts; `free v @ d` releases v once every earlier reader of v
  on d is done.
- A copy over a link with an `issue` time also holds the compute streams of
  both ends for that long: the next computation in list order on each starts
  that much later (the thread that computes hands the copy over).
- Residency is checked in list order: an input must have been computed or
  copied onto the device by an earlier instruction and not freed since.
- A `free` after a `sync` releases no earlier than the barrier.
- Memory events at the same instant are ordered: releases of earlier
  allocations, then allocations in list order; a release of an allocation made
  at that very instant, or of a value read by a zero-length operation at that
  instant, comes right after the instruction that causes it (in list order).
  So a step that ends at t makes room for one that starts at t, and a
  zero-length one still counts, inputs included.

Structural faults (unknown names, a missing input, use after free) stop the
check at the faulty instruction; an over-budget device or a missing required
result is reported with the full metrics, so a user sees by how much.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .cluster import Cluster
from .errors import OptschedError
from .graph import Graph
from .schedule import Compute, Copy, Free, Schedule, Sync
from .units import format_size


@dataclass(frozen=True)
class Violation:
    code: str            # unknown-node, unknown-device, no-link, not-runnable, not-resident,
                         # already-resident, not-recomputable, not-made-here, over-budget, missing-result
    message: str
    index: int | None = None
    node: str | None = None
    device: str | None = None
    over: int = 0        # bytes over budget, for over-budget


@dataclass(frozen=True)
class SimResult:
    valid: bool
    violation: Violation | None
    makespan: float
    peak: dict[str, int]
    budget: dict[str, int]
    compute_time: float          # first computations, seconds of device time
    recompute_time: float        # computations of a node already computed before
    recomputed: int              # number of such recomputations
    transfer_time: float         # seconds of link time
    transfer_bytes: int
    swap_out_bytes: int          # accelerator -> cpu
    swap_in_bytes: int           # cpu -> accelerator
    busy: dict[str, float]       # compute seconds per device
    start: np.ndarray = field(repr=False)     # per instruction (nan for free/sync and after a fault)
    end: np.ndarray = field(repr=False)
    timeline: dict[str, tuple[np.ndarray, np.ndarray]] = field(repr=False, default_factory=dict)


class InvalidSchedule(OptschedError):
    """A schedule the simulator rejects; carries the `Violation`."""

    def __init__(self, violation: Violation):
        self.violation = violation
        super().__init__(describe(violation))


def describe(v: Violation) -> str:
    where = f"instruction {v.index}: " if v.index is not None else ""
    return where + v.message


def require_valid(result: SimResult) -> SimResult:
    if not result.valid:
        raise InvalidSchedule(result.violation)
    return result


def simulate(graph: Graph, cluster: Cluster, schedule: Schedule) -> SimResult:
    a = graph.arrays
    index = a.index
    devs = cluster.devices
    dev_index = cluster.device_index
    nd = len(devs)
    ins = schedule.instructions
    n_ins = len(ins)

    dev_cost = [a.cost.get(d.kind) for d in devs]
    speed = [d.speed for d in devs]
    in_ptr, in_idx = a.in_ptr.tolist(), a.in_idx.tolist()
    nbytes = a.bytes.tolist()
    ws = a.workspace.tolist()
    recomputable = a.recomputable.tolist()
    output_of = a.output_of.tolist()
    computed = [False] * len(a.ids)
    links = {k: (i, lk) for k, i in cluster.link_index.items() for lk in (cluster.links[i],)}
    accel = [d.kind == "cuda" for d in devs]

    ready: dict[int, float] = {}        # key node*nd+dev -> time the copy there is complete
    last_read: dict[int, float] = {}    # key -> latest end of a reader so far
    alloc_at: dict[int, float] = {}     # key -> time its allocation happened
    zero_read: dict[int, float] = {}    # key -> time a zero-length operation read it
    made: dict[int, tuple[int, float]] = {}   # key -> (instruction, end) of the compute that made it there
    comp_free = [0.0] * nd
    link_free = [0.0] * len(cluster.links)
    busy = [0.0] * nd
    barrier = 0.0
    max_end = 0.0
    start = np.full(n_ins, np.nan)
    end = np.full(n_ins, np.nan)
    ev_dev: list[int] = []
    ev_time: list[float] = []
    ev_delta: list[int] = []
    ev_prio: list[int] = []
    ev_ins: list[int] = []
    compute_time = recompute_time = transfer_time = 0.0
    recomputed = transfer_bytes = swap_out = swap_in = 0

    def fault(code, msg, i, node=None, device=None):
        return _result(False, Violation(code, msg, i, node, device), cluster, max_end, {}, compute_time,
                       recompute_time, recomputed, transfer_time, transfer_bytes, swap_out, swap_in, busy,
                       start, end, {})

    def release(d, t, delta, i, in_list_order):
        ev_dev.append(d)
        ev_time.append(t)
        ev_delta.append(-delta)
        ev_prio.append(2 if in_list_order else 0)
        ev_ins.append(i)

    for i, x in enumerate(ins):
        t = type(x)
        if t is Compute:
            v = index.get(x.node)
            if v is None:
                return fault("unknown-node", f"compute of unknown node {x.node!r}", i, x.node, x.device)
            d = dev_index.get(x.device)
            if d is None:
                return fault("unknown-device", f"compute of {x.node!r} on unknown device {x.device!r}", i,
                             x.node, x.device)
            costs = dev_cost[d]
            c = float("nan") if costs is None else costs[v]
            if c != c:
                return fault("not-runnable", f"node {x.node!r} has no cost for device kind "
                             f"{devs[d].kind!r}, so it cannot run on {x.device!r}", i, x.node, x.device)
            key = v * nd + d
            if key in ready:
                return fault("already-resident", f"compute of {x.node!r} on {x.device!r}, where it is "
                             "already resident (free it first)", i, x.node, x.device)
            again = computed[v]
            if again and not recomputable[v]:
                return fault("not-recomputable", f"{x.node!r} is computed a second time, but it may not be "
                             "recomputed (parameter, input or random operation)", i, x.node, x.device)
            s = comp_free[d] if comp_free[d] > barrier else barrier
            for j in range(in_ptr[v], in_ptr[v + 1]):
                r = ready.get(in_idx[j] * nd + d)
                if r is None:
                    return fault("not-resident", f"input {a.ids[in_idx[j]]!r} of {x.node!r} is not resident on "
                                 f"{x.device!r}", i, x.node, x.device)
                if r > s:
                    s = r
            dur = c / speed[d]
            e = s + dur
            for j in range(in_ptr[v], in_ptr[v + 1]):
                k = in_idx[j] * nd + d
                if last_read[k] < e:
                    last_read[k] = e
            if e == s:      # zero-length, also when dur is too small to move the clock
                for j in range(in_ptr[v], in_ptr[v + 1]):
                    zero_read[in_idx[j] * nd + d] = e
            at, by = s, i
            p = output_of[v]
            if p >= 0:      # made by p's latest computation here, held since
                m = made.get(p * nd + d)
                if m is None:
                    return fault("not-made-here", f"{x.node!r} is an output of the operation that computes "
                                 f"{a.ids[p]!r}, but {a.ids[p]!r} on {x.device!r} was copied there, not computed: "
                                 f"compute {x.node!r} on the device that computes {a.ids[p]!r}", i, x.node,
                                 x.device)
                by, at = m
            ev_dev.append(d)
            ev_time.append(at)
            ev_delta.append(nbytes[v] + ws[v])
            ev_prio.append(1)
            ev_ins.append(by)
            alloc_at[key] = at
            made[key] = (i, e)
            if ws[v]:
                release(d, e, ws[v], i, s >= e)
            ready[key] = e
            last_read[key] = e
            comp_free[d] = e
            busy[d] += dur
            if again:
                recompute_time += dur
                recomputed += 1
            else:
                compute_time += dur
                computed[v] = True
        elif t is Copy:
            v = index.get(x.node)
            if v is None:
                return fault("unknown-node", f"copy of unknown node {x.node!r}", i, x.node, x.src)
            for name in (x.src, x.dst):
                if name not in dev_index:
                    return fault("unknown-device", f"copy of {x.node!r} names unknown device {name!r}", i,
                                 x.node, name)
            li = links.get((x.src, x.dst))
            if li is None:
                return fault("no-link", f"copy of {x.node!r} from {x.src!r} to {x.dst!r}, but the cluster has "
                             "no such link", i, x.node, x.src)
            li, lk = li
            sd, dd = dev_index[x.src], dev_index[x.dst]
            ks, kd = v * nd + sd, v * nd + dd
            r = ready.get(ks)
            if r is None:
                return fault("not-resident", f"copy of {x.node!r} from {x.src!r}, where it is not resident", i,
                             x.node, x.src)
            if kd in ready:
                return fault("already-resident", f"copy of {x.node!r} to {x.dst!r}, where it is already "
                             "resident", i, x.node, x.dst)
            s = max(link_free[li], r, barrier)
            dur = lk.latency + nbytes[v] / lk.bandwidth
            e = s + dur
            if last_read[ks] < e:
                last_read[ks] = e
            if e == s:      # zero-length, also when dur is too small to move the clock
                zero_read[ks] = e
            ev_dev.append(dd)
            ev_time.append(s)
            ev_delta.append(nbytes[v])
            ev_prio.append(1)
            ev_ins.append(i)
            alloc_at[kd] = s
            ready[kd] = e
            last_read[kd] = e
            link_free[li] = e
            if lk.issue:
                comp_free[sd] += lk.issue
                comp_free[dd] += lk.issue
            transfer_time += dur
            transfer_bytes += nbytes[v]
            if accel[sd] and not accel[dd]:
                swap_out += nbytes[v]
            elif accel[dd] and not accel[sd]:
                swap_in += nbytes[v]
        elif t is Free:
            v = index.get(x.node)
            if v is None:
                return fault("unknown-node", f"free of unknown node {x.node!r}", i, x.node, x.device)
            d = dev_index.get(x.device)
            if d is None:
                return fault("unknown-device", f"free of {x.node!r} on unknown device {x.device!r}", i,
                             x.node, x.device)
            key = v * nd + d
            if key not in ready:
                return fault("not-resident", f"free of {x.node!r} on {x.device!r}, where it is not resident", i,
                             x.node, x.device)
            tf = last_read.pop(key)
            if tf < barrier:
                tf = barrier
            zero = zero_read.pop(key, -1.0) == tf
            release(d, tf, nbytes[v], i, zero or alloc_at[key] >= tf)
            del ready[key]
            del alloc_at[key]
            made.pop(key, None)
            start[i] = end[i] = tf
            continue
        elif t is Sync:
            barrier = max_end
            start[i] = end[i] = barrier
            continue
        else:
            return fault("unknown-instruction", f"unknown instruction {x!r}", i)
        start[i] = s
        end[i] = e
        if e > max_end:
            max_end = e

    # memory over time, per device
    dev_arr = np.array(ev_dev, dtype=np.int64)
    time_arr = np.array(ev_time, dtype=np.float64)
    delta_arr = np.array(ev_delta, dtype=np.int64)
    ins_arr = np.array(ev_ins, dtype=np.int64)
    prio = np.array(ev_prio, dtype=np.int8)    # 0 early release, 1 allocation, 2 release in list order
    order = np.lexsort((prio == 2, ins_arr, np.minimum(prio, 1), time_arr, dev_arr))
    dev_arr, time_arr, delta_arr, ins_arr = dev_arr[order], time_arr[order], delta_arr[order], ins_arr[order]
    level = np.cumsum(delta_arr)
    bounds = np.searchsorted(dev_arr, np.arange(nd + 1))
    timeline, peak = {}, {}
    first_over = None
    for d, dev in enumerate(devs):
        lo, hi = bounds[d], bounds[d + 1]
        base = level[lo - 1] if lo > 0 else 0
        lv = level[lo:hi] - base
        timeline[dev.name] = (time_arr[lo:hi], lv)
        peak[dev.name] = int(lv.max()) if hi > lo else 0
        if hi > lo and peak[dev.name] > dev.memory:
            j = int(np.argmax(lv > dev.memory))
            cand = (time_arr[lo + j], int(ins_arr[lo + j]), dev, int(lv[j]))
            if first_over is None or cand[:2] < first_over[:2]:
                first_over = cand
    violation = None
    if first_over is not None:
        tv, i, dev, lvl = first_over
        x = ins[i]
        violation = Violation("over-budget", f"{dev.name} holds {format_size(lvl)} at t={tv:.6g} s, "
                              f"{format_size(lvl - dev.memory)} over its budget of {format_size(dev.memory)} "
                              f"(peak {format_size(peak[dev.name])})", i, getattr(x, "node", None), dev.name,
                              lvl - dev.memory)
    else:
        resident_nodes = {key // nd for key in ready}
        for v in np.flatnonzero(a.required):
            if int(v) not in resident_nodes:
                violation = Violation("missing-result", f"required result {a.ids[v]!r} is not resident on any "
                                      "device at the end", None, a.ids[v])
                break
    return _result(violation is None, violation, cluster, max_end, peak, compute_time, recompute_time, recomputed,
                   transfer_time, transfer_bytes, swap_out, swap_in, busy, start, end, timeline)


def _result(valid, violation, cluster, makespan, peak, compute_time, recompute_time, recomputed, transfer_time,
            transfer_bytes, swap_out, swap_in, busy, start, end, timeline) -> SimResult:
    names = [d.name for d in cluster.devices]
    return SimResult(valid=valid, violation=violation, makespan=makespan,
                     peak={n: peak.get(n, 0) for n in names}, budget={d.name: d.memory for d in cluster.devices},
                     compute_time=compute_time, recompute_time=recompute_time, recomputed=recomputed,
                     transfer_time=transfer_time, transfer_bytes=transfer_bytes, swap_out_bytes=swap_out,
                     swap_in_bytes=swap_in, busy=dict(zip(names, busy, strict=True)), start=start, end=end,
                     timeline=timeline)
