"""Baselines: keep-everything and Chen et al.'s sqrt(n) checkpointing."""

from __future__ import annotations

import math
from collections import Counter

import pytest

from optsched.cluster import Cluster, Device, single_accelerator
from optsched.errors import OptschedError
from optsched.formats.importers import example_graph_path, import_graph
from optsched.generate import chain_graph, random_training_graph, training_graph
from optsched.graph import Graph, Node, check_graph
from optsched.schedule import Compute, Free
from optsched.simulate import simulate
from optsched.solvers import SOLVERS, SolveOptions, chen_sqrt, get_solver, keep_everything, solve

BIG = single_accelerator(10**15)
Z = {"cuda": 0.0, "cpu": 0.0}


def one(cost):
    return {"cuda": cost, "cpu": 10 * cost}


def hand_graph() -> Graph:
    """x(10) w(5) -> f(20) -> loss(4, required); g(20) reads loss and x; gw(5, required) reads g and x."""
    return check_graph(Graph((
        Node("x", "data", "input", (), Z, 10, recomputable=False),
        Node("w", "param", "param", (), Z, 5, recomputable=False),
        Node("f", "mm", "forward", ("x", "w"), one(1.0), 20),
        Node("loss", "loss", "loss", ("f",), one(0.5), 4, required=True),
        Node("g", "grad", "backward", ("loss", "x"), one(2.0), 20),
        Node("gw", "grad_w", "backward", ("g", "x"), one(1.0), 5, required=True),
    ), name="hand"))


def test_keep_everything_hand_graph():
    g = hand_graph()
    s = keep_everything(g, BIG)
    assert s.instructions == (
        Compute("x", "gpu0"), Compute("w", "gpu0"), Compute("f", "gpu0"), Free("w", "gpu0"),
        Compute("loss", "gpu0"), Free("f", "gpu0"), Compute("g", "gpu0"), Compute("gw", "gpu0"),
        Free("g", "gpu0"), Free("x", "gpu0"))
    assert s.report.solver == "keep-everything" and s.graph == "hand"
    r = simulate(g, BIG, s)
    assert r.valid
    # x 10, w 15, f 35, w freed 30, loss 34, f freed 14, g 34, gw 39; then x and g go: 9 left (loss + gw)
    assert r.peak["gpu0"] == 39
    assert r.timeline["gpu0"][1][-1] == 9
    assert r.makespan == 4.5 and r.recomputed == 0
    small = single_accelerator(39)
    assert simulate(g, small, keep_everything(g, small)).valid
    tight = single_accelerator(38)
    r = simulate(g, tight, keep_everything(g, tight))
    assert r.violation.code == "over-budget" and r.violation.node == "gw" and r.violation.over == 1


def test_keep_everything_computes_each_node_once_and_frees_all_but_results():
    g = random_training_graph(30, seed=5)
    s = keep_everything(g, BIG)
    computes = Counter(x.node for x in s.instructions if isinstance(x, Compute))
    frees = Counter(x.node for x in s.instructions if isinstance(x, Free))
    assert set(computes) == {n.id for n in g.nodes} and set(computes.values()) == {1}
    assert set(frees) == {n.id for n in g.nodes if not n.required} and set(frees.values()) == {1}
    r = simulate(g, BIG, s)
    assert r.valid and r.recomputed == 0
    assert r.makespan == pytest.approx(sum(n.cost["cuda"] for n in g.nodes))


def test_keep_everything_on_a_chosen_device():
    g = hand_graph()
    s = solve(g, BIG, "keep-everything", device="host")
    assert {x.device for x in s.instructions} == {"host"}
    r = simulate(g, BIG, s)
    assert r.valid and r.makespan == pytest.approx(45.0)


def test_solver_refuses_a_device_that_cannot_run_a_node():
    g = check_graph(Graph((Node("a", cost={"cpu": 1.0}, bytes=1),)))
    with pytest.raises(OptschedError, match="'a' cannot run"):
        keep_everything(g, BIG)
    assert simulate(g, BIG, solve(g, BIG, "keep-everything", device="host")).valid
    with pytest.raises(OptschedError, match="unknown device"):
        solve(g, BIG, "keep-everything", device="tpu")


def test_solver_registry():
    assert SOLVERS["keep-everything"] is keep_everything and SOLVERS["chen-sqrt"] is chen_sqrt
    assert get_solver("chen-sqrt") is chen_sqrt
    with pytest.raises(OptschedError, match="unknown solver"):
        get_solver("magic")


@pytest.mark.parametrize("n", [4, 9, 16, 17, 25, 30, 50, 64, 100, 101])
def test_chen_sqrt_on_a_chain_keeps_about_sqrt_n_checkpoints(n):
    g = chain_graph(n, act_bytes=1000)
    s = chen_sqrt(g, BIG)
    ck = s.report.extra["checkpoints"]
    assert math.floor(math.sqrt(n)) - 1 <= ck <= math.ceil(math.sqrt(n))
    assert s.report.extra["segments"] == round(math.sqrt(n))
    r = simulate(g, BIG, s)
    assert r.valid
    # every dropped layer is recomputed once, except the last one if dropped (only the loss reads it)
    computes = Counter(x.node for x in s.instructions if isinstance(x, Compute))
    twice = {v for v, c in computes.items() if c == 2}
    assert set(computes.values()) <= {1, 2}
    assert twice <= {f"f{i}" for i in range(n - 1)}
    assert len(twice) == r.recomputed and n - ck - 1 <= r.recomputed <= n - ck
    assert r.recompute_time == pytest.approx(r.recomputed * 1e-3)


@pytest.mark.parametrize("n", [16, 20, 36, 50, 100, 200])
def test_chen_sqrt_beats_keep_everything_on_chains(n):
    g = chain_graph(n, act_bytes=1000)
    chen = simulate(g, BIG, chen_sqrt(g, BIG))
    keep = simulate(g, BIG, keep_everything(g, BIG))
    assert chen.valid and keep.valid
    assert chen.peak["gpu0"] < keep.peak["gpu0"]
    assert keep.peak["gpu0"] >= n * 1000                       # every activation at once
    assert chen.peak["gpu0"] <= (2 * math.sqrt(n) + 3) * 1000  # O(sqrt n) activations
    assert chen.makespan > keep.makespan                       # paid for in recomputation
    # and it runs within its own peak, where keep-everything does not
    tight = single_accelerator(chen.peak["gpu0"])
    assert simulate(g, tight, chen_sqrt(g, tight)).valid
    assert simulate(g, tight, keep_everything(g, tight)).violation.code == "over-budget"


def test_chen_sqrt_segments_option():
    g = chain_graph(12)
    s = chen_sqrt(g, BIG, SolveOptions(params={"segments": 3}))
    assert s.report.extra == {"segments": 3, "checkpoints": 3}
    assert simulate(g, BIG, s).valid
    with pytest.raises(OptschedError, match="segments"):
        chen_sqrt(g, BIG, SolveOptions(params={"segments": 0}))


def test_chen_sqrt_refuses_a_graph_without_backward_nodes():
    g = check_graph(Graph((Node("a", cost={"cuda": 1.0}, bytes=1), Node("b", inputs=("a",), cost={"cuda": 1.0},
                                                                       bytes=1, required=True))))
    with pytest.raises(OptschedError, match="backward"):
        chen_sqrt(g, BIG)


def test_chen_sqrt_with_a_forward_node_reading_a_backward_node():
    # b is tagged backward but a forward node reads it: it must run before that node, not after
    g = check_graph(Graph((
        Node("a", cost={"cuda": 1.0}, bytes=1),
        Node("b", kind="backward", inputs=("a",), cost={"cuda": 1.0}, bytes=1),
        Node("c", inputs=("b",), cost={"cuda": 1.0}, bytes=1, required=True))))
    r = simulate(g, BIG, chen_sqrt(g, BIG))
    assert r.valid, r.violation


def test_chen_sqrt_counterexample_peak_above_keep_everything():
    """chen-sqrt does not always need less memory than keep-everything.

    Two layers, f0 with a 100-byte parameter p0, activations of 10 bytes. With
    k = round(sqrt(2)) = 1 segment, f1 is the checkpoint and f0 is dropped, so
    p0 must stay alive until f0 is recomputed for g1: x + p0 + f0 + f1 = 130
    while f1 runs. keep-everything frees p0 right after f0 and peaks at 124
    (x + loss + g0 + gp0 = 10 + 4 + 10 + 100)."""
    g = training_graph([[-1], [0]], act_bytes=[10, 10], cost=[1e-3, 1e-3], param_bytes=[100, 0])
    chen = simulate(g, BIG, chen_sqrt(g, BIG))
    keep = simulate(g, BIG, keep_everything(g, BIG))
    assert chen.valid and keep.valid and chen.recomputed == 1
    assert (chen.peak["gpu0"], keep.peak["gpu0"]) == (130, 124)


def test_chen_sqrt_when_the_backward_pass_does_not_wait_for_the_forward_pass():
    """gnmt's backward nodes read parameters and inputs, no forward activation.
    Running the whole forward pass before the backward pass held every
    parameter at once (2.51 GB, keep-everything 973 MB); in topological order,
    parameters loaded when first read, chen-sqrt holds no more than keep-everything."""
    g = import_graph(example_graph_path("gnmt"))
    chen = simulate(g, BIG, chen_sqrt(g, BIG))
    keep = simulate(g, BIG, keep_everything(g, BIG))
    assert chen.valid and chen.peak["gpu0"] <= keep.peak["gpu0"]
    for name in ("chen-greedy", "articulation"):
        assert simulate(g, BIG, SOLVERS[name](g, BIG, SolveOptions())).peak["gpu0"] <= keep.peak["gpu0"]


def test_single_device_cluster_without_accelerator():
    g = hand_graph()
    cpu = Cluster((Device("cpu0", "cpu", 10**9),))
    s = keep_everything(g, cpu)
    assert {x.device for x in s.instructions} == {"cpu0"}
    assert simulate(g, cpu, s).valid


@pytest.mark.parametrize("seed", range(4))
def test_memory_order_is_a_topological_order_of_every_node(seed):
    from optsched.solvers.baselines import memory_order

    g = random_training_graph(30, seed)
    order = memory_order(g)
    assert sorted(order) == list(range(len(g)))
    pos = {v: k for k, v in enumerate(order)}
    a = g.arrays
    for v in range(len(g)):
        assert all(pos[u] < pos[v] for u in a.in_idx[a.in_ptr[v]:a.in_ptr[v + 1]].tolist())


def _peaks(g, transient):
    """Simulated peak of every plan chen-greedy tries (plain or transient), smallest first."""
    from optsched.schedule import Schedule
    from optsched.solvers import baselines as B
    from optsched.solvers.sequential import sequential_instructions

    late = B.backward_phase(g)
    fwd = B._forward_candidates(g, late)
    order = B.memory_order(g) if transient else None
    out = []
    for k in range(len(fwd) + 1):
        computes = B.checkpoint_computes(g, set(fwd[k:]), late, transient, order=order)
        r = simulate(g, BIG, Schedule(tuple(sequential_instructions(g, "gpu0", computes)), graph=g.name))
        assert r.valid, r.violation
        out.append(r.peak["gpu0"])
    return sorted(out)


def test_transient_recomputation_reaches_budgets_the_segments_do_not():
    # an 8-layer MLP's training step: Chen's segments keep what they recompute for the rest of the backward pass,
    # so their smallest peak is 75% of keep-everything's; recomputing for each reader and discarding after it, in
    # an order whose readers release values first, needs 62%. chen-greedy falls back on it only where no segment
    # plan fits
    from milp_graphs import captured_mlp

    g = captured_mlp(8)
    ke = simulate(g, BIG, keep_everything(g, BIG)).peak["gpu0"]
    plain, transient = _peaks(g, False)[0], _peaks(g, True)[0]
    assert transient < 0.63 * ke < 0.67 * ke < plain
    roomy = solve(g, single_accelerator(int(0.8 * ke)), "chen-greedy")
    assert roomy.report.extra["transient"] is False
    cl = single_accelerator(int(0.65 * ke))
    s = solve(g, cl, "chen-greedy")
    r = simulate(g, cl, s)
    assert r.valid and s.report.extra["transient"] is True
    assert r.peak["gpu0"] <= 0.65 * ke and r.makespan > simulate(g, BIG, roomy).makespan
    with pytest.raises(OptschedError, match="smallest peak found"):
        solve(g, single_accelerator(int(0.6 * ke)), "chen-greedy")
