"""Device placement: ParDNN-style partitioning and Baechi's m-ETF.

Both return `place` (device position per node, into `cluster.devices`); the
list scheduler turns a placement into a program order and estimated start
times that the memory planner (memplan.py) consumes.

ParDNN (after Koc University's ParDNN, 2020):
1. top level tl(v) = max over parents u of tl(u) + w(u) + c(u, v) and bottom
   level bl(v) = w(v) + max over children s of c(v, s) + bl(s), with c the
   transfer time of v's output between two devices;
2. primary clusters: the heaviest remaining path (by bl), one per device;
3. secondary clusters: linear chains grown from the remaining nodes in tl
   order, each mapped to the device that minimises (delay from the load
   already there in the chain's time span) - (communication saved);
4. sources (inputs, parameters) go to the device of their first reader (by
   tl), where the memory planner makes them when that reader runs;
5. memory pass: list-schedule, build each device's memory over time
   (everything kept until its last reader), and while a device overflows move
   the nodes live at its peak with the best (communication added)/(memory
   freed) ratio to the device with the lowest peak.
What remains over budget is the memory planner's to evict.

All loops run over Python lists built from the CSR arrays of `graph.arrays`.
"""

from __future__ import annotations

import heapq

import numpy as np

from ..cluster import Cluster
from ..errors import InfeasibleError
from ..graph import Graph, operation_memory

# ------------------------------------------------------------------ costs

def placement_devices(graph: Graph, cluster: Cluster, max_devices: int | None = None) -> list[int]:
    """Accelerators (at most `max_devices`), else every device."""
    acc = [i for i, d in enumerate(cluster.devices) if d.kind == "cuda"]
    if not acc:
        acc = list(range(len(cluster.devices)))
    if max_devices is not None:
        acc = acc[:max(1, int(max_devices))]
    return acc


def first_readers(graph: Graph, key) -> tuple[np.ndarray, np.ndarray]:
    """The sources that something reads (nodes without inputs: inputs,
    parameters), ascending, and for each its reader with the smallest `key`.
    A source costs nothing and waits for nothing, so it is best made where and
    when that reader runs."""
    a = graph.arrays
    n = len(a.ids)
    src = (np.diff(a.out_ptr) > 0) & (np.diff(a.in_ptr) == 0)
    owner = np.repeat(np.arange(n), np.diff(a.out_ptr))
    sel = src[owner]
    o, c = owner[sel], a.out_idx[sel]
    k = np.lexsort((np.asarray(key)[c], o))
    o, c = o[k], c[k]
    first = np.flatnonzero(np.r_[True, o[1:] != o[:-1]]) if o.size else o
    return o[first], c[first]


def comm_model(cluster: Cluster, devs: list[int]) -> tuple[float, float]:
    """(latency, seconds per byte) of moving a tensor between two placement
    devices: a direct link if there is one, else two hops through the host."""
    names = [d.name for d in cluster.devices]
    if len(devs) < 2:
        return 0.0, 0.0
    a, b = names[devs[0]], names[devs[1]]
    lk = cluster.link(a, b)
    if lk is not None:
        return lk.latency, 1.0 / lk.bandwidth
    best = None
    for h in cluster.devices:
        l1, l2 = cluster.link(a, h.name), cluster.link(h.name, b)
        if l1 and l2:
            c = (l1.latency + l2.latency, 1.0 / l1.bandwidth + 1.0 / l2.bandwidth)
            if best is None or c[1] < best[1]:
                best = c
    return best if best is not None else (1.0, 1e-6)


def work_costs(graph: Graph, cluster: Cluster, devs: list[int]) -> np.ndarray:
    """Seconds per node on the placement devices (mean over runnable ones)."""
    a = graph.arrays
    acc = np.zeros(len(a.ids))
    cnt = np.zeros(len(a.ids))
    for d in devs:
        dev = cluster.devices[d]
        c = a.cost.get(dev.kind)
        if c is None:
            continue
        ok = ~np.isnan(c)
        acc[ok] += c[ok] / dev.speed
        cnt[ok] += 1
    w = np.where(cnt > 0, acc / np.maximum(cnt, 1), 0.0)
    for c in a.cost.values():   # nodes that no placement device can run
        miss = (cnt == 0) & ~np.isnan(c)
        w[miss] = c[miss]
    return w


def runnable_mask(graph: Graph, cluster: Cluster) -> np.ndarray:
    """(devices x nodes) bool: node can run on device."""
    a = graph.arrays
    m = np.zeros((len(cluster.devices), len(a.ids)), dtype=bool)
    for d, dev in enumerate(cluster.devices):
        c = a.cost.get(dev.kind)
        if c is not None:
            m[d] = ~np.isnan(c)
    return m


def placeable_mask(graph: Graph, cluster: Cluster, fit: bool = True) -> np.ndarray:
    """(devices x nodes) bool: node can run on device and, with `fit`, its
    working set (`operation_memory`) fits the device's budget, so an op too
    big for every accelerator goes to the host; where no device passes both,
    every device that can run it (the memory planner then says what does not
    fit)."""
    m = runnable_mask(graph, cluster)
    if not fit:
        return m
    fit = m & (operation_memory(graph)[None, :] <= np.array([d.memory for d in cluster.devices])[:, None])
    fits_somewhere = fit.any(axis=0)
    return np.where(fits_somewhere[None, :], fit, m)


def levels(graph: Graph, w: np.ndarray, comm: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Top and bottom levels with communication (ParDNN's tl and bl)."""
    a = graph.arrays
    topo = a.topo.tolist()
    in_ptr, in_idx = a.in_ptr.tolist(), a.in_idx.tolist()
    out_ptr, out_idx = a.out_ptr.tolist(), a.out_idx.tolist()
    wl, cl = w.tolist(), comm.tolist()
    n = len(topo)
    tl = [0.0] * n
    for v in topo:
        best = 0.0
        for j in range(in_ptr[v], in_ptr[v + 1]):
            u = in_idx[j]
            x = tl[u] + wl[u] + cl[u]
            if x > best:
                best = x
        tl[v] = best
    bl = [0.0] * n
    for v in reversed(topo):
        best = -1.0
        for j in range(out_ptr[v], out_ptr[v + 1]):
            x = bl[out_idx[j]]
            if x > best:
                best = x
        bl[v] = wl[v] + (cl[v] + best if best >= 0 else 0.0)
    return np.array(tl), np.array(bl)


# ---------------------------------------------------------- list schedule

def list_schedule(graph: Graph, cluster: Cluster, place, w_dev=None, comm=None, priority=None):
    """Start times of every node under `place`, one compute stream per device,
    nodes taken in order of `priority` (a topological key, default tl) and
    transfers charged `comm[u]` when producer and consumer differ.
    Returns (order, start, end)."""
    a = graph.arrays
    n = len(a.ids)
    place = np.asarray(place, dtype=np.int64)
    if w_dev is None:
        w_dev = node_time_on(graph, cluster, place)
    if comm is None:
        comm = np.zeros(n)
    rank = np.empty(n, dtype=np.int64)
    rank[a.topo] = np.arange(n)
    if priority is None:
        seq = a.topo.tolist()
    else:
        seq = np.lexsort((rank, priority)).tolist()
    in_ptr, in_idx = a.in_ptr.tolist(), a.in_idx.tolist()
    pl, wl, cl = place.tolist(), w_dev.tolist(), comm.tolist()
    free = [0.0] * len(cluster.devices)
    start = [0.0] * n
    end = [0.0] * n
    for v in seq:
        d = pl[v]
        s = free[d]
        for j in range(in_ptr[v], in_ptr[v + 1]):
            u = in_idx[j]
            r = end[u] + (cl[u] if pl[u] != d else 0.0)
            if r > s:
                s = r
        start[v] = s
        e = s + wl[v]
        end[v] = e
        free[d] = e
    start_a, end_a = np.array(start), np.array(end)
    order = np.lexsort((rank, start_a))
    return order, start_a, end_a


def node_time_on(graph: Graph, cluster: Cluster, place) -> np.ndarray:
    a = graph.arrays
    place = np.asarray(place, dtype=np.int64)
    t = np.zeros(len(a.ids))
    for d, dev in enumerate(cluster.devices):
        m = place == d
        if not m.any():
            continue
        c = a.cost.get(dev.kind)
        if c is None or np.isnan(c[m]).any():
            raise InfeasibleError(f"a node placed on {dev.name!r} cannot run on a {dev.kind} device")
        t[m] = c[m] / dev.speed
    return t


def memory_profile(graph: Graph, place, start, end, nd: int):
    """Keep-until-last-reader memory of a list schedule: per device the peak,
    the time of the peak, and per node the interval it occupies on its device."""
    a = graph.arrays
    n = len(a.ids)
    place = np.asarray(place, dtype=np.int64)
    src, reader = first_readers(graph, start)
    start, end = start.copy(), end.copy()
    start[src] = end[src] = start[reader]    # the planner makes a source just before its first reader
    owner = np.repeat(np.arange(n), np.diff(a.out_ptr))
    cons = a.out_idx
    horizon = float(end.max()) if n else 0.0
    # on the producer's device: until the last consumer ends (or forever if required / unread)
    last = end.copy()
    if cons.size:
        np.maximum.at(last, owner, end[cons])
    last[a.required] = horizon
    ev_dev = [place]
    ev_t = [start]
    ev_d = [a.bytes + a.workspace]
    ev_dev.append(place)
    ev_t.append(end)
    ev_d.append(-a.workspace)
    ev_dev.append(place)
    ev_t.append(np.where(a.required, np.inf, last))
    ev_d.append(-a.bytes)
    # on remote consumers' devices: from the producer's end until the last reader there ends
    if cons.size:
        remote = place[cons] != place[owner]
        if remote.any():
            key = owner[remote] * nd + place[cons[remote]]
            uk, inv = np.unique(key, return_inverse=True)
            lst = np.zeros(uk.size)
            np.maximum.at(lst, inv, end[cons[remote]])
            u = uk // nd
            ev_dev += [uk % nd, uk % nd]
            ev_t += [end[u], lst]
            ev_d += [a.bytes[u], -a.bytes[u]]
    dv = np.concatenate(ev_dev)
    tv = np.concatenate(ev_t)
    dl = np.concatenate(ev_d).astype(np.int64)
    o = np.lexsort((dl, tv, dv))        # releases before allocations at the same instant
    dv, tv, dl = dv[o], tv[o], dl[o]
    lvl = np.cumsum(dl)
    bounds = np.searchsorted(dv, np.arange(nd + 1))
    peak = np.zeros(nd, dtype=np.int64)
    peak_t = np.zeros(nd)
    for d in range(nd):
        lo, hi = bounds[d], bounds[d + 1]
        if hi > lo:
            base = lvl[lo - 1] if lo > 0 else 0
            seg = lvl[lo:hi] - base
            k = int(np.argmax(seg))
            peak[d], peak_t[d] = int(seg[k]), tv[lo + k]
    return peak, peak_t, last


def _placement_inputs(graph: Graph, cluster: Cluster, devs: list[int] | None, fit: bool):
    """What both placements start from: the devices to place on (default: all
    that can compute), which node runs where, and the communication model."""
    if devs is None:
        devs = placement_devices(graph, cluster)
    lat, spb = comm_model(cluster, devs)
    return devs, placeable_mask(graph, cluster, fit), lat, spb


# ----------------------------------------------------------------- ParDNN

def pardnn(graph: Graph, cluster: Cluster, devs: list[int] | None = None, *, memory_rounds: int = 6,
           buckets: int = 256, fit: bool = True):
    """ParDNN placement on the devices `devs`; with `fit`, ops whose working set
    exceeds every placement device's budget go where it fits (the host).
    Returns (place, order, start)."""
    a = graph.arrays
    n = len(a.ids)
    nd = len(cluster.devices)
    devs, runnable, lat, spb = _placement_inputs(graph, cluster, devs, fit)
    w = work_costs(graph, cluster, devs)
    comm = lat + a.bytes * spb
    tl, bl = levels(graph, w, comm)
    K = len(devs)
    in_ptr, in_idx = a.in_ptr.tolist(), a.in_idx.tolist()
    out_ptr, out_idx = a.out_ptr.tolist(), a.out_idx.tolist()
    topo = a.topo.tolist()
    wl, cl = w.tolist(), comm.tolist()
    place = [-1] * n

    # nodes no placement device can run go to a device that can (the host)
    can_any = runnable[devs].any(axis=0)
    for v in np.flatnonzero(~can_any).tolist():
        ok = np.flatnonzero(runnable[:, v])
        if ok.size == 0:
            raise InfeasibleError(f"node {a.ids[v]!r} cannot run on any device of the cluster")
        place[v] = int(ok[0])

    # primary clusters: heaviest remaining path per device
    if K > 1:
        for k in range(K):
            blr = [0.0] * n
            for v in reversed(topo):
                if place[v] >= 0:
                    continue
                best = -1.0
                for j in range(out_ptr[v], out_ptr[v + 1]):
                    s = out_idx[j]
                    if place[s] < 0 and blr[s] > best:
                        best = blr[s]
                blr[v] = wl[v] + (cl[v] + best if best >= 0 else 0.0)
            free_nodes = [v for v in range(n) if place[v] < 0]
            if not free_nodes:
                break
            v = max(free_nodes, key=lambda x: blr[x])
            d = devs[k]
            while v >= 0:
                place[v] = d if runnable[d, v] else next(e for e in devs if runnable[e, v])
                nxt, best = -1, -1.0
                for j in range(out_ptr[v], out_ptr[v + 1]):
                    s = out_idx[j]
                    if place[s] < 0 and blr[s] > best:
                        nxt, best = s, blr[s]
                v = nxt

    # secondary clusters: linear chains in tl order, mapped by load and communication
    span = float((tl + w).max()) if n else 1.0
    span = span if span > 0 else 1.0
    scale = buckets / span
    load = {d: [0.0] * (buckets + 1) for d in devs}
    for v in range(n):
        if place[v] in load:
            load[place[v]][min(buckets, int(tl[v] * scale))] += wl[v]
    tll = tl.tolist()
    for v0 in np.argsort(tl, kind="stable").tolist():
        if place[v0] >= 0:
            continue
        chain = [v0]
        place[v0] = -2
        v = v0
        while True:
            nxt, best = -1, -1.0
            for j in range(out_ptr[v], out_ptr[v + 1]):
                s = out_idx[j]
                if place[s] == -1 and bl[s] > best:
                    nxt, best = s, bl[s]
            if nxt < 0:
                break
            chain.append(nxt)
            place[nxt] = -2
            v = nxt
        talk = {d: 0.0 for d in devs}
        work = 0.0
        for v in chain:
            work += wl[v]
            for j in range(in_ptr[v], in_ptr[v + 1]):
                p = place[in_idx[j]]
                if p in talk:
                    talk[p] += cl[in_idx[j]]
            for j in range(out_ptr[v], out_ptr[v + 1]):
                p = place[out_idx[j]]
                if p in talk:
                    talk[p] += cl[v]
        lo = min(buckets, int(tll[chain[0]] * scale))
        hi = min(buckets, int((tll[chain[-1]] + wl[chain[-1]]) * scale))
        length = (hi - lo + 1) / scale
        best_d, best_s = None, None
        for d in devs:
            if not all(runnable[d, v] for v in chain):
                continue
            busy = sum(load[d][lo:hi + 1])
            delay = max(0.0, busy + work - length)
            s = delay - talk[d]
            if best_s is None or s < best_s:
                best_d, best_s = d, s
        if best_d is None:
            for v in chain:
                place[v] = next(e for e in range(nd) if runnable[e, v])
            continue
        for v in chain:
            place[v] = best_d
            load[best_d][min(buckets, int(tll[v] * scale))] += wl[v]

    place_a = np.array(place, dtype=np.int64)
    rank = np.empty(n, dtype=np.int64)
    rank[a.topo] = np.arange(n)
    src, reader = first_readers(graph, np.lexsort((rank, tl)).argsort())
    to = place_a[reader]
    ok = runnable[to, src]
    place_a[src[ok]] = to[ok]           # before the memory pass, which may still move them for room
    place_a = memory_pass(graph, cluster, place_a, devs, comm, tl, rounds=memory_rounds, fit=fit)
    order, start, _ = list_schedule(graph, cluster, place_a, comm=comm, priority=tl)
    return place_a, order, start


def memory_pass(graph: Graph, cluster: Cluster, place: np.ndarray, devs: list[int], comm: np.ndarray,
                tl: np.ndarray, rounds: int = 6, fit: bool = True) -> np.ndarray:
    """Move nodes live at an overflowing device's peak to the device with the
    lowest peak, best (communication added)/(memory freed) first."""
    a = graph.arrays
    nd = len(cluster.devices)
    budget = np.array([d.memory for d in cluster.devices], dtype=np.int64)
    runnable = placeable_mask(graph, cluster, fit)
    in_ptr, in_idx = a.in_ptr, a.in_idx
    out_ptr, out_idx = a.out_ptr, a.out_idx
    place = place.copy()
    if len(devs) < 2:
        return place
    for _ in range(rounds):
        _, start, end = list_schedule(graph, cluster, place, comm=comm, priority=tl)
        peak, peak_t, last = memory_profile(graph, place, start, end, nd)
        over = [d for d in devs if peak[d] > budget[d]]
        if not over:
            break
        moved = False
        for d in sorted(over, key=lambda d: budget[d] - peak[d]):
            need = int(peak[d] - budget[d])
            t = peak_t[d]
            live = np.flatnonzero((place == d) & (start <= t) & (last >= t) & (a.bytes > 0))
            if live.size == 0:
                continue
            # communication added by moving v away from d: edges to d become remote, edges to the target local
            ratios = np.empty(live.size)
            for k, v in enumerate(live.tolist()):
                added = 0.0
                for j in range(in_ptr[v], in_ptr[v + 1]):
                    if place[in_idx[j]] == d:
                        added += comm[in_idx[j]]
                for j in range(out_ptr[v], out_ptr[v + 1]):
                    if place[out_idx[j]] == d:
                        added += comm[v]
                ratios[k] = added / a.bytes[v]
            freed = 0
            peaks = {e: int(peak[e]) for e in devs if e != d}
            for k in np.argsort(ratios, kind="stable").tolist():
                if freed >= need:
                    break
                v = int(live[k])
                if place[v] != d:
                    continue
                # v with its chain of sole consumers, so v's output does not come back to d
                group = [v]
                while len(group) < 32:
                    u = group[-1]
                    if out_ptr[u + 1] - out_ptr[u] != 1:
                        break
                    c = int(out_idx[out_ptr[u]])
                    if place[c] != d or in_ptr[c + 1] - in_ptr[c] != 1:
                        break
                    group.append(c)
                cands = [e for e in peaks if runnable[e, group].all() and peaks[e] + a.bytes[v] <= budget[e]]
                if not cands:
                    continue
                e = min(cands, key=lambda x: peaks[x])
                place[group] = e
                peaks[e] += int(a.bytes[v])
                freed += int(a.bytes[v])
                moved = True
        if not moved:
            break
    return place


# ------------------------------------------------------------------ m-ETF

def metf(graph: Graph, cluster: Cluster, devs: list[int] | None = None, *, fit: bool = True):
    """Baechi's m-ETF: repeatedly schedule the ready (op, device) pair with the
    earliest start among devices where the op's output still fits (memory =
    outputs kept until their last reader is placed); if none fits, the
    device with the most room. Sources (inputs, parameters) are placed with
    their first reader, as Baechi co-places a variable with its readers.
    `fit` as in `pardnn`. Returns (place, order, start)."""
    a = graph.arrays
    n = len(a.ids)
    nd = len(cluster.devices)
    devs, runnable, lat, spb = _placement_inputs(graph, cluster, devs, fit)
    comm = (lat + a.bytes * spb).tolist()
    budget = [d.memory for d in cluster.devices]
    speed = [d.speed for d in cluster.devices]
    costs = [None if a.cost.get(d.kind) is None else a.cost[d.kind].tolist() for d in cluster.devices]
    in_ptr, in_idx = a.in_ptr.tolist(), a.in_idx.tolist()
    out_ptr, out_idx = a.out_ptr.tolist(), a.out_idx.tolist()
    nbytes = a.bytes.tolist()
    required = a.required.tolist()
    source = np.diff(a.in_ptr) == 0
    owner = np.repeat(np.arange(n), np.diff(a.in_ptr))
    # sources that something reads are placed with their first reader, so they do not count as its inputs
    indeg = (np.diff(a.in_ptr) - np.bincount(owner, weights=source[a.in_idx], minlength=n)).astype(int).tolist()
    left = np.diff(a.out_ptr).tolist()      # consumers not yet placed
    waits = (source & (np.diff(a.out_ptr) > 0)).tolist()
    place = [-1] * n
    end = [0.0] * n
    start = [0.0] * n
    free = [0.0] * nd
    mem = [0] * nd
    seq: list[int] = []
    devs_all: dict[int, list[int]] = {}   # filled lazily

    def options(v):
        ds = devs_all.get(v)
        if ds is None:
            ds = [d for d in devs if runnable[d, v]] or [d for d in range(nd) if runnable[d, v]]
            if not ds:
                raise InfeasibleError(f"node {a.ids[v]!r} cannot run on any device of the cluster")
            devs_all[v] = ds
        return ds

    def source_device(u, d):
        """Where a source read first by a node on d is made: d if it can run there."""
        return d if runnable[d, u] else options(u)[0]

    def best(v):
        ready_in = []
        srcs = []
        for j in range(in_ptr[v], in_ptr[v + 1]):
            u = in_idx[j]
            if place[u] >= 0:
                ready_in.append((end[u], comm[u], place[u]))
            else:
                srcs.append(u)
        cand = None
        fallback = None
        for d in options(v):
            s = free[d]
            for (e, c, p) in ready_in:
                r = e + (c if p != d else 0.0)
                if r > s:
                    s = r
            need = nbytes[v]
            for u in srcs:
                e = source_device(u, d)
                r = free[e] + costs[e][u] / speed[e] + (comm[u] if e != d else 0.0)
                if e == d:
                    need += nbytes[u]
                    r = s + costs[d][u] / speed[d]
                if r > s:
                    s = r
            key = (s, d)
            room = budget[d] - mem[d] - need
            if room >= 0 and (cand is None or key < cand):
                cand = key
            if fallback is None or room > fallback[0]:
                fallback = (room, s, d)
        if cand is None:
            cand = (fallback[1], fallback[2])
        return cand

    def put(v, d, s):
        place[v] = d
        start[v] = s
        end[v] = free[d] = s + costs[d][v] / speed[d]
        seq.append(v)
        if left[v] > 0 or required[v]:
            mem[d] += nbytes[v]

    heap = []
    for v in range(n):
        if indeg[v] == 0 and not waits[v]:
            s, d = best(v)
            heapq.heappush(heap, (s, v, d))
    while heap:
        s, v, d = heapq.heappop(heap)
        s2, d2 = best(v)
        if (s2, d2) != (s, d) and heap and s2 > heap[0][0]:
            heapq.heappush(heap, (s2, v, d2))
            continue
        s, d = s2, d2
        for j in range(in_ptr[v], in_ptr[v + 1]):
            u = in_idx[j]
            if place[u] < 0:
                e = source_device(u, d)
                put(u, e, free[e])
        put(v, d, max(s, free[d]))
        for j in range(in_ptr[v], in_ptr[v + 1]):
            u = in_idx[j]
            left[u] -= 1
            if left[u] == 0 and not required[u]:
                mem[place[u]] -= nbytes[u]
        for j in range(out_ptr[v], out_ptr[v + 1]):
            x = out_idx[j]
            indeg[x] -= 1
            if indeg[x] == 0:
                s3, d3 = best(x)
                heapq.heappush(heap, (s3, x, d3))
    start_a = np.array(start)
    rank = np.empty(n, dtype=np.int64)
    rank[np.array(seq, dtype=np.int64)] = np.arange(n)
    order = np.lexsort((rank, start_a))
    return np.array(place, dtype=np.int64), order, start_a
