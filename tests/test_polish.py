"""Keep instead of recompute: the pass never returns a slower or invalid schedule, removes every recomputation
when the budget is unbounded (and with it the recomputations that only served it), drops a first computation
freed unread in its last round, and keeps within the budget;
where keeping overflows, it makes room by deferring a computation past the overflow or dropping a cheaper value.
Copies nothing reads where they land go, and the solvers return none. Computations moved to another device
(`offload`) never make a schedule invalid or slower."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st
from milp_graphs import gpu_host, ke_peak, one_gpu, small_dag, two_gpus
from strategies import seeded_training_graphs

from optsched.cluster import single_accelerator
from optsched.errors import InfeasibleError
from optsched.formats import example_graph_path, import_graph
from optsched.generate import chain_graph, random_training_graph
from optsched.graph import Graph, Node, check_graph
from optsched.schedule import Compute, Copy, Free, Schedule
from optsched.simulate import simulate
from optsched.solvers import SolveOptions, chen_sqrt, keep_everything, solve
from optsched.solvers.bounds import lower_bounds
from optsched.solvers.milp_model import make_spec, spec_for
from optsched.solvers.polish import (
    _keep,
    _tighten,
    drop_unread_copies,
    keep_instead_of_recompute,
    offload,
    remade_outputs,
)


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


def _side_graph(extra: dict | None = None) -> Graph:
    """x -> a -> b -> c, and s (a statistic of x, 50 bytes) that only g, the last operation, reads with c and a."""
    def node(i, ins, nbytes, **kw):
        return Node(i, "op", "forward", ins, {"cuda": 1.0}, nbytes, **{**kw, **(extra or {}).get(i, {})})

    return check_graph(Graph((node("x", (), 10, recomputable=False), node("s", ("x",), 50), node("a", ("x",), 100),
                              node("b", ("a",), 100), node("c", ("b",), 100),
                              node("g", ("c", "s", "a"), 99, required=True)), name="side"))


def _side_schedule() -> Schedule:
    # s computed early and held through c; a dropped after b and computed again for g
    c = [Compute(v, "gpu0") for v in "xsab"] + [Free("a", "gpu0"), Compute("c", "gpu0"), Free("b", "gpu0"),
                                                 Compute("a", "gpu0"), Compute("g", "gpu0")]
    return Schedule(tuple(c))


def test_a_first_computation_freed_unread_goes_with_a_kept_recomputation():
    # The side graph with a three times as slow: s computed where an order put it and freed unread, then again for
    # g; a dropped after b and computed again. a is kept (first: more time per byte); s kept from its first
    # computation then does not fit (x, s, a, b and c hold 360 bytes when c is computed), so in the last round
    # that first computation, serving nothing, goes with its free
    def node(i, ins, nbytes, cost=1.0, **kw):
        return Node(i, "op", "forward", ins, {"cuda": cost}, nbytes, **kw)

    g = check_graph(Graph((node("x", (), 10, recomputable=False), node("s", ("x",), 50), node("a", ("x",), 100, 3.0),
                           node("b", ("a",), 100), node("c", ("b",), 100),
                           node("g", ("c", "s", "a"), 99, required=True)), name="side"))
    cl = one_gpu(359)
    ins = [Compute(v, "gpu0") for v in "xs"] + [Free("s", "gpu0")] + [Compute(v, "gpu0") for v in "ab"] + [
        Free("a", "gpu0"), Compute("c", "gpu0"), Free("b", "gpu0"), Compute("a", "gpu0"), Compute("s", "gpu0"),
        Compute("g", "gpu0")]
    before = simulate(g, cl, Schedule(tuple(ins)))
    assert before.valid and before.recomputed == 2
    out, r = keep_instead_of_recompute(g, cl, Schedule(tuple(ins)), make_room=False)
    assert r.valid and r.recomputed == 0 and r.makespan == before.makespan - 4.0 and r.peak["gpu0"] <= 359
    assert [x for x in out.instructions if isinstance(x, Compute)] == [
        Compute(v, "gpu0") for v in ("x", "a", "b", "c", "s", "g")]


def test_a_recomputation_that_failed_is_kept_once_an_unread_first_computation_is_gone():
    # d (200 bytes) computed first beside k, e and f, freed unread, and again at the end; k dropped after e and
    # computed again for r. Kept from their first computations, each overflows 410 bytes: k beside that first d,
    # d beside b (300 bytes). The last round drops the first d, and keeping k then fits
    def node(i, ins, nbytes, **kw):
        return Node(i, "op", "forward", ins, {"cuda": 1.0}, nbytes, **kw)

    g = check_graph(Graph((node("x", (), 10, recomputable=False), node("k", ("x",), 100), node("e", ("k",), 100),
                           node("f", ("x",), 100), node("d", ("x",), 200), node("h", ("f",), 10),
                           node("r", ("k", "e"), 10, required=True), node("b", ("x",), 300),
                           node("c", ("b",), 10, required=True), node("g", ("d", "h"), 10, required=True)),
                          name="unread-first"))
    cl = one_gpu(410)

    def c(*vs):
        return [Compute(v, "gpu0") for v in vs]

    def f(*vs):
        return [Free(v, "gpu0") for v in vs]

    ins = (c("x", "k", "e") + f("k") + c("f", "d") + f("d") + c("h") + f("f") + c("k", "r") + f("k", "e")
           + c("b", "c") + f("b") + c("d", "g"))
    before = simulate(g, cl, Schedule(tuple(ins)))
    assert before.valid and before.recomputed == 2 and before.peak["gpu0"] == 410
    out, r = keep_instead_of_recompute(g, cl, Schedule(tuple(ins)), make_room=False)
    assert r.valid and r.recomputed == 0 and r.makespan == before.makespan - 2.0 and r.peak["gpu0"] <= 410
    assert [x.node for x in out.instructions if isinstance(x, Compute)] == list("xkefhrbcdg")


def test_a_computation_held_through_the_overflow_is_deferred_to_make_room():
    g = _side_graph()
    cl = one_gpu(359)       # keeping a holds x, s, a, b and c (360 bytes) when c is computed
    s = _side_schedule()
    before = simulate(g, cl, s)
    assert before.valid and before.recomputed == 1 and before.peak["gpu0"] == 359
    out, r = keep_instead_of_recompute(g, cl, s, make_room=False)
    assert r.recomputed == 1 and r.makespan == before.makespan        # keeping a alone does not fit
    out, r = keep_instead_of_recompute(g, cl, s)
    again = simulate(g, cl, out)
    assert again.valid and again.recomputed == 0 and again.makespan == r.makespan == before.makespan - 1.0
    assert again.peak["gpu0"] <= 359
    ins = list(out.instructions)
    assert ins.index(Compute("s", "gpu0")) > ins.index(Compute("c", "gpu0"))      # s deferred past the peak


def test_a_cheaper_value_is_dropped_to_make_room():
    # s is read by t at once, so it cannot be deferred; it costs a tenth of a's time and its input a stays once
    # kept: dropped after t and computed again for g, it makes the room that keeping a needs at c
    g = check_graph(Graph((Node("x", "in", "input", (), {"cuda": 0.0}, 10, recomputable=False),
                           Node("a", "op", "forward", ("x",), {"cuda": 1.0}, 100),
                           Node("s", "op", "forward", ("a",), {"cuda": 0.1}, 50),
                           Node("t", "op", "forward", ("s",), {"cuda": 1.0}, 10),
                           Node("b", "op", "forward", ("t",), {"cuda": 1.0}, 100),
                           Node("c", "op", "forward", ("b",), {"cuda": 1.0}, 100),
                           Node("g", "op", "forward", ("c", "s", "a"), {"cuda": 1.0}, 89, required=True)),
                          name="drop"))
    cl = one_gpu(359)
    ins = [Compute(v, "gpu0") for v in ("x", "a", "s", "t", "b")] + [
        Free("t", "gpu0"), Free("a", "gpu0"), Compute("c", "gpu0"), Free("b", "gpu0"), Compute("a", "gpu0"),
        Compute("g", "gpu0")]
    s = Schedule(tuple(ins))
    before = simulate(g, cl, s)
    assert before.valid and before.recomputed == 1, before.violation
    out, r = keep_instead_of_recompute(g, cl, s, make_room=False)
    assert r.makespan == before.makespan
    out, r = keep_instead_of_recompute(g, cl, s)
    again = simulate(g, cl, out)
    assert again.valid and again.makespan == r.makespan
    assert again.makespan == before.makespan - 1.0 + 0.1       # a kept, s (0.1 s) computed again instead
    assert [x.node for x in out.instructions if isinstance(x, Compute)].count("s") == 2


def test_a_small_reader_is_hoisted_before_the_overflow_to_free_its_large_input():
    # w is read by b before the overflow and by m (a weight gradient: 5 bytes) after it; m's inputs are all
    # resident at the overflow, so m moves before it and w goes: the room that keeping u needs at c. Dropping w
    # instead costs its computation, as much as keeping u saves
    def node(i, ins, nbytes, cost=1.0, **kw):
        return Node(i, "op", "forward", ins, {"cuda": cost}, nbytes, **kw)

    g = check_graph(Graph((node("x", (), 10, 0.0, recomputable=False), node("u", ("x",), 100),
                           node("w", ("x",), 100), node("b", ("u", "w"), 100), node("c", ("b",), 100),
                           node("m", ("w",), 5, required=True), node("g", ("c", "u"), 50, required=True)),
                          name="hoist"))
    cl = one_gpu(315)
    ins = [Compute(v, "gpu0") for v in "xuwb"] + [Free("u", "gpu0"), Compute("c", "gpu0"), Free("b", "gpu0"),
                                                  Compute("m", "gpu0"), Free("w", "gpu0"), Compute("u", "gpu0"),
                                                  Compute("g", "gpu0")]
    s = Schedule(tuple(ins))
    before = simulate(g, cl, s)
    assert before.valid and before.recomputed == 1, before.violation
    assert keep_instead_of_recompute(g, cl, s, make_room=False)[1].makespan == before.makespan
    out, r = keep_instead_of_recompute(g, cl, s)
    again = simulate(g, cl, out)
    assert again.valid and again.recomputed == 0 and again.makespan == r.makespan == before.makespan - 1.0
    order = [x.node for x in out.instructions if isinstance(x, Compute)]
    assert order.index("m") < order.index("c") and again.peak["gpu0"] <= 315


def test_tighten_frees_each_value_after_its_last_use():
    g = _side_graph()
    ins = [Compute(v, "gpu0") for v in "xsabc"] + [Compute("g", "gpu0"), Free("b", "gpu0"), Free("s", "gpu0")]
    tags = _tighten(g, ins, list(range(len(ins))))
    out = [ins[t] for t in tags]
    assert out.index(Free("b", "gpu0")) == out.index(Compute("c", "gpu0")) + 1
    assert out.index(Free("s", "gpu0")) == out.index(Compute("g", "gpu0")) + 1
    assert sorted(tags) == list(range(len(ins)))


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
@given(g=seeded_training_graphs(2, 25, statistics=True), frac=st.floats(0.3, 1.0),
       solver=st.sampled_from(["chen-sqrt", "dtr", "heuristic", "articulation"]))
# a kept recomputation moved the last run of a maker before its statistics' reader: one call moves them again
@example(g=random_training_graph(23, 15962670, max_inputs=1, window=2, params=True, statistics=True), frac=0.6875,
         solver="chen-sqrt")
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
    for room in (False, True):
        out, r = keep_instead_of_recompute(g, cl, s, make_room=room)
        again = simulate(g, cl, out)
        assert again.valid, again.violation
        assert again.makespan == r.makespan <= before.makespan
        assert room or again.recomputed <= before.recomputed    # making room may compute a cheaper value again
        # the passes run until one keeps nothing more: another over the result finds nothing
        assert keep_instead_of_recompute(g, cl, out, make_room=room)[1].makespan == r.makespan


def test_copies_nothing_reads_where_they_land_go_with_their_frees():
    """On the chain: f1 swapped out and never read on the host (freed there), g2 swapped out and held there to the
    end: both go. f2 swapped out, dropped, and prefetched back for g3 stays; so does the copy of the required
    gradient g0 held on the host to the end."""
    g = chain_graph(4)
    c = single_accelerator(10**9, bandwidth=1e9)
    base = list(keep_everything(g, c).instructions)

    def after(x, *new):
        k = base.index(x) + 1
        base[k:k] = new

    after(Compute("f1", "gpu0"), Copy("f1", "gpu0", "host"))
    after(Compute("f3", "gpu0"), Free("f1", "host"), Copy("f2", "gpu0", "host"))
    after(Compute("loss", "gpu0"), Free("f2", "gpu0"), Copy("f2", "host", "gpu0"))
    after(Compute("g2", "gpu0"), Copy("g2", "gpu0", "host"))
    after(Compute("g0", "gpu0"), Copy("g0", "gpu0", "host"))
    before = simulate(g, c, Schedule(tuple(base)))
    assert before.valid, before.violation
    out, r = drop_unread_copies(g, c, Schedule(tuple(base)))
    assert [x for x in out.instructions if isinstance(x, Copy)] == [
        Copy("f2", "gpu0", "host"), Copy("f2", "host", "gpu0"), Copy("g0", "gpu0", "host")]
    assert Free("f1", "host") not in out.instructions and len(out.instructions) == len(base) - 3
    assert r.valid and r.makespan <= before.makespan and r.transfer_bytes == before.transfer_bytes - 2 * 10**6
    assert r.peak["host"] < before.peak["host"]
    assert simulate(g, c, out).makespan == r.makespan


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(g=seeded_training_graphs(max_forward=25), frac=st.sampled_from([0.4, 0.6, 0.8]),
       solver=st.sampled_from(["heuristic", "dtr", "offload-all"]))
def test_the_planners_return_no_copy_that_could_go_unread(g, frac, solver):
    """Every schedule the memory planner makes with swapping comes without a copy that `drop_unread_copies` would
    remove (before, the GPU-sized transformer's heuristic schedule at 70% had 3 of 19)."""
    c = single_accelerator(int(ke_peak(g) * frac), bandwidth=1e9)
    try:
        s = solve(g, c, solver)
    except InfeasibleError:
        return
    assert drop_unread_copies(g, c, s)[0] is s


def _statistic_graph(chain: int = 0) -> Graph:
    """x -> p (which also makes o, a statistic: `Node.output_of`) -> a (also reads q) -> b; g reads b, o, p and q.
    `chain`: p reads x through y (20 bytes), and b through c1 ... c`chain` (1 byte each) reaches g."""
    def node(i, ins, nbytes, cost=1.0, **kw):
        return Node(i, "op", "forward", ins, {"cuda": cost}, nbytes, **kw)

    u = "y" if chain else "x"
    cs = [node(f"c{k}", (f"c{k - 1}" if k > 1 else "b",), 1) for k in range(1, chain + 1)]
    return check_graph(Graph((node("x", (), 10, recomputable=False), *[node("y", ("x",), 20)] * bool(chain),
                              node("p", (u,), 100), node("o", ("p", u), 50, 0.0, recomputable=False, output_of="p"),
                              node("q", ("x",), 60, 5.0), node("a", ("p", "q"), 200), node("b", ("a",), 200), *cs,
                              node("g", (cs[-1].id if cs else "b", "o", "p", "q"), 10, required=True)),
                             name="statistic"))


def _statistic_schedule(chain: int = 0) -> list:
    # o made with p's first run and held through b; p and q (and y) dropped after a and computed again for g
    c = [Compute(f"c{k}", "gpu0") for k in range(1, chain + 1)]
    f = [Free(f"c{k - 1}" if k > 1 else "b", "gpu0") for k in range(1, chain + 1)]
    y = ["y"] * bool(chain)
    return [Compute(v, "gpu0") for v in ["x", *y, "p", "o", "q", "a"]] + [Free(v, "gpu0") for v in ["q", *y, "p"]] + [
        Compute("b", "gpu0"), Free("a", "gpu0")] + [x for pair in zip(c, f, strict=True) for x in pair] + [
        Compute(v, "gpu0") for v in [*y, "p", "q", "g"]]


def test_an_other_output_is_made_by_its_makers_last_run_before_its_reader_so_a_kept_value_fits():
    # Computed with p's first run, o is held through b, where keeping q (cost 5) would then overflow the 470 bytes
    # (x, o, a, b and q: 520), and nothing else there can make room. Computed after p's second run, o is held from
    # that run on (the simulator counts it so): 50 bytes less through b, and q is kept
    g, cl, ins = _statistic_graph(), one_gpu(470), _statistic_schedule()
    before = simulate(g, cl, Schedule(tuple(ins)))
    assert before.valid and before.recomputed == 2 and before.peak["gpu0"] == 460
    remade = remade_outputs(g, ins)
    assert [x.node for x in remade if isinstance(x, Compute)] == list("xpqabpoqg")
    assert simulate(g, cl, Schedule(tuple(remade))).peak["gpu0"] == 430      # at g now, 410 at b
    out, r = keep_instead_of_recompute(g, cl, Schedule(tuple(ins)))
    assert r.valid and r.recomputed == 1 and r.makespan == before.makespan - 5.0 and r.peak["gpu0"] <= 470
    assert [x.node for x in out.instructions if isinstance(x, Compute)] == list("xpqabpog")
    assert remade_outputs(g, remade, first=[True] * len(g.nodes)) == ins       # back after p's first run


def test_the_milp_stages_a_schedule_whose_other_output_a_later_run_of_its_maker_made_where_the_model_counts_it():
    # a schedule that computes o after p's last run is staged with o in that run's stage, where the stage model
    # lets an other output come late (`milp_model.late_outputs`), in Checkmate's window of 0; staged as a first
    # computation at its position, o was refused ("'o' is first computed 4 stages after its position";
    # lp-rounding's schedule for the 3-layer GPT-2 at 25%: 242)
    import importlib

    milp = importlib.import_module("optsched.solvers.milp")
    g, cl = _statistic_graph(chain=9), one_gpu(470)
    sched = Schedule(tuple(remade_outputs(g, _statistic_schedule(chain=9))))
    assert simulate(g, cl, sched).valid

    def spec_of(order, window, gaps=None):
        return spec_for(g, cl, SolveOptions(swap=False), order=order, window=window, gaps=gaps)

    objective, spec, decisions, why = milp._stage(g, spec_of, "remade", sched, None)
    assert decisions is not None and spec.K == 0, why
    assert objective == simulate(g, cl, sched).makespan
    index = g.arrays.index
    runs = decisions.R[0][:, [index["p"], index["o"]]]
    assert runs[:, 1].sum() == 1 and runs[:, 0].sum() == 2
    assert runs[:, 0].nonzero()[0][-1] == runs[:, 1].nonzero()[0][0]    # o with p's last run, in its stage


def test_offload_runs_a_weight_gradient_on_the_idle_host_beside_the_gpus_backward():
    # example:tiny at 1.1 MB: keep-everything computes all on the GPU in 85 us; the host takes g_w2 (its inputs
    # copied over as they are made), and the step is the longest dependency chain, 77 us, which no schedule beats
    g = import_graph(example_graph_path("tiny"))
    cl = single_accelerator(1_100_000)
    s = keep_everything(g, cl)
    out, r = offload(g, cl, s, ("gpu0", "host"))
    again = simulate(g, cl, out)
    assert again.valid and again.makespan == r.makespan
    assert r.makespan == pytest.approx(lower_bounds(make_spec(g, cl))["chain"])
    assert r.makespan < simulate(g, cl, s).makespan * 0.95
    assert [i for i in out.instructions if isinstance(i, Compute) and i.device == "host"] == [Compute("g_w2", "host")]
    # one device to compute on: nothing to move, the schedule comes back as it was
    same, r1 = offload(g, cl, s, ("gpu0",))
    assert same is s and r1.makespan == simulate(g, cl, s).makespan


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(n=st.integers(3, 12), seed=st.integers(0, 10**6), frac=st.floats(0.4, 1.0), hosted=st.booleans(),
       solver=st.sampled_from(["keep-everything", "dtr", "heuristic", "metf", "lp-rounding"]))
def test_offload_never_invalid_never_slower(n, seed, frac, hosted, solver):
    # random DAGs on a GPU and the host, or on two GPUs, with costs that make moving worth a try: each schedule,
    # offloaded, stays valid and no slower, and another pass over the result finds nothing more
    g = small_dag(n, seed)
    cl = (gpu_host if hosted else two_gpus)(max(1, int(ke_peak(g) * frac)), bandwidth=1e4)
    try:
        s = solve(g, cl, solver, SolveOptions(time_limit=5))
    except InfeasibleError:
        return
    before = simulate(g, cl, s)
    if not before.valid:
        return
    devices = tuple(d.name for d in cl.devices)
    out, r = offload(g, cl, s, devices)
    again = simulate(g, cl, out)
    assert again.valid, again.violation
    assert again.makespan == r.makespan <= before.makespan
    assert offload(g, cl, out, devices)[1].makespan == r.makespan
    event("faster" if r.makespan < before.makespan else "as fast")
