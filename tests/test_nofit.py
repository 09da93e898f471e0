"""No schedule: "fits" only when proven (an operation larger than every device that can run it), "found" when a
solver merely found none."""

from __future__ import annotations

import importlib

import pytest
from milp_graphs import ke_peak, one_gpu

from optsched.cluster import Cluster, Device, single_accelerator
from optsched.errors import InfeasibleError
from optsched.generate import random_training_graph
from optsched.graph import largest_operation
from optsched.simulate import simulate
from optsched.solvers import SolveOptions, solve
from optsched.solvers import nofit as N
from optsched.solvers.bounds import least_budget
from optsched.solvers.milp_model import make_spec
from optsched.solvers.nofit import smaller_found
from optsched.units import format_size

SEARCHING = ["chen-greedy", "articulation", "dtr", "heuristic", "metf", "lp-rounding", "milp"]


@pytest.mark.parametrize("solver", SEARCHING)
def test_below_the_largest_operation_every_solver_proves_it(solver):
    g = random_training_graph(30, 1)
    name, need = largest_operation(g)
    cl = Cluster((Device("gpu0", "cuda", need - 1),))
    with pytest.raises(InfeasibleError) as e:
        solve(g, cl, solver, SolveOptions(time_limit=10, threads=1))
    assert e.value.proven and str(e.value).startswith("no schedule fits: ")
    assert f"operation {name!r}" in str(e.value)


def test_a_solver_that_finds_none_proves_nothing():
    # with the host beside the accelerator, the same budget has schedules (the heuristic runs the largest
    # operation on the host): the one-accelerator solvers that find none must not claim that none fits
    g = random_training_graph(30, 1)
    cl = single_accelerator(largest_operation(g)[1] - 1)
    s = solve(g, cl, "heuristic", SolveOptions(time_limit=10, threads=1))
    assert simulate(g, cl, s).valid
    refused = 0
    for solver in ("chen-greedy", "articulation", "dtr", "lp-rounding"):
        try:
            solve(g, cl, solver, SolveOptions(time_limit=10, threads=1))
        except InfeasibleError as e:
            refused += 1
            assert not e.proven and str(e).startswith("no schedule found: "), (solver, str(e))
            # what it found, if anything, is over the budget, and nothing says where no schedule fits
            assert e.least is None, solver
            if e.closest is not None:
                peak = simulate(g, cl, e.closest).peak["gpu0"]
                assert e.found == peak > cl.device("gpu0").memory, solver
    assert refused


def test_the_recomputation_bound_is_asked_once_per_graph_and_budget(monkeypatch):
    # every solver that finds none at 40% of keep-everything's peak gives the same proof (nothing fits below the
    # least budget), from one run of the bound; another budget runs it again
    import optsched.solvers.bounds as B

    calls = []
    real = B.least_budget
    monkeypatch.setattr(B, "least_budget", lambda *a, **k: calls.append(1) or real(*a, **k))
    g = random_training_graph(30, 2)
    leasts = []
    for frac in (0.4, 0.4, 0.39):
        cl = one_gpu(int(frac * ke_peak(g)))
        for solver in ("chen-greedy", "dtr", "heuristic"):
            with pytest.raises(InfeasibleError) as e:
                solve(g, cl, solver, SolveOptions(swap=False, time_limit=10, threads=1))
            assert e.value.proven and e.value.least > cl.device("gpu0").memory, solver
            leasts.append(e.value.least)
    assert len(set(leasts[:6])) == 1 and len(calls) == 2


def test_the_smallest_budget_found_is_the_accelerators_peak_not_the_hosts():
    # a schedule that swaps holds more on the host than on the accelerator: the host's RAM is no budget found
    from optsched.solvers.nofit import smallest_peak

    cl = single_accelerator(10**6)
    assert smallest_peak(cl, [{"gpu0": 900, "host": 5000}, {"gpu0": 700, "host": 9000}]) == 700
    assert smallest_peak(cl, []) is None
    assert smallest_peak(Cluster((Device("host", "cpu", 10**6),)), [{"host": 40}]) == 40


def test_lp_rounding_out_of_time_says_so(monkeypatch):
    # its LP unfinished, lp-rounding has tried no rounding: the message names the time limit, not the budget
    from optsched.solvers import rounding

    def unfinished(self, scale, time_limit):
        self.timed_out = True
        return None, False

    monkeypatch.setattr(rounding._Relaxation, "solve", unfinished)
    g = random_training_graph(30, 1)
    cl = Cluster((Device("gpu0", "cuda", 10**9),))      # room for every schedule: nothing to prove
    with pytest.raises(InfeasibleError) as e:
        solve(g, cl, "lp-rounding", SolveOptions(time_limit=7, threads=1, swap=False))
    assert not e.value.proven and "did not finish within the time limit of 7 s" in str(e.value)
    assert "--time-limit" in e.value.hint


def _infeasible_at(g, frac: float, monkeypatch) -> tuple[InfeasibleError, list]:
    """The MILP's error at `frac` of keep-everything's peak (one accelerator, no swapping), and the budgets its
    search for a smaller one started from (`nofit.smaller_found`'s lo and hi)."""
    M = importlib.import_module("optsched.solvers.milp")
    real, seen = M.smaller_found, []
    monkeypatch.setattr(M, "smaller_found", lambda *a: seen.append(a[3:5]) or real(*a))
    with pytest.raises(InfeasibleError) as e:
        solve(g, one_gpu(int(frac * ke_peak(g))), "milp", SolveOptions(swap=False, time_limit=10, threads=1))
    return e.value, seen


def test_where_nothing_fits_the_milp_names_a_budget_where_its_schedule_fits_below_its_candidates_closest(
        monkeypatch):
    # at 20% of keep-everything's peak the candidates' closest schedule holds all of it; DTR, the heuristic and
    # lp-rounding at smaller budgets find one at about 65% (this box), and the error carries that schedule
    g = random_training_graph(30, 2)
    err, seen = _infeasible_at(g, 0.2, monkeypatch)
    (lo, hi), = seen
    assert err.proven and lo <= err.found < hi and err.least <= err.found
    r = simulate(g, one_gpu(err.found), err.closest)
    assert r.valid and r.peak["gpu0"] == err.found
    assert f"smallest budget at which a schedule was found: {format_size(err.found)} ({err.found} bytes)" in str(err)


def test_where_a_budget_is_proven_too_small_the_memory_lower_bound_is_above_it(monkeypatch):
    # at 35% the relaxation at the moments where the closest candidate overflowed proves that nothing fits
    # (`bounds.no_fit`) while the least budget of the single moments is 34%: the bound given is over 35%. The
    # search for a budget that fits runs once: not for the bounds found beside the LP, whose error is discarded
    g = random_training_graph(30, 1)
    err, seen = _infeasible_at(g, 0.35, monkeypatch)
    assert err.proven and err.least > int(0.35 * ke_peak(g))
    assert len(seen) == 1


def test_the_search_for_a_budget_that_fits_rises_to_the_least_budget_a_try_proves(monkeypatch):
    # from 0 to 90% of keep-everything's peak: the first try, at 45%, proves that nothing fits below the
    # relaxation's least budget (48%), so no try runs below that; what it finds simulates within its budget. The
    # search stops at the first schedule found (the budgets then within 35%), however fast the machine
    monkeypatch.setattr(N, "_FOUND_WITHIN", 0.35)
    g = random_training_graph(30, 2)
    top = int(0.9 * ke_peak(g))
    least, found, sched = smaller_found(g, one_gpu(top), SolveOptions(swap=False, threads=1), 0, top, 60.0)
    # 10 s, not the default 2: it ends once within 0.1% (1.3 s in a quiet hour); in an hour 2.6 times slower, 2 s
    # cut its climb short, 0.7% below what the tries proved
    floor = least_budget(make_spec(g, one_gpu(top)), seconds=10.0)
    assert top // 2 < least and abs(least - floor) <= floor // 500 and least <= found < top
    r = simulate(g, one_gpu(found), sched)
    assert r.valid and r.peak["gpu0"] == found
