"""Comparison tables: each row says what the simulator says about that solver's
schedule, a solver that finds nothing gives a row (not an exception), and a
sweep gives one row per (budget, solver) however many processes run it."""

from __future__ import annotations

import math

import pytest

from optsched import simulate, single_accelerator, solve
from optsched.cluster import Cluster, Device
from optsched.compare import MILP_VARIANTS, compare, reference_time, run_solver, sweep
from optsched.errors import InfeasibleError, OptschedError
from optsched.generate import chain_graph, random_training_graph
from optsched.graph import largest_operation
from optsched.solvers import SolveOptions
from optsched.units import parse_size_range

CHEAP = ["keep-everything", "chen-sqrt", "heuristic", "offload-all", "dtr"]


@pytest.fixture(scope="module")
def graph():
    return random_training_graph(12, 3)


@pytest.fixture(scope="module")
def keep_peak(graph):
    return run_solver(graph, single_accelerator(10**12), "keep-everything").result.peak["gpu0"]


def test_rows_agree_with_the_simulator(graph, keep_peak):
    cl = single_accelerator(int(0.6 * keep_peak))
    df = compare(graph, cl, CHEAP)
    assert list(df["solver"]) == CHEAP
    base = simulate(graph, cl, solve(graph, cl, "keep-everything")).makespan
    for row in df.itertuples():
        if row.status in ("infeasible", "no_incumbent", "model_infeasible"):    # the solver's refusal
            with pytest.raises(InfeasibleError):
                solve(graph, cl, row.solver)
            continue
        r = simulate(graph, cl, solve(graph, cl, row.solver))
        assert row.valid == r.valid
        assert row.step_time_s == pytest.approx(r.makespan)
        assert row.overhead == pytest.approx(r.makespan / base - 1)
        assert row.recompute_s == pytest.approx(r.recompute_time)
        assert (row.swap_out_bytes, row.swap_in_bytes) == (r.swap_out_bytes, r.swap_in_bytes)
        assert (row.peak_gpu0_bytes, row.peak_host_bytes) == (r.peak["gpu0"], r.peak["host"])
        assert row.solve_s >= 0
    keep = df.set_index("solver").loc["keep-everything"]
    # 60% of its own peak: keep-everything is over budget, and the row says so instead of hiding it
    assert keep.status == "invalid" and not keep.valid and "over its budget" in keep.violation
    assert keep.overhead == 0
    assert df.set_index("solver").loc["heuristic", "valid"]


@pytest.mark.parametrize("host, status", [(False, "infeasible"), (True, "no_incumbent")])
def test_a_solver_that_finds_nothing_gives_a_row_that_says_so(graph, host, status):
    # below every operation's size on the accelerator: proven infeasible when it is the only device; with a
    # host that can run every operation, the solvers that find nothing prove nothing
    cl = single_accelerator(1000) if host else Cluster((Device("gpu0", "cuda", 1000),))
    df = compare(graph, cl, ["dtr", "chen-greedy", "keep-everything"]).set_index("solver")
    for name in ("dtr", "chen-greedy"):
        row = df.loc[name]
        assert row.status == status and not row.valid and row.message
        assert math.isnan(row.step_time_s) and math.isnan(row.peak_gpu0_bytes) and math.isnan(row.overhead)
    # the proof names what the largest operation needs; chen-greedy's smallest peak is over the budget; a
    # schedule's row has no bracket
    if host:
        assert df.loc["chen-greedy", "smallest_found_bytes"] > 1000
        assert math.isnan(df.loc["chen-greedy", "memory_lower_bound_bytes"])
    else:
        assert df.loc["chen-greedy", "memory_lower_bound_bytes"] == largest_operation(graph)[1] > 1000
    assert math.isnan(df.loc["keep-everything", "smallest_found_bytes"])
    assert df.loc["keep-everything", "status"] == "invalid"


def test_a_proven_refusal_gives_the_least_budget_that_fits():
    # every schedule of this graph needs 350 bytes, more than its largest operation's 250 (test_bounds)
    from test_bounds import forced_recompute_graph

    row = compare(forced_recompute_graph(), Cluster((Device("gpu0", "cuda", 349),)), ["milp"],
                  SolveOptions(swap=False, time_limit=10, threads=1)).set_index("solver").loc["milp"]
    assert row.status == "infeasible" and row.memory_lower_bound_bytes == 350


def test_a_milp_out_of_time_without_a_schedule_is_not_called_infeasible():
    # no baseline fits this graph at 40% of its keep-everything peak and 0.05 s is too short for the MILP; the
    # host computes nothing (where it may, every operation on it is a schedule, a candidate of its own)
    g = random_training_graph(40, 11, window=2)
    big = single_accelerator(10**15)
    cl = single_accelerator(int(0.4 * simulate(g, big, solve(g, big, "keep-everything")).peak["gpu0"]))
    opts = SolveOptions(swap=False, time_limit=0.05, threads=1, params={"host_compute": False})
    row = compare(g, cl, ["milp"], opts).set_index("solver").loc["milp"]
    assert row.status == "no_incumbent" and not row.valid
    assert row.message.startswith("no schedule found: ") and "--time-limit" in row.message


def test_unknown_solver_or_variant_is_refused_before_solving(graph):
    cl = single_accelerator(10**9)
    with pytest.raises(OptschedError, match="unknown solver 'nope'"):
        compare(graph, cl, ["keep-everything", "nope"])
    with pytest.raises(OptschedError, match="variant"):
        sweep(graph, [10**9], ["milp/swap-nothing"], progress=False)


def test_milp_variants_respect_their_restrictions(keep_peak):
    g = chain_graph(5, act_bytes=1000, cost=1e-3)
    big = run_solver(g, single_accelerator(10**12), "keep-everything").result.peak["gpu0"]
    cl = single_accelerator(int(0.7 * big))
    df = compare(g, cl, list(MILP_VARIANTS), SolveOptions(time_limit=10, threads=1)).set_index("solver")
    assert df["valid"].all(), df["message"]
    assert df.loc["milp/recompute-only", "swap_out_bytes"] == 0
    assert df.loc["milp/swap-only", "recomputed_ops"] == 0
    for row in df.itertuples():
        # the bound is a lower bound on the objective, which the simulated step time never exceeds
        assert row.bound_s <= row.objective_s * (1 + 1e-9)
        assert row.step_time_s <= row.objective_s * (1 + 1e-9)
    # the joint problem contains both restricted ones
    best_restricted = min(df.loc["milp/recompute-only", "step_time_s"], df.loc["milp/swap-only", "step_time_s"])
    assert df.loc["milp", "step_time_s"] <= best_restricted * (1 + 0.01) + 1e-12


def test_sweep_one_row_per_budget_and_solver(graph, keep_peak, capsys):
    budgets = [int(0.5 * keep_peak), keep_peak]
    par = sweep(graph, budgets, ["heuristic", "keep-everything"], processes=2, progress=True)
    assert len(par) == 4
    assert list(zip(par["budget_bytes"], par["solver"], strict=True)) == [
        (budgets[0], "heuristic"), (budgets[0], "keep-everything"), (budgets[1], "heuristic"),
        (budgets[1], "keep-everything")]
    assert "4/4" in capsys.readouterr().err
    seq = sweep(graph, budgets, ["heuristic", "keep-everything"], processes=1, progress=False)
    assert list(seq["step_time_s"]) == pytest.approx(list(par["step_time_s"]))
    assert list(par["valid"]) == [True, False, True, True]
    assert (par["peak_gpu0_bytes"][par["valid"]] <= par["budget_bytes"][par["valid"]]).all()
    base = reference_time(graph, single_accelerator(keep_peak))
    assert par["overhead"].tolist() == pytest.approx((par["step_time_s"] / base - 1).tolist())


def test_budget_ranges():
    assert parse_size_range("1GB..2GB", 3) == [10**9, 1_500_000_000, 2 * 10**9]
    assert parse_size_range("1GB,512MB", 9) == [10**9, 512 * 10**6]
    assert parse_size_range("1GiB", 4) == [2**30]
    for bad, steps in (("2GB..1GB", 3), ("1GB..2GB", 1), ("1GB..", 3), ("lots", 3)):
        with pytest.raises(OptschedError):
            parse_size_range(bad, steps)
