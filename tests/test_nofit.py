"""No schedule: "fits" only when proven (an operation larger than every device that can run it), "found" when a
solver merely found none."""

from __future__ import annotations

import pytest

from optsched.cluster import Cluster, Device, single_accelerator
from optsched.errors import InfeasibleError
from optsched.generate import random_training_graph
from optsched.graph import largest_operation
from optsched.simulate import simulate
from optsched.solvers import SolveOptions, solve

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
