"""Properties of the simulator and the baselines over random graphs, clusters and schedules.

- keep-everything is valid exactly when the budget covers its own peak;
- every corruption of a valid schedule is caught, with the right code, index and node;
- chen-sqrt is valid within its own peak; its peak is at most keep-everything's
  on training graphs without parameters, and at most keep-everything's plus the
  parameters' bytes with them (it can exceed keep-everything's: see
  test_baselines.test_chen_sqrt_counterexample_peak_above_keep_everything);
- the simulator agrees with an independent, naive re-implementation of the
  schedule contract on random multi-device schedules with copies, frees and syncs.
"""

from __future__ import annotations

import math

import numpy as np
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from strategies import (
    big_cluster,
    clusters,
    placed_schedules,
    random_dags,
    seeded_training_graphs,
    sequential_schedules,
    training_graphs,
    with_memory,
)

from optsched.cluster import Cluster, Device
from optsched.graph import Graph, memory_lower_bound
from optsched.schedule import Compute, Copy, Free, Schedule, Sync
from optsched.simulate import simulate
from optsched.solvers import chen_sqrt, keep_everything
from optsched.solvers.baselines import backward_phase

FAST = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
SOME = settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])

any_graph = st.one_of(training_graphs(max_forward=15), seeded_training_graphs(max_forward=25, statistics=True),
                      random_dags(max_nodes=20))
with_backward = st.one_of(training_graphs(max_forward=15), seeded_training_graphs(max_forward=25, statistics=True),
                          random_dags(max_nodes=20).filter(lambda g: any(n.kind in ("backward", "optimizer")
                                                                         for n in g.nodes)))


def peak_of(graph, schedule, device="gpu0"):
    r = simulate(graph, big_cluster(), schedule)
    assert r.valid, r.violation
    return r.peak[device]


# --- keep-everything and budgets ------------------------------------------------------------------

@SOME
@given(g=any_graph, c=clusters(), data=st.data())
def test_keep_everything_valid_iff_budget_covers_its_peak(g, c, data):
    dev = c.accelerators[0].name
    big = with_memory(c, dev, 10**15)
    s = keep_everything(g, big)
    r = simulate(g, big, s)
    assert r.valid, r.violation
    peak = r.peak[dev]
    assert peak >= memory_lower_bound(g)
    assert all(v == 0 for k, v in r.peak.items() if k != dev)
    budget = data.draw(st.integers(peak, peak + 10**6), label="budget >= peak")
    assert simulate(g, with_memory(c, dev, budget), s).valid
    if peak > 0:
        below = data.draw(st.integers(0, peak - 1), label="budget < peak")
        r2 = simulate(g, with_memory(c, dev, below), s)
        v = r2.violation
        assert not r2.valid and v.code == "over-budget" and v.device == dev
        assert 1 <= v.over <= peak - below
        assert isinstance(s.instructions[v.index], Compute) and s.instructions[v.index].node == v.node
        assert r2.peak[dev] == peak                       # the metrics are still reported in full


@SOME
@given(g=any_graph, data=st.data())
def test_sequential_schedules_time_and_memory(g, data):
    """Every node once on one device in any topological order: the makespan is
    the sum of the costs over the speed, the peak at least the lower bound, and
    what stays resident at the end is exactly the required results."""
    speed = data.draw(st.sampled_from([0.5, 1.0, 2.0]))
    c = big_cluster()
    c = Cluster((Device("gpu0", "cuda", 10**15, speed), c.devices[1]), c.links)
    s = data.draw(sequential_schedules(g, "gpu0"))
    r = simulate(g, c, s)
    assert r.valid, r.violation
    total = sum(n.cost["cuda"] for n in g.nodes) / speed
    assert math.isclose(r.makespan, total, rel_tol=1e-9, abs_tol=1e-12)
    assert math.isclose(r.busy["gpu0"], total, rel_tol=1e-9, abs_tol=1e-12)
    assert r.peak["gpu0"] >= memory_lower_bound(g)
    t, lv = r.timeline["gpu0"]
    assert (np.diff(t) >= 0).all() and (lv >= 0).all() and lv.max() == r.peak["gpu0"]
    assert lv[-1] == sum(n.bytes for n in g.nodes if n.required)


# --- corruptions are detected ----------------------------------------------------------------------

def reads(x, node: str, graph: Graph) -> bool:
    """Does instruction x read `node` on gpu0 (or free it there)?"""
    if isinstance(x, Compute):
        return node in graph.node(x.node).inputs
    if isinstance(x, Free):
        return x.node == node
    if isinstance(x, Copy):
        return x.node == node and x.src == "gpu0"
    return False


@SOME
@given(g=any_graph, data=st.data())
def test_dropping_a_compute_is_detected(g, data):
    c = big_cluster()
    ins = list(keep_everything(g, c).instructions)
    i = data.draw(st.sampled_from([k for k, x in enumerate(ins) if isinstance(x, Compute)]), label="dropped")
    v = ins[i].node
    corrupt = ins[:i] + ins[i + 1:]
    r = simulate(g, c, Schedule(tuple(corrupt)))
    assert not r.valid
    first = next((k for k in range(i, len(corrupt)) if reads(corrupt[k], v, g)), None)
    if first is None:
        assert g.node(v).required
        assert (r.violation.code, r.violation.node, r.violation.index) == ("missing-result", v, None)
    else:
        assert (r.violation.code, r.violation.index, r.violation.node, r.violation.device) == \
            ("not-resident", first, corrupt[first].node, "gpu0")


@SOME
@given(g=any_graph, data=st.data())
def test_moving_a_free_before_a_read_is_detected(g, data):
    c = big_cluster()
    ins = list(keep_everything(g, c).instructions)
    pos = {x.node: k for k, x in enumerate(ins) if isinstance(x, Compute)}
    moves = [(j, r) for j, x in enumerate(ins) if isinstance(x, Free)
             for r in range(pos[x.node] + 1, j) if isinstance(ins[r], Compute) and reads(ins[r], x.node, g)]
    assume(moves)
    j, r = data.draw(st.sampled_from(moves), label="free j moved before reader r")
    corrupt = ins[:r] + [ins[j]] + ins[r:j] + ins[j + 1:]
    res = simulate(g, c, Schedule(tuple(corrupt)))
    v = res.violation
    assert (v.code, v.index, v.node, v.device) == ("not-resident", r + 1, ins[r].node, "gpu0")
    assert "not resident" in v.message and repr(ins[j].node) in v.message


@SOME
@given(g=any_graph, data=st.data())
def test_shrinking_the_budget_below_the_peak_is_detected(g, data):
    for solver in (keep_everything, chen_sqrt) if any(n.kind == "backward" for n in g.nodes) else (keep_everything,):
        s = solver(g, big_cluster())
        peak = peak_of(g, s)
        assume(peak > 0)
        budget = data.draw(st.integers(0, peak - 1))
        r = simulate(g, big_cluster(budget), s)
        assert r.violation.code == "over-budget" and r.violation.device == "gpu0"
        assert 1 <= r.violation.over <= peak - budget
        assert simulate(g, big_cluster(peak), s).valid


@SOME
@given(g=any_graph, data=st.data())
def test_duplicating_a_param_compute_is_detected(g, data):
    c = big_cluster()
    ins = list(keep_everything(g, c).instructions)
    params = [k for k, x in enumerate(ins) if isinstance(x, Compute) and g.node(x.node).kind == "param"]
    assume(params)
    c0 = data.draw(st.sampled_from(params), label="param compute")
    p = ins[c0].node
    k = data.draw(st.integers(c0 + 1, len(ins)), label="insert at")
    corrupt = ins[:k] + [Compute(p, "gpu0")] + ins[k:]
    v = simulate(g, c, Schedule(tuple(corrupt))).violation
    still_there = not any(isinstance(x, Free) and x.node == p for x in ins[c0 + 1:k])
    assert (v.code, v.index, v.node, v.device) == \
        ("already-resident" if still_there else "not-recomputable", k, p, "gpu0")


# --- chen-sqrt -------------------------------------------------------------------------------------

@SOME
@given(g=with_backward)
def test_chen_sqrt_valid_within_its_own_peak(g):
    s = chen_sqrt(g, big_cluster())
    peak = peak_of(g, s)
    r = simulate(g, big_cluster(peak), s)
    assert r.valid, r.violation
    assert r.recompute_time >= 0 and r.recomputed <= sum(n.kind == "forward" for n in g.nodes)


@SOME
@given(g=training_graphs(max_forward=25, params=False))
def test_chen_sqrt_peak_at_most_keep_everything_without_params(g):
    assert peak_of(g, chen_sqrt(g, big_cluster())) <= peak_of(g, keep_everything(g, big_cluster()))


@SOME
@given(g=st.one_of(training_graphs(max_forward=25, params=True), seeded_training_graphs(max_forward=40)))
def test_chen_sqrt_peak_at_most_keep_everything_plus_what_it_reads_again(g):
    """A recomputation reads its sources again, and the forward values on its way that no backward operation
    reads, which keep-everything frees during the forward pass; chen-sqrt may hold those (a checkpoint among them)
    beyond keep-everything's peak: at most all of them. (A random 8-layer graph with skip connections whose
    backward pass reads 3 of its 8 activations: 433 kB, against 256 kB and 141 kB of sources, with a 100 kB
    checkpoint that no backward operation reads.)"""
    late = backward_phase(g)
    a = g.arrays
    read_late = np.zeros(len(g), dtype=bool)
    for v in np.flatnonzero(late):
        read_late[a.inputs_of(v)] = True
    again = sum(n.bytes for n, r in zip(g.nodes, read_late, strict=True)
                if n.kind in ("param", "input") or (n.kind == "forward" and not r))
    assert peak_of(g, chen_sqrt(g, big_cluster())) <= peak_of(g, keep_everything(g, big_cluster())) + again


# --- agreement with a naive re-implementation of the contract --------------------------------------

class _Fault(Exception):
    def __init__(self, code, index):
        self.code, self.index = code, index


def reference(graph: Graph, cluster, schedule: Schedule) -> dict:
    """The schedule contract, written out naively and independently of
    optsched.simulate: per-instance records, per-stream clocks, and the peak as
    the maximum over all moments (t, list position) of the bytes allocated and
    not yet released by then. Conventions shared with the simulator: a release
    at t comes before allocations at t unless the value was allocated at t or
    read by a zero-length operation at t; such a release comes right after the
    instruction that causes it, in list order. A free after a sync takes effect
    no earlier than the barrier."""
    devs = {d.name: d for d in cluster.devices}
    links = {(lk.src, lk.dst): lk for lk in cluster.links}
    n = len(schedule.instructions)
    start, end = [math.nan] * n, [math.nan] * n
    clock = {d: 0.0 for d in devs}
    link_clock = dict.fromkeys(links, 0.0)
    barrier = makespan = 0.0
    live = {}                 # (node, device) -> instance
    allocs = []               # [device, bytes, t_alloc, i_alloc, t_release, i_release, late]
    computed = set()
    out = {"compute": 0.0, "recompute": 0.0, "recomputed": 0, "bytes": 0, "out": 0, "in": 0,
           "busy": dict.fromkeys(devs, 0.0)}

    def new_instance(node, dev, t, i, ready):
        rec = [dev, graph.node(node).bytes, t, i, math.inf, None, False]
        allocs.append(rec)
        live[(node, dev)] = {"rec": rec, "ready": ready, "reads": [(ready, ready if ready == t else -1.0)]}

    try:
        for i, x in enumerate(schedule.instructions):
            if isinstance(x, Sync):
                barrier = makespan
                start[i] = end[i] = barrier
                continue
            ids = {nd.id for nd in graph.nodes}
            if x.node not in ids:
                raise _Fault("unknown-node", i)
            nd = graph.node(x.node)
            if isinstance(x, Compute):
                if x.device not in devs:
                    raise _Fault("unknown-device", i)
                d = devs[x.device]
                if d.kind not in nd.cost:
                    raise _Fault("not-runnable", i)
                if (x.node, x.device) in live:
                    raise _Fault("already-resident", i)
                if x.node in computed and not nd.recomputable:
                    raise _Fault("not-recomputable", i)
                s = max(clock[x.device], barrier)
                for u in nd.inputs:
                    if (u, x.device) not in live:
                        raise _Fault("not-resident", i)
                    s = max(s, live[(u, x.device)]["ready"])
                e = s + nd.cost[d.kind] / d.speed
                for u in set(nd.inputs):
                    live[(u, x.device)]["reads"].append((e, s))
                new_instance(x.node, x.device, s, i, e)
                if nd.workspace:
                    allocs.append([x.device, nd.workspace, s, i, e, i, s == e])
                clock[x.device] = e
                out["busy"][x.device] += e - s
                if x.node in computed:
                    out["recompute"] += e - s
                    out["recomputed"] += 1
                else:
                    out["compute"] += e - s
                computed.add(x.node)
            elif isinstance(x, Copy):
                if x.src not in devs or x.dst not in devs:
                    raise _Fault("unknown-device", i)
                if (x.src, x.dst) not in links:
                    raise _Fault("no-link", i)
                if (x.node, x.src) not in live:
                    raise _Fault("not-resident", i)
                if (x.node, x.dst) in live:
                    raise _Fault("already-resident", i)
                lk = links[(x.src, x.dst)]
                src = live[(x.node, x.src)]
                s = max(link_clock[(x.src, x.dst)], barrier, src["ready"])
                e = s + lk.latency + nd.bytes / lk.bandwidth
                src["reads"].append((e, s))
                new_instance(x.node, x.dst, s, i, e)
                link_clock[(x.src, x.dst)] = e
                out["bytes"] += nd.bytes
                ks, kd = devs[x.src].kind, devs[x.dst].kind
                out["out"] += nd.bytes if (ks, kd) == ("cuda", "cpu") else 0
                out["in"] += nd.bytes if (ks, kd) == ("cpu", "cuda") else 0
            else:   # Free
                if x.device not in devs:
                    raise _Fault("unknown-device", i)
                inst = live.pop((x.node, x.device), None)
                if inst is None:
                    raise _Fault("not-resident", i)
                tf = max(max(r[0] for r in inst["reads"]), barrier)
                rec = inst["rec"]
                rec[4], rec[5] = tf, i
                rec[6] = rec[2] == tf or any(r == (tf, tf) for r in inst["reads"])
                start[i] = end[i] = tf
                continue
            start[i], end[i] = s, e
            makespan = max(makespan, e)
    except _Fault as f:
        return {"fault": f.code, "index": f.index, "start": start, "end": end}

    peak = dict.fromkeys(devs, 0)
    for dev in devs:
        mine = [a for a in allocs if a[0] == dev]
        for _, _, t, k, *_ in mine:          # the moment right after allocation k at time t
            level = 0
            for _, b, ta, ia, tr, ir, late in mine:
                allocated = ta < t or (ta == t and ia <= k)
                released = tr < t or (tr == t and (not late or ir < k))
                if allocated and not released:
                    level += b
            peak[dev] = max(peak[dev], level)
    over = any(peak[d] > devs[d].memory for d in devs)
    missing = any(not any(nid == nd.id for nid, _ in live) for nd in graph.nodes if nd.required)
    return {"fault": "over-budget" if over else "missing-result" if missing else None, "index": None,
            "start": start, "end": end, "makespan": makespan, "peak": peak, **out}


def _compare(graph, cluster, schedule):
    r = simulate(graph, cluster, schedule)
    ref = reference(graph, cluster, schedule)
    code = None if r.violation is None else r.violation.code
    assert code == ref["fault"], (r.violation, ref["fault"])
    assert r.valid == (ref["fault"] is None)
    np.testing.assert_allclose(r.start, ref["start"], rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(r.end, ref["end"], rtol=1e-12, atol=1e-15)
    if ref["index"] is not None:
        assert r.violation.index == ref["index"]
        return r
    assert r.peak == ref["peak"]
    assert math.isclose(r.makespan, ref["makespan"], rel_tol=1e-12, abs_tol=1e-15)
    assert math.isclose(r.compute_time, ref["compute"], rel_tol=1e-9, abs_tol=1e-15)
    assert math.isclose(r.recompute_time, ref["recompute"], rel_tol=1e-9, abs_tol=1e-15)
    assert r.recomputed == ref["recomputed"]
    assert (r.transfer_bytes, r.swap_out_bytes, r.swap_in_bytes) == (ref["bytes"], ref["out"], ref["in"])
    for d, b in ref["busy"].items():
        assert math.isclose(r.busy[d], b, rel_tol=1e-9, abs_tol=1e-15)
    return r


@st.composite
def _dag_runnable_somewhere(draw):
    kind = draw(st.sampled_from([("cuda",), ("cpu",), ("cuda", "cpu")]))
    return draw(random_dags(max_nodes=12, runnable_on=kind, max_bytes=1000))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(g=_dag_runnable_somewhere(), c=clusters(memory=st.integers(0, 6000)), data=st.data())
def test_simulator_agrees_with_the_naive_contract(g, c, data):
    s = data.draw(placed_schedules(g, c))
    assume(s is not None)
    _compare(g, c, s)
    big = c
    for d in c.devices:
        big = with_memory(big, d.name, 10**15)
    r = _compare(g, big, s)
    assert r.valid, r.violation                       # placed schedules are valid by construction


@FAST
@given(g=_dag_runnable_somewhere(), c=clusters(), data=st.data())
def test_simulator_agrees_on_mangled_schedules(g, c, data):
    """Random edits (drop, duplicate, swap, retarget) of a valid schedule: the
    simulator and the naive reading agree on the verdict and where it fails."""
    s = data.draw(placed_schedules(g, c))
    assume(s is not None and s.instructions)
    ins = list(s.instructions)
    names = [d.name for d in c.devices] + ["nowhere"]
    for _ in range(data.draw(st.integers(1, 3))):
        k = data.draw(st.integers(0, len(ins) - 1))
        op = data.draw(st.sampled_from(["drop", "dup", "swap", "device", "node"]))
        if op == "drop" and len(ins) > 1:
            del ins[k]
        elif op == "dup":
            ins.insert(data.draw(st.integers(0, len(ins))), ins[k])
        elif op == "swap":
            j = data.draw(st.integers(0, len(ins) - 1))
            ins[k], ins[j] = ins[j], ins[k]
        elif op == "device" and isinstance(ins[k], (Compute, Free)):
            ins[k] = type(ins[k])(ins[k].node, data.draw(st.sampled_from(names)))
        elif op == "device" and isinstance(ins[k], Copy):
            ins[k] = Copy(ins[k].node, ins[k].src, data.draw(st.sampled_from(names)))
        elif op == "node" and not isinstance(ins[k], Sync):
            ins[k] = type(ins[k])(data.draw(st.sampled_from([n.id for n in g.nodes] + ["ghost"])),
                                  *[getattr(ins[k], f) for f in ins[k].__slots__[1:]])
    _compare(g, c, Schedule(tuple(ins)))
