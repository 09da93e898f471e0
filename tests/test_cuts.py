"""Recomputation-chain cuts (`optsched.solvers.cuts`): valid at every integer point of the model, the most
violated one per path found, and the LP bound raised without changing the optimum."""

from __future__ import annotations

import importlib

import numpy as np
import pytest
from milp_graphs import gpu_host, one_gpu, small_dag, two_gpus

from optsched.cluster import Cluster, Device
from optsched.generate import random_training_graph
from optsched.graph import memory_lower_bound
from optsched.simulate import simulate
from optsched.solvers import SolveOptions, solve
from optsched.solvers.baselines import keep_everything
from optsched.solvers.bruteforce import bruteforce
from optsched.solvers.cuts import chain_paths, root_cuts, separate
from optsched.solvers.milp_model import build_model, make_spec, row_activity

milp = importlib.import_module("optsched.solvers.milp")


def _cut_terms(model, d, path, t1, t2):
    """The chain inequality of `path` on device d for stages t1 <= t2, written from its definition:
    (S + R)[t2, c] - sum_p S[t1, p] - sum_{s=t1..t2} R[s, last] - sum_p sum_{s=t1..t2-1} Cin[s, p] <= 0."""
    spec = model.spec
    c, last = path[0], path[-1]
    terms = [(model.S[d, t2, c], 1.0), (model.R[d, t2, c], 1.0)]
    terms += [(model.S[d, t1, p], -1.0) for p in path]
    terms += [(model.R[d, s, last], -1.0) for s in range(t1, t2 + 1)]
    for k, (_, _, b) in enumerate(spec.links):
        if b == d:
            terms += [(model.C[k, s, p], -1.0) for p in path for s in range(t1, t2)]
    return [(int(j), v) for j, v in terms if j >= 0]


def _worst(model, x, path):
    """Largest left-hand side over every device and stage pair, by enumeration."""
    worst = -np.inf
    for d in range(model.spec.nD):
        for t2 in range(model.spec.T):
            for t1 in range(t2 + 1):
                worst = max(worst, sum(v * x[j] for j, v in _cut_terms(model, d, path, t1, t2)))
    return worst


def _integer_points(model, k, seed):
    """Up to k integer points of the model: HiGHS's optima for random costs on its binaries."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(k):
        h = milp.highs_model(model)
        cost = model.cost.copy()
        cost[model.integ == 1] = rng.uniform(-1.0, 1.0, int(model.integ.sum()))
        h.changeColsCost(model.ncol, np.arange(model.ncol, dtype=np.int32), cost)
        h.setOptionValue("time_limit", 10.0)
        h.run()
        if h.getInfo().primal_solution_status >= 1:
            out.append(np.round(np.asarray(h.getSolution().col_value), 9))
    return out


CLUSTERS = {"one": one_gpu, "host": gpu_host, "two": two_gpus}


@pytest.mark.parametrize("n,seed,kind", [(n, s, k) for n in (4, 5, 6) for s in range(3) for k in CLUSTERS
                                          if n < 6 or k != "two"])
def test_every_chain_cut_holds_at_integer_points_of_the_model(n, seed, kind):
    g = small_dag(n, seed)
    lb = memory_lower_bound(g)
    ke = simulate(g, one_gpu(10**9), keep_everything(g, one_gpu(10**9))).peak["gpu0"]
    checked = 0
    for mem in (lb + (ke - lb) // 2, ke):
        model = build_model(make_spec(g, CLUSTERS[kind](mem)))
        paths = chain_paths(model, depth=3)
        for x in _integer_points(model, 3, seed):
            act = row_activity(model, x)
            assert (act <= model.row_hi + 1e-6).all() and (act >= model.row_lo - 1e-6).all()
            for path in paths:
                p = [int(v) for v in path if v >= 0]
                assert _worst(model, x, p) <= 1e-6, (p, x)
            start, _, _ = separate(model, paths, x)
            assert start.size == 1                                            # nothing violated, nothing added
            checked += 1
    assert checked


def test_separate_finds_the_most_violated_cut_of_each_path():
    g = random_training_graph(6, 1)
    ke = simulate(g, one_gpu(10**12), keep_everything(g, one_gpu(10**12))).peak["gpu0"]
    model = build_model(make_spec(g, gpu_host(int(0.5 * ke)), swap=True))
    h = milp.highs_model(model)
    h.setOptionValue("solve_relaxation", True)
    h.run()
    x = np.asarray(h.getSolution().col_value)
    paths = chain_paths(model, depth=2)
    start, index, value = separate(model, paths, x, limit=10**6)
    acts = sorted(np.add.reduceat(value * x[index], start[:-1]).tolist(), reverse=True) if index.size else []
    worst = sorted((w for w in (_worst(model, x, [int(v) for v in p if v >= 0]) for p in paths) if w > 1e-3),
                   reverse=True)
    assert worst, "the LP point should violate some chain cut here"
    # one row per violated path and device (a path's worst may be reached on either device), each as violated as
    # the worst of its path, and every path's worst violation found
    assert len(acts) >= len(worst)
    assert acts[0] == pytest.approx(worst[0], abs=1e-9)
    assert min(acts) > 1e-3


def test_root_cuts_raise_the_lp_bound_and_keep_the_optimum():
    g = random_training_graph(16, 3)
    big = Cluster((Device("gpu0", "cuda", 10**15),))
    ke = simulate(g, big, keep_everything(g, big)).peak["gpu0"]
    model = build_model(make_spec(g, one_gpu(int(0.7 * ke)), swap=False))
    h = milp.highs_model(model)
    info = root_cuts(h, model, 20.0, depth=2)
    assert info["rounds"] >= 1 and info["cuts"] > 0
    assert info["lp"][-1] > info["lp"][0] * (1 + 1e-3)
    h.setOptionValue("time_limit", 30.0)
    h.run()
    plain = milp.highs_model(model)
    plain.setOptionValue("time_limit", 30.0)
    plain.run()
    for x in (h, plain):
        assert x.getModelStatus() == x.getModelStatus().kOptimal
    assert h.getInfo().objective_function_value == pytest.approx(plain.getInfo().objective_function_value,
                                                                  rel=1e-6)


def test_solve_reports_the_cut_rounds_and_cuts_are_off_by_default():
    g = random_training_graph(16, 3)
    big = Cluster((Device("gpu0", "cuda", 10**15),))
    ke = simulate(g, big, keep_everything(g, big)).peak["gpu0"]
    cl = one_gpu(int(0.7 * ke))
    # the whole-stage model, without the within-stage follow-up, its schedule unpolished (`polish.py` may beat it
    # outside the model)
    whole = {"warm": False, "instage": False, "polish": False}
    on = solve(g, cl, "milp", SolveOptions(swap=False, time_limit=30, threads=1, params={**whole, "cuts": 2}))
    off = solve(g, cl, "milp", SolveOptions(swap=False, time_limit=30, threads=1, params=whole))
    assert on.report.status == off.report.status == "optimal"
    cuts = on.report.extra["cuts"]
    assert cuts["rows"] > 0 and cuts["lp_after"] > cuts["lp_before"]
    assert "cuts" not in off.report.extra
    assert on.report.objective == pytest.approx(off.report.objective, rel=0.011)
    assert simulate(g, cl, on).valid


@pytest.mark.parametrize("n,seed,kind", [(n, s, k) for n in (4, 5) for s in range(3) for k in CLUSTERS])
def test_with_cuts_the_milp_still_reaches_the_exhaustive_optimum(n, seed, kind):
    g = small_dag(n, seed)
    lb = memory_lower_bound(g)
    ke = simulate(g, one_gpu(10**9), keep_everything(g, one_gpu(10**9))).peak["gpu0"]
    opts = SolveOptions(time_limit=30, gap=0.0, threads=1, params={"cuts": 3, "warm": False, "instage": False})
    for mem in (lb + (ke - lb) // 2, ke):        # the tighter budget, unless the model has no schedule there
        cl = CLUSTERS[kind](mem)
        best = bruteforce(g, cl, opts)
        if best is not None:
            break
    assert best is not None
    s = solve(g, cl, "milp", opts)
    assert simulate(g, cl, s).valid
    if s.report.extra.get("polished"):      # the model's optimum, then faster outside the model
        assert s.report.extra["milp_objective"] == pytest.approx(best, rel=1e-9, abs=1e-12)
        assert s.report.objective < best
    elif s.report.extra.get("fallback"):    # a baseline outside the model was faster
        assert s.report.objective <= best + 1e-9
    else:
        assert s.report.status == "optimal" and s.report.objective == pytest.approx(best, rel=1e-9, abs=1e-12)
