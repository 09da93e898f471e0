"""The graph IR: structural checks, derived arrays, lower bound, networkx round trip."""

from __future__ import annotations

import math
from dataclasses import replace

import networkx as nx
import numpy as np
import pytest
from hypothesis import given, settings
from strategies import random_dags, training_graphs

from optsched.cluster import single_accelerator
from optsched.errors import GraphError
from optsched.generate import chain_graph, random_training_graph
from optsched.graph import (
    Graph,
    Node,
    check_graph,
    drop_unneeded,
    from_networkx,
    largest_operation,
    memory_lower_bound,
    to_networkx,
    unneeded,
)
from optsched.simulate import simulate
from optsched.solvers import solve

C = {"cuda": 1e-3}


def n(id, inputs=(), **kw):
    kw.setdefault("cost", C)
    return Node(id, inputs=tuple(inputs), **kw)


def small() -> Graph:
    """x -> a -> b, x -> b; listed out of topological order."""
    return Graph((n("b", ["a", "x"], bytes=30), n("x", kind="input", recomputable=False, bytes=10),
                  n("a", ["x"], bytes=20)), name="small")


def raises_at(graph: Graph, node: str, field: str, match: str | None = None) -> GraphError:
    with pytest.raises(GraphError, match=match) as info:
        check_graph(graph)
    assert info.value.node == node
    assert info.value.field == field
    assert repr(node) in str(info.value) and repr(field) in str(info.value)
    return info.value


# --- check_graph --------------------------------------------------------------------------------

def test_valid_graph_passes_and_is_returned():
    g = small()
    assert check_graph(g) is g


def test_duplicate_ids():
    raises_at(Graph((n("a"), n("b", ["a"]), n("a"))), "a", "id", "duplicate")


def test_dangling_input():
    raises_at(Graph((n("a"), n("b", ["a", "ghost"]))), "b", "inputs", "ghost")


def test_cycle():
    e = raises_at(Graph((n("s"), n("a", ["s", "c"]), n("b", ["a"]), n("c", ["b"]))), "a", "inputs", "cycle")
    assert e.node in {"a", "b", "c"}


def test_cycle_two_nodes():
    with pytest.raises(GraphError, match="cycle") as info:
        check_graph(Graph((n("a", ["b"]), n("b", ["a"]))))
    assert info.value.node in {"a", "b"} and info.value.field == "inputs"


def test_self_loop():
    raises_at(Graph((n("a"), n("b", ["a", "b"]))), "b", "inputs", "own output")


@pytest.mark.parametrize("field", ["bytes", "workspace"])
@pytest.mark.parametrize("value", [-1, math.nan, math.inf, 1.5, "10", None, True])
def test_bad_sizes(field, value):
    raises_at(Graph((n("a"), n("b", ["a"], **{field: value}))), "b", field)


def test_integral_float_size_is_accepted():
    check_graph(Graph((n("a", bytes=1024.0),)))


def test_unknown_kind():
    raises_at(Graph((n("a", kind="activation"),)), "a", "kind", "unknown kind")


def test_empty_cost():
    raises_at(Graph((n("a"), n("b", ["a"], cost={}))), "b", "cost", "no device kind")


@pytest.mark.parametrize("cost", [{"tpu": 1.0}, {"cuda": -1.0}, {"cuda": math.nan}, {"cuda": math.inf},
                                  {"cuda": "1ms"}])
def test_bad_cost(cost):
    raises_at(Graph((n("a", cost=cost),)), "a", "cost")


@pytest.mark.parametrize("kind", ["param", "input"])
def test_source_with_inputs(kind):
    raises_at(Graph((n("a"), n("w", ["a"], kind=kind, recomputable=False))), "w", "inputs")


@pytest.mark.parametrize("kind", ["param", "input"])
def test_recomputable_source(kind):
    raises_at(Graph((n("w", kind=kind, recomputable=True),)), "w", "recomputable")


def test_an_ops_other_output_names_an_input_that_makes_it_and_is_not_recomputable():
    x = n("x", kind="input", recomputable=False)
    p = n("p", ["x"])
    raises_at(Graph((x, p, n("o", ["x"], recomputable=False, output_of="p"))), "o", "output_of", "not one of")
    raises_at(Graph((x, p, n("o", ["p", "x"], output_of="p"))), "o", "recomputable", "on its own")
    g = check_graph(Graph((x, p, n("o", ["p", "x"], recomputable=False, output_of="p"))))
    assert g.arrays.output_of.tolist() == [-1, -1, 1]
    assert to_networkx(g).nodes["o"]["output_of"] == "p"
    assert from_networkx(to_networkx(g)) == g


def test_empty_id():
    with pytest.raises(GraphError) as info:
        check_graph(Graph((n(""),)))
    assert info.value.field == "id"


# --- derived arrays and topological order ---------------------------------------------------------

def test_topological_order_respects_edges_and_listing():
    g = Graph((n("d", ["b", "c"]), n("c", ["a"]), n("b", ["a"]), n("a"), n("e")))
    a = g.arrays
    order = [a.ids[i] for i in a.topo]
    pos = {v: p for p, v in enumerate(order)}
    for node in g.nodes:
        for u in node.inputs:
            assert pos[u] < pos[node.id]
    assert sorted(order) == sorted(x.id for x in g.nodes)


def test_topological_order_is_listing_when_listing_is_topological():
    g = chain_graph(6)
    assert g.arrays.topo.tolist() == list(range(len(g)))


def test_topological_order_exact_stable():
    # ready at start: a (pos 3) and e (pos 4); a first; then c (1), b (2) become ready -> c first
    g = Graph((n("d", ["b", "c"]), n("c", ["a"]), n("b", ["a"]), n("a"), n("e")))
    a = g.arrays
    assert [a.ids[i] for i in a.topo] == ["a", "c", "b", "d", "e"]


def test_arrays_dedupe_inputs_and_index_outputs():
    g = Graph((n("x", bytes=8), n("y", ["x", "x"], bytes=4)))
    a = g.arrays
    assert a.inputs_of(a.index["y"]).tolist() == [a.index["x"]]
    assert a.outputs_of(a.index["x"]).tolist() == [a.index["y"]]
    assert g.num_edges == 1
    assert a.bytes.tolist() == [8, 4]
    assert g.node("y").inputs == ("x", "x")


def test_arrays_cost_columns_nan_where_missing():
    g = Graph((n("a", cost={"cuda": 1.0}), n("b", ["a"], cost={"cpu": 2.0})))
    a = g.arrays
    assert a.cost["cuda"][0] == 1.0 and np.isnan(a.cost["cuda"][1])
    assert np.isnan(a.cost["cpu"][0]) and a.cost["cpu"][1] == 2.0


# --- memory lower bound -----------------------------------------------------------------------

def test_memory_lower_bound_hand_examples():
    # y reads x twice: counted once. need(y) = 100 (x) + 50 (y) + 7 (workspace) = 157
    g = Graph((n("x", bytes=100), n("y", ["x", "x"], bytes=50, workspace=7), n("z", ["y"], bytes=10)))
    assert memory_lower_bound(g) == 157
    assert largest_operation(g) == ("y", 157)
    # a fan-in: need(s) = 10 + 20 + 30 + 5 = 65 > any single tensor
    g2 = Graph((n("a", bytes=10), n("b", bytes=20), n("c", bytes=30), n("s", ["a", "b", "c"], bytes=5)))
    assert largest_operation(g2) == ("s", 65)
    # a lone big source
    g3 = Graph((n("w", kind="param", recomputable=False, bytes=1000), n("u", ["w"], bytes=1)))
    assert largest_operation(g3) == ("u", 1001)
    # chain of equal layers: a backward node reads the next gradient and the saved activation
    assert memory_lower_bound(chain_graph(5, act_bytes=100)) == 300


@settings(max_examples=60, deadline=None)
@given(random_dags(max_nodes=15))
def test_memory_lower_bound_matches_definition(g):
    best = 0
    for node in g.nodes:
        ins = {u for u in node.inputs}
        best = max(best, node.bytes + node.workspace + sum(g.node(u).bytes for u in ins))
    assert memory_lower_bound(g) == best


# --- networkx ------------------------------------------------------------------------------------

def test_networkx_round_trip_keeps_input_order_and_duplicates():
    g = Graph((n("x", kind="input", recomputable=False, bytes=3), n("w", kind="param", recomputable=False, bytes=5),
               n("y", ["w", "x", "w"], bytes=7, workspace=2, op="mm"),
               n("l", ["y"], kind="loss", required=True, cost={"cuda": 1.0, "cpu": 9.0}, bytes=4)),
              name="nx", meta={"source": "hand"})
    d = to_networkx(g)
    assert isinstance(d, nx.DiGraph)
    assert set(d.edges) == {("x", "y"), ("w", "y"), ("y", "l")}
    assert d.nodes["y"]["workspace"] == 2
    back = from_networkx(d)
    assert back == g
    assert back.node("y").inputs == ("w", "x", "w")


def test_from_networkx_defaults_and_predecessor_order():
    d = nx.DiGraph()
    d.add_node("w", kind="param", cost={"cuda": 0.0})
    d.add_node("x", kind="input", cost={"cuda": 0.0})
    d.add_node("y", cost={"cuda": 1.0}, bytes=4)
    d.add_edge("x", "y")
    d.add_edge("w", "y")
    g = from_networkx(d)
    assert g.node("y").inputs == ("x", "w")     # insertion order of the edges
    assert g.node("w").recomputable is False and g.node("x").recomputable is False
    assert g.node("y").recomputable is True and g.node("y").kind == "forward"


def test_from_networkx_checks_the_graph():
    d = nx.DiGraph()
    d.add_node("a", cost={})
    with pytest.raises(GraphError) as info:
        from_networkx(d)
    assert info.value.node == "a" and info.value.field == "cost"


@settings(max_examples=60, deadline=None)
@given(random_dags(max_nodes=15))
def test_networkx_round_trip_random_dags(g):
    assert from_networkx(to_networkx(g)) == g


@settings(max_examples=20, deadline=None)
@given(training_graphs(max_forward=8))
def test_networkx_round_trip_training_graphs(g):
    assert from_networkx(to_networkx(g)) == g


# --- unneeded operations ----------------------------------------------------------------------------

def dead_branch() -> Graph:
    """x -> a -> loss (required); a -> d -> e and x -> e: d and e feed no required result. Listed out of order."""
    return check_graph(Graph((n("e", ["d", "x"], bytes=50), n("loss", ["a"], bytes=4, required=True),
                              n("x", kind="input", recomputable=False, bytes=10), n("d", ["a"], bytes=40),
                              n("a", ["x"], bytes=20)), name="dead"))


def test_unneeded_operations_are_those_no_required_result_depends_on():
    g = dead_branch()
    assert unneeded(g) == ["e", "d"]            # in graph order
    kept = drop_unneeded(g)
    assert [v.id for v in kept.nodes] == ["loss", "x", "a"] and kept.name == g.name
    assert check_graph(kept) is kept and unneeded(kept) == []
    assert drop_unneeded(kept) is kept
    # nothing required: nothing to anchor on, the graph stays whole
    free = Graph(tuple(replace(v, required=False) for v in g.nodes))
    assert unneeded(free) == [] and drop_unneeded(free) is free


def test_a_schedule_without_the_unneeded_operations_is_valid_for_the_whole_graph_and_faster():
    g = dead_branch()
    cl = single_accelerator(10**6)
    whole = simulate(g, cl, solve(g, cl, "keep-everything"))
    s = solve(drop_unneeded(g), cl, "keep-everything")
    r = simulate(g, cl, s)
    assert whole.valid and r.valid
    assert r.makespan < whole.makespan and r.peak["gpu0"] < whole.peak["gpu0"]


@settings(max_examples=50, deadline=None)
@given(g=training_graphs(max_forward=15))
def test_generated_training_graphs_hold_only_what_a_required_result_depends_on(g):
    assert unneeded(g) == []
    assert any(v.kind == "backward" for v in g.nodes)


def test_random_and_chain_graphs_keep_the_backward_pass_they_need():
    # random-8-0 gives parameters to layers 6 and 7 only: autodiff stops at layer 6, and so does the generator
    g = random_training_graph(8, 0)
    assert unneeded(g) == [] and {v.id for v in g.nodes if v.kind == "backward"} == {"g7", "gp7", "g6", "gp6"}
    # without parameters the data input's gradient is required, so the whole backward pass runs
    for g in (chain_graph(6), random_training_graph(8, 0, params=False)):
        assert sum(v.kind == "backward" for v in g.nodes) == sum(v.kind == "forward" for v in g.nodes)


def test_an_other_output_goes_right_after_its_maker_or_after_an_input_that_comes_later():
    """`attach_outputs`: a captured output (reading its maker and what the maker reads) comes right after its
    maker; one that also reads a node the order puts after the maker comes after that node, so the order stays
    topological (before, `o` came before `b`, and the bounds' chains of moments built on it named columns that do
    not exist, which corrupted HiGHS's memory)."""
    from optsched.graph import attach_outputs

    g = check_graph(Graph((
        n("x", kind="input", recomputable=False), n("m", ["x"]), n("b", ["x"]), n("c", ["b"]),
        n("o", ["m", "b"], output_of="m", recomputable=False), n("p", ["m", "x"], output_of="m", recomputable=False),
        n("w", ["o", "p", "c"], required=True))))
    ids = list(g.arrays.ids)
    order = [ids[i] for i in attach_outputs(g, [ids.index(v) for v in ("x", "m", "b", "c", "o", "p", "w")])]
    assert order == ["x", "m", "p", "b", "o", "c", "w"]
    placed = {v: k for k, v in enumerate(order)}
    assert all(placed[u] < placed[n.id] for n in g.nodes for u in n.inputs)
