"""Heuristic solvers and baselines: every schedule they return passes the
simulator, or they raise InfeasibleError; known cases behave sensibly."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from optsched.cluster import Cluster, Device, Link, single_accelerator
from optsched.errors import InfeasibleError, OptschedError
from optsched.formats.importers import example_graph_path, import_graph
from optsched.generate import chain_graph, random_training_graph, training_graph
from optsched.graph import KINDS, Graph, Node, check_graph, memory_lower_bound, operation_memory
from optsched.schedule import Compute, Schedule
from optsched.simulate import simulate
from optsched.solvers import SOLVERS, SolveOptions, keep_everything
from optsched.solvers.coarsen import coarsen, expand, solve_coarsened
from optsched.solvers.memplan import plan

HEURISTICS = ["heuristic", "metf", "offload-all", "dtr", "chen-greedy", "articulation"]


def keep_peak(graph) -> int:
    big = single_accelerator(10**15)
    return simulate(graph, big, keep_everything(graph, big)).peak["gpu0"]


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(n=st.integers(2, 24), seed=st.integers(0, 10**6), gpus=st.integers(1, 4),
       frac=st.floats(0.05, 1.3), window=st.integers(1, 4), params=st.booleans())
def test_every_schedule_is_valid_or_infeasible(n, seed, gpus, frac, window, params):
    g = random_training_graph(n, seed, window=window, params=params)
    cl = single_accelerator(max(1, int(keep_peak(g) * frac)), gpus=gpus)
    for name in HEURISTICS:
        try:
            s = SOLVERS[name](g, cl, SolveOptions())
        except InfeasibleError as e:
            assert str(e)
            continue
        r = simulate(g, cl, s)
        assert r.valid, (name, r.violation)
        if s.report.objective is not None:
            assert s.report.objective == pytest.approx(r.makespan)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(n=st.integers(2, 20), seed=st.integers(0, 10**6), gpus=st.integers(2, 4), frac=st.floats(0.2, 1.2))
def test_more_accelerators_never_make_the_heuristic_slower(n, seed, gpus, frac):
    g = random_training_graph(n, seed)
    cl = single_accelerator(max(1, int(keep_peak(g) * frac)), gpus=gpus)
    try:
        one = simulate(g, cl, SOLVERS["heuristic"](g, cl, SolveOptions(devices=1))).makespan
    except InfeasibleError:
        return
    assert simulate(g, cl, SOLVERS["heuristic"](g, cl, SolveOptions())).makespan <= one


def test_the_heuristic_also_plans_in_the_graphs_order_and_keeps_the_faster():
    """bert_l3 at 70% of keep-everything's peak, one accelerator without swapping: planned in the graph's own
    order (as DTR takes it), 143.7 ms with 99 recomputations; in ParDNN's list order, 147.3 ms with 130."""
    g = import_graph(example_graph_path("bert_l3"))
    cl = single_accelerator(int(0.7 * keep_peak(g)))
    both = SOLVERS["heuristic"](g, cl, SolveOptions(swap=False))
    listed = SOLVERS["heuristic"](g, cl, SolveOptions(swap=False, params={"compare_single": False}))
    assert both.report.extra["order"] == "graph" and "order" not in listed.report.extra
    r, r0 = simulate(g, cl, both), simulate(g, cl, listed)
    assert r.valid and r0.valid and r.makespan < r0.makespan
    assert both.report.objective == pytest.approx(r.makespan)


def test_an_operation_only_the_host_runs_leaves_the_plans_on_one_accelerator_out():
    """An operation without a cost on the accelerator: the plans that run everything there (ParDNN's on one
    accelerator, the graph's order, offloading) are left out, and the placement's plan, which runs it on the host,
    stands; before, the graph's order (and with swapping, offloading) refused the whole solve."""
    g = random_training_graph(6, 3)
    nodes = list(g.nodes)
    i = next(k for k, n in enumerate(nodes) if n.kind == "forward" and n.inputs)
    host_only = nodes[i].id
    nodes[i] = replace(nodes[i], cost={"cpu": nodes[i].cost["cpu"]})
    g = Graph(tuple(nodes), name="host-only")
    devs = (Device("gpu0", "cuda", 10**9), Device("host", "cpu", 10**9))
    cl = Cluster(devs, (Link("gpu0", "host", 200.0), Link("host", "gpu0", 200.0)))
    for swap in (False, True):
        s = SOLVERS["heuristic"](g, cl, SolveOptions(swap=swap))
        assert simulate(g, cl, s).valid
        assert any(isinstance(x, Compute) and x.node == host_only and x.device == "host" for x in s.instructions)
        assert "order" not in s.report.extra and s.report.extra.get("variant") != "offload"


def test_more_accelerators_never_make_the_heuristic_slower_on_bert():
    """bert_l3 at 70% of keep-everything's peak on two accelerators: 129.1 ms
    when its one-device candidate was planned in plain topological order,
    126.1 ms held to one accelerator."""
    g = import_graph(example_graph_path("bert_l3"))
    cl = single_accelerator(int(0.7 * keep_peak(g)), gpus=2)
    one = simulate(g, cl, SOLVERS["heuristic"](g, cl, SolveOptions(devices=1))).makespan
    assert simulate(g, cl, SOLVERS["heuristic"](g, cl, SolveOptions())).makespan <= one


@pytest.mark.parametrize("name", HEURISTICS)
def test_ample_memory_needs_no_recomputation(name):
    g = random_training_graph(30, 1)
    cl = single_accelerator(10**12, gpus=2)
    r = simulate(g, cl, SOLVERS[name](g, cl, SolveOptions()))
    assert r.valid and r.recomputed == 0


def test_heuristic_fits_where_keep_everything_does_not():
    g = random_training_graph(60, 3)
    pk = keep_peak(g)
    cl = single_accelerator(int(pk * 0.35), gpus=1)
    assert not simulate(g, cl, keep_everything(g, cl)).valid
    for name in ("heuristic", "offload-all", "metf"):
        r = simulate(g, cl, SOLVERS[name](g, cl, SolveOptions()))
        assert r.valid and r.peak["gpu0"] <= cl.devices[0].memory


@pytest.mark.parametrize("name", ["chen-sqrt", "chen-greedy", "articulation", "dtr", "lp-rounding"])
def test_a_solver_that_recomputes_by_design_refuses_recomputation_off(name):
    # --no-recompute is never silently ignored: dtr and chen-sqrt once returned schedules that recomputed
    g = chain_graph(10)
    cl = single_accelerator(10**9)
    with pytest.raises(OptschedError, match="recomputation off") as e:
        SOLVERS[name](g, cl, SolveOptions(recompute=False))
    assert name in str(e.value) and "--no-recompute" in e.value.hint


def test_offload_all_swaps_every_activation_and_hides_transfers():
    g = chain_graph(20, act_bytes=1_000_000, cost=1e-3)
    cl = single_accelerator(8_000_000)
    s = SOLVERS["offload-all"](g, cl, SolveOptions())
    r = simulate(g, cl, s)
    assert r.valid and r.swap_out_bytes >= 19 * 1_000_000
    base = simulate(g, single_accelerator(10**12), keep_everything(g, single_accelerator(10**12)))
    assert r.makespan <= base.makespan * 1.1      # 1 MB at 16 GB/s hides behind 1 ms layers
    with pytest.raises(OptschedError, match="swapping off") as e:     # --no-swap is never silently ignored
        SOLVERS["offload-all"](g, cl, SolveOptions(swap=False))
    assert not isinstance(e.value, InfeasibleError)


def test_dtr_recomputes_on_a_chain():
    g = chain_graph(20)
    cl = single_accelerator(int(keep_peak(g) * 0.4))
    r = simulate(g, cl, SOLVERS["dtr"](g, cl, SolveOptions()))
    assert r.valid and r.recomputed > 0 and r.transfer_bytes == 0


def near_lower_bound(graph, gpus: int = 1):
    """One accelerator (or more) 5% of the way from the lower bound to keep-everything's peak."""
    lb = memory_lower_bound(graph)
    return single_accelerator(int(lb + 0.05 * (keep_peak(graph) - lb)), gpus=gpus)


def keep_time(graph) -> float:
    big = single_accelerator(10**15)
    return simulate(graph, big, keep_everything(graph, big)).makespan


def test_sources_are_made_where_and_when_first_read():
    """tiny near its lower bound: a weight made at the start would be swapped out
    to make room for the largest operation (25% slower); made when first read
    (and, on two accelerators, where), nothing has to move."""
    g = import_graph(example_graph_path("tiny"))
    for name, gpus in (("heuristic", 1), ("heuristic", 2), ("metf", 1), ("dtr", 1)):
        cl = near_lower_bound(g, gpus=gpus)
        r = simulate(g, cl, SOLVERS[name](g, cl, SolveOptions()))
        assert r.valid and r.makespan == pytest.approx(keep_time(g)), (name, gpus)


def test_swap_outs_overlap_the_computation_before_they_are_needed():
    """gnmt near its lower bound on one accelerator: swap-outs issued right after
    the tensor's last use hide behind the computation (issued when the room was
    needed, the step took 24% longer than keep-everything's)."""
    g = import_graph(example_graph_path("gnmt"))
    cl = near_lower_bound(g)
    r = simulate(g, cl, SOLVERS["heuristic"](g, cl, SolveOptions()))
    assert r.valid and r.makespan <= 1.12 * keep_time(g)


@pytest.mark.parametrize("name", ["chen-greedy", "articulation"])
def test_checkpoint_baselines_on_a_chain(name):
    n = 36
    g = chain_graph(n)
    pk = keep_peak(g)
    # ample memory: nothing recomputed
    cl = single_accelerator(pk)
    r = simulate(g, cl, SOLVERS[name](g, cl, SolveOptions()))
    assert r.valid and r.recomputed == 0
    # tight memory: a few checkpoints, each forward node recomputed at most once
    cl = single_accelerator(int(pk * 0.35))
    s = SOLVERS[name](g, cl, SolveOptions())
    r = simulate(g, cl, s)
    assert r.valid and r.peak["gpu0"] <= cl.devices[0].memory
    assert 0 < r.recomputed < n
    assert 2 <= s.report.extra["checkpoints"] <= n // 2
    # impossible memory: plain refusal
    with pytest.raises(InfeasibleError):
        SOLVERS[name](g, single_accelerator(int(pk * 0.05)), SolveOptions())


def test_infeasible_below_the_largest_operation():
    """Without a host, or without swapping (no copies to the host), nothing runs
    an operation bigger than the budget; with them the host runs it."""
    g = chain_graph(10)
    cl = single_accelerator(500_000)       # one activation is 1 MB
    gpu_only = Cluster(cl.devices[:1])
    for name in HEURISTICS:
        with pytest.raises(InfeasibleError):
            SOLVERS[name](g, gpu_only, SolveOptions())
        # offload-all refuses swapping off as a contradiction, not as a budget too small
        with pytest.raises(OptschedError if name == "offload-all" else InfeasibleError):
            SOLVERS[name](g, cl, SolveOptions(swap=False))
    for name in HEURISTICS:
        if name in ("heuristic", "metf"):
            s = SOLVERS[name](g, cl, SolveOptions())
            r = simulate(g, cl, s)
            assert r.valid and r.peak["gpu0"] <= 500_000
            assert all(x.device == "host" for x in s.instructions if type(x) is Compute and x.node != "x")
        else:   # one accelerator and nothing else
            with pytest.raises(InfeasibleError):
                SOLVERS[name](g, cl, SolveOptions())


# ------------------------------------------------- work the accelerators cannot hold

MB = 1_000_000


def too_big_graph():
    """x -> a -> b(a, w) -> loss: b holds a (4 MB), the weight w (6 MB) and its
    output (1 MB) at once, 11 MB (GNMT's n192: 960 MB on 876 MB GPUs)."""
    c = {"cuda": 1e-3, "cpu": 1e-2}
    z = {"cuda": 0.0, "cpu": 0.0}
    return check_graph(Graph((
        Node("x", "data", "input", (), z, MB, recomputable=False),
        Node("w", "param", "param", (), z, 6 * MB, recomputable=False),
        Node("a", "op", "forward", ("x",), c, 4 * MB),
        Node("b", "op", "forward", ("a", "w"), c, MB),
        Node("loss", "loss", "loss", ("b",), c, 4, required=True),
    ), name="too-big"))


def computes_on(sched, device):
    return {x.node for x in sched.instructions if type(x) is Compute and x.device == device}


@pytest.mark.parametrize("name", ["heuristic", "metf"])
@pytest.mark.parametrize("gpus", [1, 2])
def test_an_operation_too_big_for_every_accelerator_runs_on_the_host(name, gpus):
    g = too_big_graph()
    cl = single_accelerator(8 * MB, gpus=gpus)
    s = SOLVERS[name](g, cl, SolveOptions())
    r = simulate(g, cl, s)
    assert r.valid and all(r.peak[f"gpu{i}"] <= 8 * MB for i in range(gpus))
    assert "b" in computes_on(s, "host") and "a" not in computes_on(s, "host")
    with pytest.raises(InfeasibleError):    # no copies to the host: no way to run b
        SOLVERS[name](g, cl, SolveOptions(swap=False))


def test_the_planner_runs_on_the_host_what_it_cannot_make_room_for():
    """Given a placement that puts everything on the accelerator, the memory
    planner runs b on the host instead of giving up (and gives up without swapping)."""
    g = too_big_graph()
    cl = single_accelerator(8 * MB)
    place = np.zeros(len(g), dtype=np.int64)
    ins = plan(g, cl, place, g.arrays.topo)
    s = Schedule(tuple(ins))
    r = simulate(g, cl, s)
    assert r.valid and r.peak["gpu0"] <= 8 * MB
    assert computes_on(s, "host") == {"b"}
    with pytest.raises(InfeasibleError):
        plan(g, cl, place, g.arrays.topo, swap=False)


def test_consecutive_big_activations_go_to_the_host_and_the_rest_stays():
    """bert_l3's attention scores: f3 and f4 are 50 kB each, so f4 (reads f3)
    and the backward ops around them need 100 kB at once, more than the 80 kB
    GPUs; those run on the host, everything else on the accelerators."""
    act = [1000, 2000, 1000, 50_000, 50_000, 1000, 2000, 1000]
    g = training_graph([[i - 1] for i in range(len(act))], act_bytes=act, cost=[1e-3] * len(act),
                       input_grad=True)
    need = dict(zip(g.arrays.ids, operation_memory(g).tolist(), strict=True))
    cl = single_accelerator(80_000, gpus=2)
    for name in ("heuristic", "metf"):
        s = SOLVERS[name](g, cl, SolveOptions())
        r = simulate(g, cl, s)
        assert r.valid and max(r.peak["gpu0"], r.peak["gpu1"]) <= 80_000
        host = computes_on(s, "host")
        assert {v for v, b in need.items() if b > 80_000} <= host
        assert len(host) <= 6, host    # f4, g3, g4 and what feeds them on the host at most


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(n=st.integers(2, 30), seed=st.integers(0, 10**6), gpus=st.integers(1, 3),
       frac=st.floats(0.01, 1.0), window=st.integers(1, 4))
def test_with_a_host_that_may_compute_the_heuristic_never_gives_up(n, seed, gpus, frac, window):
    """The host holds everything and can run everything: some schedule always
    exists, so the heuristic and m-ETF always return one (and it is valid)."""
    g = random_training_graph(n, seed, window=window)
    cl = single_accelerator(max(1, int(keep_peak(g) * frac)), gpus=gpus)
    for name in ("heuristic", "metf"):
        r = simulate(g, cl, SOLVERS[name](g, cl, SolveOptions()))
        assert r.valid, (name, r.violation)


# ----------------------------------------------------------------- coarsening

def forward_chain_graph(n: int):
    """An inference-like graph: a chain with no backward readers, so it folds."""
    z = {"cuda": 0.0, "cpu": 0.0}
    nodes = [Node("x", "data", "input", (), z, 1000, recomputable=False)]
    prev = "x"
    for i in range(n):
        nodes.append(Node(f"a{i}", "op", "forward", (prev,), {"cuda": 1e-3, "cpu": 1e-2}, 1000 * (1 + i % 3),
                          workspace=100 * (i % 2)))
        prev = f"a{i}"
    nodes.append(Node("out", "loss", "loss", (prev,), {"cuda": 1e-4, "cpu": 1e-3}, 4, required=True))
    return check_graph(Graph(tuple(nodes), name=f"fchain-{n}"))


def test_coarsen_folds_chains_and_expands_to_a_valid_schedule():
    g = forward_chain_graph(40)
    c, m = coarsen(g, max_len=8, max_need=10**9)
    check_graph(c)
    assert len(c) < len(g) // 3
    assert sorted(x for f in m.values() for x in f) == sorted(n.id for n in g.nodes)
    cl = single_accelerator(10**9, gpus=2)
    for name in ("keep-everything", "heuristic", "dtr"):
        coarse_s = SOLVERS[name](c, cl, SolveOptions())
        rc = simulate(c, cl, coarse_s)
        fine = expand(coarse_s, m, g)
        rf = simulate(g, cl, fine)
        assert rf.valid
        assert rf.makespan == pytest.approx(rc.makespan)
        assert max(rf.peak.values()) <= max(rc.peak.values())


def test_coarsen_respects_the_memory_lower_bound():
    g = forward_chain_graph(30)
    from optsched.graph import memory_lower_bound

    c, _ = coarsen(g)
    assert memory_lower_bound(c) <= memory_lower_bound(g)
    # a budget at the fine lower bound stays feasible on the coarse graph
    cl = single_accelerator(memory_lower_bound(g) + 8)
    s = solve_coarsened(g, cl, "dtr")
    assert simulate(g, cl, s).valid


@settings(max_examples=30, deadline=None)
@given(n=st.integers(2, 20), seed=st.integers(0, 10**6), frac=st.floats(0.2, 1.2))
def test_coarse_schedules_expand_valid(n, seed, frac):
    g = random_training_graph(n, seed, window=1, params=False)
    cl = single_accelerator(max(1, int(keep_peak(g) * frac)), gpus=2)
    try:
        s = solve_coarsened(g, cl, "heuristic", max_need=10**12)
    except InfeasibleError:
        return
    assert simulate(g, cl, s).valid


RESNET50 = Path(__file__).resolve().parents[2] / "shared" / "data" / "msr-dnn-partitioning" / "resnet50_training.json"


@pytest.mark.skipif(not RESNET50.is_file(), reason=f"shared MSR graphs not found at {RESNET50.parent}")
@pytest.mark.parametrize("name,frac", [("heuristic", 0.3), ("heuristic", 0.2), ("dtr", 0.3)])
def test_dropped_gradients_stay_one_computation_from_what_is_resident(name, frac):
    # the planner once dropped ResNet-50's gradients one by one, each cheap while the next was resident, until a
    # backward operation needed the backward pass behind it again and nothing was left to evict: no schedule from
    # either policy at 30% on one accelerator without swapping (the MILP fell back on articulation's, 12.4x)
    g = import_graph(RESNET50)
    a = g.arrays
    cl = Cluster((Device("gpu0", "cuda", int(frac * keep_peak(g))),))
    s = SOLVERS[name](g, cl, SolveOptions(swap=False))
    r = simulate(g, cl, s)
    assert r.valid, r.violation
    big = single_accelerator(10**15)
    assert r.makespan < 2.5 * simulate(g, big, keep_everything(g, big)).makespan
    backward = {KINDS.index(k) for k in ("backward", "optimizer", "loss")}
    computed, again = set(), set()
    for x in s.instructions:
        if isinstance(x, Compute):
            v = a.index[x.node]
            if v in computed and a.kind[v] in backward:    # a gradient computed again reads only what was kept
                assert not any(int(u) in again and a.kind[u] in backward for u in a.inputs_of(v)), x.node
            if v in computed:
                again.add(v)
            else:
                again.clear()
                computed.add(v)


def test_checked_keeps_the_fastest_of_the_plans_in_every_variant_that_may_differ():
    from optsched.solvers.heuristics import _checked
    from optsched.solvers.memplan import VARIANTS

    g = chain_graph(8)
    cl = single_accelerator(10**9)
    fast = list(keep_everything(g, cl).instructions)
    slow = list(SOLVERS["chen-sqrt"](g, cl, SolveOptions()).instructions)
    assert simulate(g, cl, Schedule(tuple(slow))).makespan > simulate(g, cl, Schedule(tuple(fast))).makespan
    assert len(VARIANTS) == 4
    calls = []

    def build(plans):
        def b(scale, variant):
            k = VARIANTS.index(variant) if variant else None
            calls.append(k)
            out = plans[k]
            if isinstance(out, Exception):
                raise out
            return out
        return b

    none = InfeasibleError("no room")
    # fast recomputes nothing: with the deepest input first (2 after 0, 3 after 1), it would plan the same
    for plans, want, made in (({0: fast, 1: slow, 2: slow, 3: slow}, fast, [0, 1, 3]),
                              ({0: slow, 1: slow, 2: slow, 3: fast}, fast, [0, 1, 2, 3]),
                              ({0: none, 1: slow, 2: none, 3: none}, slow, [0, 1, 2, 3]),
                              ({0: slow, 1: fast, 2: fast, 3: slow}, fast, [0, 1, 2])):
        calls.clear()
        s = _checked(g, cl, "dtr", SolveOptions(), build(plans), 0.0)
        assert list(s.instructions) == want and calls == made
    calls.clear()
    s = _checked(g, cl, "offload-all", SolveOptions(), build({None: slow}), 0.0, drops=False)
    assert list(s.instructions) == slow and calls == [None]
    with pytest.raises(InfeasibleError, match="no room"):
        _checked(g, cl, "dtr", SolveOptions(), build({0: none, 1: InfeasibleError("none either"), 2: none,
                                                      3: none}), 0.0)


def deep_graph():
    """y reads s, one computation from a, and r, three from a through q(a, p). Recomputing y while g (35 B) is held:
    s first holds s beside a, p and q (76 B with x, g and the others); r first, 66 B."""
    c, z = {"cuda": 1e-3}, {"cuda": 0.0}
    return check_graph(Graph((
        Node("x", "data", "input", (), z, 1, recomputable=False),
        Node("a", "op", "forward", ("x",), c, 10),
        Node("s", "op", "forward", ("a",), c, 10),
        Node("p", "op", "forward", ("a",), c, 10),
        Node("q", "op", "forward", ("a", "p"), c, 10),
        Node("r", "op", "forward", ("q",), c, 10),
        Node("y", "op", "forward", ("s", "r"), c, 10),
        Node("h1", "op", "forward", ("x",), c, 20),      # 60 B at once: y cannot stay
        Node("h2", "op", "forward", ("h1",), c, 20),
        Node("h3", "op", "forward", ("h1", "h2"), c, 20),
        Node("g", "op", "forward", ("h3",), c, 35),
        Node("z", "loss", "loss", ("g", "y"), c, 1, required=True),
    ), name="deep"))


def test_a_recomputation_takes_its_deepest_input_first():
    """The planner recomputes y for z in z's own step, from x, which it must hold through that step (its last
    reader's); with y's inputs in their order it holds s through r's chain and finds no room at 70 B."""
    g = deep_graph()
    cl = Cluster((Device("gpu0", "cuda", 70),))
    place, order = np.zeros(len(g), dtype=int), g.arrays.topo
    for defer in (True, False):
        with pytest.raises(InfeasibleError, match="66 B held"):
            plan(g, cl, place, order, swap=False, policy="dtr", deep_first=False, defer_chains=defer)
        r = simulate(g, cl, Schedule(tuple(plan(g, cl, place, order, swap=False, policy="dtr", deep_first=True,
                                                defer_chains=defer))))
        assert r.valid and r.peak["gpu0"] == 66 and r.recomputed == 7
    r = simulate(g, cl, SOLVERS["dtr"](g, cl, SolveOptions(swap=False)))
    assert r.valid and r.peak["gpu0"] == 66


def test_deferring_the_drops_that_chain_gradients_pays_on_the_shipped_bert():
    # one accelerator, no swapping, 91% of the keep-everything peak, the capuchin policy in topological order:
    # 0.133 s with the deferral, 0.310 s without (the gradients' chains recomputed)
    from optsched.solvers.heuristics import _single_device_inputs

    g = import_graph(example_graph_path("bert_l3"))
    cl = Cluster((Device("gpu0", "cuda", int(0.91 * keep_peak(g))),))
    place, order, est = _single_device_inputs(g, cl, SolveOptions(swap=False))
    t = {}
    for defer in (True, False):
        s = Schedule(tuple(plan(g, cl, place, order, est, swap=False, host_fallback=False, defer_chains=defer)))
        r = simulate(g, cl, s)
        assert r.valid, r.violation
        t[defer] = r.makespan
    assert t[True] < 0.5 * t[False]
