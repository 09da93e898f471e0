"""Memory planner: turn a placed, ordered graph into a valid schedule.

Input: a device per node (`place`), a global program order of first
computations (topological), and estimated start times. Sources (inputs and
parameters: no inputs of their own) are made just before their first reader,
not where the order lists them, since holding them earlier only takes memory
(the placements put them on that reader's device). The planner walks the
order and emits computes, cross-device copies (routed through the host when
two devices share no link) and frees after the last use. When a device would
overflow it evicts tensors:

- policy "capuchin" (Capuchin / SwapAdvisor): swap to host when the transfer
  hides behind the computation until the next use, else drop for
  recomputation ranked by seconds of recompute per byte freed, else swap
  anyway; the swap-out is issued right after the tensor's last access, not
  when the room is needed, so it overlaps the computation in between, and a
  swapped tensor gets a prefetch placed early enough to hide it;
- policy "dtr" (DTR): drop the tensor with the least cost/(bytes * staleness),
  recompute on demand (no swapping unless a tensor cannot be recomputed).

Under both, a backward value (a gradient) is dropped while its inputs are
resident, and an input of a dropped backward value that may still be read is
not dropped (`chained`), unless nothing else can go: a dropped gradient stays
one computation away from what is resident. Otherwise gradients dropped one by
one, each cheap while the next was resident, chain, and a backward operation
needs the backward pass behind it again, its forward inputs held for it, until
nothing is left to evict (ResNet-50 at 30% of its keep-everything memory on one
accelerator without swapping: neither policy found a schedule; the heuristic's
is now 1.65x keep-everything's step time, DTR's 2.11x). Eviction paths depend on
the order of drops, so `plan` plans again without the deferral where it ends
with no room.

A recomputation takes its inputs in their order, or (`deep_first`) the one with
the most to recompute first, as Sethi and Ullman order a tree's evaluation: an
input recomputed first is held while the others are (GPT-2's GELU, x * 0.5
beside tanh(...) of x, five 2 MB values deep: at 30% of its keep-everything
memory DTR has a plan only this way). `plan` tries the variants in turn
(`VARIANTS`); the solvers (`heuristics._checked`) make all four plans on graphs
of up to 20,000 operations and keep the fastest.

When an accelerator cannot make room for an operation (its inputs, output
and workspace beside what must stay: tensors that cannot be recomputed
without swapping, a recomputation's protected inputs), and swapping is on,
the operation runs on the host instead (unless `host_fallback` is off, as
for the one-accelerator solvers): its inputs are copied there and its
output goes back when read, as for any cross-device edge. The host's RAM is
usually far larger, so the plan succeeds where it would otherwise give up.

Forced offload (vDNN) swaps the listed tensors out after their last forward
use and prefetches them one computation ahead of their next use.

The memory model is conservative with respect to the simulator's stream
timing (simulate.py), so what the planner accepts the simulator accepts:
- a compute allocates at its list position (one compute stream per device);
- a copy into d may start as early as the last `sync`, so it is counted from
  the last sync on (`peak_since[d] + bytes <= budget`); an early swap-out
  (issued before the current position) is counted against the highest level
  its destination has had so far (`top[d]`);
- a free is immediate only when every reader of the tensor on d so far was a
  compute on d that the next compute waits for; a tensor read by a copy (or
  that arrived by a copy and was not read since) is released at the next
  `sync`, which the planner inserts when the pending bytes are needed.
Hot loops use Python lists of ints built from the CSR arrays of `graph.arrays`.
"""

from __future__ import annotations

import random
from bisect import bisect_left

import numpy as np

from ..cluster import Cluster
from ..errors import InfeasibleError
from ..graph import KINDS, Graph, attach_outputs
from ..schedule import Compute, Copy, Free, Instruction, Sync
from ..units import format_size
from .partition import first_readers

_BACKWARD = (KINDS.index("backward"), KINDS.index("optimizer"), KINDS.index("loss"))
_SAMPLE = 24   # eviction candidates examined per eviction when many are resident
_LOOK = 64     # ancestors counted when ordering a recomputation's inputs (`deepest_first`)


def find_host(cluster: Cluster, accel: list[int]) -> int | None:
    """The cpu device linked both ways with the most accelerators (swap space)."""
    best, best_links = None, 0
    names = [d.name for d in cluster.devices]
    for h, dev in enumerate(cluster.devices):
        if dev.kind != "cpu":
            continue
        k = sum(1 for d in accel if d != h and cluster.link(names[d], dev.name) and cluster.link(dev.name, names[d]))
        if k > best_links or (k == best_links and best is None):
            best, best_links = h, k
    return best if best_links > 0 else None


def defer_sources(graph: Graph, order) -> np.ndarray:
    """`order` with each source moved to just before its first reader: it
    holds memory only from then on."""
    order = np.asarray(order, dtype=np.int64)
    pos = np.empty(len(order), dtype=np.int64)
    pos[order] = np.arange(len(order))
    key = pos.astype(np.float64)
    src, reader = first_readers(graph, pos)
    key[src] = pos[reader] - 0.5
    return order[np.argsort(key[order], kind="stable")]


def plan(graph: Graph, cluster: Cluster, place, order, est=None, *, defer_chains: bool | None = None,
         deep_first: bool | None = None, **kw) -> list[Instruction]:
    """Instructions for computing `order` (node positions) with node v on device
    `place[v]`, within every device's budget; with `host_fallback` and `swap`,
    v runs on the host when its device cannot make room for it. Raises
    InfeasibleError when it cannot make room, unproven (the caller asks `nofit.not_found` for a proof, once for all
    the plans it tries: the proof costs more than the plans). Other keyword arguments: `_plan`'s.
    `defer_chains`: drop last what would chain gradients (`chained`), or not; `deep_first`: recompute the input
    with the most to recompute first (`deepest_first`), or take the inputs in their order. None: each way in turn
    (`VARIANTS`; deep_first only where it recomputes) until one has a plan. Eviction paths differ with the order
    of drops: a random 40-operation graph at 70% of its keep-everything memory under DTR has a plan only without
    the deferral; GPT-2 at 30%, one accelerator without swapping, only with the deep inputs first."""
    variants = [v for v in VARIANTS if defer_chains in (None, v["defer_chains"])
                and deep_first in (None, v["deep_first"]) and (kw.get("recompute", True) or not v["deep_first"])]
    first = None
    for v in variants:
        try:
            return _plan(graph, cluster, place, order, est, **v, **kw)
        except InfeasibleError as e:
            first = first or e
    raise first from None


VARIANTS = tuple({"defer_chains": defer, "deep_first": deep} for deep in (False, True) for defer in (True, False))


def _plan(graph: Graph, cluster: Cluster, place, order, est=None, *, policy: str = "capuchin", swap: bool = True,
          recompute: bool = True, offload=None, budget_scale: float = 1.0, lookahead: float = 1.5,
          prefetch: bool = True, prefetch_room: float = 0.9, seed: int = 0,
          host_fallback: bool = True, defer_chains: bool = True, deep_first: bool = False) -> list[Instruction]:
    a = graph.arrays
    n = len(a.ids)
    ids = a.ids
    devs = cluster.devices
    nd = len(devs)
    names = [d.name for d in devs]
    if len(order) != n:
        raise ValueError("order must list every node once")
    place = [int(x) for x in place]
    order = attach_outputs(graph, defer_sources(graph, order)).tolist()
    made_by = a.output_of.tolist()
    made_on = [-1] * n                  # device of each node's latest computation
    pos = [0] * n
    for i, v in enumerate(order):
        pos[v] = i
    if est is None:
        est_order = list(range(n))
    else:
        est = np.asarray(est, dtype=np.float64)
        est_order = np.maximum.accumulate(est[order]).tolist()
    in_ptr, in_idx = a.in_ptr.tolist(), a.in_idx.tolist()
    out_ptr = a.out_ptr.tolist()
    # consumers of each node sorted by program position
    out_sorted = a.out_idx.copy()
    if out_sorted.size:
        owner = np.repeat(np.arange(n), np.diff(a.out_ptr))
        posarr = np.asarray(pos)
        o = np.lexsort((posarr[out_sorted], owner))
        out_sorted = out_sorted[o]
    cons = out_sorted.tolist()
    cons_pos = [pos[c] for c in cons]
    cons_dev = [place[c] for c in cons]
    ptr = out_ptr[:-1].copy()          # first consumer not yet computed
    nbytes, wsp = a.bytes.tolist(), a.workspace.tolist()
    recomp = a.recomputable.tolist()
    required = a.required.tolist()
    kind = a.kind.tolist()
    cdev = []
    for dev in devs:
        c = a.cost.get(dev.kind)
        cdev.append(None if c is None else (c / dev.speed).tolist())
    budget = [int(d.memory * budget_scale) for d in devs]
    accel = [d for d in range(nd) if devs[d].kind == "cuda"]
    host = find_host(cluster, accel or list(range(nd)))
    link = {}
    for lk in cluster.links:
        link[(cluster.device_index[lk.src], cluster.device_index[lk.dst])] = lk
    rng = random.Random(seed)

    res = [bytearray(n) for _ in range(nd)]
    dirty = [bytearray(n) for _ in range(nd)]   # 1: arrived by copy, unread; 2: read by a copy
    dirty_keys: list[tuple[int, int]] = []
    rlist: list[list[int]] = [[] for _ in range(nd)]
    rpos = [[-1] * n for _ in range(nd)]
    last_acc = [[0.0] * n for _ in range(nd)]
    touch = [[0] * n for _ in range(nd)]   # position in `out` after the last instruction using or freeing u on d
    top = [0] * nd                          # highest level of d before the last sync
    early: dict[int, list[Instruction]] = {}   # swap-outs issued before out[k]
    ncopies = [0] * n
    computed = bytearray(n)
    cur = [0] * nd
    peak_since = [0] * nd
    pending = [0] * nd
    out: list[Instruction] = []
    prefetch_at: dict[int, list[tuple[int, int]]] = {}
    offload_set = set() if offload is None else set(int(x) for x in offload)
    state = {"i": 0, "t": 0.0, "sync": -1}
    pc = [0] * n                        # protection counts: inputs of pending computations
    slot: list[int] = []

    # ---------------------------------------------------------------- helpers
    def advance(u: int, i: int) -> int:
        p, end = ptr[u], out_ptr[u + 1]
        while p < end and cons_pos[p] <= i:
            p += 1
        ptr[u] = p
        return p

    def next_use(u: int, d: int, i: int) -> int:
        """Program position of the next first-computation on d reading u, or -1."""
        for p in range(advance(u, i), out_ptr[u + 1]):
            if cons_dev[p] == d:
                return cons_pos[p]
        return -1

    def needed_off(u: int, d: int, i: int) -> bool:
        """A future consumer on another device that does not hold u yet."""
        for p in range(advance(u, i), out_ptr[u + 1]):
            e = cons_dev[p]
            if e != d and not res[e][u]:
                return True
        return False

    def any_future(u: int, i: int) -> bool:
        return advance(u, i) < out_ptr[u + 1]

    # horizon[u]: the last program position that may read u, directly or to
    # recompute a descendant through recomputable nodes (during that step too:
    # its recomputations come before its computation)
    horizon = [-1] * n
    for u in reversed(a.topo.tolist()):
        h = -1
        for p in range(out_ptr[u], out_ptr[u + 1]):
            c = cons[p]
            x = horizon[c] if recomp[c] else cons_pos[p]
            if x < cons_pos[p]:
                x = cons_pos[p]
            if x > h:
                h = x
        horizon[u] = h

    def pinned(u: int, i: int) -> bool:
        """The last copy of a value that cannot be recomputed while a descendant
        may still need recomputing from it, or the last copy of a result."""
        if ncopies[u] > 1:
            return False
        if required[u]:
            return True
        return not recomp[u] and horizon[u] >= i

    def add_res(d: int, u: int) -> None:
        res[d][u] = 1
        ncopies[u] += 1
        if nbytes[u]:              # empty tensors are never worth evicting
            rpos[d][u] = len(rlist[d])
            rlist[d].append(u)

    def drop_res(d: int, u: int) -> None:
        res[d][u] = 0
        ncopies[u] -= 1
        p = rpos[d][u]
        if p < 0:
            return
        lst = rlist[d]
        last = lst.pop()
        if last != u:
            lst[p] = last
            rpos[d][last] = p
        rpos[d][u] = -1

    def set_dirty(d: int, u: int, val: int) -> None:
        if not dirty[d][u]:
            dirty_keys.append((d, u))
        if val > dirty[d][u]:
            dirty[d][u] = val

    def do_sync() -> None:
        if out and type(out[-1]) is Sync:
            return
        state["sync"] = len(out)
        out.append(Sync())
        for d in range(nd):
            if peak_since[d] > top[d]:
                top[d] = peak_since[d]
            cur[d] -= pending[d]
            pending[d] = 0
            peak_since[d] = cur[d]
        for d, u in dirty_keys:
            dirty[d][u] = 0
        dirty_keys.clear()

    def free(u: int, d: int) -> None:
        out.append(Free(ids[u], names[d]))
        touch[d][u] = len(out)
        drop_res(d, u)
        if dirty[d][u]:
            pending[d] += nbytes[u]
        else:
            cur[d] -= nbytes[u]

    def xfer_time(u: int, s: int, t: int) -> float:
        lk = link.get((s, t))
        if lk is None:
            return float("inf")
        return lk.latency + nbytes[u] / lk.bandwidth

    def copy(u: int, s: int, t: int, protect, evict: bool = True, at: int | None = None) -> None:
        """Copy u from s to t; with `at`, issue it before out[at] (an early swap-out)
        if t's highest level so far leaves room for it there."""
        b = nbytes[u]
        hi = max(top[t], peak_since[t]) + b
        if at is not None and (at >= len(out) or hi > budget[t]):
            at = None
        if not make_room(t, b, False, protect, evict):
            raise _NoRoom(t, b)
        x = Copy(ids[u], names[s], names[t])
        if at is None:
            out.append(x)
        else:
            early.setdefault(at, []).append(x)
            top[t] = hi
        add_res(t, u)
        cur[t] += b
        peak_since[t] += b
        if cur[t] > peak_since[t]:
            peak_since[t] = cur[t]
        if at is None or at > state["sync"]:    # before a sync, the copy is done when u is freed
            set_dirty(s, u, 2)
            set_dirty(t, u, 1)
        touch[s][u] = touch[t][u] = len(out) if at is None else at

    def recompute_cost(u: int, d: int) -> float:
        """u's own cost plus that of its inputs that are gone too (DTR's
        evicted neighbourhood, one level deep)."""
        cd = cdev[d]
        c = cd[u] if cd is not None else 1e9
        c = c if c == c else 1e9
        for j in range(in_ptr[u], in_ptr[u + 1]):
            w = in_idx[j]
            if ncopies[w] == 0:
                cw = cd[w] if cd is not None else 1e9
                c += cw if cw == cw else 1e9
        return c

    def releasable(u: int, i: int) -> bool:
        """u (last copy, not recomputable, no reader left) is kept only so that its
        consumers can be recomputed; when all of those that may still be are
        resident, u can go and they stop being recomputable (then they are
        swapped, not dropped): a free instead of a swap-out that may stall."""
        if required[u] or ncopies[u] > 1:
            return False
        return all(ncopies[c] > 0 for c in release_set(u, i))

    def release_set(u: int, i: int) -> list[int]:
        return [c for c in cons[out_ptr[u]:out_ptr[u + 1]] if recomp[c] and horizon[c] >= i]

    def chained(u: int, i: int) -> bool:
        """Dropping u would chain recomputations through the backward pass: u is a backward value whose inputs are
        not all resident, or an input of a dropped backward value that may still be read. Such a drop comes last
        (_LAST), so that dropped gradients stay one computation away from what is resident and a backward operation
        does not need the backward pass behind it again (each step cheap while the next was resident, the chain a
        whole pass long)."""
        if ncopies[u] > 1 or not defer_chains:
            return False
        if kind[u] in _BACKWARD and any(ncopies[in_idx[j]] == 0 for j in range(in_ptr[u], in_ptr[u + 1])):
            return True
        return any(kind[x] in _BACKWARD and ncopies[x] == 0 and computed[x] and horizon[x] >= i
                   for x in cons[out_ptr[u]:out_ptr[u + 1]])

    def victim_score(u: int, d: int, i: int, tnow: float):
        """(category, score, action) -- lower is evicted first; None: not evictable."""
        b = nbytes[u]
        if b == 0:
            return None
        nu = next_use(u, d, i)
        can_swap = swap and host is not None and d != host and (d, host) in link and (host, d) in link
        if nu < 0:
            if not needed_off(u, d, i):
                if not pinned(u, i):
                    return (-1, 0.0, "free")
                if can_swap and releasable(u, i):
                    return (-1, 0.0, "release")
            dist = 1e30
        else:
            dist = max(est_order[nu] - tnow, 1e-12)
        on_host = host is not None and res[host][u]
        can_drop = recompute and recomp[u] and not (required[u] and ncopies[u] <= 1) and not (
            nu < 0 and pinned(u, i))
        if on_host and d != host:
            return (-1, -b * dist, "swap")   # a copy is kept on host: free is enough
        last = can_drop and chained(u, i)     # dropped only when nothing else can go
        can_drop = can_drop and not last
        if policy == "dtr":
            stale = max(tnow - last_acc[d][u], 1e-9)
            if can_drop:
                c = recompute_cost(u, d)
                return (1, (c + 1e-9) / (b * stale), "drop")
            if can_swap:
                tt = xfer_time(u, d, host) + xfer_time(u, host, d)
                return (2, tt / (b * stale), "swap")
            return (_LAST, recompute_cost(u, d) / b, "drop") if last else None
        if can_swap:
            tt = xfer_time(u, d, host) + xfer_time(u, host, d)
            if dist >= tt:
                return (0, -b * dist, "swap")
        if can_drop:
            return (1, recompute_cost(u, d) / b, "drop")
        if can_swap:
            tt = xfer_time(u, d, host) + xfer_time(u, host, d)
            return (2, tt / b, "swap")
        return (_LAST, recompute_cost(u, d) / b, "drop") if last else None

    def evict_one(d: int, protect) -> bool:
        lst = rlist[d]
        if not lst:
            return False
        i, tnow = state["i"], state["t"]
        if len(lst) <= _SAMPLE:
            cand = lst
        else:   # a window at a random offset: cheaper than random.sample, as good here
            k = rng.randrange(len(lst))
            cand = lst[k:k + _SAMPLE]
            if len(cand) < _SAMPLE:
                cand = cand + lst[:_SAMPLE - len(cand)]
        best, best_key = None, None
        for u in cand:
            if pc[u]:
                continue
            key = victim_score(u, d, i, tnow)
            if key is not None and (best_key is None or key[:2] < best_key[:2]):
                best, best_key = u, key
                if key[0] < 0:
                    break
        if (best is None or best_key[0] == _LAST) and len(lst) > _SAMPLE:
            # the sample missed every tensor evictable but as a last resort: look further, from another offset
            k = rng.randrange(len(lst))
            for u in lst[k:] + lst[:k]:
                if pc[u]:
                    continue
                key = victim_score(u, d, i, tnow)
                if key is not None and (best_key is None or key[:2] < best_key[:2]):
                    best, best_key = u, key
                    if key[0] < _LAST:
                        break
        if best is None:
            return False
        u, act = best, best_key[2]
        if act == "release":
            for c in release_set(u, i):
                recomp[c] = False
        if act == "swap":
            if not res[host][u]:
                pc[u] += 1
                try:
                    copy(u, d, host, protect, evict=False, at=max(touch[d][u], touch[host][u]))
                finally:
                    pc[u] -= 1
            free(u, d)
            nu = next_use(u, d, i)
            if prefetch and nu > i + 1:
                schedule_prefetch(u, d, nu, xfer_time(u, host, d))
        else:
            free(u, d)
        return True

    def schedule_prefetch(u: int, d: int, nu: int, tt: float) -> None:
        i = state["i"]
        target = est_order[nu] - lookahead * tt
        pp = bisect_left(est_order, target, i + 1, nu)
        pp = min(max(pp, i + 1), nu)
        prefetch_at.setdefault(pp, []).append((u, d))

    def make_room(d: int, need: int, is_compute: bool, protect, evict: bool = True) -> bool:
        while True:
            level = (cur[d] if is_compute else peak_since[d]) + need
            if level <= budget[d]:
                return True
            after_sync = cur[d] - pending[d] + need
            if after_sync <= budget[d] and (pending[d] > 0 or not is_compute):
                do_sync()
                continue
            if evict and evict_one(d, protect):
                continue
            if after_sync < level:
                do_sync()
                if (cur[d] if is_compute else peak_since[d]) + need <= budget[d]:
                    return True
                if not evict:
                    return False
                continue
            return False

    def runnable(v: int, d: int) -> bool:
        c = cdev[d]
        return c is not None and c[v] == c[v]

    def compute(v: int, d: int, protect) -> None:
        need = nbytes[v] + wsp[v]
        if not make_room(d, need, True, protect):
            raise _NoRoom(d, need)
        out.append(Compute(ids[v], names[d]))
        made_on[v] = d
        cur[d] += need
        if cur[d] > peak_since[d]:
            peak_since[d] = cur[d]
        cur[d] -= wsp[v]
        add_res(d, v)
        computed[v] = 1
        t = state["t"]
        last_acc[d][v] = t
        k = len(out)
        touch[d][v] = k
        for j in range(in_ptr[v], in_ptr[v + 1]):
            u = in_idx[j]
            last_acc[d][u] = t
            touch[d][u] = k
            if dirty[d][u] == 1:
                dirty[d][u] = 0

    def fetch(u: int, d: int, protect, temps) -> None:
        """Make u resident on d: copy it from where it is, or recompute it."""
        if res[d][u]:
            return
        # 1. a resident copy with a direct link
        srcs = [s for s in range(nd) if res[s][u]]
        for s in sorted(srcs, key=lambda s: (s == host,)):
            if (s, d) in link:
                copy(u, s, d, protect)
                return
        if srcs and host is not None and (host, d) in link:
            for s in srcs:
                if (s, host) in link:
                    copy(u, s, host, protect)
                    copy(u, host, d, protect)
                    return
        if srcs and not (recompute and recomp[u]):
            raise InfeasibleError(f"no link path carries {ids[u]!r} from {names[srcs[0]]!r} to {names[d]!r}",
                                  hint="add links between the devices or through the host")
        if not (recomp[u] and computed[u]):
            raise InfeasibleError(f"{ids[u]!r} is needed on {names[d]!r} but no copy of it is left and it may "
                                  "not be recomputed", hint="allow swapping (a host device with links)",
                                  proven=False)
        # 2. recompute, depth first, iteratively
        stack = [(u, False)]
        try:
            recompute_stack(stack, d, protect, temps)
        except _NoRoom:     # the caller may run the reader elsewhere: no protection may stay behind
            for w, expanded in stack:
                if expanded:
                    unprotect_inputs(w)
            raise

    def missing(x: int, d: int) -> int:
        """Bytes that recomputing x on d makes: x and its ancestors not resident there (up to _LOOK of them)."""
        total, seen, todo = 0, {x}, [x]
        while todo and len(seen) <= _LOOK:
            u = todo.pop()
            if res[d][u] or ncopies[u] > 0 or not recomp[u]:
                continue
            total += nbytes[u]
            for j in range(in_ptr[u], in_ptr[u + 1]):
                if in_idx[j] not in seen:
                    seen.add(in_idx[j])
                    todo.append(in_idx[j])
        return total

    def deepest_first(w: int, d: int) -> list[int]:
        """w's inputs; with `deep_first`, the one whose recomputation makes most first (as Sethi and Ullman order
        a tree's evaluation): an input recomputed first is held while the others are, so the long chain goes before
        the short one (GPT-2's GELU: x * 0.5 beside tanh(...) of x, five 2 MB values deep)."""
        ins = in_idx[in_ptr[w]:in_ptr[w + 1]]
        if not deep_first or len(ins) < 2:
            return ins
        return sorted(ins, key=lambda x: -missing(x, d))

    def unprotect_inputs(w: int) -> None:
        for j in range(in_ptr[w], in_ptr[w + 1]):
            pc[in_idx[j]] -= 1

    def recompute_stack(stack, d: int, protect, temps) -> None:
        while stack:
            w, expanded = stack[-1]
            if expanded:
                if not res[d][w]:
                    compute(w, d, protect)
                    temps.append(w)
                stack.pop()
                unprotect_inputs(w)
                continue
            stack.pop()
            if res[d][w]:
                continue
            if not runnable(w, d):
                e = place[w]
                fetch(w, e, protect, temps)
                if (e, d) in link:
                    copy(w, e, d, protect)
                elif host is not None and (e, host) in link and (host, d) in link:
                    if not res[host][w]:
                        copy(w, e, host, protect)
                    copy(w, host, d, protect)
                else:
                    raise InfeasibleError(f"no link path carries {ids[w]!r} to {names[d]!r}")
                continue
            stack.append((w, True))
            for j in range(in_ptr[w], in_ptr[w + 1]):
                pc[in_idx[j]] += 1
            for x in reversed(deepest_first(w, d)):
                if not res[d][x]:
                    if ncopies[x] > 0 or not recomp[x]:
                        fetch(x, d, protect, temps)
                    else:
                        stack.append((x, False))

    def run(v: int, d: int, protect, temps: list[int]) -> None:
        """Fetch v's inputs to d and compute v there; on _NoRoom no input stays protected."""
        for j in range(in_ptr[v], in_ptr[v + 1]):
            pc[in_idx[j]] += 1
        try:
            for x in deepest_first(v, d):
                fetch(x, d, protect, temps)
            for j in range(in_ptr[v], in_ptr[v + 1]):
                if not res[d][in_idx[j]]:   # pragma: no cover - protected inputs are never evicted
                    fetch(in_idx[j], d, protect, temps)
            compute(v, d, protect)
        finally:
            unprotect_inputs(v)

    def move_to(v: int, d: int) -> None:
        """Place v on d from now on: its inputs' next uses and recomputations follow it."""
        place[v] = d
        if not slot:    # in-edge j -> its entry in `cons`, built on the first move
            slot.extend(edge_slots(a, out_sorted).tolist())
        for j in range(in_ptr[v], in_ptr[v + 1]):
            cons_dev[slot[j]] = d

    def release_unneeded(u: int, d: int, i: int) -> None:
        if not res[d][u] or pc[u] or next_use(u, d, i) >= 0:
            return
        if needed_off(u, d, i) or pinned(u, i):
            return
        free(u, d)
        if not any_future(u, i):
            for e in range(nd):
                if res[e][u] and not pinned(u, i):
                    free(u, e)

    # ------------------------------------------------------------ main loop
    try:
        for i, v in enumerate(order):
            state["i"] = i
            state["t"] = est_order[i]
            for (u, d2) in prefetch_at.pop(i, ()):
                if not res[d2][u] and host is not None and res[host][u] and next_use(u, d2, i - 1) >= 0:
                    # prefetch only into free room: syncing or evicting for it thrashes
                    if peak_since[d2] + nbytes[u] <= budget[d2] * prefetch_room or offload_set:
                        if make_room(d2, nbytes[u], False, None, evict=False):
                            copy(u, host, d2, None, evict=False)
            d = place[v]
            if made_by[v] >= 0 and made_on[made_by[v]] != d:    # where the op that makes it ran
                d = made_on[made_by[v]]
                move_to(v, d)
            if not runnable(v, d):
                raise InfeasibleError(f"node {ids[v]!r} is placed on {names[d]!r}, which cannot run it")
            protect = None
            temps: list[int] = []
            tried = [d]
            try:
                run(v, d, protect, temps)
            except _NoRoom:
                # v and what it reads do not fit beside what d must hold: run v on the host instead
                if not (host_fallback and swap) or host is None or d == host or not runnable(v, host) or \
                        made_by[v] >= 0:
                    raise
                move_to(v, host)
                d = host
                tried.append(d)
                run(v, d, protect, temps)
            for e in tried:
                for j in range(in_ptr[v], in_ptr[v + 1]):
                    release_unneeded(in_idx[j], e, i)
                for w in temps:
                    release_unneeded(w, e, i)
            if not any_future(v, i) and not required[v]:
                free(v, d)
            if offload_set:
                for j in range(in_ptr[v], in_ptr[v + 1]):
                    u = in_idx[j]
                    if u in offload_set and res[d][u] and host is not None and d != host:
                        nu = next_use(u, d, i)
                        if nu >= 0 and kind[order[nu]] in _BACKWARD and all(
                                kind[cons[p]] in _BACKWARD for p in range(ptr[u], out_ptr[u + 1])
                                if cons_dev[p] == d):
                            if not res[host][u]:
                                copy(u, d, host, protect, evict=False)
                            free(u, d)
                            prev = nu - 1
                            while prev > i and place[order[prev]] != d:
                                prev -= 1
                            prefetch_at.setdefault(max(prev, i + 1), []).append((u, d))
    except _NoRoom as e:
        d, need = e.args
        raise InfeasibleError(
            f"{names[d]} cannot make room for {format_size(need)}: {format_size(cur[d])} held, "
            f"budget {format_size(budget[d])}, nothing left to evict",
            hint="try the milp or lp-rounding, raise the budget, allow swapping and recomputation, or use more "
                 "devices", proven=False) from None
    if not early:
        return out
    merged: list[Instruction] = []
    for k, x in enumerate(out):
        merged.extend(early.get(k, ()))
        merged.append(x)
    return merged


def edge_slots(a, out_sorted: np.ndarray) -> np.ndarray:
    """For each in-edge u->v (CSR position in `a.in_idx`) the position of the
    same edge among the consumer lists `out_sorted` (u's consumers in the
    slice `a.out_ptr[u]:a.out_ptr[u + 1]`, in any order)."""
    n = len(a.ids)
    key_in = a.in_idx * n + np.repeat(np.arange(n), np.diff(a.in_ptr))
    key_out = np.repeat(np.arange(n), np.diff(a.out_ptr)) * n + out_sorted
    slot = np.empty(key_in.size, dtype=np.int64)
    slot[np.argsort(key_in, kind="stable")] = np.argsort(key_out, kind="stable")
    return slot


_LAST = 3   # eviction category of a drop that `chained` defers: after every other drop and swap


class _NoRoom(Exception):
    pass
