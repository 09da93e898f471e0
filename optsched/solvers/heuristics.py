"""Fast heuristic solvers, each `solver(graph, cluster, options) -> Schedule`.

- heuristic:   ParDNN placement on the accelerators + list schedule + the
               Capuchin-style memory planner (swap when it hides, else
               recompute by seconds per byte freed); on small graphs it also
               plans everything on one accelerator (as with devices=1), and
               there in the graph's own order too (`extra["order"]` "graph"),
               and keeps the fastest.

With swapping on, work also goes to the host (when the cluster's host may
run it): the placements put an operation whose inputs, output and workspace
exceed every accelerator's budget there, and the planner runs an operation
there when it cannot make room for it on its accelerator. With swapping off
("never copy tensors to the host and back") neither happens.
- metf:        Baechi m-ETF placement + the same planner.
- offload-all: vDNN on one accelerator: every forward activation is copied to
               the host after its last forward use and prefetched back one
               computation before its backward use.
- dtr:         DTR on one accelerator: evict the tensor with the least
               cost/(bytes * staleness), recompute on demand.

Every schedule is checked in the simulator before it is returned (unless
`params["verify"]` is false); the planner's memory model is conservative, and
should the simulator still find an overflow the plan is redone with a smaller
effective budget. When nothing fits, `InfeasibleError` says so.

Knobs in `options.params`: verify (bool), compare_single (bool), policy
("capuchin" | "dtr"), memory_rounds (int, ParDNN memory pass).
"""

from __future__ import annotations

import time

import numpy as np

from ..cluster import Cluster
from ..errors import InfeasibleError, OptschedError
from ..graph import KINDS, Graph
from ..schedule import Schedule, SolveReport
from ..simulate import simulate
from .memplan import VARIANTS, find_host, plan
from .nofit import not_found
from .options import SolveOptions, recomputing
from .partition import metf as metf_place
from .partition import node_time_on, pardnn, placement_devices
from .polish import drop_unread_copies
from .sequential import pick_device

_FORWARD = KINDS.index("forward")


def _verify_default(graph: Graph) -> bool:
    return True


def _checked(graph: Graph, cluster: Cluster, name: str, options: SolveOptions, build, t0: float,
             extra=None, drops: bool = True) -> Schedule:
    """Run `build(budget_scale, variant)` (`memplan.plan`'s keywords); check in the simulator, without the copies
    nothing reads (`polish.drop_unread_copies`; params {"drop_unread": False} keeps them); shrink and retry on
    overflow. Where the plan may drop values (`drops`) and the graph is small enough to plan several times, a plan
    is made in each of `memplan.VARIANTS` and the fastest is kept: deferring the drops that chain gradients gives
    ResNet-50 at 30% of its keep-everything memory a plan at all, but the shipped BERT at 878 MB, one accelerator
    without swapping, is 3.3% faster without it; recomputing the deepest input first gives GPT-2 at 30% a plan
    under DTR, and is 19% slower at 35%. A plan that recomputes nothing is the same with the deepest input first,
    which is then not planned."""
    verify = bool(options.params.get("verify", True))
    every = drops and verify and options.recompute and len(graph) <= _PLAN_EVERY
    variants = VARIANTS if every else ({},)
    last = None
    for scale in (1.0, 0.95, 0.85, 0.7):
        best, errors, same, made = None, [], set(), 0
        for variant in variants:
            if variant.get("deep_first") and variant["defer_chains"] in same:
                continue
            try:
                ins = build(scale, variant)
            except InfeasibleError as e:
                errors.append(e)
                continue
            sched = Schedule(tuple(ins), graph=graph.name)
            if not verify:
                return Schedule(sched.instructions, SolveReport(name, "heuristic",
                                                                solve_time=time.perf_counter() - t0,
                                                                extra=dict(extra or {})), graph=graph.name)
            r = simulate(graph, cluster, sched)
            made += 1
            if variant and not r.recomputed:
                same.add(variant["defer_chains"])
            if r.valid:
                if best is None or r.makespan < best[1].makespan:
                    best = (sched, r)
                continue
            last = r.violation
            if last.code != "over-budget":
                raise RuntimeError(f"{name} produced an invalid schedule: {last.message}")
        if best is not None:
            sched, r = drop_unread_copies(graph, cluster, *best) if options.params.get("drop_unread", True) else best
            ex = dict(extra or {})
            ex.update(peak=r.peak, recomputed=r.recomputed, transfer_bytes=r.transfer_bytes)
            return Schedule(sched.instructions, SolveReport(name, "heuristic", objective=r.makespan,
                                                            solve_time=time.perf_counter() - t0, extra=ex),
                            graph=graph.name)
        if errors and not made:
            e = errors[0]
            raise e if e.proven else not_found(graph, cluster, e.message, hint=e.hint)
    raise not_found(graph, cluster, f"{name} found none within the budget ({last.message})",
                    hint="another solver may: milp, lp-rounding, or allow swapping")


_PLAN_EVERY = 20000     # nodes, at most, for planning in every variant (`_checked`)


def _single_device_inputs(graph: Graph, cluster: Cluster, options: SolveOptions):
    dev = pick_device(graph, cluster, options.device)
    d = cluster.device_index[dev.name]
    a = graph.arrays
    order = a.topo
    cost = a.cost[dev.kind] / dev.speed
    est = np.zeros(len(a.ids))
    c = cost[order]
    est[order] = np.concatenate(([0.0], np.cumsum(c)[:-1]))
    place = np.full(len(a.ids), d, dtype=np.int64)
    return place, order, est


def _one_accelerator(graph: Graph, cluster: Cluster, options: SolveOptions, memory_rounds: int):
    """ParDNN's list schedule on the device the single-device solvers use: the
    plan `heuristic` makes with devices=1, so more accelerators never make its
    result worse."""
    d = cluster.device_index[pick_device(graph, cluster, options.device).name]
    return pardnn(graph, cluster, [d], memory_rounds=memory_rounds, fit=options.swap)


def heuristic(graph: Graph, cluster: Cluster, options: SolveOptions = SolveOptions()) -> Schedule:
    t0 = time.perf_counter()
    p = options.params
    policy = p.get("policy", "capuchin")
    rounds = int(p.get("memory_rounds", 6))
    devs = placement_devices(graph, cluster, options.devices)
    place, order, est = pardnn(graph, cluster, devs, memory_rounds=rounds, fit=options.swap)
    t_place = time.perf_counter() - t0
    verify = bool(p.get("verify", True))
    compare = p.get("compare_single", len(graph) <= 20000) and verify
    if len(devs) > 1 and not compare:
        # no simulator to arbitrate: keep the placement only if its list schedule beats one device
        multi = float((est + node_time_on(graph, cluster, place)).max()) if len(graph) else 0.0
        try:
            splace, sorder, sest = _one_accelerator(graph, cluster, options, rounds)
            single = float((sest + node_time_on(graph, cluster, splace)).max()) if len(graph) else 0.0
            if multi >= 0.98 * single:
                place, order, est = splace, sorder, sest
        except Exception:  # noqa: BLE001 - some node cannot run on one accelerator: keep the placement
            pass

    def planned(pl, od, es, **extra) -> Schedule:      # the planner over one placement and list order, checked
        return _checked(graph, cluster, "heuristic", options,
                        lambda s, v: plan(graph, cluster, pl, od, es, policy=policy, swap=options.swap,
                                          recompute=options.recompute, budget_scale=s, **v), t0,
                        extra={**extra, "placement_time": t_place})

    best, err = None, None
    try:
        best = planned(place, order, est, devices=len(set(place.tolist())))
    except InfeasibleError as e:
        err = e
    one_device = compare        # the plans on one accelerator: none where some operation cannot run on it
    try:
        pick_device(graph, cluster, options.device)
    except OptschedError:
        one_device = False
    if len(devs) > 1 and one_device:
        try:
            single = planned(*_one_accelerator(graph, cluster, options, rounds), devices=1)
            if best is None or single.report.objective < best.report.objective:
                best = single
        except (InfeasibleError, Exception) as e:  # noqa: BLE001 - the multi-device plan may still stand
            if best is None and isinstance(e, InfeasibleError) is False:
                raise
    if one_device:
        # and in the graph's own order on that accelerator, as DTR takes it: ParDNN's list order computes ahead
        # what a tight budget then cannot hold (GPT-2 at 30% of its keep-everything memory, one accelerator
        # without swapping: no plan in ParDNN's order, 4.38x keep-everything's step time in the graph's)
        try:
            ordered = planned(*_single_device_inputs(graph, cluster, options), devices=1, order="graph")
            if best is None or ordered.report.objective < best.report.objective:
                best = ordered
        except InfeasibleError:
            pass
    if one_device and options.swap:
        # vDNN-style offloading on one device is sometimes the better plan (long sequential graphs)
        try:
            off = offload_all(graph, cluster, options)
            if best is None or off.report.objective < best.report.objective:
                best = Schedule(off.instructions, SolveReport("heuristic", "heuristic", objective=off.report.objective,
                                                              extra={**dict(off.report.extra), "devices": 1,
                                                                     "variant": "offload"}), graph=graph.name)
        except InfeasibleError:
            pass
    if best is None:
        raise err
    r = best.report
    return Schedule(best.instructions, SolveReport(r.solver, r.status, objective=r.objective,
                                                   solve_time=time.perf_counter() - t0, extra=r.extra),
                    graph=graph.name)


def metf(graph: Graph, cluster: Cluster, options: SolveOptions = SolveOptions()) -> Schedule:
    t0 = time.perf_counter()
    devs = placement_devices(graph, cluster, options.devices)
    place, order, est = metf_place(graph, cluster, devs, fit=options.swap)
    t_place = time.perf_counter() - t0
    return _checked(graph, cluster, "metf", options,
                    lambda s, v: plan(graph, cluster, place, order, est,
                                          policy=options.params.get("policy", "capuchin"), swap=options.swap,
                                          recompute=options.recompute, budget_scale=s, **v), t0,
                    extra={"devices": len(set(place.tolist())), "placement_time": t_place})


def offload_all(graph: Graph, cluster: Cluster, options: SolveOptions = SolveOptions()) -> Schedule:
    t0 = time.perf_counter()
    if not options.swap:
        raise OptschedError("offload-all copies every forward activation to the host: it cannot run with swapping "
                            "off", hint="drop --no-swap, or pick a recomputing solver (chen-sqrt, dtr, milp)")
    place, order, est = _single_device_inputs(graph, cluster, options)
    d = int(place[0]) if len(place) else 0
    if find_host(cluster, [d]) is None:
        raise InfeasibleError("offload-all needs a host (cpu device) linked both ways with the accelerator",
                              hint="use a cluster from single_accelerator() or add the links")
    a = graph.arrays
    fwd = np.flatnonzero(a.kind == _FORWARD)
    return _checked(graph, cluster, "offload-all", options,
                    lambda s, v: plan(graph, cluster, place, order, est, policy="capuchin", swap=True,
                                          recompute=False, offload=fwd, budget_scale=s, prefetch=False,
                                          host_fallback=False, **v), t0,
                    extra={"offloaded": int(fwd.size)}, drops=False)


def dtr(graph: Graph, cluster: Cluster, options: SolveOptions = SolveOptions()) -> Schedule:
    t0 = time.perf_counter()
    recomputing("dtr", options)
    place, order, est = _single_device_inputs(graph, cluster, options)
    return _checked(graph, cluster, "dtr", options,
                    lambda s, v: plan(graph, cluster, place, order, est, policy="dtr",
                                          swap=bool(options.params.get("swap", options.swap)), recompute=True,
                                          budget_scale=s, host_fallback=False, **v), t0)
