"""The lower bounds of `optsched.solvers.bounds` hold for every schedule, not only the MILP's: checked against the
exhaustive optimum over all schedules on one device for tiny graphs (a search written from the schedule contract,
its optimum replayed in the simulator), against every solver's schedules (each also a point of the coupled
programme, row by row), and shown tight where recomputation is forced."""

from __future__ import annotations

import heapq
import itertools
import math
import threading
import time
from dataclasses import replace
from functools import partial

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, event, given, settings
from hypothesis import strategies as st
from milp_graphs import captured, captured_mlp, gpu_host, ke_peak, one_gpu, small_dag, two_gpus
from strategies import random_dags, seeded_training_graphs, training_graphs

from optsched import generate
from optsched.errors import InfeasibleError
from optsched.graph import Graph, Node, check_graph, largest_operation
from optsched.schedule import Compute, Free, Schedule, Sync
from optsched.simulate import simulate
from optsched.solvers import SolveOptions, bounds, rounding, solve
from optsched.solvers.bounds import least_budget, lower_bounds, moment_plans
from optsched.solvers.milp_model import TIME_SCALE, make_spec


def exhaustive(graph: Graph, budget: int, guided: bool = True) -> tuple[float, list] | None:
    """(least step time, its instructions) over every schedule on one device of `budget` bytes, or None: Dijkstra
    over (values resident, values not recomputable already computed, other outputs made but not yet computed); a
    step computes a node whose inputs are resident (within the budget with its output and workspace) or frees a
    value; the time is the sum of the computations (one compute stream, no copies). An op's other output
    (`Node.output_of`) is held from the end of the maker's run whose value it takes: a run of the maker makes any
    of its outputs not yet computed, held until they are (the maker stays resident until then).

    `guided` orders the search by time plus `_still_to_compute` (A*): that estimate never exceeds the time left
    and falls by at most a step's time, so the first goal reached is still the least; without it the search is
    plain Dijkstra, which the tests compare it with."""
    a = graph.arrays
    n = len(a.ids)
    ins = [a.in_idx[a.in_ptr[v]:a.in_ptr[v + 1]].tolist() for v in range(n)]
    cost = a.cost["cuda"].tolist()
    size = a.bytes.tolist()
    ws = a.workspace.tolist()
    others = [np.flatnonzero(a.output_of == v).tolist() for v in range(n)]
    required = [v for v in range(n) if a.required[v]]
    goal = sum(1 << v for v in required)
    ahead = partial(_still_to_compute, ins, cost, required) if guided else lambda res: 0.0
    start = (0, 0, 0)
    best = {start: 0.0}
    back = {start: None}
    heap = [(ahead(0), 0, 0.0, 0, start)]
    tick = 1
    while heap:
        _, _, t, held, (res, once, made) = heapq.heappop(heap)
        if t > best[(res, once, made)]:
            continue
        if res & goal == goal:
            steps, s = [], (res, once, made)
            while back[s] is not None:
                s, step = back[s]
                steps.append(step)
            return t, steps[::-1]
        moves = []
        for v in range(n):
            bit = 1 << v
            if res & bit:
                if not any(made >> o & 1 for o in others[v]):
                    moves.append(((res & ~bit, once, made), held - size[v], 0.0, Free(a.ids[v], "gpu0")))
            elif made & bit:        # its bytes held since its maker's run
                if all(res >> u & 1 for u in ins[v]):
                    moves.append(((res | bit, once | bit, made & ~bit), held - ws[v], cost[v],
                                  Compute(a.ids[v], "gpu0")))
            elif (not once & bit and a.output_of[v] < 0 and all(res >> u & 1 for u in ins[v])
                  and held + size[v] + ws[v] <= budget):
                rest = [o for o in others[v] if not once >> o & 1]
                for k in range(len(rest) + 1):
                    for outs in itertools.combinations(rest, k):
                        after = held + size[v] + sum(size[o] + ws[o] for o in outs)
                        if after <= budget:
                            moves.append(((res | bit, once | (bit if not a.recomputable[v] else 0),
                                           made | sum(1 << o for o in outs)), after, cost[v],
                                          Compute(a.ids[v], "gpu0")))
        for state, after, dt, step in moves:
            if t + dt < best.get(state, float("inf")):
                best[state] = t + dt
                back[state] = ((res, once, made), step)
                heapq.heappush(heap, (t + dt + ahead(state[0]), tick, t + dt, after, state))
                tick += 1
    return None


def _still_to_compute(ins: list, cost: list, required: list, res: int) -> float:
    """The time of the computations every schedule still makes from `res` resident: each required value not
    resident, and each input not resident of one of these, down the graph. Each must be computed (again) before
    the end, so the sum never exceeds the time left; a step that computes v removes only v (its inputs are
    resident), so the sum falls by at most that step's time."""
    todo = [v for v in required if not res >> v & 1]
    seen = set(todo)
    while todo:
        for u in ins[todo.pop()]:
            if not res >> u & 1 and u not in seen:
                seen.add(u)
                todo.append(u)
    return sum(cost[v] for v in seen)


def optimum(graph: Graph, budget: int) -> float:
    """`exhaustive`'s least step time, its schedule replayed in the simulator at that time."""
    best, steps = exhaustive(graph, budget)
    r = simulate(graph, one_gpu(budget), Schedule(tuple(steps)))
    assert r.valid and r.makespan == pytest.approx(best)
    return best


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(g=training_graphs(2, 3, params=True, max_bytes=400, zero_sizes=False), frac=st.floats(0.1, 0.4),
       picks=st.lists(st.booleans(), min_size=8, max_size=8), once=st.lists(st.booleans(), min_size=3, max_size=3),
       other=st.booleans())
def test_the_guided_search_finds_the_plain_searchs_optimum(g, frac, picks, once, other):
    # the estimate that orders the search never cuts off the optimum: the same least time as plain Dijkstra, on
    # training graphs with and without other outputs, with its schedule replayed in the simulator
    g = _last_gradients_required(g)
    if other:
        g = _with_other_outputs(g, picks, once)
    budget = _between_largest_and_total(g, frac)
    plain, guided = exhaustive(g, budget, guided=False), exhaustive(g, budget)
    assert (plain is None) == (guided is None)
    if plain is not None:
        assert guided[0] == pytest.approx(plain[0], rel=1e-12, abs=1e-15)
        r = simulate(g, one_gpu(budget), Schedule(tuple(guided[1])))
        assert r.valid and r.makespan == pytest.approx(guided[0])
        computes = [i.node for i in guided[1] if isinstance(i, Compute)]
        event("recomputes" if len(computes) > len(set(computes)) else "no recomputation")
    else:
        event("no schedule")


def forced_recompute_graph() -> Graph:
    """x -> a -> b -> l, then gb(l, b) and ga(gb, a), ga required. With 350 bytes, computing l (b and l held,
    200) leaves no room for a (200), only for x (50): a is dropped and computed again for ga, so every schedule
    takes the work (6 s) plus a (1 s)."""
    z = {"cuda": 0.0}
    nodes = (Node("x", "data", "input", (), z, 50, recomputable=False),
             Node("a", "op", "forward", ("x",), {"cuda": 1.0}, 200),
             Node("b", "op", "forward", ("a",), {"cuda": 2.0}, 100),
             Node("l", "op", "loss", ("b",), {"cuda": 1.0}, 100),
             Node("gb", "op", "backward", ("l", "b"), {"cuda": 1.0}, 50),
             Node("ga", "op", "backward", ("gb", "a"), {"cuda": 1.0}, 50, required=True))
    return check_graph(Graph(nodes, name="forced-recompute"))


def test_the_recompute_bound_is_tight_where_the_budget_forces_a_recomputation():
    g = forced_recompute_graph()
    b = lower_bounds(make_spec(g, one_gpu(350), swap=False))
    assert b["work"] == pytest.approx(6.0) and b["recompute"] == pytest.approx(7.0) and b["floor"] == b["recompute"]
    assert [g.arrays.ids[v] for v in b["at"]] in (["l"], ["gb"])    # computing either leaves no room for a
    assert optimum(g, 350) == pytest.approx(7.0)
    # with room for everything, nothing is forced and the bound is the work
    assert lower_bounds(make_spec(g, one_gpu(550), swap=False))["floor"] == pytest.approx(6.0)
    assert exhaustive(g, 550)[0] == pytest.approx(6.0)


def statistics_graph(output_of: bool = True) -> Graph:
    """x -> m (an op that also makes o, held as m's workspace while it runs) -> b -> l; gb(l, m) and gm(gb, o, x),
    gm required: o is read only after the loss, like a layer norm's statistics. `output_of` False: the same graph
    with o a plain node."""
    z = {"cuda": 0.0}
    nodes = (Node("x", "data", "input", (), z, 10, recomputable=False),
             Node("m", "op", "forward", ("x",), {"cuda": 1.0}, 100, workspace=50),
             Node("o", "op", "forward", ("m", "x"), z, 50, recomputable=False, output_of="m" if output_of else ""),
             Node("b", "op", "forward", ("m",), {"cuda": 2.0}, 100),
             Node("l", "op", "loss", ("b",), {"cuda": 1.0}, 10),
             Node("gb", "op", "backward", ("l", "m"), {"cuda": 1.0}, 100),
             Node("gm", "op", "backward", ("gb", "o", "x"), {"cuda": 1.0}, 10, required=True))
    return check_graph(Graph(nodes, name="statistics"))


def test_an_ops_other_output_is_held_from_its_makers_run_in_the_bound():
    # at 260 bytes, holding m, o and b at the loss (270) does not fit: a plain o is computed after the loss for
    # free, but an op's other output is held from m's run, so m is computed again to make it later (1 s)
    g, plain = statistics_graph(), statistics_graph(output_of=False)
    assert exhaustive(plain, 260)[0] == pytest.approx(6.0)
    assert lower_bounds(make_spec(plain, one_gpu(260), swap=False))["floor"] == pytest.approx(6.0)
    assert optimum(g, 260) == pytest.approx(7.0)
    assert lower_bounds(make_spec(g, one_gpu(260), swap=False))["floor"] == pytest.approx(7.0)
    # with room to hold it, nothing is forced
    assert optimum(g, 270) == pytest.approx(6.0)
    assert lower_bounds(make_spec(g, one_gpu(270), swap=False))["floor"] == pytest.approx(6.0)
    # a maker computed once (a random op) makes it once: it is held from there to its reader, so nothing fits
    # below 270 bytes, which the least budget finds (220 for the plain node, made after the loss)
    g, plain = (check_graph(Graph(tuple(replace(n, recomputable=n.recomputable and n.id != "m") for n in h.nodes),
                                  name=h.name))
                for h in (g, plain))
    assert exhaustive(g, 269) is None and optimum(g, 270) == pytest.approx(6.0)
    assert least_budget(make_spec(g, one_gpu(10**6), swap=False)) == 270
    assert least_budget(make_spec(plain, one_gpu(10**6), swap=False)) == 220


def _with_other_outputs(g: Graph, picks: list[bool], once: list[bool]) -> Graph:
    """`g` with the first node that reads a recomputable non-source node, and each picked one, turned into that
    node's other output (zero cost, not recomputable, held as its maker's workspace while the maker runs); the
    makers `once` picks are not recomputable either (a random op, whose other outputs are held until read)."""
    by = {n.id: n for n in g.nodes}
    made = {}
    for n, pick in zip(g.nodes, picks, strict=False):
        makers = [u for u in n.inputs if by[u].inputs and by[u].recomputable and u not in made]
        if (pick or not made) and makers and n.id not in made.values():
            made[n.id] = makers[0]
    ws = {}
    for o, m in made.items():
        ws[m] = ws.get(m, 0) + by[o].bytes
    fixed = {m for m, f in zip(sorted(ws), once, strict=False) if f}
    nodes = tuple(replace(n, output_of=made[n.id], recomputable=False, cost={k: 0.0 for k in n.cost})
                  if n.id in made else
                  replace(n, workspace=max(n.workspace, ws[n.id]), recomputable=n.id not in fixed) if n.id in ws
                  else n for n in g.nodes)
    return check_graph(Graph(nodes, name=g.name))


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(g=training_graphs(2, 4, params=False, max_bytes=400, zero_sizes=False), frac=st.floats(0.0, 0.5),
       picks=st.lists(st.booleans(), min_size=12, max_size=12), once=st.lists(st.booleans(), min_size=4, max_size=4),
       data=st.data())
def test_the_bounds_never_exceed_the_exhaustive_optimum_with_other_outputs(g, frac, picks, once, data):
    # budgets from the least at which a schedule fits (bisected with the exhaustive search) up to half way to
    # where everything fits at once; the single and coupled moments, and the orders of any moments
    g = _with_other_outputs(_last_gradients_required(g), picks, once)
    total = int(g.arrays.bytes.sum() + g.arrays.workspace.sum())
    lo, hi = largest_operation(g)[1] - 1, total
    if exhaustive(g, hi) is None:
        event("no schedule fits")
        return
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if exhaustive(g, mid) is not None else (mid, hi)
    budget = int(hi + frac * (total - hi))
    best, steps = exhaustive(g, budget)
    r = simulate(g, one_gpu(budget), Schedule(tuple(steps)))
    assert r.valid and r.makespan == pytest.approx(best, rel=1e-9, abs=1e-12)
    spec = make_spec(g, one_gpu(budget), swap=False)
    b = lower_bounds(spec)
    assert b["floor"] <= best * (1 + 1e-9) + 1e-12
    without = lower_bounds(replace(spec, output_of=None))["floor"]
    event("the other outputs raised the bound" if b["floor"] > without * (1 + 1e-9) else
          "recomputation forced" if b["recompute"] > b["work"] * (1 + 1e-9) else "none forced")
    moments = data.draw(st.permutations(_needed_with_inputs(spec)))
    with pytest.MonkeyPatch.context() as m:
        m.setattr(bounds, "_ORDER_NEAR", 1.0)
        ordered = lower_bounds(spec, target=10 * best, moments=lambda: moments, order_seconds=10)
    assert ordered["floor"] <= best * (1 + 1e-6) + 1e-12
    event("orders raised the bound" if ordered["floor"] > b["floor"] * (1 + 1e-9) else "orders: not raised")
    # the chain grown from them (`_grow`), then their orders as blocking moments
    grown = lower_bounds(spec, target=10 * best, blocking=lambda: moments, blocking_seconds=10, tight=lambda: moments)
    assert grown["floor"] <= best * (1 + 1e-6) + 1e-12
    event("growth raised the bound" if grown["floor"] > b["floor"] * (1 + 1e-9) else "growth: not raised")


@pytest.fixture
def coupled7(monkeypatch):
    """(the coupled graph, its spec at 7 bytes), the coupled bound's own chain one moment long: only `_grow`
    lengthens it."""
    monkeypatch.setattr(bounds, "_MOMENTS", 1)
    g = coupled_graph()
    return g, make_spec(g, one_gpu(7), swap=False)


_GROWTH = {"target": 20.0, "blocking": lambda: [], "blocking_seconds": 5.0}   # the growth runs (no orders after it)
_NO_ORDERS = {"blocking": lambda: [], "blocking_seconds": 5.0, "tight": lambda: []}     # no moments offered


def test_the_chain_grown_from_the_best_moment_by_the_tight_ones_reaches_the_coupled_bound(coupled7):
    # with chains of one moment, the loss alone proves 11 s at 7 bytes; grown by the other operations (`_grow`,
    # before the orders over the blocking moments, here none) the chain proves the 13 s every schedule takes
    g, spec = coupled7
    assert lower_bounds(spec)["floor"] == pytest.approx(11.0)
    assert lower_bounds(spec, **_GROWTH)["floor"] == pytest.approx(11.0)
    grown = lower_bounds(spec, **_GROWTH, tight=lambda: list(range(spec.n)))
    assert grown["floor"] == pytest.approx(13.0) and len(grown["at"]) > 1



def test_the_bound_is_told_as_it_rises_while_the_chain_grows(coupled7):
    # live progress: the loss's 11 s as soon as the single moments give it, then each larger chain's, up to the
    # 13 s the call returns, never down
    g, spec = coupled7
    told = []
    grown = lower_bounds(spec, **_GROWTH, tight=lambda: list(range(spec.n)), tell=told.append)
    assert told[0] == pytest.approx(11.0) and told[-1] == pytest.approx(grown["floor"]) == pytest.approx(13.0)
    assert told == sorted(told)


def test_where_no_tight_moment_raises_the_chain_the_moments_its_own_point_has_no_room_at_do(coupled7, monkeypatch):
    # no tight moments at all: the loss's chain, 11 s, takes the moments where its own optimal point overflows
    # (`_separated`: each with the chain's columns fixed at that point, over 11 s), and reaches the 13 s every
    # schedule takes; each moment separated is such a one
    g, spec = coupled7
    found = []
    separated = bounds._separated

    def spy(*a, **k):
        found.append((a[7], separated(*a, **k)))        # (the chain's bound, what it separates)
        return found[-1][1]

    monkeypatch.setattr(bounds, "_separated", spy)
    grown = lower_bounds(spec, **_GROWTH, tight=lambda: [])
    assert grown["floor"] == pytest.approx(13.0) and len(grown["at"]) > 1
    assert found and found[0][1] and found[0][0] == pytest.approx(1.0 * TIME_SCALE)
    assert set(grown["at"]) - {found[0][1][0]} != set(grown["at"])      # the first one separated joined

def test_pairs_of_moments_that_cut_off_the_grown_chain_s_point_raise_the_bound(monkeypatch):
    # a 14-operation training graph at 95% of keep-everything's memory, no tight moments: the chain stops growing
    # short of the optimum. Pairs (y, (u, y, 0)) where y reads a value the chain's point computes again beside one
    # held from before (`_paired`), one of which cuts off that point as far as the optimum (`_beyond`), raise the
    # bound over their orders, and it stays below the exhaustive optimum
    g = generate.random_training_graph(4, 4, params=True, max_inputs=2, window=3)
    budget = int(0.95 * ke_peak(g))
    best = optimum(g, budget)
    spec = make_spec(g, one_gpu(budget), swap=False)
    monkeypatch.setattr(bounds, "_PAIRS", 0.0)
    alone = lower_bounds(spec, target=best, **_NO_ORDERS)
    monkeypatch.undo()
    paired = lower_bounds(spec, target=best, **_NO_ORDERS)
    assert alone["floor"] < paired["floor"] * (1 - 1e-3) and paired["floor"] <= best * (1 + 1e-6)
    assert any(bounds._last_before(m) for m in paired["at"]) and not any(bounds._last_before(m) for m in alone["at"])


def test_pairs_of_moments_whose_cut_falls_short_of_the_target_leave_their_seconds_unspent(monkeypatch):
    # a 16-operation training graph at 85% of keep-everything's memory: a pair cuts off the grown chain's point, but
    # none as far as the optimum, so one pair proves nothing there and no orders run: the bound is the growth's
    g = generate.random_training_graph(7, 31, params=False, max_inputs=2, window=3)
    budget = int(0.85 * ke_peak(g))
    best = optimum(g, budget)
    spec = make_spec(g, one_gpu(budget), swap=False)
    calls, ordered = [], []
    beyond, orders = bounds._beyond, bounds._orders

    def spy(*a, **k):
        calls.append((a, k, beyond(*a, **k)))
        return calls[-1][2]

    monkeypatch.setattr(bounds, "_beyond", spy)
    monkeypatch.setattr(bounds, "_orders", lambda *a, **k: ordered.append(orders(*a, **k)) or ordered[-1])
    short = lower_bounds(spec, target=best, **_NO_ORDERS)
    a, k, found = calls[-1]
    assert all(len(group) == 2 for group in a[8]) and k["cutoff"] is not None     # the pairs' call
    assert a[8] and not found and not ordered
    deepest = max(v for v, _ in beyond(*a[:9], 0.0, 10.0, threading.Event()))    # model time, as the chain's
    chain, reach = (short["floor"] - short["work"]) * TIME_SCALE, (best - short["work"]) * TIME_SCALE
    assert chain * (1 + 1e-6) < deepest < reach
    monkeypatch.setattr(bounds, "_PAIRS", 0.0)
    assert short["floor"] == pytest.approx(lower_bounds(spec, target=best, **_NO_ORDERS)["floor"], rel=1e-9)


def test_with_seconds_to_spare_a_pair_whose_cut_falls_short_of_the_target_still_takes_its_orders(monkeypatch):
    # the same graph and budget as above, where the growth has seconds of its own (`grow_seconds`: large models, on
    # which no solver waits for the bound) and more than _DEEP are left after it: the pair that cuts off the chain's
    # point, though short of the optimum, is kept and its orders raise the bound, which stays below the optimum
    g = generate.random_training_graph(7, 31, params=False, max_inputs=2, window=3)
    budget = int(0.85 * ke_peak(g))
    best = optimum(g, budget)
    spec = make_spec(g, one_gpu(budget), swap=False)
    ordered = []
    orders = bounds._orders
    monkeypatch.setattr(bounds, "_orders", lambda *a, **k: ordered.append(a[7]) or orders(*a, **k))
    spare = {**_NO_ORDERS, "blocking_seconds": 20.0, "grow_seconds": 4.0}
    short = lower_bounds(spec, target=best, **spare)
    assert not ordered          # 20 s less the growth's are fewer than _DEEP: the pairs are gated as before
    monkeypatch.setattr(bounds, "_DEEP", 10.0)
    deep = lower_bounds(spec, target=best, **spare)
    assert ordered and all(any(bounds._last_before(m) for m in ms) for ms in ordered)
    assert short["floor"] * (1 + 1e-6) < deep["floor"] <= best * (1 + 1e-6)


def test_the_chain_grown_is_solved_to_its_optimum_where_the_seconds_per_programme_stopped_it_short(coupled7,
                                                                                                   monkeypatch):
    # every programme the growth runs stops short (its dual bound 1% under the optimum, unsolved): the chain it
    # ends with runs again, to the 13 s every schedule takes, which no programme of the growth showed
    g, spec = coupled7
    solve = bounds._solve

    def short(*a, solved=False, **k):
        v = solve(*a, **k)
        return (0.99 * v, False) if solved else v

    monkeypatch.setattr(bounds, "_solve", short)
    grown = lower_bounds(spec, **_GROWTH, tight=lambda: list(range(spec.n)))
    assert grown["floor"] == pytest.approx(13.0) and len(grown["at"]) > 1


def test_the_next_tier_of_tight_moments_joins_where_the_first_raises_nothing(coupled7, monkeypatch):
    # tiers of one: g2 first raises nothing on the loss's chain (11 s); g1, of the second tier, raises it to 12 s,
    # and then g2 joins too: the 13 s every schedule takes
    g, spec = coupled7
    monkeypatch.setattr(bounds, "_PAIRS", 0.0)     # the growth alone: no pairs of moments after it
    monkeypatch.setattr(bounds, "_TIGHT", 1)
    monkeypatch.setattr(bounds, "_separated", lambda *a, **k: [])     # the tiers alone
    ix = g.arrays.index
    assert lower_bounds(spec, **_GROWTH, tight=lambda: [ix["g2"]])["floor"] == pytest.approx(11.0)
    grown = lower_bounds(spec, **_GROWTH, tight=lambda: [ix["g2"], ix["g1"]])
    assert grown["floor"] == pytest.approx(13.0)
    assert sorted(g.arrays.ids[x] for x in grown["at"]) == ["g1", "g2", "loss"]


def test_the_chain_grows_again_from_its_start_with_every_tier_where_an_early_tier_led_it_astray(coupled7,
                                                                                                monkeypatch):
    # the programmes' values are stand-ins (the test is of the search): g2, alone in the first tier, raises the
    # loss's chain a little and joins; g1, of the second, a little more on that chain; nothing then. Grown again
    # from the loss with both tiers at once, g1 joins first, and that chain's bound is the largest
    g, spec = coupled7
    monkeypatch.setattr(bounds, "_PAIRS", 0.0)     # the growth alone: no pairs of moments after it
    monkeypatch.setattr(bounds, "_TIGHT", 1)
    ix, ids = g.arrays.index, g.arrays.ids
    extra = {frozenset({"loss", "g2"}): 0.2, frozenset({"loss", "g1", "g2"}): 0.3, frozenset({"loss", "g1"}): 1.0}
    coupled, solve, tried = bounds._coupled, bounds._solve, []

    def built(spec, d, chain, *a, **k):
        out = coupled(spec, d, chain, *a, **k)
        names = frozenset(ids[m] for m in chain)
        return (names if names in extra else out[0], *out[1:])

    def value(problem, *a, solved=False, **k):
        if not isinstance(problem, frozenset):
            return solve(problem, *a, solved=solved, **k)
        tried.append(problem)
        v = (1.0 + extra[problem]) * TIME_SCALE          # the loss's second of recomputation, and more
        return (v, True) if solved else v

    monkeypatch.setattr(bounds, "_coupled", built)
    monkeypatch.setattr(bounds, "_solve", value)
    monkeypatch.setattr(bounds, "_separated", lambda *a, **k: [])     # the tiers alone
    grown = lower_bounds(spec, **_GROWTH, tight=lambda: [ix["g2"], ix["g1"]])
    assert tried[:2] == [frozenset({"loss", "g2"}), frozenset({"loss", "g1", "g2"})]     # the first growth
    assert grown["floor"] == pytest.approx(12.0)
    assert sorted(ids[x] for x in grown["at"]) == ["g1", "loss"]


def test_the_growth_takes_the_seconds_it_is_given_instead_of_its_own(coupled7, monkeypatch):
    # no seconds of its own for the growth: the loss's 11 s; given some (as the MILP gives them on large models),
    # the grown chain's 13 s
    g, spec = coupled7
    monkeypatch.setattr(bounds, "_PAIRS", 0.0)     # the growth alone: no pairs of moments after it
    monkeypatch.setattr(bounds, "_GROWING", 0.0)
    args = {**_GROWTH, "tight": lambda: list(range(spec.n))}
    assert lower_bounds(spec, **args)["floor"] == pytest.approx(11.0)
    assert lower_bounds(spec, **args, grow_seconds=5.0)["floor"] == pytest.approx(13.0)


def test_the_chains_grown_last_are_finished_side_by_side_where_the_last_is_not_solved_in_time(coupled7, monkeypatch):
    # every programme of the growth stops short: g1 joins the loss (11.88 s of its 12), then g2 (11.99 s of 13),
    # whose chain stays that short when finished; the one before it is solved then, 12 s, and is the bound
    g, spec = coupled7
    monkeypatch.setattr(bounds, "_PAIRS", 0.0)     # the growth alone: no pairs of moments after it
    monkeypatch.setattr(bounds.os, "cpu_count", lambda: 2)
    ix = g.arrays.index
    stuck, coupled, solve = [], bounds._coupled, bounds._solve     # stuck: held, so that no id is reused

    def built(spec, d, chain, *a, **k):        # the programme of the three moments is the one stuck
        out = coupled(spec, d, chain, *a, **k)
        if len(chain) == 3:
            stuck.append(out[0][0])
        return out

    def short(problem, *a, solved=False, **k):
        last = any(problem[0] is c for c in stuck)
        v = 1.99 * TIME_SCALE if last else solve(problem, *a, **k)      # 11.99 s in all, never more
        return (v if last else 0.99 * v, False) if solved else v

    monkeypatch.setattr(bounds, "_coupled", built)
    monkeypatch.setattr(bounds, "_solve", short)
    monkeypatch.setattr(bounds, "_separated", lambda *a, **k: [])     # the tiers alone
    grown = lower_bounds(spec, **_GROWTH, tight=lambda: [ix["g1"], ix["g2"]])
    assert grown["floor"] == pytest.approx(12.0)
    assert sorted(g.arrays.ids[x] for x in grown["at"]) == ["g1", "loss"]


def test_a_chain_from_an_earlier_call_is_where_the_growth_starts(coupled7, monkeypatch):
    # g1 alone raises the loss's chain to 12 s; g2 alone raises nothing on it (11 s). Given the chain of the loss
    # and g1 (`start`, from the earlier call's "grown"), the growth over g2 alone starts there: 13 s
    g, spec = coupled7
    monkeypatch.setattr(bounds, "_PAIRS", 0.0)     # the growth alone: no pairs of moments after it
    monkeypatch.setattr(bounds, "_separated", lambda *a, **k: [])     # the moments offered alone
    ix, ids = g.arrays.index, g.arrays.ids
    first = lower_bounds(spec, **_GROWTH, tight=lambda: [ix["g1"]])
    assert first["floor"] == pytest.approx(12.0) and sorted(ids[x] for x in first["grown"][1]) == ["g1", "loss"]
    assert lower_bounds(spec, **_GROWTH, tight=lambda: [ix["g2"]])["floor"] == pytest.approx(11.0)
    again = lower_bounds(spec, **_GROWTH, tight=lambda: [ix["g2"]], start=first["grown"])
    assert again["floor"] == pytest.approx(13.0) and sorted(ids[x] for x in again["at"]) == ["g1", "g2", "loss"]
    assert again["grown"][1] == again["at"]


def test_a_chain_from_an_earlier_call_may_hold_moments_this_call_did_not_rank(coupled7, monkeypatch):
    # the earlier call's chain holds g1, which this call's candidates leave out (one candidate here; on GPT-2 at
    # 30% of its keep-everything memory, a moment `_separated` added): its ancestors are found all the same, and
    # the growth from it gets as far as from a chain of ranked moments (it raised KeyError in the MILP's second
    # bounds, on the core the model without gap stages left, with a time limit of 300 s)
    g, spec = coupled7
    monkeypatch.setattr(bounds, "_PAIRS", 0.0)
    monkeypatch.setattr(bounds, "_separated", lambda *a, **k: [])
    ix, ids = g.arrays.index, g.arrays.ids
    first = lower_bounds(spec, **_GROWTH, tight=lambda: [ix["g1"]])
    assert sorted(ids[x] for x in first["grown"][1]) == ["g1", "loss"]
    monkeypatch.setattr(bounds, "_CANDIDATES", 1)
    assert ix["g1"] not in bounds._candidates(spec, bounds._needed(spec), np.repeat(np.arange(spec.n),
                                                                                   np.diff(spec.in_ptr)))
    again = lower_bounds(spec, **_GROWTH, tight=lambda: [ix["g2"]], start=first["grown"])
    assert again["floor"] == pytest.approx(13.0) and sorted(ids[x] for x in again["at"]) == ["g1", "g2", "loss"]


def test_the_chains_finished_are_the_best_one_and_those_it_grew_from_not_the_last_grown(coupled7, monkeypatch):
    # the tries' values are stand-ins (the test is of the search), none solved, one core: g1 joins the loss's
    # chain (1.5 s of recomputation tried); g2, of the next tier, raises nothing on it (1.4 s). Grown again from
    # the loss with both tiers, g1's try stops at 1.3 s this time and g2 (1.45 s) joins instead. The chain
    # finished is the best one, the loss and g1, not the last grown: solved, 2 s, 12 s in all (the 3-layer GPT-2
    # at 25% of its keep-everything memory, where the growth began again after its best chain)
    g, spec = coupled7
    monkeypatch.setattr(bounds, "_PAIRS", 0.0)     # the growth alone: no pairs of moments after it
    monkeypatch.setattr(bounds, "_TIGHT", 1)
    monkeypatch.setattr(bounds.os, "cpu_count", lambda: 1)
    monkeypatch.setattr(bounds, "_separated", lambda *a, **k: [])     # the tiers alone
    ix, ids = g.arrays.index, g.arrays.ids
    tries = {frozenset({"loss", "g1"}): [1.5, 1.3], frozenset({"loss", "g2"}): [1.45],
             frozenset({"loss", "g1", "g2"}): [1.4]}
    coupled, solve, named, finished = bounds._coupled, bounds._solve, {}, []

    def built(spec, d, chain, *a, **k):
        out = coupled(spec, d, chain, *a, **k)
        named[id(out[0][0])] = (out[0][0], frozenset(ids[m] for m in chain))     # held, so that no id is reused
        return out

    def value(problem, *a, solved=False, **k):
        names = named.get(id(problem[0]), (None, None))[1]
        if names not in tries:
            return solve(problem, *a, solved=solved, **k)
        if not solved:                  # the chains finished side by side
            finished.append(names)
            return solve(problem, *a, **k)
        vs = tries[names]
        return (vs.pop(0) if len(vs) > 1 else vs[0]) * TIME_SCALE, False

    monkeypatch.setattr(bounds, "_coupled", built)
    monkeypatch.setattr(bounds, "_solve", value)
    grown = lower_bounds(spec, **_GROWTH, tight=lambda: [ix["g1"], ix["g2"]])
    assert finished == [frozenset({"loss", "g1"})]
    assert grown["floor"] == pytest.approx(12.0)
    assert sorted(ids[x] for x in grown["at"]) == ["g1", "loss"]


def test_tight_moments_take_a_drop_from_the_value_s_last_reader_wherever_the_list_puts_it():
    # f2 (read by the loss only) dropped right after the loss or at the end of the list: the simulator releases
    # it after the loss either way, so the least memory to spare is at the loss (12 of 20 bytes held... 8), then g2
    g = coupled_graph()
    cl = one_gpu(20)
    spec = make_spec(g, cl, swap=False)
    order = ["x", "f0", "f1", "f2", "loss", "g2", "g1", "g0"]
    frees = {"loss": ["f2"], "g2": ["loss", "f1"], "g1": ["g2", "f0"], "g0": ["g1", "x"]}

    def steps(late: bool) -> list:
        out = []
        for v in order:
            out.append(Compute(v, "gpu0"))
            out += [Free(u, "gpu0") for u in frees.get(v, []) if not (late and u == "f2")]
        return out + ([Free("f2", "gpu0")] if late else [])

    early, late = steps(False), steps(True)
    assert simulate(g, cl, Schedule(tuple(early))).peak == simulate(g, cl, Schedule(tuple(late))).peak
    ids = g.arrays.ids
    ranked = [ids[v] for v in bounds.tight_moments(spec, ids, early)]
    assert ranked[:2] == ["loss", "g2"] and [ids[v] for v in bounds.tight_moments(spec, ids, late)] == ranked


def test_the_moment_plan_recomputes_what_the_budget_forces_and_proves_the_bound():
    # at 350 bytes the plan at the loss (or its gradient) recomputes a, the 1 s it forces; with room for
    # everything nothing is forced and there is no plan
    g = forced_recompute_graph()
    plans, bound = moment_plans(make_spec(g, one_gpu(350), swap=False))
    assert bound == pytest.approx(7.0)
    assert plans and all(len(plan) == 1 for plan in plans)
    assert all(g.arrays.ids[x] in ("l", "gb") for (x, _), in plans)
    assert all([g.arrays.ids[v] for v in drop] == ["a"] for (_, drop), in plans)
    assert moment_plans(make_spec(g, one_gpu(550), swap=False)) == ([], pytest.approx(6.0))


def op(i, kind, ins, cost, size=1, required=False) -> Node:
    return Node(i, "op", kind, ins, {"cuda": cost}, size, required=required)


def coupled_graph() -> Graph:
    """x -> f0 -> f1 -> f2 -> loss (4 bytes, required), then g2(loss, f1), g1(g2, f0), g0(g1, x) required; 1 byte
    each otherwise, forward operations 1 s, gradients 2 s."""
    nodes = (Node("x", "data", "input", (), {"cuda": 0.0}, 1, recomputable=False),
             op("f0", "forward", ("x",), 1.0), op("f1", "forward", ("f0",), 1.0), op("f2", "forward", ("f1",), 1.0),
             op("loss", "loss", ("f2",), 1.0, 4, True), op("g2", "backward", ("loss", "f1"), 2.0),
             op("g1", "backward", ("g2", "f0"), 2.0), op("g0", "backward", ("g1", "x"), 2.0, 1, True))
    return check_graph(Graph(nodes, name="coupled"))


def test_the_coupled_bound_is_tight_where_each_moment_alone_is_not(monkeypatch):
    # 7 bytes: computing the loss leaves room for f0 or f1, not both (one recomputation, 1 s, for that moment
    # alone); but whichever is dropped comes back when the loss and g2 are held too, and then more must go: every
    # schedule takes the work (10 s) plus 3 s
    g = coupled_graph()
    spec = make_spec(g, one_gpu(7), swap=False)
    assert optimum(g, 7) == pytest.approx(13.0)
    b = lower_bounds(spec)
    assert b["work"] == pytest.approx(10.0) and b["floor"] == b["recompute"] == pytest.approx(13.0)
    assert len(b["at"]) > 1 and g.arrays.ids[b["at"][0]] != g.arrays.ids[b["at"][-1]]
    # not tried when a schedule within reach is proven by the single moments already
    assert len(lower_bounds(spec, target=11.0)["at"]) == 1
    # the MILP keeps required results once computed, so its stage model has no room here: it must not say that no
    # schedule fits
    with pytest.raises(InfeasibleError) as e:
        solve(g, one_gpu(7), "milp", SolveOptions(swap=False, time_limit=30, threads=1))
    assert not e.value.proven and str(e.value).startswith("no schedule found: ") and "stage model" in str(e.value)
    monkeypatch.setattr(bounds, "_MOMENTS", 1)      # one moment at a time
    one = lower_bounds(spec)
    assert one["recompute"] == pytest.approx(11.0) and len(one["at"]) == 1


def weight_gradient_graph() -> Graph:
    """x -> a -> l -> gl, then X(gl) (4 bytes) -> gx and the weight gradient w(gl, a) (2 bytes), both required: w
    is neither above nor below X, so a schedule computes it before X or after, as it likes."""
    nodes = (Node("x", "data", "input", (), {"cuda": 0.0}, 1, recomputable=False),
             op("a", "forward", ("x",), 3.0, 2), op("l", "loss", ("a",), 1.0, 1), op("gl", "backward", ("l",), 1.0, 1),
             op("X", "backward", ("gl",), 1.0, 4), op("w", "backward", ("gl", "a"), 1.0, 2, True),
             op("gx", "backward", ("X",), 1.0, 1, True))
    return check_graph(Graph(nodes, name="weight-gradient"))


def test_what_only_an_operation_beside_the_moment_reads_is_held_or_computed_again(monkeypatch):
    # 6 bytes: computing X (gl and X, 5 bytes) leaves room for neither a nor w. A moment that counted only what X's
    # descendants read would let a go for nothing (the bound: the work, 8 s); but w, computed before X, must be
    # held or computed again, and computed after, needs a: every schedule takes 13 s, and the bound says so
    g = weight_gradient_graph()
    spec = make_spec(g, one_gpu(6), swap=False)
    assert optimum(g, 6) == pytest.approx(13.0)
    b = lower_bounds(spec)
    assert b["work"] == pytest.approx(8.0) and b["floor"] == b["recompute"] == pytest.approx(13.0)
    coupled = bounds._coupled
    monkeypatch.setattr(bounds, "_coupled", lambda *a: coupled(*a[:7], free=False))
    assert lower_bounds(spec)["floor"] == pytest.approx(8.0)


def test_below_the_least_budget_no_schedule_fits_and_every_single_gpu_solver_says_so_proven():
    # the largest operation (l with its input b: 200 bytes, or gb with l and b: 250) fits in 300, yet every
    # schedule needs 350: computing l or gb leaves no room for a, which ga reads, and recomputing a then needs x
    # beside gb and a: the coupled moments see it
    g = forced_recompute_graph()
    assert largest_operation(g)[1] <= 300
    assert exhaustive(g, 349) is None and exhaustive(g, 350) is not None
    assert least_budget(make_spec(g, one_gpu(300), swap=False)) == 350
    b = lower_bounds(make_spec(g, one_gpu(349), swap=False))
    assert b["recompute"] == b["floor"] == float("inf") and len(b["at"]) > 1
    for solver in ("milp", "pulp", "lp-rounding", "dtr"):
        with pytest.raises(InfeasibleError) as e:
            solve(g, one_gpu(349), solver, SolveOptions(swap=False, time_limit=10, threads=1))
        msg = str(e.value)
        assert e.value.proven and msg.startswith("no schedule fits: ") and "whatever it recomputes" in msg, solver
        assert "350 B" in msg, (solver, msg)
    # with a host to swap to, the bound does not apply: no claim
    assert least_budget(make_spec(g, gpu_host(300), swap=True)) is None


def _last_gradients_required(g: Graph) -> Graph:
    """The graph with its last gradients required, as parameter gradients are: forward activations are then held
    for the backward pass, and tight budgets force recomputation."""
    read = {u for node in g.nodes for u in node.inputs}
    last = [replace(node, required=node.required or (node.kind == "backward" and node.id not in read))
            for node in g.nodes]
    return check_graph(Graph(tuple(last), name=g.name))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(g=random_dags(min_nodes=2, max_nodes=7, max_bytes=400, zero_costs=False), frac=st.floats(0.0, 0.6))
def test_no_schedule_fits_where_the_bounds_say_none_does(g, frac):
    _no_schedule_below_the_least_budget(g, frac)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(g=training_graphs(2, 5, params=False, max_bytes=400, zero_sizes=False), frac=st.floats(0.0, 0.5))
def test_no_schedule_fits_small_training_graphs_where_the_bounds_say_none_does(g, frac):
    _no_schedule_below_the_least_budget(_last_gradients_required(g), frac)


def _no_schedule_below_the_least_budget(g: Graph, frac: float) -> None:
    need = largest_operation(g)[1]
    total = int(g.arrays.bytes.sum() + g.arrays.workspace.max(initial=0))
    budget = _between_largest_and_total(g, frac)
    spec = make_spec(g, one_gpu(budget), swap=False)
    least = least_budget(spec)
    assert 0 <= least <= total
    if least > need:
        assert exhaustive(g, least - 1) is None
    none = not lower_bounds(spec)["floor"] < float("inf")
    if none:
        assert exhaustive(g, budget) is None
    event("no schedule proven" if none else "above the largest operation" if least > need else "at it")


def test_the_milp_stops_when_its_warm_start_is_within_the_gap_of_the_bound():
    g = forced_recompute_graph()
    s = solve(g, one_gpu(350), "milp", SolveOptions(swap=False, time_limit=30, threads=1))
    r = simulate(g, one_gpu(350), s)
    assert r.valid and r.makespan == pytest.approx(7.0)
    rep = s.report
    assert rep.status == "optimal" and rep.bound == pytest.approx(7.0) and rep.gap == pytest.approx(0.0)
    lb = rep.extra["lower_bounds"]
    assert lb["at"] in (["l"], ["gb"]) and lb["recompute"] == pytest.approx(7.0)


def test_operations_no_required_result_needs_are_not_counted():
    z = {"cuda": 0.0}
    nodes = (Node("x", "data", "input", (), z, 8, recomputable=False),
             Node("a", "op", "forward", ("x",), {"cuda": 1.0}, 8, required=True),
             Node("dead", "op", "forward", ("x",), {"cuda": 10.0}, 8))
    g = check_graph(Graph(nodes, name="dead-branch"))
    b = lower_bounds(make_spec(g, one_gpu(10**6), swap=False))
    assert b["floor"] == pytest.approx(1.0)
    r = simulate(g, one_gpu(10**6), Schedule((Compute("x", "gpu0"), Compute("a", "gpu0"))))
    assert r.valid and r.makespan == pytest.approx(1.0)


def test_the_recompute_bound_applies_only_where_one_device_computes_everything_and_nothing_leaves_it():
    g = forced_recompute_graph()
    # a host to swap to, or a second GPU, can hold a instead of recomputing it
    assert lower_bounds(make_spec(g, gpu_host(350), swap=True))["recompute"] is None
    assert lower_bounds(make_spec(g, two_gpus(350), swap=False))["recompute"] is None
    # without swapping and without host computation the host holds nothing: the bound applies
    assert lower_bounds(make_spec(g, gpu_host(350), swap=False, host_compute=False))["recompute"] == pytest.approx(7)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(g=random_dags(min_nodes=2, max_nodes=7, max_bytes=400, zero_costs=False), frac=st.floats(0.0, 1.0))
def test_the_bounds_never_exceed_the_exhaustive_optimum(g, frac):
    budget = _between_largest_and_total(g, frac)
    found = exhaustive(g, budget)
    assume(found is not None)
    best, steps = found
    r = simulate(g, one_gpu(budget), Schedule(tuple(steps)))
    assert r.valid and r.makespan == pytest.approx(best, rel=1e-9, abs=1e-12)
    b = lower_bounds(make_spec(g, one_gpu(budget), swap=False))
    assert b["recompute"] is not None
    assert b["floor"] <= best * (1 + 1e-9) + 1e-12
    assert moment_plans(make_spec(g, one_gpu(budget), swap=False), chain_seconds=5.0)[1] <= best * (1 + 1e-9) + 1e-12
    event("recomputation forced" if b["recompute"] > b["work"] * (1 + 1e-9) else "none forced")


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(g=training_graphs(2, 5, params=False, max_bytes=400, zero_sizes=False), frac=st.floats(0.0, 0.5))
def test_the_bounds_never_exceed_the_exhaustive_optimum_of_small_training_graphs(g, frac):
    g = _last_gradients_required(g)
    budget = _between_largest_and_total(g, frac)
    found = exhaustive(g, budget)
    assume(found is not None)
    b = lower_bounds(make_spec(g, one_gpu(budget), swap=False))
    assert b["floor"] <= found[0] * (1 + 1e-9) + 1e-12
    event("recomputation forced" if b["recompute"] > b["work"] * (1 + 1e-9) else "none forced")


@pytest.mark.parametrize("n", [6, 8])
@pytest.mark.parametrize("seed", range(6))
def test_the_bounds_never_exceed_the_exhaustive_optimum_on_small_dags_at_tight_budgets(n, seed):
    g = small_dag(n, seed, ws=True)
    need = largest_operation(g)[1]
    total = int(g.arrays.bytes.sum() + g.arrays.workspace.max(initial=0))
    for budget in sorted({need, need + (total - need) // 4, need + (total - need) // 2}):
        found = exhaustive(g, budget)
        b = lower_bounds(make_spec(g, one_gpu(budget), swap=False))
        if found is not None:
            assert b["floor"] <= found[0] * (1 + 1e-9)


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(g=seeded_training_graphs(max_forward=8), frac=st.floats(0.3, 0.9))
def test_every_solver_schedule_takes_at_least_the_bound(g, frac):
    ke = simulate(g, one_gpu(10**15), solve(g, one_gpu(10**15), "keep-everything"))
    cl = one_gpu(max(int(frac * ke.peak["gpu0"]), largest_operation(g)[1]))
    floor = lower_bounds(make_spec(g, cl, swap=False))["floor"]
    for name in ("chen-greedy", "dtr", "heuristic", "lp-rounding"):
        try:
            r = simulate(g, cl, solve(g, cl, name, SolveOptions(swap=False, time_limit=10, threads=1)))
        except InfeasibleError:
            continue
        assert r.valid and r.makespan >= floor * (1 - 1e-9), name


def _training_spec(g: Graph, frac: float) -> tuple[Graph, int, object]:
    """(the graph with its last gradients required, a budget `frac` of the way up from its largest operation's
    need (`_between_largest_and_total`), the one-device spec at that budget without swapping)."""
    g = _last_gradients_required(g)
    budget = _between_largest_and_total(g, frac)
    return g, budget, make_spec(g, one_gpu(budget), swap=False)


def _between_largest_and_total(g: Graph, frac: float) -> int:
    """The budget `frac` of the way from the largest operation's need to the graph's total bytes."""
    need = largest_operation(g)[1]
    total = int(g.arrays.bytes.sum() + g.arrays.workspace.max(initial=0))
    return int(need + frac * max(total - need, 0))


def _needed_with_inputs(spec) -> list[int]:
    needed = bounds._needed(spec)
    return [v for v in range(spec.n) if needed[v] and spec.in_ptr[v + 1] > spec.in_ptr[v]]


def test_the_orders_and_the_growth_run_no_later_than_until(monkeypatch):
    # their seconds count from where they start, after the single moments: a caller's deadline (`until`) caps
    # them (a 20 s solve of the 3-layer GPT-2 at 30% of its keep-everything memory took 23 s without it)
    g = small_dag(7, 217, ws=True)
    spec = make_spec(g, one_gpu(1010), swap=False)
    monkeypatch.setattr(bounds, "_ORDER_NEAR", 1.0)     # the orders over `moments` run however far short
    given = []
    for name, at in (("_orders", 9), ("_grow", 9)):
        real = getattr(bounds, name)

        def spy(*a, _real=real, _name=name, _at=at, **k):
            given.append((_name, a[_at]))
            return _real(*a, **k)

        monkeypatch.setattr(bounds, name, spy)
    moments = _needed_with_inputs(spec)
    lower_bounds(spec, target=40.0, moments=lambda: moments, order_seconds=30)
    assert given == [("_orders", 30)]       # without a deadline, all of their seconds
    for kw in ({"moments": lambda: moments, "order_seconds": 30},
               {"blocking": lambda: moments, "blocking_seconds": 30, "tight": lambda: moments}):
        given.clear()
        until = time.perf_counter() + 1.0
        lower_bounds(spec, target=40.0, **kw, until=until)
        assert given and all(0 < seconds <= 1.0 for _, seconds in given), given
        assert time.perf_counter() < until + 0.5
    # nor the single moments' integer programmes and the coupled one: past `until`, none is given a second
    solves = []
    real = bounds._solve

    def timed(problem, integer, seconds, *a, **k):
        solves.append((integer, seconds))
        return real(problem, integer, seconds, *a, **k)

    monkeypatch.setattr(bounds, "_solve", timed)
    plain = lower_bounds(spec, target=40.0)
    assert any(integer and seconds >= 1.0 for integer, seconds in solves)
    solves.clear()
    late = lower_bounds(spec, target=40.0, until=time.perf_counter())
    assert late["floor"] <= plain["floor"] and all(seconds <= 0.01 for integer, seconds in solves if integer)


def test_the_orders_of_moments_prove_what_no_chain_of_them_does(monkeypatch):
    # 7 operations at 1010 bytes: the single moments and their chains prove 25 s of the 31 s every schedule takes;
    # taken in every order the moments neither of which is above the other prove all 31
    g = small_dag(7, 217, ws=True)
    spec = make_spec(g, one_gpu(1010), swap=False)
    assert optimum(g, 1010) == pytest.approx(31.0)
    plain = lower_bounds(spec, target=31.0)
    assert plain["floor"] == pytest.approx(25.0)
    monkeypatch.setattr(bounds, "_ORDER_NEAR", 1.0)     # tried however far the bound falls short
    ordered = lower_bounds(spec, target=40.0, moments=lambda: _needed_with_inputs(spec), order_seconds=30)
    assert ordered["floor"] == pytest.approx(31.0)
    at = ordered["at"]
    reach = {x: bounds._reach(spec.in_ptr, spec.in_idx, x, spec.n) for x in at}
    assert any(not reach[y][x] for x, y in itertools.pairwise(at)), "the weakest order is no chain of ancestors"
    # with the target in reach it stops there, and without time or moments nothing changes
    assert lower_bounds(spec, target=28.0, moments=lambda: _needed_with_inputs(spec), order_seconds=30)["floor"] \
        == pytest.approx(28.0, rel=1e-6)
    assert lower_bounds(spec, target=40.0, moments=lambda: _needed_with_inputs(spec))["floor"] == pytest.approx(25.0)
    assert lower_bounds(spec, target=40.0, order_seconds=30)["floor"] == pytest.approx(25.0)
    # not tried where the bound is further than _ORDER_NEAR below the target
    monkeypatch.setattr(bounds, "_ORDER_NEAR", 0.02)
    assert lower_bounds(spec, target=31.0, moments=lambda: _needed_with_inputs(spec), order_seconds=30)["floor"] \
        == pytest.approx(25.0)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(g=random_dags(min_nodes=2, max_nodes=7, max_bytes=400, zero_costs=False), frac=st.floats(0.0, 0.6),
       data=st.data())
def test_the_orders_of_moments_never_exceed_the_exhaustive_optimum(g, frac, data):
    budget = _between_largest_and_total(g, frac)
    found = exhaustive(g, budget)
    assume(found is not None)
    spec = make_spec(g, one_gpu(budget), swap=False)
    moments = data.draw(st.permutations(_needed_with_inputs(spec)))
    target = found[0] * data.draw(st.sampled_from([1.0, 10.0]))     # stopping at the optimum, or searching on
    with pytest.MonkeyPatch.context() as m:
        m.setattr(bounds, "_ORDER_NEAR", 1.0)
        if data.draw(st.booleans()):
            b = lower_bounds(spec, target=target, moments=lambda: moments, order_seconds=10)
        else:       # as blocking moments: the same orders, for at most _BLOCKING seconds
            b = lower_bounds(spec, target=target, blocking=lambda: moments, blocking_seconds=10)
    assert b["floor"] <= found[0] * (1 + 1e-6) + 1e-12
    event("orders raised the bound" if b["at"] is not None and len(b["at"]) > 1 else "not raised")


def test_the_orders_of_every_moment_never_exceed_the_exhaustive_optimum_on_small_dags(monkeypatch):
    # every operation a moment, searched until they run out: each order's programme is tried, and the least over
    # them holds (an order no schedule follows, a row it breaks: 6 operations, seed 6 at 710 bytes once said 200 s
    # of 20)
    monkeypatch.setattr(bounds, "_ORDER_NEAR", 1.0)
    raised = 0
    for n, seed in itertools.product((6, 7, 8), range(40)):
        g = small_dag(n, seed, ws=True)
        need = largest_operation(g)[1]
        total = int(g.arrays.bytes.sum() + g.arrays.workspace.max(initial=0))
        for k in range(1, 6):
            budget = need + (total - need) * k // 10
            found = exhaustive(g, budget)
            if found is None:
                continue
            spec = make_spec(g, one_gpu(budget), swap=False)
            b = lower_bounds(spec, target=10 * found[0], moments=partial(_needed_with_inputs, spec), order_seconds=10)
            assert b["floor"] <= found[0] * (1 + 1e-9) + 1e-12, (n, seed, budget)
            raised += b["floor"] > lower_bounds(spec)["floor"] * (1 + 1e-9)
    assert raised       # the orders do raise the bound on some of them (8 operations, seed 3 at 980 bytes)


def test_the_moments_to_order_are_first_computed_where_a_value_came_back_a_third_time():
    # a is computed three times; between its second free and its third computation, d is computed first, below a
    # and reading b, computed twice: the one moment worth ordering. c, first computed after a's first free, is not
    nodes = (Node("x", "data", "input", (), {"cuda": 0.0}, 1, recomputable=False),
             op("a", "forward", ("x",), 1.0), op("b", "forward", ("a",), 1.0), op("c", "forward", ("b",), 1.0),
             op("d", "backward", ("c", "b"), 1.0), op("e", "backward", ("d", "a"), 1.0, 1, True))
    g = check_graph(Graph(nodes, name="thrice"))
    C, F = (lambda v: Compute(v, "gpu0")), (lambda v: Free(v, "gpu0"))
    ins = (C("x"), C("a"), C("b"), F("a"), C("c"), F("b"), C("a"), C("b"), F("a"), C("d"), C("a"), C("e"))
    twice = ins[:8] + (C("d"), C("e"))
    for s in (ins, twice):
        assert simulate(g, one_gpu(100), Schedule(s)).valid
    spec = make_spec(g, one_gpu(100), swap=False)
    assert [g.arrays.ids[v] for v in bounds.order_moments(spec, g.arrays.ids, ins)] == ["d"]
    assert bounds.order_moments(spec, g.arrays.ids, twice) == []


def thrice_graph() -> Graph:
    """x -> e -> p, q -> l, then big1(l), gp(big1, p), big2(gp), gq(big2, q) required; e, p, q 2 bytes, big1 and big2
    10 with workspace 2 and 3. With 15 bytes, x stays (e reads it again), and at big1 and at big2 there is no
    room for 2 more bytes: e, p, q are dropped at big1, e and p computed again for gp, and e dropped at big2 and
    computed a third time, with q, for gq. The optimum is the work (8 s) and 4 recomputations; big1's moment
    alone charges e once (11 s)."""
    nodes = (Node("x", "data", "input", (), {"cuda": 0.0}, 1, recomputable=False),
             op("e", "forward", ("x",), 1.0, 2), op("p", "forward", ("e",), 1.0, 2),
             op("q", "forward", ("e",), 1.0, 2), op("l", "loss", ("p", "q"), 1.0, 1),
             replace(op("big1", "backward", ("l",), 1.0, 10), workspace=2), op("gp", "backward", ("big1", "p"), 1.0),
             replace(op("big2", "backward", ("gp",), 1.0, 10), workspace=3), op("gq", "backward", ("big2", "q"), 1.0, 1,
                                                                                True))
    return check_graph(Graph(nodes, name="thrice"))


def test_the_blocking_moments_are_where_memory_was_too_short_to_keep_a_value_computed_a_third_time():
    g = thrice_graph()
    best, steps = exhaustive(g, 15)
    assert best == pytest.approx(12.0)
    assert [s.node for s in steps if isinstance(s, Compute)].count("e") == 3
    spec = make_spec(g, one_gpu(15), swap=False)
    assert [g.arrays.ids[v] for v in bounds.blocking_moments(spec, g.arrays.ids, steps)] == ["big2"]
    # with room at big2 for e, the same schedule was short of nothing there: no moment
    roomy = make_spec(g, one_gpu(17), swap=False)
    assert bounds.blocking_moments(roomy, g.arrays.ids, steps) == []
    # a schedule that computes nothing a third time has none
    keep = Schedule(tuple(Compute(v, "gpu0") for v in g.arrays.ids))
    assert simulate(g, one_gpu(40), keep).valid
    assert bounds.blocking_moments(make_spec(g, one_gpu(40), swap=False), g.arrays.ids, keep.instructions) == []


def test_the_blocking_moment_charges_the_third_computation_the_peaks_moment_leaves_free(monkeypatch):
    # with one candidate moment (no chain of them), the bound is big1's alone; big2, where the optimum had no room
    # to keep e, ordered after it proves the optimum
    g = thrice_graph()
    best, steps = exhaustive(g, 15)
    spec = make_spec(g, one_gpu(15), swap=False)
    monkeypatch.setattr(bounds, "_CANDIDATES", 1)
    alone = lower_bounds(spec, target=20.0)
    assert alone["floor"] < 12.0 - 0.5
    blocking = partial(bounds.blocking_moments, spec, g.arrays.ids, steps)
    b = lower_bounds(spec, target=20.0, blocking=blocking, blocking_seconds=10)
    assert b["floor"] == pytest.approx(best)
    # gp, which reads big1's output beside p, is tried first (`_reader`), and alone raises nothing
    assert [g.arrays.ids[v] for v in b["at"]] == [*(g.arrays.ids[v] for v in alone["at"]), "gp", "big2"]
    assert lower_bounds(spec, target=20.0, blocking=partial(list, [g.arrays.ids.index("gp")]),
                        blocking_seconds=10)["floor"] == pytest.approx(alone["floor"])
    # no time for them, or the target reached already: nothing changes
    assert lower_bounds(spec, target=20.0, blocking=blocking)["floor"] == pytest.approx(alone["floor"])
    assert lower_bounds(spec, target=alone["floor"] * 0.9, blocking=blocking, blocking_seconds=10)["floor"] \
        == pytest.approx(alone["floor"])
    # the MILP takes them from its fastest candidate and proves its schedule optimal (the orders stop at its
    # target, 1% under it)
    s = solve(g, one_gpu(15), "milp", SolveOptions(swap=False, time_limit=30, gap=0.01))
    assert simulate(g, one_gpu(15), s).makespan == pytest.approx(best)
    assert s.report.status == "optimal" and s.report.gap <= 0.01
    assert best * 0.99 <= s.report.bound * (1 + 1e-6) and s.report.bound > alone["floor"] + 0.5
    assert s.report.extra["lower_bounds"]["at"][-1] == "big2"


def test_the_weight_gradient_read_beside_a_moments_output_comes_first_in_the_orders(monkeypatch):
    # gp3 reads g3 with f1 and f2, which the chain's moments need not hold together: first in the orders, it
    # raises the bound, which stays under the exhaustive optimum
    monkeypatch.setattr(bounds, "_ORDER_NEAR", 1.0)
    g = generate.random_training_graph(4, 4)
    ids = g.arrays.ids
    found = exhaustive(g, 240_800)
    spec = make_spec(g, one_gpu(240_800), swap=False)
    chain = [ids.index(v) for v in ("f0", "f1", "f2", "f3", "loss", "g3", "g2", "g1", "g0")]
    anc = {x: bounds._reach(spec.in_ptr, spec.in_idx, x, spec.n) for x in chain}
    assert [ids[w] for w in bounds._reader(spec, bounds._needed(spec), chain, anc)] == ["gp3"]
    # the orders run where the fastest schedule gives moments (here one the chain has already: alone, no gain)
    blocking = partial(list, [ids.index("g0")])
    with_it = lower_bounds(spec, target=10 * found[0], blocking=blocking, blocking_seconds=10)
    assert "gp3" in [ids[x] for x in with_it["at"]]
    monkeypatch.setattr(bounds, "_reader", lambda *a: [])
    without = lower_bounds(spec, target=10 * found[0], blocking=blocking, blocking_seconds=10)
    assert without["floor"] * 1.02 < with_it["floor"] <= found[0] * (1 + 1e-9)


def test_the_chain_plan_drops_what_the_coupled_point_does_not_hold_and_fits_where_one_moment_needs_repair():
    # one moment's plans prove 10 s; the coupled programme over the chain through big1 proves the optimum, 12 s,
    # and its point drops e, p, q at big1 and e again at big2: that keep-set fits as it stands and takes 12 s,
    # where the single moments' keep-sets need repair (or cannot have it)
    g = thrice_graph()
    ids = g.arrays.ids
    spec = make_spec(g, one_gpu(15), swap=False)
    plans, bound = moment_plans(spec)
    assert bound == pytest.approx(10.0) and all(len(plan) == 1 for plan in plans)
    plans, bound = moment_plans(spec, chain_seconds=5.0)
    assert bound == pytest.approx(exhaustive(g, 15)[0]) == pytest.approx(12.0)
    *singles, chain = plans
    assert all(len(plan) == 1 for plan in singles) and len(chain) > 1
    moments = [x for x, _ in chain]
    assert all(bounds._reach(spec.in_ptr, spec.in_idx, b, spec.n)[a] for a, b in itertools.pairwise(moments))
    drops = {ids[x]: {ids[v] for v in drop} for x, drop in chain}
    assert {"e", "p", "q"} <= drops["big1"] and "e" in drops["big2"]
    # no chain where it proves no more than one moment: room for everything
    assert all(len(plan) == 1 for plan in moment_plans(make_spec(g, one_gpu(40), swap=False), chain_seconds=5.0)[0])
    found, _ = rounding._seeded(g, one_gpu(15), spec, "gpu0", 2, time.perf_counter() + 30, math.inf)
    by_seed = {seed: (r.makespan, repaired) for _, r, repaired, *_, seed in found}
    assert by_seed["bound at " + ", ".join(ids[x] for x in moments)] == (pytest.approx(12.0), False)
    assert all(repaired for seed, (_, repaired) in by_seed.items() if "," not in seed)


def _as_point(g, spec, chain, columns, schedule) -> np.ndarray:
    """A schedule on the sole device as a point of the coupled programme over `chain` (`bounds._coupled`): S[j, v]
    v resident while x_j is first computed, P[j, v] v computed before, R[j, v] v computed again, after a computation
    before x_j, before x_{j+1} is first computed (after x_j for the last). Resident under the simulator's rules: a
    `free` releases once the computations before it in the list that read the value are done, and no earlier than
    the last `sync` before it; an op's other output is made, and held, from the end of its maker's latest
    computation before its own."""
    S, R, P = columns
    index, made_by = g.arrays.index, g.arrays.output_of
    computes = np.array([index[ins.node] for ins in schedule.instructions if isinstance(ins, Compute)])
    # per computation (its place among them): the last computation during which its value stays resident, and
    # when it is made (its place; for an other output, just after its maker's latest run)
    held_until = np.full(computes.size, computes.size)
    made = np.arange(computes.size, dtype=float)
    open_, last_read, ran, barrier, step = {}, {}, {}, -1, 0
    for ins in schedule.instructions:
        if isinstance(ins, Sync):
            barrier = step - 1
        elif isinstance(ins, Free):
            v = index[ins.node]
            if v in open_:
                held_until[open_.pop(v)] = max(last_read.get(v, -1), barrier)
        elif isinstance(ins, Compute):
            v = index[ins.node]
            for u in g.arrays.inputs_of(v).tolist():
                last_read[u] = step
            open_[v], last_read[v], ran[v] = step, step, step
            if made_by[v] >= 0:
                made[step] = ran[int(made_by[v])] + 0.5
            step += 1
    z = np.zeros(int(max(S.max(), R.max(), P.max())) + 1)
    computed = np.zeros(spec.n, dtype=bool)
    before, j = computed, -1        # before: computed before x_j
    for c in np.argsort(made, kind="stable").tolist():
        v = int(computes[c])
        if j + 1 < len(chain) and v == chain[j + 1] and not computed[v]:
            j += 1
            earlier = made <= made[c]       # the other outputs its maker's run made with it, too
            earlier[c] = False
            before = np.zeros(spec.n, dtype=bool)
            before[computes[earlier]] = True
            resident = np.zeros(spec.n, dtype=bool)
            resident[computes[earlier & (held_until >= made[c])]] = True
            for cols, value in ((S, resident), (P, before)):
                on = cols[j] >= 0
                z[cols[j, on]] = value[on]
        elif j >= 0 and computed[v] and before[v] and R[j, v] >= 0:
            z[R[j, v]] = 1.0
        computed[v] = True
    assert j == len(chain) - 1
    return z


def _assert_a_point(g, cl, spec, chain, programme, sched, name) -> None:
    """The schedule, valid, is a point of the programme (`bounds._coupled`'s output) costing at most its
    recomputation time."""
    (cost, lb, ub, lo, hi, start, idx, val), columns = programme
    r = simulate(g, cl, sched)
    assert r.valid, name
    z = _as_point(g, spec, chain, columns, sched)
    act = np.bincount(np.repeat(np.arange(lo.size), np.diff(start)), weights=val * z[idx], minlength=lo.size)
    assert ((lb <= z) & (z <= ub)).all(), name
    bad = np.flatnonzero((act < lo - 1e-6) | (act > hi + 1e-6))
    assert not bad.size, (name, bad, act[bad], lo[bad], hi[bad])
    assert float(cost @ z) / TIME_SCALE <= r.recompute_time * (1 + 1e-9) + 1e-12, name


def _walk_down(spec, needed, start: int, pick) -> list[int]:
    """`start` and, from each operation, the reader `pick(readers)` chooses among those some result needs, to the
    end: each an ancestor of the next."""
    walk = [start]
    while (outs := [w for w in spec.out_idx[spec.out_ptr[walk[-1]]:spec.out_ptr[walk[-1] + 1]] if needed[w]]):
        walk.append(int(pick(outs)))
    return walk


def _own_bounds(spec, d, moments, needed, dst, anc, free: bool = True) -> dict:
    """Each moment's own recompute bound (its integer programme's, `_at`), where it has one."""
    return {x: bounds._solve(at[0], True, 10.0) for x in moments
            if (at := bounds._at(spec, d, x, needed, dst, anc[x], free)) is not None}


def _backward_chain_programme(g, cl):
    """(spec, the moments down the longest path from the one where keep-everything holds the most, the coupled
    programme over them with their own bounds)."""
    spec = make_spec(g, cl, swap=False)
    needed = bounds._needed(spec)
    d = bounds._sole_device(spec, needed)
    dst = np.repeat(np.arange(spec.n), np.diff(spec.in_ptr))
    chain = _walk_down(spec, needed, int(bounds._candidates(spec, needed, dst)[0]),
                       lambda outs: max(outs, key=lambda w: bounds._reach(spec.out_ptr, spec.out_idx, w, spec.n).sum()))
    anc = {x: bounds._reach(spec.in_ptr, spec.in_idx, x, spec.n) for x in chain}
    single = _own_bounds(spec, d, chain, needed, dst, anc)
    assert max(single.values()) > 0
    return spec, chain, bounds._coupled(spec, d, chain, needed, dst, anc, single)


def test_the_schedules_of_a_captured_mlp_are_points_of_the_coupled_programme_at_every_backward_moment():
    # the 8-layer MLP at 70% of its keep-everything memory: the moments of the longest path down from the one where
    # keep-everything holds the most, every one of them, and their own bounds; the MILP's and lp-rounding's
    # schedules recompute there
    g = captured_mlp(8)
    cl = one_gpu(int(0.7 * ke_peak(g)))
    spec, chain, programme = _backward_chain_programme(g, cl)
    assert len(chain) > 10
    for name in ("lp-rounding", "milp"):
        sched = solve(g, cl, name, SolveOptions(swap=False, time_limit=30, threads=1))
        assert simulate(g, cl, sched).recomputed > 0
        _assert_a_point(g, cl, spec, chain, programme, sched, name)


def test_the_schedules_of_a_captured_transformer_are_points_of_the_programme_that_holds_its_other_outputs():
    # the layer norms' statistics are held from their op's run: the programme says so at the backward moments
    # (rows the same programme without `output_of` lacks), and the schedules of lp-rounding and the MILP at 70% of
    # keep-everything's memory are points of it
    g = captured("transformer")
    cl = one_gpu(int(0.7 * ke_peak(g)))
    spec, chain, programme = _backward_chain_programme(g, cl)
    assert len(chain) > 10
    needed = bounds._needed(spec)
    dst = np.repeat(np.arange(spec.n), np.diff(spec.in_ptr))
    anc = {x: bounds._reach(spec.in_ptr, spec.in_idx, x, spec.n) for x in chain}
    rows = [bounds._coupled(sp, bounds._sole_device(spec, needed), chain, needed, dst, anc, {})[0][3].size
            for sp in (spec, replace(spec, output_of=None))]
    assert rows[0] > rows[1]
    for name in ("lp-rounding", "milp"):
        sched = solve(g, cl, name, SolveOptions(swap=False, time_limit=5, threads=1))
        assert simulate(g, cl, sched).recomputed > 0
        _assert_a_point(g, cl, spec, chain, programme, sched, name)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(g=seeded_training_graphs(max_forward=16), frac=st.floats(0.45, 0.95), seed=st.integers(0, 2**31 - 1),
       free=st.booleans())
def test_every_solver_schedule_is_a_point_of_the_coupled_programme_over_its_order_of_any_moments(g, frac, seed, free):
    # every row of the programme holds at every valid schedule, the moments' own bounds included, and the point
    # costs at most the schedule's recomputation time: so the programme's optimum bounds every schedule's. Over a
    # chain of moments (each an ancestor of the next), and over any moments in the order the schedule first
    # computes them (`_orders`: the least bound over the orders holds for all schedules)
    # a budget between the least at which a schedule may fit and keep-everything's peak (half of them too tight,
    # where the least leaves out the operations beside the moments)
    ke = simulate(g, one_gpu(10**15), solve(g, one_gpu(10**15), "keep-everything")).peak["gpu0"]
    least = least_budget(make_spec(g, one_gpu(ke), swap=False))
    cl = one_gpu(int(least + frac * (ke - least)))
    spec = make_spec(g, cl, swap=False)
    needed = bounds._needed(spec)
    d = bounds._sole_device(spec, needed)
    rng = np.random.default_rng(seed)
    anc = {x: bounds._reach(spec.in_ptr, spec.in_idx, x, spec.n) for x in np.flatnonzero(needed).tolist()}
    # a random chain: a walk down the graph, thinned; and a few moments anywhere
    walk = [x for x in _walk_down(spec, needed, int(rng.choice(np.flatnonzero(needed))), rng.choice) if anc[x].any()]
    assume(walk)
    chain = sorted(rng.choice(walk, size=int(rng.integers(1, min(len(walk), 6) + 1)), replace=False).tolist(),
                   key=walk.index)
    anywhere = [x for x, a in anc.items() if a.any()]
    moments = rng.choice(anywhere, size=min(len(anywhere), int(rng.integers(2, 6))), replace=False).tolist()
    dst = np.repeat(np.arange(spec.n), np.diff(spec.in_ptr))
    single = _own_bounds(spec, d, set(chain) | set(moments), needed, dst, anc, free)
    programme = bounds._coupled(spec, d, chain, needed, dst, anc, single, free)
    schedules = 0
    for name in ("chen-greedy", "dtr", "heuristic", "lp-rounding", "milp"):
        try:
            sched = solve(g, cl, name, SolveOptions(swap=False, time_limit=5, threads=1))
        except InfeasibleError:
            continue
        _assert_a_point(g, cl, spec, chain, programme, sched, name)
        first = {}
        for k, ins in enumerate(sched.instructions):
            if isinstance(ins, Compute):
                first.setdefault(g.arrays.index[ins.node], k)
        order = sorted(moments, key=first.__getitem__)
        _assert_a_point(g, cl, spec, order, bounds._coupled(spec, d, order, needed, dst, anc, single, free), sched,
                        name)
        schedules += 1
    event(f"schedules {schedules}")
    event(f"moments {len(chain)}")


def test_a_cutoff_proves_only_whether_the_optimum_reaches_it():
    # min x0 + x1 over binaries with x0 + x1 >= 1.5: the optimum is 2
    problem = (np.ones(2), np.zeros(2), np.ones(2), np.array([1.5]), np.array([np.inf]), np.array([0, 2]),
               np.array([0, 1]), np.ones(2))
    assert bounds._solve(problem, True, 5.0) == pytest.approx(2.0)
    assert bounds._solve(problem, True, 5.0, cutoff=1.0) == pytest.approx(1.0)
    assert bounds._solve(problem, True, 5.0, cutoff=3.0) == pytest.approx(2.0)
    infeasible = (*problem[:3], np.array([2.5]), *problem[4:])
    assert bounds._solve(infeasible, True, 5.0) == np.inf
    assert bounds._solve(infeasible, True, 5.0, cutoff=3.0) == pytest.approx(3.0)


def test_without_sub_mips_a_programme_proves_the_same_against_its_cutoff():
    # the coupled programme over the 8-layer MLP's backward chain at 70% of its keep-everything memory: with and
    # without HiGHS's sub-MIP heuristics, a cutoff below its optimum is reached and one above it gives the optimum
    g = captured_mlp(8)
    _, _, (problem, _) = _backward_chain_programme(g, one_gpu(int(0.7 * ke_peak(g))))
    optimum = bounds._solve(problem, True, 30.0)
    assert optimum > 0
    for cutoff in (0.5 * optimum, 2 * optimum):
        values = [bounds._solve(problem, True, 30.0, cutoff=cutoff, sub_mips=sub) for sub in (True, False)]
        assert values == pytest.approx([min(cutoff, optimum)] * 2, rel=1e-4)     # HiGHS's relative gap


def test_a_ctrl_c_during_the_orders_ends_them_with_the_bound_so_far(monkeypatch, ctrl_c):
    # the orders' programmes (made to run until stopped) are running when Ctrl-C comes: it sets `stop`, they end
    # at once, and the bound is what the moments proved before them
    import _thread
    import threading
    import time

    g = small_dag(7, 217, ws=True)
    spec = make_spec(g, one_gpu(1010), swap=False)
    started = threading.Event()
    real = bounds._solve

    def slow(problem, integer, seconds, point=False, cutoff=None, stop=None, seed=0, sub_mips=True):
        if cutoff is None:
            return real(problem, integer, seconds, point)
        started.set()
        assert stop is not None and stop.wait(30)
        return 0.0

    def ctrl_c():
        started.wait(30)
        time.sleep(0.2)
        _thread.interrupt_main()

    monkeypatch.setattr(bounds, "_solve", slow)
    monkeypatch.setattr(bounds, "_ORDER_NEAR", 1.0)
    stop = threading.Event()
    threading.Thread(target=ctrl_c, daemon=True).start()
    t0 = time.perf_counter()
    b = lower_bounds(spec, target=40.0, moments=partial(_needed_with_inputs, spec), order_seconds=60, stop=stop)
    assert started.is_set() and stop.is_set() and time.perf_counter() - t0 < 20
    assert b["floor"] == pytest.approx(25.0)       # the single moments' and chains' bound (31 with the orders)


def test_a_ctrl_c_during_the_orders_stops_the_milp_with_its_warm_start(monkeypatch):
    # the MILP passes its stop event to the bounds: set there (a Ctrl-C during the orders), HiGHS does not run on,
    # and the warm start comes back marked interrupted, valid
    import importlib
    import time

    M = importlib.import_module("optsched.solvers.milp")
    real, seen = M.lower_bounds, []

    def interrupted(spec, *a, stop=None, **k):
        out = real(spec, *a, stop=stop, **k)
        if stop is not None:
            seen.append(stop)
            stop.set()
        return out

    monkeypatch.setattr(M, "lower_bounds", interrupted)
    g = generate.random_training_graph(40, 3, window=2)
    ke = simulate(g, one_gpu(10**15), solve(g, one_gpu(10**15), "keep-everything"))
    cl = one_gpu(int(0.5 * ke.peak["gpu0"]))
    t0 = time.perf_counter()
    s = solve(g, cl, "milp", SolveOptions(swap=False, time_limit=120, threads=2, params={"instage": False}))
    assert seen and s.report.status == "interrupted" and simulate(g, cl, s).valid
    assert time.perf_counter() - t0 < 60        # not the 120 s limit


def test_a_core_left_idle_takes_a_copy_of_a_running_programme_under_another_seed(monkeypatch):
    # two programmes on two cores: the first ends at once; the second's seed-0 run would take 30 s, but its copy
    # under seed 1 on the idle core ends at once, gives its value, and the seed-0 run is stopped
    import threading
    import time

    monkeypatch.setattr(bounds.os, "cpu_count", lambda: 2)
    calls, stopped = [], []

    def fake(problem, integer, seconds, point=False, cutoff=None, stop=None, seed=0, sub_mips=True):
        calls.append((problem, seed))
        if problem == "slow" and seed == 0:
            stopped.append(stop.wait(30))
            return 1.0          # its dual bound so far
        return {"fast": 5.0, "slow": 2.0}[problem]

    monkeypatch.setattr(bounds, "_solve", fake)
    t0 = time.perf_counter()
    assert bounds._side_by_side(["fast", "slow"], 60, 3.0, threading.Event()) == [5.0, 2.0]
    assert time.perf_counter() - t0 < 10 and stopped == [True]
    assert sorted(calls) == [("fast", 0), ("slow", 0), ("slow", 1)]
    # stopped from outside: each programme's value is the best dual bound of its runs
    stop = threading.Event()
    threading.Timer(0.3, stop.set).start()
    calls.clear()
    stopped.clear()

    def stalled(problem, integer, seconds, point=False, cutoff=None, stop=None, seed=0, sub_mips=True):
        calls.append(seed)
        stop.wait(30)
        return 1.5 if seed else 1.0

    monkeypatch.setattr(bounds, "_solve", stalled)
    assert bounds._side_by_side(["slow"], 60, 3.0, stop) == [1.5] and sorted(calls) == [0, 1]


def _fake_orders(monkeypatch, solve):
    """`_orders` over integer moments with every ancestry open: each moment goes before or after the order it joins,
    the programme of an order is the order itself, and `solve` gives its value."""
    monkeypatch.setattr(bounds.os, "cpu_count", lambda: 2)
    monkeypatch.setattr(bounds, "_ancestors", lambda spec, anc, moments: None)
    monkeypatch.setattr(bounds, "_places", lambda anc, seq, m: [seq + (m,), (m,) + seq])
    monkeypatch.setattr(bounds, "_coupled", lambda spec, d, order, *a, **k: (tuple(order), None))
    monkeypatch.setattr(bounds, "_solve", solve)


def test_the_next_weakest_order_takes_its_moment_while_a_slow_programme_of_the_one_before_runs(monkeypatch):
    # moment 1 splits the start into (0, 1) at 1.0 and (1, 0) at 2.0; moment 2 then joins (0, 1), whose programme
    # (0, 1, 2) is slow: it waits for one of (1, 0)'s to start, which a search that waits for the slowest programme
    # of each order before taking the next never does (it would stop the wait after 20 s)
    other = threading.Event()
    saw = []

    def fake(problem, integer, seconds, point=False, cutoff=None, stop=None, seed=0, sub_mips=True):
        if len(problem) == 3 and (problem[:2] == (1, 0) or problem[1:] == (1, 0)):
            other.set()
        if problem == (0, 1, 2):
            saw.append(other.wait(20))
        return {(0, 1): 1.0, (1, 0): 2.0}.get(problem, 10.0)

    _fake_orders(monkeypatch, fake)
    t0 = time.perf_counter()
    val, seq = bounds._orders(None, 0, None, None, {}, {}, (0.0, (0,)), [1, 2], 10.0, 60.0, threading.Event())
    assert val == 10.0 and len(seq) == 3        # every order reached the target
    assert saw and all(saw) and time.perf_counter() - t0 < 15


def test_an_order_that_reaches_the_target_takes_no_more_moments(monkeypatch):
    # (0, 1) reaches the target at once and (1, 0) does not: only (1, 0) takes moment 2, though a core is free
    solved = []

    def fake(problem, integer, seconds, point=False, cutoff=None, stop=None, seed=0, sub_mips=True):
        solved.append(problem)
        return {(1, 0): 2.0}.get(problem, 10.0)

    _fake_orders(monkeypatch, fake)
    val, _ = bounds._orders(None, 0, None, None, {}, {}, (0.0, (0,)), [1, 2], 10.0, 60.0, threading.Event())
    assert val == 10.0
    assert sorted(set(solved)) == [(0, 1), (1, 0), (1, 0, 2), (2, 1, 0)]


def test_a_weaker_order_s_programmes_start_before_those_queued_for_a_stronger_one(monkeypatch):
    # one core: (0, 1) at 1.0 takes moment 2 first, then (1, 0) at 2.0 while (0, 1)'s last programme runs; (0, 1, 2)
    # at 1.5 then takes moment 3, and its programmes start before (1, 0)'s that still wait, as in a search that
    # takes the weakest order each time: where the time runs out, the bound is the weakest order's
    solved = []

    def fake(problem, integer, seconds, point=False, cutoff=None, stop=None, seed=0, sub_mips=True):
        solved.append(problem)
        return {(0, 1): 1.0, (1, 0): 2.0, (0, 1, 2): 1.5}.get(problem, 10.0)

    _fake_orders(monkeypatch, fake)
    monkeypatch.setattr(bounds.os, "cpu_count", lambda: 1)
    val, _ = bounds._orders(None, 0, None, None, {}, {}, (0.0, (0,)), [1, 2, 3], 10.0, 60.0, threading.Event())
    assert val == 10.0
    assert solved[:4] == [(0, 1), (1, 0), (0, 1, 2), (2, 0, 1)]
    assert solved.index((0, 1, 2, 3)) < solved.index((1, 0, 2)) and solved.index((3, 0, 1, 2)) < solved.index((1, 0, 2))


def test_the_orders_tell_the_weakest_order_s_bound_each_time_it_rises(monkeypatch):
    # the weakest of (0, 1) at 1.0 and (1, 0) at 2.0 is 1.0; (0, 1) then splits into (0, 1, 2) at 1.5 and (2, 0, 1)
    # at 10, the weakest 1.5; then (1, 0) at 2.0, whose orders reach the target: the live bound climbs 1, 1.5, 2, 10
    # (every value a bound on all orders then), never down, and ends at the orders' bound
    told = []
    _fake_orders(monkeypatch, lambda problem, *a, **k: {(0, 1): 1.0, (1, 0): 2.0, (0, 1, 2): 1.5}.get(problem, 10.0))
    monkeypatch.setattr(bounds.os, "cpu_count", lambda: 1)
    val, _ = bounds._orders(None, 0, None, None, {}, {}, (0.0, (0,)), [1, 2, 3], 10.0, 60.0, threading.Event(),
                            rise=told.append)
    assert val == 10.0 and told == [1.0, 1.5, 2.0, 10.0]


def test_a_programme_that_cannot_be_built_stops_the_orders_with_its_error(monkeypatch):
    def broken(spec, d, order, *a, **k):
        raise ValueError("a bound's programme names a column it does not have")

    _fake_orders(monkeypatch, lambda *a, **k: 1.0)
    monkeypatch.setattr(bounds, "_coupled", broken)
    with pytest.raises(ValueError, match="names a column"):
        bounds._orders(None, 0, None, None, {}, {}, (0.0, (0,)), [1, 2], 10.0, 60.0, threading.Event())


def shared_weight_graph() -> Graph:
    """GNMT's last decoder layer in small: a 500-byte weight w read by two required operations neither of which is
    an ancestor of the other, a (beside the 30-byte f) and b (beside the 400-byte g; f and g both read x and q).
    At b, w and g alone take 900 bytes; but a schedule that runs a first holds w with f and g (930) or w while it
    computes g (920), and one that runs b first holds f, or x and q to make f again, beside w and g (930, 920):
    under 920 nothing fits."""
    z = {"cuda": 0.0}
    nodes = (Node("x", "data", "input", (), z, 10, recomputable=False),
             Node("q", "w", "param", (), z, 10, recomputable=False),
             Node("w", "w", "param", (), z, 500, recomputable=False),
             Node("f", "op", "forward", ("x", "q"), {"cuda": 1.0}, 30),
             Node("a", "op", "forward", ("f", "w"), {"cuda": 1.0}, 0, required=True),
             Node("g", "op", "backward", ("x", "q"), {"cuda": 1.0}, 400),
             Node("b", "op", "backward", ("g", "w"), {"cuda": 1.0}, 0, required=True))
    return check_graph(Graph(nodes, name="shared-weight"))


def test_the_computations_between_moments_prove_that_nothing_fits_where_the_moments_alone_do_not():
    g = shared_weight_graph()
    assert exhaustive(g, 919) is None and exhaustive(g, 920) is not None
    spec = make_spec(g, one_gpu(919), swap=False)
    assert least_budget(spec) == 900 and lower_bounds(spec)["floor"] < float("inf")
    ke = simulate(g, one_gpu(10**6), solve(g, one_gpu(10**6), "keep-everything"))
    ids = g.arrays.ids
    kept = solve(g, one_gpu(10**6), "keep-everything").instructions
    at, least, latest = bounds.no_fit(spec, ids, kept, 10.0)
    assert not latest and {ids[bounds._op(m)] for m in at} >= {"a", "b"} and least == 920, ke.peak
    # given a budget that fits, it bisects up to the least that does (to 0.1%)
    assert 919 < bounds.no_fit(make_spec(g, one_gpu(910), swap=False), ids, kept, 10.0, upto=ke.peak["gpu0"])[1] <= 920
    # at 920 it proves nothing, as a schedule fits
    spec = make_spec(g, one_gpu(920), swap=False)
    assert bounds.no_fit(spec, ids, solve(g, one_gpu(10**6), "keep-everything").instructions, 10.0) is None


def test_the_milp_says_proven_that_nothing_fits_where_its_stage_model_has_no_point_and_the_moments_show_why():
    g = shared_weight_graph()
    with pytest.raises(InfeasibleError) as e:
        solve(g, one_gpu(919), "milp", SolveOptions(swap=False, time_limit=10, threads=1))
    msg = str(e.value)
    assert e.value.proven and not e.value.restricted and msg.startswith("no schedule fits: "), msg
    assert "in whichever order, or between them" in msg and e.value.least == 920, msg
    s = solve(g, one_gpu(920), "milp", SolveOptions(swap=False, time_limit=10, threads=1))
    assert simulate(g, one_gpu(920), s).valid


def two_layer_graph() -> Graph:
    """x -> f0 -> f1 -> loss with 30-byte parameters p0, p1 and their required gradients gp1 (g1, f0) and gp0
    (g0, x): whichever gradient is computed for the last time last, the other is held from its own final
    computation on, beside what the last one needs (84 bytes fit, 83 do not)."""
    return generate.training_graph([[-1], [0]], act_bytes=[10, 10], cost=[1e-3] * 2, param_bytes=[30, 30])


def test_the_final_computations_prove_that_nothing_fits_where_the_first_ones_do_not(monkeypatch):
    g = two_layer_graph()
    assert exhaustive(g, 83) is None and exhaustive(g, 84) is not None
    spec = make_spec(g, one_gpu(83), swap=False)
    assert least_budget(spec) < 83 and lower_bounds(spec)["floor"] < float("inf")
    ids = g.arrays.ids
    kept = solve(g, one_gpu(10**6), "keep-everything").instructions
    at, least, latest = bounds.no_fit(spec, ids, kept, 10.0)
    assert not latest and least == 84 and {(ids[m[0]], m[1]) for m in at if m[1] < 0} == {("gp0", -1), ("gp1", -1)}
    assert bounds.no_fit(make_spec(g, one_gpu(70), swap=False), ids, kept, 10.0, upto=100)[1] == 84
    assert bounds.no_fit(make_spec(g, one_gpu(84), swap=False), ids, kept, 10.0) is None
    # the moments at first computations alone, where the schedule had least to spare, in every order: no proof
    monkeypatch.setattr(bounds, "final_moments", lambda spec, needed, dst: [])
    assert bounds.no_fit(spec, ids, kept, 10.0) is None
    monkeypatch.undo()
    with pytest.raises(InfeasibleError) as e:
        solve(g, one_gpu(83), "milp", SolveOptions(swap=False, time_limit=10, threads=1))
    assert e.value.proven and e.value.least == 84 and "'gp0', 'gp1' for the last time" in str(e.value), str(e.value)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(g=random_dags(min_nodes=4, max_nodes=7, max_bytes=400, zero_costs=False), frac=st.floats(0.0, 0.6),
       data=st.data())
def test_the_memory_between_moments_never_exceeds_the_exhaustive_optimum(g, frac, data):
    # every needed operation a moment, in every order, with the rows of the computations between them: the least
    # over the orders is under every schedule's recomputation time, and infinite only where no schedule fits
    budget = _between_largest_and_total(g, frac)
    spec = make_spec(g, one_gpu(budget), swap=False)
    moments = data.draw(st.permutations(_needed_with_inputs(spec)))
    assume(len(moments) >= 2)
    _check_orders_against_the_exhaustive_optimum(g, spec, budget, moments, 30.0, between=True)


def _check_orders_against_the_exhaustive_optimum(g: Graph, spec, budget: int, moments: list, seconds: float,
                                                 between: bool) -> None:
    """The coupled programme over `moments` in every order (`bounds._orders`): work plus its least over the orders
    is at most the exhaustive optimum, and infinite only where the exhaustive search finds no schedule."""
    needed = bounds._needed(spec)
    dst = np.repeat(np.arange(spec.n), np.diff(spec.in_ptr))
    anc = {moments[0]: bounds._reach(spec.in_ptr, spec.in_idx, bounds._op(moments[0]), spec.n)}
    val, _ = bounds._orders(spec, 0, needed, dst, anc, {}, (0.0, (moments[0],)), moments[1:], None, seconds,
                            threading.Event(), between=between)
    found = exhaustive(g, budget)
    if found is None:
        event("no schedule" + (", proven" if np.isinf(val) else ""))
        return
    work = float(np.nan_to_num(spec.ccost[0])[needed].sum())
    assert (work + val) / TIME_SCALE <= found[0] * (1 + 1e-6) + 1e-12
    event("raised" if val > 0 else "not raised")


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(g=training_graphs(2, 5, params=True, max_bytes=400, zero_sizes=False), frac=st.floats(0.0, 0.5))
def test_a_proof_that_nothing_fits_holds_on_small_training_graphs(g, frac):
    g, budget, spec = _training_spec(g, frac)
    closest = solve(g, one_gpu(10**9), "keep-everything")
    proof = bounds.no_fit(spec, g.arrays.ids, closest.instructions, 5.0)
    if proof is not None:
        assert proof[1] == budget + 1 and exhaustive(g, budget) is None
    event("not proven" if proof is None else "proven at the least budget or above" if budget >= least_budget(spec)
          else "proven")


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(g=training_graphs(2, 5, params=True, max_bytes=400, zero_sizes=False), frac=st.floats(0.0, 0.6),
       data=st.data())
def test_the_latest_moment_of_a_group_of_gradients_proves_nothing_where_a_schedule_fits(g, frac, data):
    # any group of required results with their heavy inputs (`_latest`): where every programme has no point, the
    # exhaustive search finds no schedule either
    g, budget, spec = _training_spec(g, frac)
    needed = bounds._needed(spec)
    dst = np.repeat(np.arange(spec.n), np.diff(spec.in_ptr))
    pairs = bounds._heavy_inputs(spec, needed, dst, len(g))
    assume(len(pairs) >= 2)
    group = data.draw(st.lists(st.sampled_from(pairs), unique=True, min_size=2, max_size=len(pairs)))
    proof = bounds._latest(spec, 0, needed, dst, group, budget, {}, time.perf_counter() + 30, threading.Event())
    if proof is not None:
        assert set(proof) <= set(group) and len(proof) >= 2
        assert exhaustive(g, budget) is None
    event("not proven" if proof is None else "proven at the least budget or above" if budget >= least_budget(spec)
          else "proven")


def test_the_latest_moment_of_a_captured_mlps_weight_gradients_proves_what_their_orders_do_not():
    # the 8-layer MLP at 60% of its keep-everything memory: seven 256 kB weight gradients, each read with a 1 MB
    # gradient that a 3 MB ReLU backward makes; whichever of those comes last holds the other six or what they read
    # beside it. The orders of the three largest gradients' final moments prove nothing in 3 s; the group's
    # programmes have no point in any case, up to 61.7%; at the peak of the schedule chen-greedy found they prove
    # nothing
    g = captured_mlp(8)
    keep = ke_peak(g)
    spec = make_spec(g, one_gpu(int(0.6 * keep)), swap=False)
    ids = g.arrays.ids
    kept = solve(g, one_gpu(10**12), "keep-everything").instructions
    at, least, latest = bounds.no_fit(spec, ids, kept, 10.0, upto=keep)
    assert latest and {ids[w] for _, w in at} == {f"mm_{k}" for k in (3, 5, 7, 9, 11, 13, 14)}
    assert least > 0.617 * keep
    needed = bounds._needed(spec)
    dst = np.repeat(np.arange(spec.n), np.diff(spec.in_ptr))
    finals = bounds.final_moments(spec, needed, dst)
    anc = {finals[0]: bounds._reach(spec.in_ptr, spec.in_idx, bounds._op(finals[0]), spec.n)}
    val, _ = bounds._orders(spec, 0, needed, dst, anc, {}, (0.0, (finals[0],)), finals[1:], None, 3.0,
                            threading.Event(), between=True)
    assert np.isfinite(val)
    with pytest.raises(InfeasibleError) as e:
        solve(g, one_gpu(int(0.6 * keep)), "chen-greedy")
    found = simulate(g, one_gpu(10**12), e.value.closest).peak["gpu0"]
    assert found < 0.62 * keep
    pairs = bounds._heavy_inputs(spec, needed, dst, bounds._GROUP)
    assert bounds._latest(spec, 0, needed, dst, pairs, found, {}, time.perf_counter() + 30, threading.Event()) is None


def _final_moments(spec) -> list:
    """Every final moment the bound can take: (w, -1) per required result w that is computed, not loaded, and
    (v, w) per such w and each of its inputs v that is computed too."""
    needed = bounds._needed(spec)
    out = []
    for w in np.flatnonzero(spec.required & needed & ~spec.once).tolist():
        ins = spec.in_idx[spec.in_ptr[w]:spec.in_ptr[w + 1]]
        out += [(w, -1)] + [(v, w) for v in dict.fromkeys(ins.tolist()) if not spec.once[v]]
    return out


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(g=training_graphs(2, 4, params=True, max_bytes=400, zero_sizes=False), frac=st.floats(0.0, 0.6),
       data=st.data())
def test_final_moments_never_exceed_the_exhaustive_optimum(g, frac, data):
    # the final computations of required results and the last computations of their inputs before them, beside
    # first computations, in every order, with the memory between them: the least over the orders is under every
    # schedule's recomputation time, and infinite only where no schedule fits
    g, budget, spec = _training_spec(g, frac)
    finals = _final_moments(spec)
    assume(finals)
    firsts = data.draw(st.lists(st.sampled_from(_needed_with_inputs(spec)), unique=True, max_size=3))
    moments = data.draw(st.permutations(data.draw(st.lists(st.sampled_from(finals), unique=True, min_size=1,
                                                           max_size=4)) + firsts))
    assume(len(moments) >= 2)
    _check_orders_against_the_exhaustive_optimum(g, spec, budget, moments, 5.0, between=data.draw(st.booleans()))


def _last_before_moments(spec) -> list:
    """Every moment (u, y, 0) the bound can take: u's last computation before y's first, per needed operation y
    with inputs and each ancestor u of y that has inputs too (a computation, not a load)."""
    needed = bounds._needed(spec)
    out = []
    for y in _needed_with_inputs(spec):
        anc = bounds._reach(spec.in_ptr, spec.in_idx, y, spec.n)
        out += [(u, y, 0) for u in np.flatnonzero(anc & needed).tolist() if spec.in_ptr[u + 1] > spec.in_ptr[u]]
    return out


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(g=training_graphs(2, 4, params=True, max_bytes=400, zero_sizes=False), frac=st.floats(0.2, 1.0),
       data=st.data())
def test_last_computations_before_an_operation_never_exceed_the_exhaustive_optimum(g, frac, data):
    # moments (u, y, 0), with or without y's first computation among the moments (u is not computed again up to
    # it), beside first and final computations, in every order, with or without the memory between them: the
    # least over the orders is under every schedule's recomputation time, and infinite only where no schedule fits.
    # The budget lies between the least at which the single moments have a point and keep-everything's peak, where
    # schedules recompute
    g = _last_gradients_required(g)
    ke = simulate(g, one_gpu(10**15), solve(g, one_gpu(10**15), "keep-everything")).peak["gpu0"]
    least = least_budget(make_spec(g, one_gpu(ke), swap=False))
    budget = int(least + frac * (ke - least))
    spec = make_spec(g, one_gpu(budget), swap=False)
    befores = _last_before_moments(spec)
    assume(befores)
    picked = data.draw(st.lists(st.sampled_from(befores), unique=True, min_size=1, max_size=3))
    ys = [y for _, y, _ in picked if data.draw(st.booleans())]
    firsts = data.draw(st.lists(st.sampled_from(_needed_with_inputs(spec)), unique=True, max_size=2))
    finals = _final_moments(spec)
    finals = data.draw(st.lists(st.sampled_from(finals), unique=True, max_size=2)) if finals else []
    moments = data.draw(st.permutations(list(dict.fromkeys(picked + ys + firsts + finals))))
    assume(len(moments) >= 2)
    _check_orders_against_the_exhaustive_optimum(g, spec, budget, moments, 5.0, between=data.draw(st.booleans()))


def _orders_of(spec, moments: list) -> tuple[float, tuple]:
    """(the least over the orders of `moments` of the coupled programme's value, that order: `bounds._orders`)."""
    needed = bounds._needed(spec)
    dst = np.repeat(np.arange(spec.n), np.diff(spec.in_ptr))
    anc = {moments[0]: bounds._reach(spec.in_ptr, spec.in_idx, bounds._op(moments[0]), spec.n)}
    return bounds._orders(spec, 0, needed, dst, anc, {}, (0.0, (moments[0],)), moments[1:], None, 10.0,
                          threading.Event())


def _four_ops_and_a_loss() -> Graph:
    """Four 1-byte forward operations of 1 us each, a 4-byte loss, the input's gradient required."""
    return generate.training_graph([[-1], [0], [1], [2]], act_bytes=[1] * 4, cost=[1e-6] * 4, input_grad=True)


def test_the_last_computation_of_the_loss_before_a_gradient_proves_more_than_first_computations():
    # four 1-byte forward operations and a 4-byte loss under 7 bytes: the first computations of g1 and g2, in
    # either order, prove that every schedule recomputes a forward operation; with the loss's last computation
    # before g1's first, two; the best schedule recomputes four
    g = _four_ops_and_a_loss()
    spec = make_spec(g, one_gpu(7), swap=False)
    ix = g.arrays.index
    firsts = [ix["g1"], ix["g2"]]
    (plain, _), (more, _) = _orders_of(spec, firsts), _orders_of(spec, firsts + [(ix["loss"], ix["g1"], 0)])
    forward = float(spec.ccost[0, ix["f0"]])
    assert plain == pytest.approx(forward) and more == pytest.approx(2 * forward)
    best, _ = exhaustive(g, 7)
    work = float(np.nan_to_num(spec.ccost[0])[bounds._needed(spec)].sum())
    assert (work + more) / TIME_SCALE <= best * (1 + 1e-9)
    assert best == pytest.approx((work + 4 * forward) / TIME_SCALE)


def test_a_last_computation_that_raises_no_order_is_left_out_of_the_orders():
    # under 7 bytes the loss's last computation before g1 raises the orders of g1 and g2 and stays in the weakest;
    # under 8 it raises none, and the orders go on without it, to the same value as without it
    g = _four_ops_and_a_loss()
    ix = g.arrays.index
    before = (ix["loss"], ix["g1"], 0)
    for budget, kept in ((7, True), (8, False)):
        spec = make_spec(g, one_gpu(budget), swap=False)
        val, order = _orders_of(spec, [ix["g1"], before, ix["g2"]])
        assert (before in order) == kept and ix["g2"] in order
        if not kept:
            assert val == pytest.approx(_orders_of(spec, [ix["g1"], ix["g2"]])[0]) and val > 0


def test_tight_recomputations_name_an_operation_the_schedule_computes_again_before_a_descendant():
    # `tight_moments` with recomputations: each (u, y, 0) has u an ancestor of y, and the schedule computes u again
    # before it first computes y; the bound's report names it so
    g = _four_ops_and_a_loss()
    spec = make_spec(g, one_gpu(7), swap=False)
    _, instructions = exhaustive(g, 7)
    ids = g.arrays.ids
    tight = bounds.tight_moments(spec, ids, instructions, recomputations=True)
    assert bounds.tight_moments(spec, ids, instructions) == [m for m in tight if not isinstance(m, tuple)]
    befores = [m for m in tight if isinstance(m, tuple)]
    assert befores
    computes = [ins.node for ins in instructions if isinstance(ins, Compute)]
    for u, y, _ in befores:
        assert bounds._reach(spec.in_ptr, spec.in_idx, y, spec.n)[u]
        assert computes[:computes.index(ids[y])].count(ids[u]) >= 2
        assert bounds.moment_name(ids, (u, y, 0)) == f"{ids[u]} (last before {ids[y]})"
