"""The MILP's optimum equals the exhaustive optimum of the same model on tiny DAGs."""

from __future__ import annotations

import math

import pytest
from milp_graphs import gpu_host, one_gpu, small_dag, two_gpus

from optsched.errors import InfeasibleError
from optsched.graph import Graph, Node, check_graph, memory_lower_bound
from optsched.schedule import Compute
from optsched.simulate import simulate
from optsched.solvers import SolveOptions, solve
from optsched.solvers.baselines import keep_everything
from optsched.solvers.bruteforce import bruteforce

CASES = [(n, seed, kind) for n in (3, 4, 5) for seed in range(4)
         for kind in ("one", "one-norecompute", "host-swap", "host-noswap", "two")]
CASES += [(6, seed, "one") for seed in range(4)]
# the within-stage memory count (Checkmate's FREE variables) against the same exhaustive search
CASES += [(4, seed, kind + "-within") for seed in range(4) for kind in ("one", "host-swap", "two")]
CASES += [(n, seed, "one-within") for n in (5, 6) for seed in range(4)]
# copies that also hold both ends' compute streams (Link.issue)
CASES += [(n, seed, "host-issue") for n in (3, 4) for seed in range(4)]
# an op with a second output (`Node.output_of`), made with the op's first run or, late, with a recomputation of it
CASES += [(n, seed, "one-output") for n in (4, 5) for seed in range(4)]
CASES += [(4, seed, "two-output") for seed in range(4)]


def _cluster(kind, mem):
    kind = kind.removesuffix("-output")
    within = kind.endswith("-within")
    kind = kind.removesuffix("-within")
    extra = {"params": {"instage": within}}     # one model: no within-stage follow-up after the whole-stage one
    if kind.startswith("one"):
        return one_gpu(mem), extra
    if kind == "host-swap":
        return gpu_host(mem), extra
    if kind == "host-issue":
        return gpu_host(mem, issue=0.7), extra
    if kind == "host-noswap":
        return gpu_host(mem), {"swap": False, **extra}
    return two_gpus(mem), extra


@pytest.mark.parametrize("n,seed,kind", CASES)
def test_milp_equals_exhaustive(n, seed, kind):
    g = small_dag(n, seed, ws=seed % 2 == 1, output=kind.endswith("-output"))
    lb = memory_lower_bound(g)
    ke = simulate(g, one_gpu(10**9), keep_everything(g, one_gpu(10**9))).peak["gpu0"]
    frac = (0.2, 0.5, 0.8, 1.0)[seed % 4]
    mem = lb + int(frac * (ke - lb))
    cl, kw = _cluster(kind, mem)
    opts = SolveOptions(time_limit=30, gap=0.0, warm_start=keep_everything(g, cl),
                        recompute=kind != "one-norecompute", **kw)
    best = bruteforce(g, cl, opts)
    try:
        s = solve(g, cl, "milp", opts)
    except InfeasibleError:
        assert best is None
        return
    r = s.report
    sim = simulate(g, cl, s)
    assert sim.valid
    if best is None:
        # the model is infeasible; the MILP may only return a baseline that the simulator accepts
        assert r.extra.get("fallback")
        return
    if r.extra.get("polished"):
        # the model's optimum, then a faster schedule outside it (`polish.py`: the model fixes the order)
        assert r.extra["milp_objective"] == pytest.approx(best, abs=1e-9)
        assert sim.makespan == pytest.approx(r.objective) and sim.makespan < best
        return
    if r.extra.get("fallback"):
        assert sim.makespan <= best + 1e-9
        assert r.extra.get("milp_objective", best) == pytest.approx(best, abs=1e-9) or \
            (r.status == "feasible" and r.extra["stage_model_status"] == "infeasible")
        return
    assert r.status == "optimal"
    assert math.isclose(r.objective, best, rel_tol=1e-9, abs_tol=1e-9), (r.objective, best)
    assert sim.makespan <= r.objective * (1 + 1e-9)


@pytest.mark.parametrize("within", [False, True])
def test_an_other_output_comes_late_with_a_recomputation_of_its_op(within):
    """A norm's statistics, read only by the backward node: where holding them through the forward peak does not
    fit, the model makes them with the norm's recomputation there (`milp_model.late_outputs`), as the simulator
    counts them, and its optimum is the exhaustive one."""
    def c(s):
        return {"cuda": s, "cpu": 3 * s}

    g = check_graph(Graph((
        Node("x", "in", "input", (), c(0), 100, recomputable=False),
        Node("a", "norm", "forward", ("x",), c(1), 100),
        Node("stat", "norm", "forward", ("a",), c(0), 300, recomputable=False, output_of="a"),
        Node("b", "op", "forward", ("a",), c(5), 400),
        Node("y", "op", "forward", ("b",), c(2), 100),
        Node("da", "grad", "backward", ("y", "a", "stat"), c(3), 100, required=True),
    )))
    budget = 800        # x, a, b and stat held at once need 900
    cl = one_gpu(budget)
    opts = SolveOptions(time_limit=30, gap=0.0, swap=False, params={"instage": within})
    best = bruteforce(g, cl, opts)
    s = solve(g, cl, "milp", opts)
    sim = simulate(g, cl, s)
    assert sim.valid and sim.peak["gpu0"] <= budget
    assert s.report.status == "optimal" and best == pytest.approx(12.0)     # a computed twice: 11 + 1
    assert s.report.objective == pytest.approx(best) and sim.makespan <= s.report.objective * (1 + 1e-9)
    runs = [x.node for x in s.instructions if isinstance(x, Compute)]
    assert runs.count("a") == 2 and runs.index("stat") > len(runs) - 1 - runs[::-1].index("a")
