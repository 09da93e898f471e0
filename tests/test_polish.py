"""Keep instead of recompute: the pass never returns a slower or invalid schedule, removes every recomputation
when the budget is unbounded (and with it the recomputations that only served it), and keeps within the budget."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from milp_graphs import one_gpu
from strategies import seeded_training_graphs

from optsched.generate import chain_graph
from optsched.schedule import Compute, Free, Schedule
from optsched.simulate import simulate
from optsched.solvers import SolveOptions, chen_sqrt, keep_everything, solve
from optsched.solvers.polish import _keep, keep_instead_of_recompute


def test_unbounded_budget_removes_every_recomputation():
    g = chain_graph(16)
    big = one_gpu(10**15)
    ke = simulate(g, big, keep_everything(g, big))
    s = chen_sqrt(g, big)
    before = simulate(g, big, s)
    assert before.recomputed > 0
    out, r = keep_instead_of_recompute(g, big, s)
    assert r.valid and r.recomputed == 0
    assert r.makespan == ke.makespan and r.peak["gpu0"] == ke.peak["gpu0"]
    assert simulate(g, big, out).makespan == r.makespan


def test_a_recomputation_chain_goes_with_the_value_it_served():
    # f1 and f2 dropped after the forward pass; f1 recomputed only to recompute f2 (then freed), and again for g2.
    # Keeping f2 leaves the first recomputation of f1 unread: it goes too, the second stays.
    g = chain_graph(4)
    big = one_gpu(10**15)
    base = list(keep_everything(g, big).instructions)

    def at(node):
        return base.index(Compute(node, "gpu0"))

    ins = (base[:at("f3") + 1] + [Free("f1", "gpu0"), Free("f2", "gpu0")] + base[at("f3") + 1:at("g3")]
           + [Compute("f1", "gpu0"), Compute("f2", "gpu0"), Free("f1", "gpu0")] + base[at("g3"):at("g2")]
           + [Compute("f1", "gpu0")] + base[at("g2"):])
    before = simulate(g, big, Schedule(tuple(ins)))
    assert before.valid, before.violation
    assert before.recomputed == 3
    f = ins.index(Free("f2", "gpu0"))
    c = len(ins) - 1 - ins[::-1].index(Compute("f2", "gpu0"))
    kept, _ = _keep(g, ins, list(range(len(ins))), f, c)
    r = simulate(g, big, Schedule(tuple(kept)))
    assert r.valid and r.recomputed == 1
    assert [x for x in kept if x in (Compute("f1", "gpu0"), Compute("f2", "gpu0"))] == [
        Compute("f1", "gpu0"), Compute("f2", "gpu0"), Compute("f1", "gpu0")]
    assert len(kept) == len(ins) - 4      # f2's free and recomputation, f1's unread recomputation and its free
    out, r = keep_instead_of_recompute(g, big, Schedule(tuple(ins)))
    assert r.valid and r.recomputed == 0


def test_tight_budget_stays_within_it():
    g = chain_graph(16)
    big = one_gpu(10**15)
    s = chen_sqrt(g, big)
    peak = simulate(g, big, s).peak["gpu0"]
    cl = one_gpu(peak + 2_000_000)      # room for two more activations, not for all
    out, r = keep_instead_of_recompute(g, cl, s)
    before = simulate(g, cl, s)
    assert r.valid and r.peak["gpu0"] <= cl.devices[0].memory
    assert 0 < r.recomputed < before.recomputed and r.makespan < before.makespan


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(g=seeded_training_graphs(2, 25), frac=st.floats(0.3, 1.0),
       solver=st.sampled_from(["chen-sqrt", "dtr", "heuristic", "articulation"]))
def test_never_invalid_never_slower(g, frac, solver):
    big = one_gpu(10**15)
    cl = one_gpu(max(1, int(simulate(g, big, keep_everything(g, big)).peak["gpu0"] * frac)))
    try:
        s = solve(g, cl, solver, SolveOptions(swap=False, time_limit=5))
    except Exception:
        return      # nothing to polish: the solver found no schedule
    before = simulate(g, cl, s)
    if not before.valid:
        return
    out, r = keep_instead_of_recompute(g, cl, s)
    again = simulate(g, cl, out)
    assert again.valid, again.violation
    assert again.makespan == r.makespan <= before.makespan
    assert again.recomputed <= before.recomputed
