"""The large-neighbourhood search that takes a core the MILP's branch and bound leaves idle."""

from __future__ import annotations

import importlib
import threading
import time

import numpy as np
import pytest
from milp_graphs import ke_peak, one_gpu

from optsched import generate
from optsched.schedule import Schedule
from optsched.simulate import simulate
from optsched.solvers import SolveOptions, solve
from optsched.solvers.lns import improve
from optsched.solvers.milp import prepare
from optsched.solvers.milp_model import TIME_SCALE, decisions_from_x, emit, violated_rows

M = importlib.import_module("optsched.solvers.milp")

# seconds for a solve of `_gap_staged()` in which the models run: its candidates and lower bounds take a share of the
# limit before them (12 s of 15 on this 2-core box; the tests that use it passed with a busy loop on one core too;
# in an hour when the box ran 2.6 times slower they took all 15 s, and the models never ran: 25 s gave them room)
_MODELS_RUN = 25


def _gap_staged():
    """A graph and budget whose warm start needs gap stages and misses a 0.1% gap, so that both models run and
    the one without gap stages starts cold: the 24-layer random graph at 60% of its keep-everything memory."""
    g = generate.random_training_graph(24, 2, window=2)
    return g, one_gpu(int(0.6 * ke_peak(g)))


def _poor_start():
    # chen-greedy recomputes where the budget would let a schedule keep more: a point the search can improve
    g = generate.random_training_graph(8, 14)
    cl = one_gpu(int(0.9 * ke_peak(g)))
    warm = solve(g, cl, "chen-greedy", swap=False)
    assert simulate(g, cl, warm).recomputed > 0
    opts = SolveOptions(time_limit=20, threads=1, swap=False, warm_start=warm)
    spec, model, x0, msg, *_ = prepare(g, cl, opts)
    assert x0 is not None and msg.startswith("user: accepted")
    return g, cl, spec, model, x0


def test_the_search_improves_a_poor_point_and_stays_a_point_of_the_model():
    g, cl, spec, model, x0 = _poor_start()
    x, seen = improve(model, x0, time.perf_counter() + 5, lambda: False)
    assert seen["rounds"] >= 1 and seen["improved"] >= 1
    assert float(model.cost @ x) < float(model.cost @ x0) * (1 - 1e-6)
    assert np.array_equal(x[model.integ == 1], np.round(x[model.integ == 1]))
    assert violated_rows(model, x, tol=1e-6) == []
    # its schedule is valid, and no slower than the model says
    r = simulate(g, cl, Schedule(tuple(emit(g, spec, decisions_from_x(model, x))), graph=g.name))
    assert r.valid and r.makespan <= float(model.cost @ x) / TIME_SCALE * (1 + 1e-9)


def test_the_search_stops_when_asked_and_at_the_goal():
    _, _, _, model, x0 = _poor_start()
    x, seen = improve(model, x0, time.perf_counter() + 5, lambda: True)
    assert seen["rounds"] == 0 and float(model.cost @ x) == float(model.cost @ x0)
    t = time.perf_counter()
    x, seen = improve(model, x0, t + 30, lambda: False, goal=float(model.cost @ x0) * 2)
    assert seen["rounds"] == 0 and time.perf_counter() - t < 1


def test_with_two_threads_a_search_runs_beside_the_branch_and_bound_and_the_faster_point_is_kept(monkeypatch):
    # branch and bound stopped after its root, so that its point and the search's may differ; the search beside it
    # gets 5 s whatever the branch and bound does (its own stop, the end of the branch and bound, is ignored here)
    _, _, _, model, x0 = _poor_start()
    params = {"highs": {"mip_max_nodes": 1}}
    stop = threading.Event()
    alone = M._highs_run(model, x0, SolveOptions(threads=1, gap=0.0, swap=False, params=params), 20, stop)
    assert "search" not in alone["extra"] and alone["x"] is not None
    seen, real = [], M.improve

    def spy(model_, x, until, stopped, goal=-np.inf, seed=0, found=None):
        out = real(model_, x, time.perf_counter() + 5, lambda: False, goal, seed, found)
        seen.append((x, out))
        return out

    monkeypatch.setattr(M, "improve", spy)
    monkeypatch.setattr(M, "_SEARCH_AFTER", 0.0)     # this branch and bound ends within a second
    both = M._highs_run(model, x0, SolveOptions(threads=2, gap=0.0, swap=False, params=params), 20, stop)
    [(start, (y, info))] = seen
    assert start is x0 and info["rounds"] >= 1 and info["improved"] >= 1 and both["extra"]["search"] == info
    assert f"beside the branch and bound: {info['rounds']} rounds, {info['improved']} improvements" in \
        " ".join(both["notes"])
    # the faster of the two points (the branch and bound ran on one thread, as alone: the same point), and its
    # bound, which holds for every point of the model
    cost = float(model.cost @ both["x"])
    assert cost == pytest.approx(min(float(model.cost @ alone["x"]), float(model.cost @ y)), rel=1e-9)
    assert cost < float(model.cost @ x0) * (1 - 1e-6)
    assert both["bound"] == pytest.approx(alone["bound"], rel=1e-9)
    assert violated_rows(model, both["x"], tol=1e-6) == []


def _plain_infeasible_at_once(calls: list):
    """A `_highs_run` for which the model without gap stages is proven infeasible at once (as at tight budgets),
    the staged model running as it would; `calls` gets "plain" and "staged" as they start."""
    real = M._highs_run

    def run(model, x0, options, left, stop, cancel=None, live=None, floor=0.0, stall=None):
        if x0 is None or model.spec.T == model.spec.n + model.spec.K:
            calls.append("plain")
            return {"x": None, "status": "infeasible", "bound": None, "extra": {"backend": "highs"}, "notes": [],
                    "solve_time": 0.0}
        calls.append("staged")
        return real(model, x0, options, left, stop, cancel, live, floor)

    return run


def test_a_plain_run_over_early_leaves_its_core_to_the_search(monkeypatch):
    # the model without gap stages proven infeasible at once (as at tight budgets): its core searches around the
    # gap-stage model's warm start while that model's branch and bound runs; the faster point is returned
    calls, searched = [], []
    real_improve = M.improve
    run = _plain_infeasible_at_once(calls)

    def spy(model, x, until, stopped, goal=-np.inf, seed=0):
        out = real_improve(model, x, until, stopped, goal, seed)
        searched.append((model, x, out))
        return out

    monkeypatch.setattr(M, "_highs_run", run)
    monkeypatch.setattr(M, "improve", spy)
    g, cl = _gap_staged()
    s = solve(g, cl, "milp", SolveOptions(swap=False, time_limit=_MODELS_RUN, threads=2, gap=0.001))
    assert sorted(calls) == ["plain", "staged"] and len(searched) == 1
    model, x0, (x, seen) = searched[0]
    assert seen["rounds"] >= 1
    assert f"{seen['rounds']} rounds, {seen['improved']} improvements" in s.report.message
    r = simulate(g, cl, s)
    assert r.valid and s.report.objective <= float(model.cost @ x) / TIME_SCALE * (1 + 1e-9)
    assert s.report.objective <= float(model.cost @ x0) / TIME_SCALE * (1 + 1e-9)


def test_on_a_large_model_the_core_a_plain_run_leaves_takes_the_bounds_again_before_the_search(monkeypatch):
    # as above, on a stage model counted as large (`_ORDER_FROM_NNZ`): the freed core first finds the bounds again,
    # their chain grown and aimed at the warm start, stopped when the staged run ends; the larger bound is reported
    events, floors = [], []
    real_bounds, real_improve = M._bounds, M.improve
    run = _plain_infeasible_at_once(events)

    def bounds(*args, **kw):
        b = real_bounds(*args, **kw)
        events.append(("bounds", kw.get("grow", False)))
        floors.append(b["floor"])
        return b

    def spy(model, x, until, stopped, goal=-np.inf, seed=0):
        events.append("search")
        return real_improve(model, x, until, stopped, goal, seed)

    monkeypatch.setattr(M, "_ORDER_FROM_NNZ", 0)
    monkeypatch.setattr(M, "_highs_run", run)
    monkeypatch.setattr(M, "_bounds", bounds)
    monkeypatch.setattr(M, "improve", spy)
    g, cl = _gap_staged()
    s = solve(g, cl, "milp", SolveOptions(swap=False, time_limit=_MODELS_RUN, threads=2, gap=0.001))
    at = events.index("plain")
    assert "staged" in events and events[at + 1:].count(("bounds", True)) == 1, events
    assert events.index(("bounds", True), at) < events.index("search", at)
    assert s.report.bound >= max(floors) * (1 - 1e-9)
    assert simulate(g, cl, s).valid


def test_a_cold_plain_run_without_a_schedule_by_its_stall_time_gives_its_core_to_the_search(monkeypatch):
    # with no time to find a schedule, the cold model without gap stages stops at HiGHS's first MIP callback and
    # its core searches around the gap-stage model's warm start; the report says so, and the schedule is valid
    searched = []
    real_improve = M.improve

    def spy(model, x, until, stopped, goal=-np.inf, seed=0):
        out = real_improve(model, x, until, stopped, goal, seed)
        searched.append(out)
        return out

    monkeypatch.setattr(M, "_PLAIN_STALL", 0.0)
    monkeypatch.setattr(M, "improve", spy)
    g, cl = _gap_staged()
    opts = SolveOptions(swap=False, time_limit=_MODELS_RUN, threads=2, gap=0.001)
    spec, model, x0, msg, *_, alt = prepare(g, cl, opts)
    assert x0 is not None and alt is not None and alt[1] is None       # the plain model starts cold
    s = solve(g, cl, "milp", opts)
    plain = s.report.extra["runs"]["without gap stages"]
    assert plain["objective"] is None and plain["solve_time"] < 10
    assert "the model without gap stages found no schedule in 0 s and gave its core up" in s.report.message
    assert len(searched) == 1 and searched[0][1]["rounds"] >= 1
    seen = searched[0][1]
    assert f"on the freed core: {seen['rounds']} rounds, {seen['improved']} improvements" in s.report.message
    r = simulate(g, cl, s)
    assert r.valid and s.report.objective <= float(model.cost @ x0) / TIME_SCALE * (1 + 1e-9)


def test_a_model_too_large_for_branch_and_bound_gets_the_search_instead(monkeypatch):
    # every model counts as too large for the time left: the search around the warm start takes that time
    g = generate.random_training_graph(8, 14)
    cl = one_gpu(int(0.9 * ke_peak(g)))
    warm = solve(g, cl, "chen-greedy", swap=False)
    monkeypatch.setattr(M, "_NNZ_PER_S", 1)
    # unpolished: polishing the first schedule reaches what the search finds here
    opts = SolveOptions(time_limit=8, threads=1, swap=False, warm_start=warm, params={"polish": False})
    # beyond _SEARCH_NNZ, the warm start's point as it was
    monkeypatch.setattr(M, "_SEARCH_NNZ", 0)
    s = solve(g, cl, "milp", opts)
    assert "too large to solve" in s.report.message and "search" not in s.report.extra
    before = simulate(g, cl, s).makespan
    monkeypatch.setattr(M, "_SEARCH_NNZ", 10**9)
    s = solve(g, cl, "milp", opts)
    seen = s.report.extra["search"]
    assert "too large to solve" in s.report.message
    assert f"a search around the warm start instead: {seen['rounds']} rounds, {seen['improved']} improvements" \
        in s.report.message
    # proven only where the lower bounds prove it
    assert seen["improved"] >= 1 and s.report.status == ("optimal" if s.report.gap <= opts.gap else "time_limit")
    r = simulate(g, cl, s)
    assert r.valid and r.makespan < before * (1 - 1e-6)
