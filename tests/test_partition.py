"""Placement: ParDNN-style partitioner, its memory pass, and m-ETF."""

from __future__ import annotations

import numpy as np

from optsched.cluster import single_accelerator
from optsched.generate import random_training_graph
from optsched.graph import Graph, Node, check_graph
from optsched.simulate import simulate
from optsched.solvers import SOLVERS, SolveOptions
from optsched.solvers.partition import (
    comm_model,
    levels,
    list_schedule,
    memory_pass,
    memory_profile,
    metf,
    pardnn,
    work_costs,
)


def two_branches(k: int = 6, nbytes: int = 1000) -> Graph:
    """Two independent chains from two inputs, each ending in a required result."""
    z = {"cuda": 0.0, "cpu": 0.0}
    nodes = []
    for b in "ab":
        nodes.append(Node(f"{b}x", "data", "input", (), z, nbytes, recomputable=False))
        prev = f"{b}x"
        for i in range(k):
            nodes.append(Node(f"{b}{i}", "op", "forward", (prev,), {"cuda": 1e-3, "cpu": 1e-2}, nbytes))
            prev = f"{b}{i}"
        nodes.append(Node(f"{b}out", "loss", "loss", (prev,), {"cuda": 1e-4, "cpu": 1e-3}, 4, required=True))
    return check_graph(Graph(tuple(nodes), name="two-branches"))


def fan(k: int = 6, nbytes: int = 1_000_000) -> Graph:
    """k branches from one input, each a wide node then a narrow one, joined at
    the end; breadth-first, all the wide outputs are live at once."""
    z = {"cuda": 0.0, "cpu": 0.0}
    nodes = [Node("x", "data", "input", (), z, 1000, recomputable=False)]
    for i in range(k):
        nodes.append(Node(f"b{i}", "op", "forward", ("x",), {"cuda": 1e-3, "cpu": 1e-2}, nbytes))
    for i in range(k):
        nodes.append(Node(f"c{i}", "op", "forward", (f"b{i}",), {"cuda": 1e-3, "cpu": 1e-2}, 1000))
    nodes.append(Node("join", "op", "forward", tuple(f"c{i}" for i in range(k)), {"cuda": 1e-3, "cpu": 1e-2}, 1000,
                      required=True))
    return check_graph(Graph(tuple(nodes), name="fan"))


def test_two_independent_branches_go_to_two_devices():
    g = two_branches()
    cl = single_accelerator(10**9, gpus=2)
    place, order, start = pardnn(g, cl)
    a = g.arrays
    da = {int(place[a.index[f"a{i}"]]) for i in range(6)}
    db = {int(place[a.index[f"b{i}"]]) for i in range(6)}
    assert len(da) == 1 and len(db) == 1 and da != db
    s = SOLVERS["heuristic"](g, cl, SolveOptions())
    r = simulate(g, cl, s)
    assert r.valid and r.makespan < 6 * 2e-3 * 0.75     # the branches overlap


def test_metf_uses_both_devices_for_independent_branches():
    g = two_branches()
    cl = single_accelerator(10**9, gpus=2)
    place, order, start = metf(g, cl)
    a = g.arrays
    assert place[a.index["a3"]] != place[a.index["b3"]]


def test_sources_go_with_their_first_reader():
    """An input is made on the device of the node that reads it (no copy), by
    both placements; m-ETF used to put every source it met before the first
    computation on the first device (here both, listed first)."""
    nodes = two_branches().nodes
    g = check_graph(Graph(tuple(sorted(nodes, key=lambda nd: bool(nd.inputs))), name="two-branches"))
    cl = single_accelerator(10**9, gpus=2)
    a = g.arrays
    for place_fn in (pardnn, metf):
        place, order, start = place_fn(g, cl)
        assert place[a.index["a0"]] != place[a.index["b0"]]
        for b in "ab":
            assert place[a.index[f"{b}x"]] == place[a.index[f"{b}0"]], place_fn.__name__


def test_levels_on_a_chain():
    g = two_branches(k=3)
    cl = single_accelerator(10**9, gpus=2)
    w = work_costs(g, cl, [0, 1])
    lat, spb = comm_model(cl, [0, 1])
    assert lat > 0 and spb > 0
    tl, bl = levels(g, w, lat + g.arrays.bytes * spb)
    a = g.arrays
    assert tl[a.index["ax"]] == 0 and tl[a.index["a2"]] > tl[a.index["a1"]] > tl[a.index["a0"]]
    assert bl[a.index["ax"]] > bl[a.index["a0"]] > bl[a.index["a2"]] > 0


def test_memory_pass_removes_a_planted_overflow():
    g = fan(k=6)
    cl = single_accelerator(4_200_000, gpus=2)
    nd = len(cl.devices)
    planted = np.zeros(len(g), dtype=np.int64)          # everything on gpu0: 6 MB live at the join
    comm = np.zeros(len(g))
    tl = levels(g, work_costs(g, cl, [0, 1]), comm)[0]      # breadth first: every b before any c
    _, s0, e0 = list_schedule(g, cl, planted, priority=tl)
    peak0, _, _ = memory_profile(g, planted, s0, e0, nd)
    assert peak0[0] > cl.devices[0].memory
    moved = memory_pass(g, cl, planted, [0, 1], comm, tl)
    _, s1, e1 = list_schedule(g, cl, moved, priority=tl)
    peak1, _, _ = memory_profile(g, moved, s1, e1, nd)
    assert peak1[0] <= cl.devices[0].memory
    assert (moved == 1).any()


def test_list_schedule_order_is_topological():
    g = random_training_graph(40, 5)
    cl = single_accelerator(10**9, gpus=3)
    place, order, start = pardnn(g, cl)
    a = g.arrays
    pos = np.empty(len(g), dtype=np.int64)
    pos[order] = np.arange(len(g))
    owner = np.repeat(np.arange(len(g)), np.diff(a.out_ptr))
    assert (pos[owner] < pos[a.out_idx]).all()
    assert set(place.tolist()) <= {0, 1, 2}


def test_placement_scales():
    import time

    g = random_training_graph(3300, 0)       # about 10,000 nodes
    cl = single_accelerator(10**8, gpus=4)
    t = time.perf_counter()
    s = SOLVERS["heuristic"](g, cl, SolveOptions(params={"verify": False}))
    assert time.perf_counter() - t < 5.0       # goal < 1 s; slack for loaded CI machines
    assert simulate(g, cl, s).valid
