"""The optimal scheduler: one mixed-integer linear programme that decides device
placement, recomputation and swapping jointly, solved by HiGHS (`milp`) or by
any solver PuLP drives (`pulp`, `pulp:NAME`).

Formulation (stages over a fixed topological order, Checkmate-style, extended
to several devices and links; all sets index-pruned, see `milp_model.py`):

- Stages t = 0..T-1, T = n + K (+ gap stages). Node v (rank p(v) in the order,
  stage pos(v) = p(v) plus the gap stages before it) is first computed in a
  stage of its window [pos(v), pos(v)+K]; K = 0 (Checkmate's
  frontier-advancing order) when only one device can compute and nothing can
  be copied, K = 2 otherwise, so that independent nodes can run side by side
  on different devices and a transfer can sit between producer and consumer.
- Binaries per model device d: R[d,t,v] compute v on d in stage t;
  S[d,t,v] v resident on d at the start of stage t (t = T: at the end);
  per link l = a->b: C[l,t,v] copy v over l in stage t (swap-out, prefetch,
  cross-device transfer; the copy is usable on b from stage t+1).
- Continuous tau[t] (stage time), W[d,t] (largest workspace in the stage).
- Constraints: R[d,t,v] <= S[d,t,u] + R[d,t,u] for each input u (a device runs
  its stage's computations in order); S[d,t+1,v] <= S[d,t,v] + R[d,t,v] +
  sum_l->d C[l,t,v]; C[a->b,t,v] <= S[a,t,v]; S + R + sum C-in <= 1 per
  (d,t,v) (the simulator refuses a second instance on one device); window
  sum >= 1 (== 1 for params, inputs and everything when recompute is off);
  required results: sum_d S[d,T,v] >= 1.
- Memory, per device and stage, conservative w.r.t. the simulator: bytes of
  all values resident at the stage start, computed there or copied in, plus
  W[d,t] >= ws[v] R[d,t,v], <= budget. Or, with params {"instage": True}
  (CLI --within-stage), Checkmate's count within the stage: continuous
  U[d,t,k] (bytes after computing k in stage order) and FREE[d,t,i,k] (i
  released after k: its last use in the stage, not kept, not copied out),
  U + ws[k] R[d,t,k] <= budget. Exact for the stage order, so a stage may hold
  several recomputations without gap stages; but 2-3 times the rows, and its
  LP is far slower (GPT-2, 236 nodes: 80-120 s against 0.3-4 s), so the
  whole-stage count is the default.
- Time: tau[t] >= sum_v cost(d,v) R[d,t,v] per device and >= sum_v
  time(l,v) C[l,t,v] per link; minimise sum_t tau[t].
- Emission: per stage the copies, each device's computations, frees of what
  is not kept, then `Sync()`. Every copy reads a value resident at the stage
  start, so each stream finishes its stage within tau[t] after the barrier:
  the simulated makespan equals the sum of stage maxima, i.e. the objective
  of the integer point (never more), and each device's simulated memory never
  exceeds the stage's modelled sum. A solver's point is rounded first, and set
  aside where the rounding holds more than a budget (columns within the
  solver's integrality tolerance of 1 count a little less of their bytes in its
  rows): the best candidate is returned instead.
- Special cases: `--devices 1 --no-swap` on a one-accelerator cluster without
  host computation is Checkmate's problem in this coarser memory model; with
  recompute off and swap on it is a POET-like swap-only problem (whose
  transfer time counts in the objective).

Reductions and what they cost:
- exact (w.r.t. the stage model over the given order): no R before p(v); no S
  before p(v)+1; S[d,t,v] only while some consumer of v may still be computed
  (need_end) or v is required; C only where its destination could hold v and
  before the last useful stage; memory rows dropped on devices whose budget
  exceeds the graph's total bytes; params/inputs have no R outside their
  window; no R on a device whose budget cannot hold the operation's inputs,
  output and workspace at once (so the lower bounds count it at the device it
  must use); copies into the host removed when swap is off.
- restrictions (may cost optimality against schedules outside the model):
  the fixed order itself (the graph's topological order, or the warm start's
  first-computation order); the stage barrier (no overlap across stages);
  memory counted for a whole stage (unless "instage"; when its schedule is
  more than the gap above the bound every schedule obeys, a small model is
  then solved in the within-stage count from it, `_within_stage`);
  the window K; required results are not recomputed after their window
  (they are kept once computed); a copy is usable only from the next stage;
  a multi-output op's other output (`Node.output_of`, which the simulator
  counts from its maker's run) comes right after its maker in the order with
  no gap stage before it (K = 0), or is computed in its maker's stage on its
  device (K > 0, where it shares the maker's window and the maker's workspace
  row leaves it out); after its window, only in a stage that recomputes its
  maker there (`milp_model.late_outputs`: a norm's statistics made in the
  backward pass, with the norm's recomputation).
  So an infeasible model proves nothing (InfeasibleError `restricted`).
- cuts (exact: valid for every integer point, so the optimum is unchanged):
  before branch and bound, rounds of LP and separation of recomputation-chain
  cuts (`cuts.py`: a value present at t' was resident at t or regained since,
  and so were the inputs its recomputation reads), for at most _CUT_SHARE of
  a run's time; HiGHS only (the PuLP backend and --write-model get the model
  without them). Off by default: params {"cuts": k} (CLI --cuts K) follows
  inputs k deep. On the Checkmate benchmark (60 s, --cuts 2 against none):
  the 69-node MLP at 70% proven in 7 s (4.4% gap after 60 s without, in the whole-stage model alone);
  time to 1% 35 -> 13 s on transformer at 70%, 40 -> 15 s on bert at 60%;
  at 50%, gpt2 3.7% -> 2.9% and gpt2-3 4.0% -> 2.7% with faster schedules;
  but the rounds' time is lost to the branch and bound elsewhere: easy
  budgets take 2-10 s longer, bert at 50% 1.3% -> 2.9%, transformer at 50%
  2.2% -> 3.3%, gpt2-3 at 40% 6.7% -> 16.5% (its root unfinished)
  (experiments/results/milp_checkmate_cuts.csv beside milp_checkmate.csv).
- `options.params`: {"window": K} overrides K; {"host_compute": False} keeps
  the host to swap space only (left out of the model when swapping is off too:
  Checkmate's problem, CLI --no-host-compute); {"coarsen": True} solves the graph with its
  cheap chains folded (`coarsen.py`) and expands the result: a smaller model,
  a restriction (only `bounds.lower_bounds` is reported as the bound);
  {"highs": {name: value}} sets HiGHS options (over `_HIGHS_DEFAULTS`);
  {"polish": False} returns the solver's schedule unpolished (see Polish);
  {"drop_unread": False} keeps the copies nothing reads where they land
  (`polish.drop_unread_copies`, which otherwise removes them).
- Bounds: the reported bound is the larger of the solver's dual bound and
  `bounds.lower_bounds` (longest dependency chain, total work over the
  devices, and on one device without copies the work plus the recomputation
  that the budget forces, at one moment or a chain of them (grown from the
  moments where the fastest candidate had least memory to spare, its recomputations
  there among them: `bounds.tight_moments`), with the moments
  where the fastest candidate had no room to keep a value it computes a third
  time, or taken in every order where the warm start is just short of proven:
  `_bounds`), which holds for
  every schedule; it stands in when
  the solver has none (its root LP unfinished), beats the LP relaxation at
  tight budgets, and a schedule within the gap of it is proven: HiGHS stops
  there, or does not start when the warm start already is. Where the
  recompute bound's relaxation has no point, no schedule fits at all: the
  MILP (HiGHS or PuLP) says so, proven, before solving, with the budget below
  which nothing fits (`bounds.least_budget`) as the memory lower bound.

Warm start: every candidate (the baselines, the heuristic, DTR on one
accelerator, m-ETF on several accelerators, the rounding of this model's LP
relaxation and of the lower
bound's plans (`rounding.py`, given at most 35% of the time limit, three
quarters when nothing else fits), keep-everything on the host where nothing fits the accelerators and the
host can run every operation; or only `options.warm_start` when given, which also
joins the candidates to fall back on where it fits) is staged over its own
first-computation order (`milp_model.decisions_from_schedule`: copies, several
devices, recomputations; the window K widens up to 8 when cross-device copies
delay first computations), checked against the model's whole-stage memory
count, and the one with the smallest staged objective fixes the model's order
and becomes HiGHS's incumbent. Staging pulls a candidate's recomputations into
the stage of the node that needs them; where that overflows the whole-stage
count, each gets a gap stage of its own before that node (only there: stages
add columns). Candidates that do not fit are named, with the
reason, in the report's message (`params={"warm": False}` starts cold). The
staged objective can exceed the candidate's simulated time (stage barriers end
a copy's overlap with the next stage), so the fallback stays: if the solver
finishes worse than the best candidate's simulated step time, that candidate is
returned and `report.extra["fallback"]` says so; the MILP never returns a
slower schedule than the heuristic's. The candidates stop at the first that
proves no schedule fits (`nofit.not_found`: the others would prove it again).

Polish: where the solver's schedule recomputes and is more than the gap above
`bounds.lower_bounds`, `polish.keep_instead_of_recompute` keeps values instead,
deferring past the peak what the model's order computed too early; a faster
result is returned as a schedule outside the model (`_polished`: the report's
bound is then the lower bounds, `extra["milp_objective"]` the model's value);
so is the fallback candidate where the model gives no schedule (GPT-2 at 30%,
before the model let a norm's statistics come with its recomputation: DTR's,
4.96x -> 1.81x keep-everything's step time), with half of the seconds the
model leaves, the bounds taking the other half, aimed at it (`_fallback`).
Where several devices compute, `polish.offload` then moves computations
between them: a stage lasts as long as its slowest device, so the model
cannot let one device work through several of another's stages (the tiny
example at 1.1 MB: the host takes a weight gradient off the GPU's critical
path, 85 us -> 77 us, the longest chain). The solver stops
`_POLISH_SHARE` of the time limit early (at most `_POLISH_MAX`) to leave it the
time.

Time and interrupts: `time_limit` bounds the whole call; HiGHS gets what is
left after the candidates and the model are built, runs in a worker thread and
is stopped by Ctrl-C through its interrupt callbacks (status `interrupted`,
best schedule so far), or given up _STOP_GRACE s after it where they are not
called (a MIP's root LP). A Ctrl-C anywhere else after the candidates returns the
fastest of them. Models too large to solve in the time left are not
handed to HiGHS's branch and bound (see _NNZ_PER_S); up to _SEARCH_NNZ
nonzeros, `lns.improve` searches around the warm start for that time. When the
warm start needs gap stages, the model without them runs too: side by side on
two cores or more (HiGHS's branch and bound uses one), one after the other on
one (`_run_pair`); when the model without gap stages is done early, a
large-neighbourhood search (`lns.py`) takes its core. A model solved alone on
two cores or more has that search beside its branch and bound, which then gets
the other threads, from its third second (_SEARCH_AFTER) until it ends; the
faster point is the run's, under its dual bound (both are points of the model). The joint problem
(2 GPUs + host, swapping, 120 s), one run each on the same day: the transformer
at 90% of its keep-everything memory 0.673 -> 0.652 ms, at 50% 0.787 ->
0.776 ms; GPT-2 at 50% 1.280 -> 1.274 ms; GNMT and BERT-L3 unchanged; GPT-2 at
90%, where the search improved nothing, 1.129 -> 1.138 ms and in a second pair
1.139 -> 1.127 ms (the final polish's share of the time varies). GNMT at 25%
on one GPU and the host (CLI defaults, 60 s): 803.7 -> 800.2 ms, where the
branch and bound kept the heuristic's schedule.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import math
import os
import threading
import time
from dataclasses import replace

import numpy as np

from ..cluster import Cluster
from ..errors import InfeasibleError, OptschedError
from ..graph import Graph, memory_lower_bound
from ..schedule import Copy, Schedule, SolveReport
from ..simulate import describe, simulate
from ..units import format_size
from .apart import Apart, ChildLost
from .bounds import (
    _SECONDS,
    blocking_moments,
    least_budget,
    lower_bounds,
    moment_name,
    no_fit,
    order_moments,
    tight_moments,
)
from .cuts import root_cuts
from .lns import improve
from .milp_model import (
    TIME_SCALE,
    MilpArrays,
    ModelSpec,
    build_model,
    decisions_from_schedule,
    decisions_from_x,
    emit,
    late_outputs,
    order_of,
    recompute_gaps,
    spec_for,
    stage_memory,
    violated_rows,
    x_from_decisions,
)
from .nofit import no_room, smaller_found, smallest_peak, unplaceable
from .options import SolveOptions
from .polish import drop_unread_copies, keep_instead_of_recompute, offload, remade_outputs


class MilpBug(RuntimeError):
    """The MILP produced a schedule the simulator rejects: a bug, never returned."""


# ----------------------------------------------------------------------------- shared driver

def _candidates(graph, cluster, options, beside=None, stop: threading.Event | None = None, found=None):
    """Valid schedules to warm-start from and fall back on: the baselines, then
    the heuristic (and m-ETF where there are several accelerators), which often
    beat the baselines by using the host and other devices, DTR on one accelerator
    (GPT-2 at 30% of its keep-everything memory: with the heuristic's plan in the
    graph's order, the only ones that fit), and the
    rounding of the model's LP relaxation (`rounding.py`), which beats them all at
    tight budgets. Where DTR's, or the heuristic's in the graph's order, is the
    fastest before the rounding, it is polished too (`polish.keep_instead_of_recompute`,
    for up to _ON_DEMAND_POLISH_SHARE of the time limit): both recompute on demand,
    far more than they must (GPT-2 at 31%: the MILP ends at 1.64x keep-everything's
    step time from DTR's, 2.08x from DTR's own 4.03x; at 30% the bounds, aimed at it,
    rise from 1.62x to 1.68x; there the heuristic's in the graph's order, 4.38x against
    DTR's 4.96x, polishes to 1.7916x in 10 s, DTR's to 1.8051x in 15 s). Not the
    heuristic's in ParDNN's order: where it led (the 3-layer GPT-2 at 25%), its polish
    took 21 s that the rounding needed, and the MILP ended at 1.7047x instead of 1.5478x.
    `beside(candidates so far)`: work for the core the LP leaves idle (`_roundings`). `stop`: a Ctrl-C sets it
    and ends the candidates there (without it, the KeyboardInterrupt goes on up); so does `stop` set by
    `found(step time)`, called with each candidate that fits as it comes (the progress lines)."""
    out: list = []
    try:
        _make_candidates(graph, cluster, options, beside, out, found, stop)
    except KeyboardInterrupt:       # Ctrl-C: the candidates so far, and the solve stops with the fastest
        if stop is None:
            raise
        stop.set()
    return out


def _make_candidates(graph, cluster, options, beside, out: list, found=None, stop=None) -> None:
    """`_candidates`' work, each candidate appended to `out` as it comes."""
    from . import baselines as B
    from . import heuristics as H

    def add(name, s, r) -> bool:        # whether to go on
        out.append((name, s, r))
        if found is not None and r.valid:
            found(r.makespan)
        return stop is None or not stop.is_set()

    fns = [getattr(B, nm) for nm in ("keep_everything", "chen_sqrt", "chen_greedy", "articulation") if hasattr(B, nm)]
    fns += [H.heuristic, H.dtr]
    if sum(d.kind == "cuda" for d in cluster.devices) > 1 and options.devices != 1:
        fns.append(H.metf)
    for fn in fns:
        try:
            s = _candidate(graph, cluster, options, fn, proofs=True)
        except InfeasibleError:     # proven that nothing fits: the others would prove it again (seconds each)
            return
        if s is not None and not add(fn.__name__.replace("_", "-"), s, simulate(graph, cluster, s)):
            return
    fastest = min((c for c in out if c[2].valid), key=lambda c: c[2].makespan, default=None)
    on_demand = fastest is not None and (fastest[0] == "dtr" or fastest[1].report.extra.get("order") == "graph")
    if on_demand and fastest[2].recomputed and options.params.get("polish", True):
        s, r = keep_instead_of_recompute(graph, cluster, fastest[1], deadline=time.perf_counter()
                                         + _ON_DEMAND_POLISH_SHARE * options.time_limit)
        if r.valid and r.makespan < fastest[2].makespan and not add(f"{fastest[0]}, polished",
                                                                    replace(s, graph=graph.name), r):
            return
    # the LP rounding costs an LP solve: only where it may start the MILP and the others leave room to gain
    if options.recompute and options.warm_start is None and options.params.get("warm", True):
        best = min((r.makespan for _, _, r in out if r.valid), default=np.inf)
        once = _one_device_time(graph, cluster, options)
        if best > (1 + _ROOM) * once:
            share = _ROUNDING_SHARE if best <= _POOR * once else _ALONE_SHARE
            out += _roundings(graph, cluster, options, share, out, beside, stop)
    host = _host(cluster, options)
    if host is not None and not any(r.valid for _, _, r in out):
        # nothing fits the accelerators: every operation on the host, where it can run them all, is a schedule
        # all the same (gnmt at 60% without swapping: an operation of 960 MB over the accelerator's 584 MB; the
        # MILP started cold and found none in 8 s)
        s = _candidate(graph, cluster, replace(options, device=host), B.keep_everything)
        if s is not None:
            out.append(("keep-everything on the host", s, simulate(graph, cluster, s)))


def _roundings(graph, cluster, options, share, base, beside=None, stop: threading.Event | None = None) -> list:
    """lp-rounding's schedules as candidates. With `beside` and a core to spare, its LP's roundings run in a child
    process (`apart.Apart`: both are Python work, which two threads would run on one core) while this one rounds
    the lower bound's plans (`params["lp"]` False), then calls `beside(base and those)`: the LP keeps one core for
    seconds on large graphs (the 3-layer GPT-2 at 30% of its keep-everything memory: 4 s,
    `rounding._Relaxation`), time the MILP's bounds use instead. They run in a thread where `options.threads` is 1
    (a sweep's solves, one per core) or the graph has fewer than _APART_FROM operations. A Ctrl-C (`stop` set) ends
    the child at once (a thread, after the LP solve under way): the plans' roundings stand."""
    from . import rounding

    def named(name, s):
        return [] if s is None else [(name, s, simulate(graph, cluster, s))]

    stageable = {"remake": False}      # its polish keeps an op's other outputs where the stage model counts them
    if beside is None or (os.cpu_count() or 1) < 2:
        return named("lp-rounding", _candidate(graph, cluster, options, rounding.lp_rounding, share, stageable))
    own = stop is None      # no caller to tell of a Ctrl-C through `stop`: it goes on up
    stop = stop or threading.Event()
    lp = {**stageable, "seeds": 0}
    # one core each: its LP on one thread, beside the plans' integer programmes here
    child = Apart(_candidate, graph, cluster, replace(options, progress=None, warm_start=None, params={}, threads=1),
                  rounding.lp_rounding, share, lp,
                  here=lambda: _candidate(graph, cluster, options, rounding.lp_rounding, share, {**lp, "stop": stop}),
                  child=(options.threads is None or options.threads > 1) and len(graph.nodes) >= _APART_FROM)
    ended = False
    try:
        plans = named("lp-rounding of the bound's plans",
                      _candidate(graph, cluster, options, rounding.lp_rounding, share, {**stageable, "lp": False}))
        beside(base + plans)
        ended = _join(child.thread, stop, after_stop=0.0 if child.in_child else _STOP_GRACE)
    except KeyboardInterrupt:
        stop.set()
        raise
    finally:
        if not ended:
            child.stop()
    if not ended:     # a Ctrl-C: the plans' schedules stand (a thread that overran it ends on its own)
        if not child.in_child:
            _abandon(child.thread)
        if own:
            raise KeyboardInterrupt
        return plans
    try:
        rounded = child.result()
    except ChildLost:       # the child died (its stderr says why): the plans' roundings stand
        rounded = None
    return named("lp-rounding", rounded) + plans


def _host(cluster, options) -> str | None:
    """The host device, where the model lets it compute; else None. (Where it cannot run some operation,
    keep-everything refuses it, `sequential.pick_device`, and there is no candidate.)"""
    if options.device is not None or not options.params.get("host_compute", True):
        return None
    return next((d.name for d in cluster.devices if d.kind == "cpu"), None)


_CANDIDATE_SHARE = 0.25   # of the time limit, at most, for one candidate
_ON_DEMAND_POLISH_SHARE = 0.35  # for polishing DTR's schedule, or the heuristic's in the graph's order, where it
                                # leads: DTR's of GPT-2 at 30% of its keep-everything memory converges in 14.6 s
                                # (1.8051x keep-everything's step time); stopped at 15 s of 60 when it took 24 s,
                                # 1.8936x, from which the stage model's search reached 1.8652x
_ROUNDING_SHARE = 0.35    # for lp-rounding, whose keep-sets seeded by the lower bound need a few seconds after its LP
                          # (gpt2, 3 layers, at 40-50%: 7-9 s), and at tight budgets B&B rarely betters them
_ALONE_SHARE = 0.75       # for lp-rounding when no other candidate fits: a cold MILP whose LP is that slow rarely
                          # finds a schedule in the rest (gpt2-3 at 30%: 4.2x cold, 1.31x rounded), and its LP alone
                          # takes 18-35 s on 2 cores, so half of 60 s lost the rounding in 1 of 4 solves; at 25-40%
                          # the MILP never bettered the rounding in the time left (milp_checkmate.csv)
_POOR = 3.0               # a candidate this many times keep-everything's one-device time counts as none for the share:
                          # the heuristic's 4.39x on gpt2-3 at 30% left lp-rounding 35% of 60 s, too little for its
                          # rounding (1.51x, gap 14.4%, against 1.31x and 1.02% with three quarters)
_APART_FROM = 150         # operations, for lp-rounding's LP roundings in a child process (`_roundings`): below, they
                          # take about as long as the child's start (0.35 s of imports): the 37-operation MLP's
                          # benchmark rows 0.2 s slower with a child, the 140-operation CNN's the same either way
_ROOM = 0.01              # skip lp-rounding when a candidate is within 1% of keep-everything's one-device time


def _candidate(graph, cluster, options, fn, share=_CANDIDATE_SHARE, params=None, proofs: bool = False):
    """`fn`'s schedule (with `params`, none of the MILP's); where it finds none that fits, the one with the smallest
    peak it reached (over the budget: `_infeasible` reports it as the smallest budget at which a schedule was
    found), if any. `proofs`: raise its InfeasibleError where it proves, with the budget below which nothing fits
    (`nofit.not_found`), that no schedule fits."""
    try:
        return fn(graph, cluster, replace(options, warm_start=None, progress=None, params=params or {},
                                          time_limit=options.time_limit * share))
    except InfeasibleError as e:
        if proofs and e.proven and e.least is not None:
            raise
        return e.closest
    except OptschedError:
        return None


def _one_device_time(graph, cluster, options) -> float:
    """Seconds of every operation once on the single-device solvers' device (no recomputation)."""
    from .sequential import pick_device

    try:
        dev = pick_device(graph, cluster, options.device)
    except OptschedError:
        return np.inf
    return float(np.nansum(graph.arrays.cost.get(dev.kind, np.zeros(1)))) / dev.speed


_MAX_WINDOW = 8   # widest window a warm start may ask for (columns grow with it)


def _stage(graph, spec_of, name, sched, window):
    """(objective, spec, decisions, note): the schedule staged in the model over its own
    order, widening the window K (up to _MAX_WINDOW, unless the user fixed it) when its
    cross-device copies delay first computations beyond it. Recomputations are pulled
    into the stage of the node that needs them; where that stage would overflow the
    budget in the model's whole-stage count, they get gap stages of their own (memory
    counted one computation at a time there, as the simulator counts it). Gaps are
    opened only where needed: every stage adds columns. An op's other output is staged
    with the op's last run before its readers (`polish.remade_outputs`), where the simulator
    counts it from: a recomputation, where the model lets it come late
    (`milp_model.late_outputs`), else the op's first run."""
    spec = spec_of(None, window)
    early = ~late_outputs(spec.output_of, spec.once, spec.required)
    canonical = remade_outputs(graph, list(sched.instructions), first=early)
    if canonical is not None:
        sched = Schedule(tuple(canonical), sched.report, sched.graph)
    order = order_of(graph, sched)
    if order is None:
        return None, None, None, f"{name}: not every node is computed in topological order"
    wanted = recompute_gaps(graph, sched, order)
    gaps = np.zeros_like(wanted)
    while True:
        spec, dec, why, over = _stage_over(graph, spec_of, sched, order, window, gaps if gaps.any() else None)
        if dec is not None:
            return dec.objective(spec), spec, dec, ""
        rank = np.searchsorted(spec.pos[order], over, side="left") if over is not None else np.array([], int)
        rank = rank[rank < len(order)]
        opened = rank[(gaps[rank] == 0) & (wanted[rank] > 0)]
        if opened.size:
            gaps[opened] = wanted[opened]
        elif (gaps != wanted).any():    # the overflow is where the gaps are open: every recomputation its own stage
            gaps = wanted.copy()
        else:
            return None, spec, None, f"{name}: {why}"


def _stage_over(graph, spec_of, sched, order, window, gaps):
    """(spec, decisions, "", None), or (spec, None, why, stages over the budget or None)."""
    spec = spec_of(order, window, gaps)
    dec, why, need = decisions_from_schedule(graph, spec, sched)
    if dec is None and window is None and spec.K < need <= _MAX_WINDOW:
        spec = spec_of(order, need, gaps)
        dec, why, need = decisions_from_schedule(graph, spec, sched)
    if dec is None:
        return spec, None, why, None
    mem = stage_memory(spec, dec)
    over = (mem > spec.budget[:, None]) & spec.mem_row[:, None]
    if over.any():
        d = int(np.flatnonzero(over.any(axis=1))[0])
        t = int(np.argmax(mem[d] - spec.budget[d]))
        count = "within-stage" if spec.instage else "whole-stage"
        return spec, None, (f"stage {t} would hold {format_size(mem[d, t])} on {spec.dev_names[d]} "
                            f"(budget {format_size(spec.budget[d])}) in the model's {count} memory count"), \
            np.flatnonzero(over.any(axis=0))
    return spec, dec, "", None


def _unplaceable(graph: Graph, spec: ModelSpec) -> str:
    """`nofit.unplaceable` over the model's devices (the solve options may leave some out)."""
    return unplaceable(graph, spec.dev_names, spec.runs, spec.budget)


_IN_CANDIDATES = "while the candidates were made"


class _Stopped(Exception):
    """Ctrl-C while the candidates were made (`when`), or the models built: `base`, the candidates so far."""

    def __init__(self, base: list, when: str = _IN_CANDIDATES):
        super().__init__("interrupted")
        self.base = base
        self.when = when


def _interrupted(graph: Graph, solver_name: str, base: list, t_start: float, when: str = _IN_CANDIDATES) -> Schedule:
    """The fastest candidate made before a Ctrl-C, marked `interrupted`; KeyboardInterrupt where none fits."""
    valid = [b for b in base if b[2].valid]
    if not valid:
        raise KeyboardInterrupt
    name, sched, res = min(valid, key=lambda b: b[2].makespan)
    return Schedule(sched.instructions, SolveReport(
        solver_name, "interrupted", objective=res.makespan, solve_time=time.perf_counter() - t_start,
        message=f"interrupted {when}: returning {name}",
        extra={"fallback": name, "makespan": res.makespan, "peak": res.peak}), graph=graph.name)


def prepare(graph: Graph, cluster: Cluster, options: SolveOptions, beside=None, stop: threading.Event | None = None,
            found=None):
    """Spec, model, warm start (x or None), its message, the candidate schedules, build time,
    notes on candidates that could not start the MILP, and `alt`: when the chosen model has gap
    stages, (model, x0, message) of the model without them (over the best candidate that fits it,
    or the graph's order, cold), else None. `beside`, `found`: see `_candidates`. `stop` set during the
    candidates (a Ctrl-C, or the progress callback's KeyboardInterrupt), or a Ctrl-C while the models are built:
    `_Stopped` with them.

    Every candidate is staged over its own first-computation order; the one with the
    smallest staged objective fixes the model's order and becomes the incumbent."""
    t0 = time.perf_counter()
    base = _candidates(graph, cluster, options, beside, stop, found) + _given(graph, cluster, options)
    if stop is not None and stop.is_set():
        raise _Stopped(base)
    try:
        return _models(graph, cluster, options, base, t0)
    except KeyboardInterrupt:       # Ctrl-C while the models were built: the candidates stand
        if stop is None or stop.is_set():
            raise
        stop.set()
        raise _Stopped(base, "while the models were built") from None


def _models(graph: Graph, cluster: Cluster, options: SolveOptions, base: list, t0: float):
    """`prepare`'s result from the candidates `base` (`t0`: when `prepare` started)."""
    p = dict(options.params)
    specs = {}

    def spec_of(order, window, gaps=None):
        key = (None if order is None else order.tobytes(), window, None if gaps is None else gaps.tobytes())
        if key not in specs:
            specs[key] = spec_for(graph, cluster, options, order=order, window=window, gaps=gaps)
        return specs[key]

    too_big = _unplaceable(graph, spec_of(None, p.get("window")))
    if too_big:
        _infeasible(graph, cluster, options, base, too_big)

    if options.warm_start is not None:
        tries = [("user", options.warm_start)]
    elif p.get("warm", True):
        tries = [(nm, s) for nm, s, r in sorted(base, key=lambda b: b[2].makespan) if r.valid]
    else:
        tries = []
    best, plain, notes = None, None, []
    for name, sched in tries:
        obj, spec, dec, why = _stage(graph, spec_of, name, sched, p.get("window"))
        if dec is None:
            notes.append(why)
            continue
        if best is None or obj < best[0]:
            best = (obj, name, spec, dec)
        if not _gap_stages(spec) and (plain is None or obj < plain[0]):
            plain = (obj, name, spec, dec)
    spec = best[2] if best is not None else spec_of(None, p.get("window"))
    if spec.notes["unrunnable"]:
        raise OptschedError(f"node {spec.notes['unrunnable'][0]!r} cannot run on any device in use",
                            hint="add a device of a kind it has a cost for")
    model, x0, warm_msg = _warm_model(spec, best, base, notes, "none" if not tries else "none usable")
    alt = None
    if _gap_stages(spec):
        alt_spec = plain[2] if plain is not None else spec_of(None, p.get("window"))
        alt = _warm_model(alt_spec, plain, base, [], "none (no candidate fits without gap stages)")
    build_time = time.perf_counter() - t0
    return spec, model, x0, warm_msg, base, build_time, notes, alt


def _given(graph: Graph, cluster: Cluster, options: SolveOptions) -> list:
    """The warm start as a candidate too, where it fits: the model may not stage it (a window too wide, its order
    overflowing the whole-stage count), and the result is then still no slower than it."""
    if options.warm_start is None:
        return []
    given = simulate(graph, cluster, options.warm_start)
    return [("the warm start", options.warm_start, given)] if given.valid else []


def _gap_stages(spec: ModelSpec) -> int:
    return spec.T - spec.K - spec.n


def _warm_model(spec, best, base, notes, none_msg):
    """The model of `spec` and the staged candidate `best` = (objective, name, spec, decisions) as its column
    values, if they satisfy every row (else a note says why)."""
    model = build_model(spec)
    x0, warm_msg = None, none_msg
    if best is not None:
        obj, name, _, dec = best
        x0 = x_from_decisions(model, dec)
        sim = {nm: r.makespan for nm, _, r in base}
        shown = f" (simulated {sim[name]:.6g} s)" if name in sim else ""
        if x0 is None:
            notes.append(f"{name}: uses a pruned variable")
        else:
            bad = violated_rows(model, x0, tol=1e-7)
            if bad:
                notes.append(f"{name}: breaks " + ", ".join(bad))
                x0 = None
            else:
                warm_msg = f"{name}: accepted, objective {obj:.6g} s{shown}"
    return model, x0, warm_msg


def _infeasible(graph, cluster, options, base, why, proven=True, restricted=False, spec=None, until=None,
                search: bool = True):
    """InfeasibleError with the memory lower bound (on one device without copies, `spec`'s, the budget below
    which the recomputation relaxations have no point: `bounds.least_budget`) and the smallest budget at which a
    schedule was found (and that schedule, `closest`): the smallest peak any candidate reached, then lowered
    towards the bound by DTR, the heuristic and lp-rounding at smaller budgets, for at most _FOUND_SHARE of the
    time limit or _FOUND_MAX (and not past `until`: `nofit.smaller_found`; not at all with `search` False).
    `proven` False: no schedule was found in the time given, or (`restricted`) the MILP's stage model has none;
    neither proves that there is none.
    Then, until `until` (perf_counter) and for at most _NO_FIT seconds, the latest of the moments where the
    largest weight gradients' inputs are computed for the last time, the final computations of those gradients,
    or the moments where the candidate that came closest overflowed, may prove it all the same (`bounds.no_fit`):
    the error is then proven, and its memory lower bound is raised towards the smallest peak found while the same
    moments prove that nothing fits. Proven on a budget every accelerator shares, the bound is above it."""
    lb = max(memory_lower_bound(graph), (least_budget(spec) or 0) if spec is not None else 0)
    peaks = [smallest_peak(cluster, [b[2].peak]) for b in base]
    smallest = min(peaks, default=None)
    closest = base[peaks.index(smallest)][1] if base else None
    if not proven and spec is not None and until is not None and base:
        proof = no_fit(spec, graph.arrays.ids, closest.instructions, min(until - time.perf_counter(), _NO_FIT),
                       upto=smallest)
        if proof is not None:
            why, proven, restricted = no_room(graph, proof[0], between=True, latest=proof[2]), True, False
            lb = max(lb, proof[1])
    sizes = {d.memory for d in (cluster.accelerators or cluster.devices)}
    now = max(sizes)
    if proven and len(sizes) == 1:
        lb = max(lb, now + 1)       # nothing fits this budget, on every accelerator
    seconds = min(_FOUND_SHARE * options.time_limit, _FOUND_MAX)
    if until is not None:
        seconds = min(seconds, until - time.perf_counter())
    if search and smallest is not None and seconds > 0:
        least, smallest, found = smaller_found(graph, cluster, options, max(lb, now), smallest, seconds)
        lb, closest = max(lb, least), found or closest
    budgets = ", ".join(f"{d.name} {format_size(d.memory)}" for d in cluster.devices if d.kind == "cuda")
    msg = f"budget {budgets}; {why}. Memory lower bound: {format_size(lb)} ({lb} bytes)"
    if smallest is not None:
        msg += f"; smallest budget at which a schedule was found: {format_size(smallest)} ({smallest} bytes)"
    hint = "raise the budget, add devices, or allow swapping and recomputation"
    if restricted:
        hint = f"try lp-rounding or dtr, whose schedules need not fit the MILP's stages, or {hint}"
    elif not proven:
        hint = f"give the solver more time (--time-limit, now {options.time_limit:g} s), or {hint}"
    raise InfeasibleError(msg, hint=hint, proven=proven, restricted=restricted, least=lb or None, found=smallest,
                          closest=closest)


_FOUND_SHARE = 0.2  # of the time limit, at most, for `nofit.smaller_found` (12 s of 60: the transformer at 40% of
_FOUND_MAX = 30.0   # its keep-everything memory, 71.4% -> 44.5%, where it took all of them), and seconds at most
_NO_FIT = 10.0  # seconds at most for `bounds.no_fit` where no schedule was found: GNMT at 99% is proven in 0.6 s, the
                # CNN at 65% in 0.02 s, the MLP at 75% in 0.4 s, the 8-layer MLP at 60% in 0.1 s


def _bounds(graph, cluster, options, base, spec, target=None, left: float = 0.0, orders: bool = False,
            stop: threading.Event | None = None, seconds: float = _SECONDS, grow: bool = False,
            start: tuple | None = None, search: bool = True, until: float | None = None, live: bool = False) -> dict:
    """`bounds.lower_bounds(spec, target=target)`; InfeasibleError, proven, where they show that no schedule fits
    (a relaxation of every schedule has no point; `search` False, for a caller that discards it: without
    `_infeasible`'s search for a budget that fits). Where the bound falls just short of `target` and `orders` (the
    caller's, for models of _ORDER_FROM_NNZ nonzeros or more), the orders of the moments where the fastest
    candidate computes a value a third time (`bounds.order_moments`) may take up to _ORDER_SHARE of the `left`
    seconds (GPT-2 at 35% of its keep-everything memory: the bound 1.2973x -> 1.2980x of keep-everything's step
    time in about 15 s, which proves the rounding's 1.3112x within 1%, where the stage model's branch and bound
    had not finished its root in 40 s); where it falls short otherwise, the orders over those of them where the
    candidate had no room to keep the value (`bounds.blocking_moments`) a few seconds. Before either, the chain of
    moments grows from those where the candidate had least memory to spare (`bounds.tight_moments`), for up to 5 s,
    and its last programme gets up to 5 s more; with `grow` and `orders`, both may take up to _ORDER_SHARE of the
    `left` seconds between them, half each: on models that large, branch and bound from the root rarely betters a
    bound that falls that short (the 3-layer GPT-2 at 25% of its keep-everything memory: its root unfinished after
    600 s), and a longer growth reaches the second tier of tight moments (`bounds._TIERS`) and solves the chains it
    ends with (there, with the last layer's GELU backward as a moment, 1.4120x -> 1.4454x of keep-everything's
    time in the 60 s solve). Where the grown chain falls short, the orders over pairs of moments that cut off its
    optimal point take up to 20 s more, where one pair's cut reaches the target (`bounds._pair_orders`: the
    transformer at 45% of its keep-everything memory, proven within 1% in 18 s instead of 2.4% in 60 s); with
    `grow` and `orders` and a minute or more left after the growth, every pair that cuts the point takes all of
    it (GPT-2 at 30% with a time limit of 180 s: the gap 6.07% -> 3.78%, with the chain grown from `start`: an
    earlier call's "grown", `bounds.lower_bounds`). None of it runs past `until` (perf_counter), where given.
    `live` (the HiGHS solve's callers, whose progress `_merged` takes floors): the bound goes to the progress as it
    rises. A Ctrl-C during them sets `stop` and ends them with the bound so far."""
    fits = [(r.makespan, name, sched) for name, sched, r in base if r.valid]
    fastest = min(fits, key=lambda v: v[0])[2].instructions if fits else ()
    ids = graph.arrays.ids
    b = lower_bounds(spec, seconds, target, order_seconds=_ORDER_SHARE * left if orders else 0.0, stop=stop,
                     moments=lambda: order_moments(spec, ids, fastest),
                     blocking=lambda: blocking_moments(spec, ids, fastest), blocking_seconds=_ORDER_SHARE * left,
                     tight=lambda: tight_moments(spec, ids, fastest, recomputations=True),
                     grow_seconds=_ORDER_SHARE * left if grow and orders else None, start=start, until=until,
                     tell=(lambda floor: _tell(options, stop, floor=floor)) if live else None)
    if np.isfinite(b["floor"]):
        return b
    if fits:
        raise MilpBug(f"the lower bound says no schedule fits, yet {fits[0][1]}'s schedule does")
    _infeasible(graph, cluster, options, base, no_room(graph, b["at"]), spec=spec, search=search)


def finish(graph, cluster, options, solver_name, spec, model, x, status, bound, solve_time, build_time, base,
           warm_msg, extra=None, notes=(), solve_notes=(), bounds=None, deadline=None):
    """Solution -> schedule, checked by the simulator, and polished (`_polished`, until `deadline`); or the best
    candidate (baseline or heuristic) when it simulates faster; or InfeasibleError. `notes` (candidates that could
    not start the MILP, and why) and `solve_notes` go into the report's message. `bounds`:
    `lower_bounds(spec)`, when the caller has it already."""
    valid_base = [b for b in base if b[2].valid]
    best_base = min(valid_base, key=lambda b: b[2].makespan) if valid_base else None
    extra = dict(extra or {})
    floor = _floor(graph, spec, extra, bounds)
    bound = floor if bound is None else max(bound, floor)
    extra.update(build_time=build_time, warm_start=warm_msg, stages=spec.T, window=spec.K,
                 columns=model.ncol, rows=model.nrow, nonzeros=int(model.index.size))
    why = "; ".join(notes)
    why = f"not a warm start: {why}" if why else ""
    if notes:
        extra["warm_start_rejected"] = list(notes)

    found = f"the MILP found none ({status})"
    dec = None if x is None else decisions_from_x(model, x)
    if dec is not None:
        # the solver's tolerances: a column within 1e-6 of 1 counts 1e-6 less of its bytes in a memory row than the
        # point rounded to integers holds (the 16-layer chain at 8 MB, DTR's schedule its warm start: 4 B over)
        mem = stage_memory(spec, dec)
        over = float(np.where(spec.mem_row[:, None], mem - spec.budget[:, None], 0.0).max())
        if over > 0:
            found = (f"the solver's point, rounded, holds {format_size(over)} over a budget (within its "
                     "tolerances): not used")
            solve_notes = (*solve_notes, found)
            dec = None

    def msg(head):
        return "; ".join(m for m in (head, *solve_notes, why) if m)

    if dec is None:
        if status == "infeasible" and best_base is None:
            # the stage model restricts the schedules (module docstring): its infeasibility proves nothing
            _infeasible(graph, cluster, options, base, "the MILP's stage model has no solution", proven=False,
                        restricted=True, spec=spec, until=deadline)
        if best_base is None:
            _infeasible(graph, cluster, options, base, f"{found} and no baseline fits",
                        proven=False, spec=spec, until=deadline)
        name, sched, res = best_base
        polished = _polished(graph, cluster, options, spec, sched, res, floor, status, deadline)
        if polished is not None:
            sched, res = polished
            name = name if name.endswith(", polished") else f"{name}, polished"
            extra["polished"] = True
        extra.update(fallback=name, makespan=res.makespan)
        status, bound = _outside_model(status, bound, res.makespan, extra, floor)
        status = _proven_status(status, res.makespan, floor, options.gap)
        return Schedule(sched.instructions, SolveReport(solver_name, status, objective=res.makespan, bound=bound,
                                                        gap=_gap(res.makespan, bound), solve_time=solve_time,
                                                        message=msg(f"MILP gave no schedule; returning {name}"),
                                                        extra=extra), graph=graph.name)
    obj = dec.objective(spec)
    sched = Schedule(tuple(emit(graph, spec, dec)), graph=graph.name)
    res = simulate(graph, cluster, sched)
    if not res.valid:
        raise MilpBug(f"MILP schedule rejected by the simulator: {describe(res.violation)}")
    if res.makespan > obj * (1 + 1e-9) + 1e-12:
        raise MilpBug(f"simulated makespan {res.makespan} exceeds the MILP objective {obj}")
    if bound is not None:
        bound = min(bound, obj)
    head = ""
    try:
        polished = _polished(graph, cluster, options, spec, sched, res, floor, status, deadline)
    except KeyboardInterrupt:       # Ctrl-C while polishing: the solver's schedule stands
        polished, status = None, "interrupted"
    if polished is not None:
        # outside the stage model now: its bound and optimality say nothing of this schedule
        sched, res = polished
        extra.update(milp_objective=obj, polished=True)
        status, bound = _outside_model(status, bound, res.makespan, extra, floor)
        head = (f"the MILP's schedule ({obj:.6g} s in its stage model) polished outside that model: "
                f"{res.makespan:.6g} s ({100 * (1 - res.makespan / obj):.3g}% faster), {res.recomputed} recomputations")
        obj = res.makespan
    lean, res = drop_unread_copies(graph, cluster, sched, res) if options.params.get("drop_unread", True) \
        else (sched, res)      # no slower: the objective stays an upper bound
    if lean is not sched:
        extra["unread_copies_dropped"] = sum(isinstance(i, Copy) for i in sched.instructions) - \
            sum(isinstance(i, Copy) for i in lean.instructions)
        sched = lean
    extra.update(makespan=res.makespan, peak=res.peak)
    if best_base is not None and best_base[2].makespan < res.makespan * (1 - 1e-12):
        name, bsched, bres = best_base
        extra.update(fallback=name, milp_objective=obj, makespan=bres.makespan)
        status, bound = _outside_model(status, bound, bres.makespan, extra, floor)
        status = _proven_status(status, bres.makespan, floor, options.gap)
        return Schedule(bsched.instructions, SolveReport(
            solver_name, status, objective=bres.makespan, bound=bound, gap=_gap(bres.makespan, bound),
            solve_time=solve_time,
            message=msg(f"the MILP's best point ({obj:.6g} s in its stage model) is slower than {name}; "
                        f"returning {name}"),
            extra=extra), graph=graph.name)
    status = _proven_status(status, obj, floor if polished is not None else bound, options.gap)
    return Schedule(sched.instructions, SolveReport(solver_name, status, objective=obj, bound=bound,
                                                    gap=_gap(obj, bound), solve_time=solve_time, message=msg(head),
                                                    extra=extra), graph=graph.name)


_ORDER_SHARE = 0.95     # of the time left when the bounds start (beside lp-rounding's LP, or after the candidates),
                        # at most, for the orders of moments (`_bounds`); 0.6 left the 3-layer GPT-2 at 30% of its
                        # keep-everything memory 4-7 s short of the proof, and on models this large HiGHS found
                        # nothing in the rest (16 s side by side); with 0.8 its orders proved it in 26-31 s of their
                        # 31-32 s in two runs and used up 29-31 s without it in two others; with 0.9 BERT at 40%
                        # had its orders take 42-43 s of 43 s and was proven in two runs of three, with 0.95 in
                        # three of three (orders of 45 s)
_ORDER_FROM_NNZ = 200_000   # on stage models this large, whose root LP alone takes HiGHS tens of seconds (GPT-2
# at 35%: 352k nonzeros, no node in 40 s). Below, HiGHS closes such gaps itself, and the orders would only take its
# time (a random 40-layer graph at 50% of its keep-everything memory, 92k nonzeros: 6 s of 15 found nothing, and
# left HiGHS under a second).
_BESIDE = 2.0           # times the usual seconds for the single-moment bound, beside lp-rounding's LP thread: its
                        # repairs in the simulator hold the GIL that the bound's ranking of moments needs (BERT at 40%
                        # of its keep-everything memory: 1.4225x keep-everything's time instead of 1.4868x in two of
                        # three runs with the usual 2 s)
_POLISH_SHARE = 0.05    # of the time limit, kept from the solver for `_polished`
_POLISH_MAX = 10.0      # seconds at most (a pass over the 3-layer GPT-2's schedule at 30%: 6 s on 2 cores)
_OFFLOAD_TAIL = 0.1     # of the polish's seconds, left after `polish.offload` for the checks of its result


def _polish_time(options: SolveOptions) -> float:
    """Seconds the solver leaves for `_polished`."""
    if not options.params.get("polish", True):
        return 0.0
    return min(_POLISH_SHARE * options.time_limit, _POLISH_MAX)


def _polished(graph, cluster, options, spec, sched, res, floor, status, deadline):
    """(schedule, simulation) of the polish passes over the MILP's schedule (or the candidate it falls back on)
    when that is faster, else None. The stage model fixes the order of first computations and counts memory stage
    by stage, so where its schedule recomputes and stays more than the gap above the bound every schedule obeys,
    keeping a value and deferring what the order computed too early often fits (`polish.keep_instead_of_recompute`;
    the transformer at 45% of its keep-everything memory: 1.247x -> 1.232x keep-everything's step time, the bound
    1.209x). DTR's, which recomputes on demand, gains most: GPT-2 at 30%, where it fitted alone before the
    heuristic planned in the graph's order, 4.96x -> 1.81x. Each stage takes as long as its slowest device, so
    where several devices compute, one may take an operation off another's critical path across stages
    (`polish.offload`, over the devices `spec` lets compute: `example:tiny` at 1.1 MB, 85 us -> 77 us, the longest
    chain; without swapping, not the host, as the model copies nothing into host memory then). Not after Ctrl-C,
    nor with params {"polish": False}."""
    if (deadline is None or not _polish_time(options) or status == "interrupted"
            or (_gap(res.makespan, floor) or 0.0) <= options.gap):
        return None
    out, r = sched, res
    if res.recomputed:
        out, r = keep_instead_of_recompute(graph, cluster, sched, deadline=deadline)
        if not r.valid:
            out, r = sched, res
    devices = tuple(name for name, row in zip(spec.dev_names, spec.ccost, strict=True)
                    if np.isfinite(row).any() and (options.swap or cluster.device(name).kind != "cpu"))
    if len(devices) > 1:
        # stopped a tenth of the polish's seconds early, for the checks of its result that follow (BERT-L3 on 2
        # GPUs and the host at 90% of its keep-everything memory, offloading until the deadline: the benchmark's
        # row of its 120 s solve, with its own simulation of the schedule, took 120.02 s)
        out, r = offload(graph, cluster, out, devices, deadline=deadline - _OFFLOAD_TAIL * _polish_time(options))
    return (replace(out, graph=graph.name), r) if r.valid and r.makespan < res.makespan * (1 - 1e-12) else None


def _floor(graph: Graph, spec: ModelSpec, extra: dict, bounds=None) -> float:
    """Seconds every schedule needs (`bounds.lower_bounds`), recorded in `extra` (the operations the recompute
    bound came from by name)."""
    b = dict(lower_bounds(spec) if bounds is None else bounds)
    if b["at"] is not None:
        b["at"] = [moment_name(graph.arrays.ids, m) for m in b["at"]]
    extra["lower_bounds"] = b
    extra["schedule_lower_bound"] = b["floor"]
    return b["floor"]


def _proven_status(status: str, objective: float, bound, gap: float) -> str:
    """A run stopped on time whose schedule is within `gap` of a bound that holds for every schedule is proven
    all the same."""
    if status in ("time_limit", "feasible") and bound is not None and _gap(objective, bound) <= gap:
        return "optimal"
    return status


def coarsened(graph: Graph, cluster: Cluster, options: SolveOptions, solver) -> Schedule:
    """`solver` (the MILP through HiGHS or PuLP) on the graph with its cheap chains folded into super-nodes
    (`coarsen.py`), the schedule expanded back to operations and checked by the simulator; the best candidate
    on the full graph when it is faster. Folding restricts the schedules, so the coarse model's bound is no
    bound here: it is kept as `extra["coarse_bound"]`, the bound reported is `lower_bounds`' floor, and the
    status is at best "feasible" unless that floor proves the gap; nor does its infeasibility prove anything:
    the best full-graph candidate is returned, or an InfeasibleError that is not `proven`."""
    from .coarsen import coarsen, expand

    t0 = time.perf_counter()
    stop = threading.Event()
    base = [b for b in _candidates(graph, cluster, options, None, stop) if b[2].valid]
    if stop.is_set():
        return _interrupted(graph, "milp", base, t0)
    spec = spec_for(graph, cluster, options)
    too_big = _unplaceable(graph, spec)
    if too_big:     # proven on the full graph, before anything is folded
        _infeasible(graph, cluster, options, base, too_big)
    bounds = _bounds(graph, cluster, options, base, spec)
    coarse, mapping = coarsen(graph)
    inner = replace(options, warm_start=None, time_limit=max(options.time_limit - (time.perf_counter() - t0), 0.0),
                    params={k: v for k, v in options.params.items() if k != "coarsen"})
    notes = [f"solved on {len(coarse)} of {len(graph)} nodes (chains folded)"]
    extra = {"coarse_nodes": len(coarse), "fine_nodes": len(graph)}
    try:
        cs = solver(coarse, cluster, inner)
    except InfeasibleError as e:
        # folding restricts the schedules: the coarse graph having none proves nothing about the full one
        if not base:
            raise InfeasibleError(f"the graph with its chains folded ({len(coarse)} of {len(graph)} nodes) has "
                                  f"none ({e.message}), nor has any baseline on the full graph", proven=False,
                                  hint="solve without coarsening (drop --coarsen)") from e
        cs, res = None, None
        out_of_time = e.status == "no_incumbent"
        rep = SolveReport("milp", "time_limit" if out_of_time else "infeasible")
        notes.append("the MILP found no schedule for the folded graph" + (" in time" if out_of_time else ""))
    else:
        sched = expand(cs, mapping, graph)
        res = simulate(graph, cluster, sched)
        if not res.valid:
            raise MilpBug(f"expanded coarse schedule rejected by the simulator: {describe(res.violation)}")
        rep = cs.report
        extra.update(rep.extra, makespan=res.makespan)
    extra.update(coarse_status=rep.status, coarse_bound=rep.bound, coarse_gap=rep.gap)
    if options.warm_start is not None:
        notes.append("the warm start was not used (it schedules the full graph)")
    best = min(base, key=lambda b: b[2].makespan, default=None)
    if best is not None and (res is None or best[2].makespan < res.makespan * (1 - 1e-12)):
        name, sched, res = best
        extra.update(fallback=name, makespan=res.makespan)
        notes.append(f"returning {name}" if cs is None else
                     f"the expanded schedule was slower than {name}; returning {name}")
    status = "feasible" if rep.status in ("optimal", "infeasible") or cs is None else rep.status
    floor = _floor(graph, spec, extra, bounds)
    status = _proven_status(status, res.makespan, floor, options.gap)
    return Schedule(sched.instructions, SolveReport(rep.solver, status, objective=res.makespan, bound=floor,
                                                    gap=_gap(res.makespan, floor), solve_time=rep.solve_time,
                                                    message="; ".join(notes + [rep.message] if rep.message else notes),
                                                    extra=extra), graph=graph.name)


def _outside_model(status: str, bound, makespan: float, extra: dict, floor: float):
    """A fallback schedule comes from outside the stage model (its own order, no stage barriers), so the model's
    dual bound does not bound it and the model's optimality says nothing about it: a bound above the returned
    step time is kept only in `extra["stage_model_bound"]` (the bound becomes `floor`, which holds for every
    schedule), and "optimal" becomes "feasible"; so does "infeasible" (the stage model's infeasibility proves
    nothing of the schedule returned: it is kept as `extra["stage_model_status"]`)."""
    if bound is not None and bound > makespan:
        extra["stage_model_bound"] = bound
        bound = floor
    if status == "infeasible":
        extra["stage_model_status"] = status
    return ("feasible" if status in ("optimal", "infeasible") else status), bound


def _gap(obj, bound):
    if bound is None or obj is None or not math.isfinite(bound):
        return None
    return max(0.0, (obj - bound) / max(abs(obj), 1e-12))


# ----------------------------------------------------------------------------- HiGHS

def highs_model(model: MilpArrays):
    import highspy

    h = highspy.Highs()
    h.setOptionValue("output_flag", False)
    status = h.passModel(model.ncol, model.nrow, int(model.index.size), 2, 1, 0.0,
                         model.cost, model.lb, model.ub, model.row_lo, model.row_hi,
                         model.start.astype(np.int32), model.index.astype(np.int32), model.value,
                         model.integ.astype(np.int32))
    if status == highspy.HighsStatus.kError:   # a warning (e.g. tiny matrix values dropped) is not a refusal
        raise RuntimeError(f"HiGHS refused the model: {status}")
    return h


def write_model(model: MilpArrays, path: str) -> None:
    """The model as .mps or .lp (HiGHS writes it), for any external solver: all or nothing (HiGHS crashed the
    process on a path in a missing folder; `formats.write_atomic` checks the folder first)."""
    import highspy

    from ..formats import write_atomic

    ext = model_path(path)
    h = highs_model(model)
    if ext == ".lp":
        names = model.col_names()
        for j, nm in enumerate(names):
            h.passColName(j, nm)

    def write(tmp: str) -> None:
        if h.writeModel(tmp) == highspy.HighsStatus.kError:
            raise OptschedError("HiGHS could not write the model", file=str(path))

    write_atomic(path, write, suffix=ext, what="--write-model")


def model_path(path: str) -> str:
    """The extension of a file `write_model` can write (.mps or .lp), its folder checked; else a plain error."""
    from ..formats import output_folder

    ext = os.path.splitext(str(path))[1].lower()
    if ext not in (".mps", ".lp"):
        raise OptschedError(f"cannot write the model to {str(path)!r}", field="--write-model",
                            hint="end the name in .mps or .lp")
    output_folder(path, "--write-model")
    return ext


# HiGHS checks its time limit only between phases: on bert_l3 at 1 GB (4.6M nonzeros) presolve alone ran
# 57-62 s against a 20-30 s limit on 2 cores, and without presolve the root ran 30 s against 20 s. A model
# with more nonzeros than _NNZ_PER_S per second left is not handed to HiGHS (the incumbent is returned,
# status time_limit); a run still going _GRACE s after the deadline is abandoned the same way.
_NNZ_PER_S = 50_000
_GRACE = 2.0
# Nor does it check for an interrupt during a MIP's root LP: a run still going this long after a Ctrl-C is abandoned
# too, and the best schedule in hand comes back (the 3-layer GPT-2 at 25% of its keep-everything memory on one GPU
# and the host: a Ctrl-C 22 s into the root LP of its 1.6M-nonzero model waited the 22 s of that run's time left).
_STOP_GRACE = 1.0
# Such a model, up to _SEARCH_NNZ nonzeros, gets `lns.improve` instead (each round 4-5 s there: ResNet-50, 1,243
# operations, at 30% of its keep-everything memory, one device, no swapping: 6.9M nonzeros, 1.648x -> 1.408x of
# keep-everything's step time in 60 s, 14 rounds); with at least _SEARCH_FROM_S seconds left.
_SEARCH_NNZ = 10_000_000
_SEARCH_FROM_S = 2.0
# The search beside a branch and bound starts once that has run this long: most runs of small models end sooner,
# and there building the search's own model and its first round would only add to the solve's time.
_SEARCH_AFTER = 2.0


def milp(graph: Graph, cluster: Cluster, options: SolveOptions = SolveOptions()) -> Schedule:
    """Solve the joint MILP with HiGHS (see the module docstring).

    `options.time_limit` bounds the whole call: HiGHS gets what is left after the
    candidates and the model are built. HiGHS runs in a worker thread; Ctrl-C (or a
    progress callback raising KeyboardInterrupt) asks it to stop at its next
    interrupt check and the best schedule so far comes back marked `interrupted`;
    a second Ctrl-C while it winds down aborts.

    When the warm start needs gap stages (a larger model with a weaker relaxation), the
    model without them (over the best candidate that fits it, or cold) is solved too: beside
    it on two cores or more, before it on one (`_run_pair`). If the plain model proves its gap
    (on its own bound) with a schedule no slower than the warm start, that schedule is
    returned as optimal; otherwise the faster of the two schedules, with its own model's
    status and bound (`extra["runs"]` reports both runs)."""
    if options.params.get("coarsen"):
        return coarsened(graph, cluster, options, milp)
    import highspy

    _set_options(highspy.Highs(), options)      # a bad option is refused now, not after the candidates
    t_start = time.perf_counter()
    options = replace(options, progress=_merged(options.progress, t_start))
    stop = threading.Event()        # a Ctrl-C, or the progress callback's KeyboardInterrupt: set where taken
    held: list = []                 # the candidates, once made
    try:
        sched = _stage_model(graph, cluster, options, t_start, stop, held)
    except KeyboardInterrupt:
        # a Ctrl-C outside the waits that take it (a model built or written, the bounds' own Python): the fastest
        # candidate, the runs still going told to stop; a second Ctrl-C aborts
        if stop.is_set() or not held:
            raise
        stop.set()
        return _interrupted(graph, "milp", held[0], t_start, "after the candidates were made")
    return _within_stage(graph, cluster, options, sched, t_start)


def _stage_model(graph: Graph, cluster: Cluster, options: SolveOptions, t_start: float, stop: threading.Event,
                 held: list) -> Schedule:
    """The solve of the stage model (whole-stage count by default), from `milp`; the candidates go into `held`
    as soon as they are made. Where lp-rounding's LP leaves a
    core idle, the bounds are found beside it (with the target of the candidates so far), else after the
    candidates; and again after them where the bound falls short and a faster candidate came since (the
    rounding's), aimed at its target, with its moments for the orders (the transformer at 45% of its
    keep-everything memory: 1.2320x -> 1.2559x of keep-everything's step time). Both over the graph's own order,
    not the warm start's: the moments are taken where keep-everything holds the most in it."""
    until = t_start + options.time_limit
    early = {}

    end = until - _polish_time(options)     # the solver's and the bounds' deadline: the polish gets the rest

    def order_time() -> float:      # the orders of moments' time, from which _bounds takes its share
        return end - time.perf_counter()

    @functools.cache        # built once, for the bounds beside the LP and again after the candidates
    def graph_order():      # the bounds' moments are taken where keep-everything in the graph's order holds most
        return spec_for(graph, cluster, options, window=options.params.get("window"))

    def beside(base):
        spec0 = graph_order()
        fits = [r.makespan for _, _, r in base if r.valid]
        _tell(options, stop, incumbent=min(fits, default=None))
        early["target"] = min(fits) * (1 - options.gap) if fits else None
        with contextlib.suppress(InfeasibleError):      # said after the candidates, as without the LP beside
            early["bounds"] = _bounds(graph, cluster, options, base, spec0, early["target"],
                                      order_time(), build_model(spec0).index.size >= _ORDER_FROM_NNZ, stop,
                                      _BESIDE * _SECONDS, search=False, until=end, live=True)
            _tell(options, stop, floor=early["bounds"]["floor"])

    try:
        spec, model, x0, warm_msg, base, build_time, notes, alt = prepare(
            graph, cluster, options, beside, stop, lambda t: _tell(options, stop, incumbent=t))
    except _Stopped as e:
        return _interrupted(graph, "milp", e.base, t_start, e.when)
    held.append(base)
    # the candidates not told yet: the roundings, the warm start (the bounds beside told theirs)
    _tell(options, stop, incumbent=min((r.makespan for _, _, r in base if r.valid), default=None))
    if options.write_model:
        write_model(model, options.write_model)
    known = [float(m.cost @ x) for m, x in ((model, x0), alt[:2] if alt else (None, None)) if x is not None]
    target = min(known) / TIME_SCALE * (1 - options.gap) if known else None
    bounds = early.get("bounds")
    if bounds is None or (target is not None and bounds["floor"] < target
                          and (early["target"] is None or target < early["target"] * (1 - 1e-9))):
        # none beside the LP, or none there aimed at this target: no candidate fitted then, or a faster one (the
        # rounding's) came since, whose moments the orders take
        again = _bounds(graph, cluster, options, base, graph_order(), target, order_time(),
                        model.index.size >= _ORDER_FROM_NNZ, stop, grow=True,
                        start=None if bounds is None else bounds["grown"], until=end, live=True)
        bounds = again if bounds is None or again["floor"] >= bounds["floor"] else bounds
    _tell(options, stop, floor=bounds["floor"])
    left = order_time()
    if alt is None:
        run = _highs_run(model, x0, options, left, stop, floor=bounds["floor"])
        if run["x"] is None:
            base, bounds = _fallback(graph, cluster, options, base, graph_order(), bounds,
                                     end, model.index.size >= _ORDER_FROM_NNZ, stop)
            if stop.is_set():       # Ctrl-C there: the best schedule so far, not polished again
                run = {**run, "status": "interrupted"}
        return finish(graph, cluster, options, "milp", spec, model, run["x"], run["status"], run["bound"],
                      run["solve_time"], build_time, base, warm_msg, run["extra"], notes, run["notes"], bounds, until)
    pmodel, px0, pmsg = alt
    more = {"bounds": bounds}

    def spare(end: float, ended: threading.Event) -> None:
        # the bounds again, aimed at the warm start, before the search takes the core: on models whose branch and
        # bound rarely finishes its root LP in time (GPT-2 at 30% of its keep-everything memory: 1.6481x ->
        # 1.6829x keep-everything's step time, where the search found nothing)
        if target is not None:
            more["bounds"] = _bounds_again(graph, cluster, options, base, graph_order(), bounds, target, end, True,
                                           ended)
            _tell(options, stop, floor=more["bounds"]["floor"])

    large = model.index.size >= _ORDER_FROM_NNZ
    plain, staged, solve_time, side = _run_pair(pmodel, px0, model, x0, options, left, stop, bounds["floor"],
                                                handoff=_follows(options, model.index.size),
                                                spare=spare if large else None)
    bounds = more["bounds"]
    pobj = np.inf if plain["x"] is None else float(pmodel.cost @ plain["x"])
    sobj = np.inf if x0 is None else float(model.cost @ (x0 if staged is None else staged["x"]))
    runs = {"without gap stages": _summary(pmodel, plain), "with gap stages": _summary(model, staged)}
    pproven = _proven(pmodel, plain, options.gap)
    sproven = staged is not None and _proven(model, staged, options.gap)
    # the faster schedule, with its own model's bound; on a tie, the proven one
    tie = pobj <= sobj * (1 + 1e-9)
    if plain["x"] is not None and (pobj < sobj * (1 - 1e-9) or (tie and (pproven or not sproven))):
        status = "interrupted" if stop.is_set() else "optimal" if pproven else plain["status"]
        return finish(graph, cluster, options, "milp", pmodel.spec, pmodel, plain["x"], status, plain["bound"],
                      solve_time, build_time, base, f"{pmsg}; with gap stages: {warm_msg}",
                      {**plain["extra"], "runs": runs}, notes, plain["notes"] + ["solved without gap stages"] + side,
                      bounds, until)
    if staged is None:          # Ctrl-C during the plain run: the warm start stands
        return finish(graph, cluster, options, "milp", spec, model, x0, "interrupted", None, solve_time,
                      build_time, base, warm_msg, {"backend": "highs", "runs": runs}, notes, plain["notes"], bounds)
    status = "optimal" if sproven and not stop.is_set() else staged["status"]
    return finish(graph, cluster, options, "milp", spec, model, staged["x"], status, staged["bound"],
                  solve_time, build_time, base, warm_msg, {**staged["extra"], "runs": runs}, notes,
                  staged["notes"] + side, bounds, until)


def _fallback(graph, cluster, options, base: list, spec, bounds: dict, until: float, orders: bool,
              stop: threading.Event) -> tuple[list, dict]:
    """(candidates, bounds) where the stage model gives no schedule and the fastest candidate comes back instead:
    the seconds left, idle otherwise, go half to polishing that candidate (`_polished`; its polish among the
    candidates stopped at _ON_DEMAND_POLISH_SHARE of the time limit) and half to `_bounds` again, aimed at the polished
    schedule and over the moments where it had least to spare; those found beside lp-rounding's LP
    shared the cores with it and were aimed at the schedule as it was (GPT-2 at 30% of its keep-everything memory,
    when its stage model had no point: DTR's schedule 2.15x -> 1.81x keep-everything's step time, the bound
    1.62x -> 1.65x)."""
    valid = [b for b in base if b[2].valid]
    if not valid or stop.is_set():
        return base, bounds
    name, sched, res = min(valid, key=lambda b: b[2].makespan)
    try:
        polished = _polished(graph, cluster, options, spec, sched, res, bounds["floor"], "",
                             time.perf_counter() + (until - time.perf_counter()) / 2)
    except KeyboardInterrupt:       # Ctrl-C: the candidate stands, as in the final polish
        stop.set()
        return base, bounds
    if polished is not None:
        name = name if name.endswith(", polished") else f"{name}, polished"
        base = [*base, (name, *polished)]
        res = polished[1]
    return base, _bounds_again(graph, cluster, options, base, spec, bounds, res.makespan * (1 - options.gap), until,
                               orders, stop)


def _bounds_again(graph, cluster, options, base, spec, bounds: dict, target: float, until: float, orders: bool,
                  stop: threading.Event) -> dict:
    """`bounds`, or `_bounds` found again until `until` (perf_counter), their chain grown on from that of `bounds`
    and aimed at `target`, where higher: where `bounds` fall short of it and a second or more is left."""
    left = until - time.perf_counter()
    if bounds["floor"] >= target or left < 1.0:
        return bounds
    with contextlib.suppress(InfeasibleError):      # a schedule fits: the bounds cannot say otherwise
        again = _bounds(graph, cluster, options, base, spec, target, left, orders, stop, grow=True,
                        start=bounds["grown"], search=False, until=until, live=True)
        if again["floor"] > bounds["floor"]:
            return again
    return bounds


# The within-stage follow-up (`_within_stage`) only where that model's LP solves in a second or two. Its nonzeros
# are 2.3-2.8 times the whole-stage model's, and its LP's time grows much faster: on the benchmark's graphs at 70%
# (1 thread), whole-stage nonzeros -> within-stage LP time: 18k -> 0.09 s (69-node MLP), 58k -> 0.5 s (CNN, 140
# nodes), 125k -> 2.1 s (transformer, 177), 210k -> 18 s (BERT, 230), 255k -> over 60 s (GPT-2, 236).
_WITHIN_FROM_NNZ = 150_000
_WITHIN_MIN_S = 2.0     # seconds left, at least, to start it


def _follows(options: SolveOptions, nonzeros: float) -> bool:
    """Whether a solve of a whole-stage model of `nonzeros` may be followed by the within-stage model
    (`_within_stage`)."""
    return "instage" not in options.params and nonzeros <= _WITHIN_FROM_NNZ


def _within_stage(graph: Graph, cluster: Cluster, options: SolveOptions, sched: Schedule,
                  t_start: float) -> Schedule:
    """A whole-stage schedule more than the gap above the bound every schedule obeys is at best optimal for that
    model: counting a stage's memory all at once, it refuses schedules that free a value after its last use inside
    a stage holding recomputations. Where the within-stage model (Checkmate's exact count over the same order,
    `params["instage"]`) is small and time is left, it is solved from that schedule, whatever the first run's
    status (a proven whole-stage optimum, or the gap-stage run stopped when the model without gap stages proved
    its own: `_run_pair`'s handoff), and its result is returned when faster, or as fast and proven in its larger
    model (69-node MLP at 70% of keep-everything's memory: 1.2341x keep-everything's time from the whole-stage
    models becomes 1.1679x, the bound of every schedule). `params["instage"]` True or False picks one model, no
    follow-up."""
    r = sched.report
    if not _follows(options, r.extra.get("nonzeros", math.inf)) or r.status == "interrupted":
        return sched
    above = _gap(r.objective, r.extra.get("schedule_lower_bound", 0.0))
    left = options.time_limit - (time.perf_counter() - t_start)
    if above is None or above <= options.gap or left < _WITHIN_MIN_S:
        return sched
    try:
        within = milp(graph, cluster, replace(options, warm_start=sched, time_limit=left, write_model=None,
                                              params={**options.params, "instage": True}))
    except OptschedError:
        return sched
    except KeyboardInterrupt:     # Ctrl-C before its HiGHS run took over the interrupt: the schedule in hand stands
        return replace(sched, report=replace(r, status="interrupted"))
    w = within.report
    runs = {name: {k: getattr(x, k) for k in ("status", "objective", "bound", "gap", "solve_time")}
            for name, x in (("whole-stage", r), ("within-stage", w))}
    faster = w.objective < r.objective * (1 - 1e-9)
    both = r.solve_time + w.solve_time
    if faster or (w.status == "optimal" and w.objective <= r.objective * (1 + 1e-9)):
        head = (f"within-stage model from the whole-stage schedule ({r.status}, {r.objective:.6g} s): "
                + ("faster" if faster else "proven there too"))
        # the warm start said is the solve's own: the follow-up's is the whole-stage schedule, which `head` says
        return replace(within, report=replace(w, solve_time=both, message="; ".join(m for m in (head, w.message) if m),
                                              extra={**w.extra, "warm_start": r.extra.get("warm_start"),
                                                     "stage_models": runs}))
    note = f"within-stage model from it: {w.status}, no faster schedule"
    return replace(sched, report=replace(r, status="interrupted" if w.status == "interrupted" else r.status,
                                         solve_time=both, message="; ".join(m for m in (r.message, note) if m),
                                         extra={**r.extra, "stage_models": runs}))


def _proven(model: MilpArrays, run: dict, gap: float) -> bool:
    """The run has a schedule within `gap` of its model's optimum. HiGHS may stop on time with the gap already
    closed (its last check not reached): proven all the same."""
    if run["x"] is None:
        return False
    obj = float(model.cost @ run["x"])
    return run["status"] == "optimal" or (run["bound"] is not None and obj - run["bound"] * TIME_SCALE <= gap * obj)


def _summary(model: MilpArrays, run: dict | None) -> dict | None:
    """What one HiGHS run reached, for the report (`extra["runs"]`)."""
    if run is None:
        return None
    obj = None if run["x"] is None else float(model.cost @ run["x"]) / TIME_SCALE
    return {"status": run["status"], "objective": obj, "bound": run["bound"], "stages": model.spec.T,
            "solve_time": run["solve_time"]}


def _run_pair(pmodel, px0, model, x0, options: SolveOptions, left: float, stop: threading.Event,
              floor: float = 0.0, handoff: bool = False, spare=None):
    """(plain run, staged run or None, solve time, notes): the model without gap stages and the warm start's
    model with them. With two cores or more, side by side, each on half the threads and all the time left
    (HiGHS's branch and bound works on one core; the two runs double what a 60 s limit buys on two), and the first
    to settle stops the other: the plain model proving its gap with a schedule no slower than the staged model's
    start, or the staged model proving optimality. A plain run over without settling (at tight budgets its model
    often has no schedule, proven in a second or two), or cold and still without a schedule after _PLAIN_STALL of
    the time, leaves its core to `spare(end of the runs, event set when the staged run ends)` where given, then to
    `lns.improve` around the staged model's warm start until the staged run ends; the
    better point is the staged run's. On one core, the plain model
    first for _PLAIN_SHARE of the time (_PLAIN_COLD_SHARE when it starts cold, as it must find a schedule before
    it can prove one), then the staged model for the rest unless the plain one proved its gap.
    `handoff`: the within-stage model follows (`_within_stage`); the plain model's proof then stops the staged run
    even when it holds a faster schedule, which the follow-up starts from (the plain proof took 3.3 s on the 69-node
    MLP at 70%, and the staged run, unproven at 60 s, left the follow-up no time)."""
    warm = np.inf if x0 is None else float(model.cost @ x0)

    def settled(run):
        return _proven(pmodel, run, options.gap) and float(pmodel.cost @ run["x"]) <= warm * (1 + 1e-9)

    cores = options.threads or os.cpu_count() or 1
    if cores < 2:
        share = _PLAIN_SHARE if px0 is not None else _PLAIN_COLD_SHARE
        t0 = time.perf_counter()
        plain = _highs_run(pmodel, px0, options, left * share, stop, floor=floor)
        if settled(plain) or stop.is_set():
            return plain, None, plain["solve_time"], []
        staged = _highs_run(model, x0, options, left - (time.perf_counter() - t0), stop, floor=floor)
        return plain, staged, plain["solve_time"] + staged["solve_time"], []
    half = replace(options, threads=max(1, cores // 2))
    cancel = (threading.Event(), threading.Event())
    live: tuple = ({}, {})
    out: list = [None, None, None]
    finished = threading.Event()        # the staged run is over
    goal = _goal(floor, options.gap)

    def go(i, m, x, opts):
        # a run that settles stops the other unless the other holds a faster schedule (different orders)
        try:
            # a cold plain run without a schedule halfway is unlikely to beat the staged model's warm start in
            # the time left: its core goes to the search around that start (gpt2-3 at 25%: its root LP took 12 s
            # of 34, its cut rounds the rest, and no node was searched)
            stall = left * _PLAIN_STALL if i == 0 and px0 is None and x0 is not None else None
            out[i] = _highs_run(m, x, opts, left, stop, cancel[i], live[i], floor, stall)
            if i == 0 and not settled(out[0]) and x0 is not None:
                # the plain run is over early: its core searches around the staged model's warm start
                if spare is not None and not stop.is_set():
                    spare(t0 + left, finished)
                out[2] = improve(model, x0, t0 + left, lambda: stop.is_set() or finished.is_set(), goal, seed=1)
                if float(model.cost @ out[2][0]) <= goal:
                    cancel[1].set()     # within the gap of the lower bound
                return
            if not (settled(out[0]) if i == 0 else _proven(model, out[1], options.gap)):
                return
            if (i == 0 and handoff) or live[1 - i].get("obj", np.inf) >= float(m.cost @ out[i]["x"]) * (1 - 1e-9):
                cancel[1 - i].set()
        except BaseException as e:      # raised again in the calling thread
            out[i] = e
            cancel[1 - i].set()
        finally:
            if i == 1:
                finished.set()

    t0 = time.perf_counter()
    workers = [threading.Thread(target=go, args=(0, pmodel, px0, replace(half, progress=None)), daemon=True),
               threading.Thread(target=go, args=(1, model, x0, half), daemon=True)]
    for w in workers:
        w.start()
    for w in workers:
        # after a Ctrl-C each run is given up within _STOP_GRACE, but not a search round (its sub-MIP's root LP
        # checks no interrupt either, and a round may take _STEP s): such a thread is given up too
        if not _join(w, stop, after_stop=2 * _STOP_GRACE):
            _abandon(w)
    for r in out:
        if isinstance(r, BaseException):
            raise r
    gone = {"status": "interrupted", "bound": None, "extra": {}, "notes": [], "solve_time": time.perf_counter() - t0}
    out[0] = out[0] or {**gone, "x": None}      # (not seen: each run's own wait gives it up first)
    out[1] = out[1] or {**gone, "x": x0}
    notes = ["the models with and without gap stages ran side by side"]
    if "gave_up" in out[0]["extra"]:
        notes.append(f"the model without gap stages found no schedule in {out[0]['extra']['gave_up']:.3g} s "
                     "and gave its core up")
    staged = out[1]
    if out[2] is not None:
        x, seen = out[2]
        if seen["rounds"]:      # none when the plain run ended with the staged one
            notes.append(f"a search around the warm start on the freed core: {seen['rounds']} rounds, "
                         f"{seen['improved']} improvements")
        if staged["x"] is None or float(model.cost @ x) < float(model.cost @ staged["x"]) * (1 - 1e-9):
            staged = {**staged, "x": x}
    return out[0], staged, time.perf_counter() - t0, notes


_PLAIN_SHARE = 0.2
_PLAIN_COLD_SHARE = 0.5   # a cold start must find a schedule before it can prove one (random 40-layer graph,
                          # seed 3, at 50%: 4 s found none; 10 s found the optimum the warm gap-stage model never did)
_PLAIN_STALL = 0.4        # side by side: the share of the time a cold plain run gets to find a schedule
_CUT_SHARE = 0.3          # of a run's time, at most, for the rounds of chain cuts at the root (`cuts.py`)
# No strong branching to initialise pseudocosts: these models have thousands of fractional binaries at a node, and
# strong branching on them took 80% of the LP iterations (transformer at 70%: 1% gap proven in 36 s, not 59 s; at
# 60% in 32 s, not 1.25% after 60 s). params={"highs": {...}} (CLI --highs KEY=VALUE) overrides any HiGHS option.
_HIGHS_DEFAULTS = {"mip_pscost_minreliable": 0}
# With an incumbent given (the warm start), little effort on primal heuristics: the gap is the bound's to close
# (60 s runs, one each: transformer at 50% 1.95% -> 1.44% gap; gpt2 at 60% optimal in 12 s, not 21 s; bert at 60%
# in 29 s, not 32 s; no row slower). Without one, HiGHS's own heuristics are how it finds a schedule.
_WARM_DEFAULTS = {"mip_heuristic_effort": 0.01}


def _set_options(h, options: SolveOptions, warm: bool = False) -> None:
    import highspy

    for k, v in {**_HIGHS_DEFAULTS, **(_WARM_DEFAULTS if warm else {}), **options.params.get("highs", {})}.items():
        if h.setOptionValue(k, v) != highspy.HighsStatus.kOk:
            raise OptschedError(f"HiGHS refused option {k}={v!r} (params['highs']); see HiGHS's option list")


def _goal(floor: float, gap: float) -> float:
    """Model units: an incumbent at or below it is within `gap` of `floor` (seconds, a bound on every schedule)."""
    return floor * TIME_SCALE / (1 - gap) if gap < 1 else math.inf


def _merged(progress, t_start: float):
    """`progress` as the user sees it: {incumbent, bound, gap, elapsed}, elapsed from the call's start, from
    reports of {incumbent, bound (a run's dual bound), floor (`bounds.lower_bounds`)}, any of them missing. The
    incumbent is the fastest schedule in hand so far (a candidate, or a run's point), the bound the larger of the
    floor so far and the run's own: HiGHS's dual bound alone left GPT-2 at 30% of its keep-everything memory at
    "gap 44%" to the end, which the report then gave as 6.07%, and the runs' clocks began at 0 each."""
    if progress is None:
        return None
    best = {"incumbent": math.inf, "floor": 0.0, "run": 0.0, "shown": None, "at": -math.inf}
    lock = threading.Lock()

    def tell(p: dict) -> None:
        now = time.perf_counter()
        with lock:
            if p.get("incumbent") is not None:
                best["incumbent"] = min(best["incumbent"], float(p["incumbent"]))
            if p.get("floor"):
                best["floor"] = max(best["floor"], float(p["floor"]))
            if "bound" in p:        # the run going on (one at a time reports)
                best["run"] = float(p["bound"] or 0.0)
            inc = best["incumbent"] if math.isfinite(best["incumbent"]) else None
            bd = max(best["floor"], best["run"]) or None
            if inc is not None and bd is not None:
                bd = min(bd, inc)
            if (inc, bd) == best["shown"] and now - best["at"] < 1.0:
                return      # the same line again: HiGHS reports at every interrupt check
            best.update(shown=(inc, bd), at=now)
        gap = None if inc is None or bd is None else max(0.0, (inc - bd) / max(abs(inc), 1e-12))
        progress({"incumbent": inc, "bound": bd, "gap": gap, "elapsed": now - t_start})
    return tell


def _tell(options: SolveOptions, stop: threading.Event, **report) -> None:
    """A progress report from outside HiGHS's callbacks (the candidates, the lower bounds); a KeyboardInterrupt
    from the callback stops the solve, as Ctrl-C does."""
    if options.progress is not None:
        try:
            options.progress(report)
        except KeyboardInterrupt:
            stop.set()


def _highs_run(model: MilpArrays, x0, options: SolveOptions, left: float, stop: threading.Event,
               cancel: threading.Event | None = None, live: dict | None = None, floor: float = 0.0,
               stall: float | None = None) -> dict:
    """HiGHS on `model` from `x0` for at most `left` seconds, in a worker thread stopped by Ctrl-C (`stop`), or
    by `cancel` (a run beside it settled the solve; status "time_limit": stopped before proving); `live["obj"]`
    follows its incumbent (model units) for the run beside it. `floor` (seconds, `bounds.lower_bounds`) holds
    for every schedule: an incumbent within the gap of it is proven, and the run stops (or does not start).
    `stall` (seconds): the run gives up when it has found no schedule by then.
    {x, status, bound, extra, notes, solve_time}; x is x0 when HiGHS found nothing better or did not run."""
    import highspy

    goal = _goal(floor, options.gap)
    proven = x0 is not None and float(model.cost @ x0) <= goal
    ran = left > 0 and model.index.size <= _NNZ_PER_S * left and not proven and not stop.is_set()
    # too large for branch and bound: the time left goes to the search around the warm start, whose sub-MIPs
    # presolve away the fixed columns (it passes the model to HiGHS itself)
    search = (not ran and not proven and x0 is not None and left > _SEARCH_FROM_S
              and model.index.size <= _SEARCH_NNZ and not stop.is_set())
    # branch and bound works on one core: with two or more, a search around the warm start takes another beside it
    cores = options.threads or os.cpu_count() or 1
    beside = ran and x0 is not None and cores >= 2
    h = highs_model(model) if ran else None
    if ran:
        h.setOptionValue("output_flag", bool(options.verbose))
        h.setOptionValue("mip_rel_gap", float(options.gap))
        if options.threads or beside:
            h.setOptionValue("threads", int(cores - 1 if beside else cores))
        _set_options(h, options, warm=x0 is not None)
    t0 = time.perf_counter()
    state = {"found": False}
    gave_up = threading.Event()

    def report(e):
        out = e.data_out
        inc = out.mip_primal_bound / TIME_SCALE if abs(out.mip_primal_bound) < 1e30 else None
        bd = out.mip_dual_bound / TIME_SCALE if abs(out.mip_dual_bound) < 1e30 else None
        _tell(options, stop, incumbent=inc, bound=bd, floor=floor)     # `_merged` drops the repeated lines

    halt = threading.Event()     # this run only: abandoned after overrunning (stop: the user's Ctrl-C, every run)

    def stopped() -> bool:     # HiGHS's own time limit is checked between phases only: 2 s late on gpt2-3 at 30%
        return (stop.is_set() or halt.is_set() or (cancel is not None and cancel.is_set())
                or time.perf_counter() > t0 + left)

    def stuck() -> bool:
        if stall is None or state["found"] or time.perf_counter() < t0 + stall:
            return False
        gave_up.set()
        return True

    def poll(e):
        if stopped() or stuck():
            e.interrupt()

    by_floor = threading.Event()

    def poll_mip(e):
        out = e.data_out
        if abs(out.mip_primal_bound) < 1e30:
            state["found"] = True
        if stopped() or stuck():
            e.interrupt()
        elif out.mip_primal_bound <= goal:
            by_floor.set()
            e.interrupt()

    if live is not None:
        live["obj"] = np.inf if x0 is None else float(model.cost @ x0)

        def improved(e):
            live["obj"] = min(live["obj"], e.data_out.mip_primal_bound)

    if ran:
        if live is not None:
            h.cbMipImprovingSolution.subscribe(improved)
        if options.progress is not None:
            h.cbMipImprovingSolution.subscribe(report)
            h.cbMipInterrupt.subscribe(report)
        for cb in (h.cbSimplexInterrupt, h.cbIpmInterrupt):
            cb.subscribe(poll)
        h.cbMipInterrupt.subscribe(poll_mip)
    notes = []
    if proven:
        notes.append("the warm start is within the gap of the lower bound: no branch and bound")
    elif stop.is_set():
        notes.append("not solved: a Ctrl-C came before")
    elif not ran:
        notes.append(f"the model ({model.index.size} nonzeros) is too large to solve in the "
                     f"{max(left, 0):.3g} s left; raise --time-limit")
    abandoned = False
    cut_info: dict = {}
    searched: dict = {}
    depth = int(options.params.get("cuts", 0))
    over = threading.Event()        # the branch and bound is over: the search beside it stops

    def look():
        if beside and over.wait(_SEARCH_AFTER):
            return      # the branch and bound is over already: the search's model would cost more than it brings
        try:
            searched["x"], searched["seen"] = improve(
                model, x0, t0 + left, lambda: stopped() or over.is_set(), goal,
                found=lambda obj: _tell(options, stop, incumbent=obj / TIME_SCALE))
        except BaseException as e:      # raised again in the calling thread
            searched["error"] = e
            return
        if beside and float(model.cost @ searched["x"]) <= goal:
            halt.set()      # within the gap of the lower bound: the branch and bound stops

    if ran or search:
        def solve():
            if search:
                look()
                return
            if depth > 0 and model.spec.mem_row.any():
                cut_info.update(root_cuts(h, model, left * _CUT_SHARE, x0, depth, stop=stopped))
            if x0 is not None:      # after the cut rounds: their LP solves would replace it
                h.setSolution(int(x0.size), np.arange(x0.size, dtype=np.int32), x0)
            h.setOptionValue("time_limit", float(max(left - (time.perf_counter() - t0), 0.01)))
            try:
                run_highs(h)
            finally:
                over.set()

        worker = threading.Thread(target=solve, daemon=True)
        worker.start()
        side = threading.Thread(target=look, daemon=True) if beside else None
        if side is not None:
            side.start()
        if not _join(worker, stop, t0 + left + _GRACE, after_stop=_STOP_GRACE):
            halt.set()
            abandoned = True
            notes.append(f"HiGHS did not stop within {_STOP_GRACE:g} s of the Ctrl-C and was abandoned"
                         if stop.is_set() else "HiGHS overran the time limit and was abandoned")
            _abandon(worker)
        if side is not None and not _join(side, stop, t0 + left + _GRACE, after_stop=_STOP_GRACE):
            _abandon(side)
    if "error" in searched:
        raise searched["error"]
    x, bound, extra = x0, None, {"backend": "highs"}
    status = "time_limit"
    if ran and not abandoned:
        ms = h.getModelStatus()
        MS = highspy.HighsModelStatus
        info = h.getInfo()
        status = {MS.kOptimal: "optimal", MS.kTimeLimit: "time_limit", MS.kInterrupt: "interrupted",
                  MS.kInfeasible: "infeasible"}.get(ms, "feasible")
        if info.primal_solution_status >= 1 and status != "infeasible":
            x = np.asarray(h.getSolution().col_value)
        elif status == "infeasible":
            x = None
        bound = info.mip_dual_bound / TIME_SCALE if abs(info.mip_dual_bound) < 1e30 else None
        if status == "optimal" and x is not None:
            bound = max(bound or 0.0, 0.0)
        extra.update(model_status=h.modelStatusToString(ms), nodes=int(info.mip_node_count))
    if "x" in searched:
        y, seen = searched["x"], searched["seen"]
        notes.append(f"a search around the warm start {'beside the branch and bound' if beside else 'instead'}: "
                     f"{seen['rounds']} rounds, {seen['improved']} improvements")
        extra["search"] = seen
        if x is None or float(model.cost @ y) < float(model.cost @ x) * (1 - 1e-9):
            x = y       # a point of the same model: its dual bound holds for it
            if status == "infeasible":
                status = "time_limit"
        if float(model.cost @ y) <= goal:
            by_floor.set()
    if gave_up.is_set():
        notes.append(f"HiGHS found no schedule in {stall:.3g} s: stopped")
        extra["gave_up"] = stall
    if cut_info.get("rounds"):
        lp = cut_info["lp"]
        extra["cuts"] = {"rounds": cut_info["rounds"], "rows": cut_info["cuts"], "seconds": cut_info["seconds"],
                         "lp_before": lp[0] / TIME_SCALE, "lp_after": lp[-1] / TIME_SCALE}
    if stop.is_set():
        status = "interrupted"
    elif proven:
        status = "optimal"         # within the gap of a bound on every schedule
    elif by_floor.is_set() and x is not None and float(model.cost @ x) <= goal:
        status = "optimal"
        notes.append("HiGHS stopped: its schedule is within the gap of the lower bound")
    elif status == "interrupted":
        status = "time_limit"      # cancelled by the run beside it
    if floor and (bound is None or bound < floor):
        bound = floor
    return {"x": x, "status": status, "bound": bound, "extra": extra, "notes": notes,
            "solve_time": time.perf_counter() - t0}


def _join(worker: threading.Thread, stop: threading.Event, until: float = math.inf, patient: bool = True,
          after_stop: float = math.inf) -> bool:
    """Wait for `worker` until the perf_counter time `until`: False if it is still running then. The first
    Ctrl-C sets `stop` (the runs' interrupt callbacks see it); a second one while they wind down aborts.
    `patient` False: the first Ctrl-C also ends the wait (False), for a worker that does not watch `stop`.
    `after_stop`: seconds the wait goes on, at most, once `stop` is set (here or by another thread)."""
    stopped_at = math.inf
    while worker.is_alive():
        try:
            # not worker.join: a KeyboardInterrupt inside it marks a running thread stopped (CPython 3.11's
            # Thread._wait_for_tstate_lock), and is_alive() is then False while the worker still runs
            time.sleep(0.01)
        except KeyboardInterrupt:
            if stop.is_set():
                raise
            stop.set()
            if not patient:
                return False
        now = time.perf_counter()
        if stop.is_set():
            stopped_at = min(stopped_at, now)
        if worker.is_alive() and (now > until or now > stopped_at + after_stop):
            return False
    return True


_ABANDONED: list[threading.Thread] = []


def _abandon(worker: threading.Thread) -> None:
    """An overrunning HiGHS run, asked to stop, finishes in the background; the interpreter waits for it at exit
    (a C++ solve still running when Python finalises aborts the process)."""
    if not _ABANDONED:
        atexit.register(lambda: [t.join() for t in _ABANDONED])
    _ABANDONED.append(worker)


def abandoned_running() -> bool:
    """Whether a run given up by `_abandon` is still going (the CLI then leaves without waiting for it)."""
    return any(t.is_alive() for t in _ABANDONED)


def run_highs(h):
    """HiGHS's solve in the calling thread (a worker thread here: the C++ run releases the GIL), then its thread
    pool released, as highspy's own threaded solve does. HiGHS sizes one pool per calling thread, once: without
    the release, a later solve in the same thread that asks for another `threads` fails (lp-rounding with 2
    threads after a solve with 1 found no LP solution at all)."""
    import highspy

    status = h.run()
    highspy.Highs.resetGlobalScheduler(False)
    return status


# ----------------------------------------------------------------------------- PuLP

def pulp_solver(name: str = "PULP_CBC_CMD"):
    """The `solver(graph, cluster, options)` that solves the same model through PuLP."""

    def solve(graph: Graph, cluster: Cluster, options: SolveOptions = SolveOptions()) -> Schedule:
        if options.params.get("coarsen"):
            return coarsened(graph, cluster, options, solve)
        return _pulp(graph, cluster, options, name)

    solve.__name__ = f"pulp_{name}"
    return solve


def _pulp(graph, cluster, options, solver_name):
    import pulp

    t_start = time.perf_counter()
    solver = _pulp_solver_named(solver_name, options)       # before the work: a missing solver is said at once
    try:
        spec, model, x0, warm_msg, base, build_time, notes, _ = prepare(graph, cluster, options,
                                                                        stop=threading.Event())
    except _Stopped as e:
        return _interrupted(graph, f"pulp:{solver_name}", e.base, t_start, e.when)
    if options.write_model:
        write_model(model, options.write_model)
    bounds = _bounds(graph, cluster, options, base, spec)
    extra = {"backend": f"pulp:{solver_name}"}
    until = t_start + options.time_limit       # the whole call, as for HiGHS
    built = _pulp_problem(model, x0, until)
    if built is None:
        left = until - time.perf_counter()
        why = (f"the model ({model.index.size} nonzeros) is too large to pass to PuLP in the time left "
               f"({max(left, 0):.3g} s); raise --time-limit, or use the milp solver")
        return finish(graph, cluster, options, f"pulp:{solver_name}", spec, model, x0, "time_limit", None, 0.0,
                      build_time, base, warm_msg, extra, notes, [why], bounds=bounds)
    prob, xs = built
    left = max(until - _polish_time(options) - time.perf_counter(), 1.0)
    solver.timeLimit = float(left)
    if hasattr(solver, "optionsDict"):
        solver.optionsDict["warmStart"] = x0 is not None
    t0 = time.perf_counter()
    stopped = _pulp_solve(prob, solver, solver_name, t0 + left + _GRACE)
    status = stopped or "feasible"
    solve_time = time.perf_counter() - t0
    over = [f"{solver_name} overran the time limit and was stopped after {solve_time:.3g} s"] \
        if stopped == "time_limit" else []
    ps, sol = prob.status, getattr(prob, "sol_status", None)
    x = None
    if not stopped:
        if ps == pulp.LpStatusInfeasible:
            status = "infeasible"
        elif sol == pulp.LpSolutionOptimal or (sol is None and ps == pulp.LpStatusOptimal):
            status = "optimal"
        elif sol == pulp.LpSolutionIntegerFeasible:
            status = "time_limit"
        else:
            status = "time_limit" if solve_time >= left * 0.95 else "error"     # its own limit, not the call's
    vals = [v.varValue for v in xs]
    # only a solution the solver calls integer feasible: stopped without one, CBC still writes values (those of
    # its last LP), and they are no schedule; a solver's tolerance is checked against every row all the same
    found = sol in (pulp.LpSolutionOptimal, pulp.LpSolutionIntegerFeasible) or (sol is None and
                                                                               ps == pulp.LpStatusOptimal)
    if not stopped and found and all(v is not None for v in vals):
        x = np.array(vals, dtype=float)
        if violated_rows(model, x, tol=1e-6):
            x, status = None, "feasible" if status == "optimal" else status    # the warm start, unproven
    bound = None
    if status == "optimal" and x is not None:
        bound = float(pulp.value(prob.objective)) / TIME_SCALE
    if x is None and x0 is not None and status != "infeasible":
        x = x0
    extra["pulp_status"] = pulp.LpStatus.get(ps, str(ps))
    return finish(graph, cluster, options, f"pulp:{solver_name}", spec, model, x, status, bound, solve_time,
                  build_time, base, warm_msg, extra, notes, over, bounds=bounds, deadline=until)


def _pulp_solver_named(name: str, options: SolveOptions):
    """PuLP's solver `name` with the solve options (its time limit is set once the model is built), or a plain
    error when this machine has none of that name."""
    import pulp

    kw = dict(msg=bool(options.verbose), timeLimit=float(options.time_limit), gapRel=float(options.gap),
              warmStart=True)
    if options.threads:
        kw["threads"] = int(options.threads)
    try:
        try:
            solver = pulp.getSolver(name, **kw)
        except TypeError:
            solver = pulp.getSolver(name)
    except (KeyError, pulp.PulpSolverError):
        solver = None
    if solver is None or not solver.available():
        raise OptschedError(f"PuLP solver {name!r} is not available on this machine",
                            hint="pulp.listSolvers(onlyAvailable=True) lists those that are")
    return solver


def _pulp_problem(model: MilpArrays, x0, until: float):
    """(the model as a PuLP problem with x0 as its variables' initial values, the variables), or None when building
    it would not end halfway to `until` (perf_counter), leaving as long again for PuLP to write the model out and
    for its solver. PuLP holds a Python object per variable and per term (260,000-340,000 terms a second on 2 cores: the
    3-layer BERT at 50% with the host, 4.8M nonzeros, in 18 s; gpt2-3 at 30%, 619k, in 1.9 s), so ResNet-50's
    model at 50% with the host (21M nonzeros) took some 100 s to pass and a 30 s time limit held no longer.
    Checked before (at _PULP_NNZ_PER_S, refusing what cannot be built in time) and while building."""
    import pulp

    half = time.perf_counter() + (until - time.perf_counter()) / 2     # PuLP then writes it out, about as long
    if model.index.size > _PULP_NNZ_PER_S * (half - time.perf_counter()):
        return None
    prob = pulp.LpProblem("optsched", pulp.LpMinimize)
    make = getattr(prob, "add_variable", None) or pulp.LpVariable
    xs = [make(f"x{j}", lowBound=model.lb[j], upBound=None if math.isinf(model.ub[j]) else model.ub[j],
               cat=pulp.LpInteger if model.integ[j] else pulp.LpContinuous) for j in range(model.ncol)]
    prob += pulp.lpSum(model.cost[j] * xs[j] for j in np.flatnonzero(model.cost).tolist())
    st, idx, val = model.start.tolist(), model.index.tolist(), model.value.tolist()
    for i in range(model.nrow):
        if i % 4096 == 0 and time.perf_counter() > half:
            return None
        expr = pulp.LpAffineExpression([(xs[idx[k]], val[k]) for k in range(st[i], st[i + 1])])
        lo, hi = model.row_lo[i], model.row_hi[i]
        if lo == hi:
            prob += expr == lo
        else:
            if math.isfinite(lo):
                prob += expr >= lo
            if math.isfinite(hi):
                prob += expr <= hi
    if x0 is not None:
        for j, v in enumerate(x0.tolist()):
            xs[j].setInitialValue(round(v) if model.integ[j] else v)
    return prob, xs


_PULP_NNZ_PER_S = 400_000   # above the rates measured


def _pulp_solve(prob, solver, solver_name: str, until: float) -> str | None:
    """PuLP's solve in a worker thread: None when it finished, "time_limit" or "interrupted" when the solver
    process it started was still running at `until` (perf_counter) or at Ctrl-C, and was killed. CBC checks its
    own time limit only between phases (gnmt, 276 operations, at 60% with 2 devices: over 300 s on a 20 s limit,
    inside its root). Its files go to a folder of this call's, removed after it, killed or not. A solver PuLP runs
    inside this process (through a Python API) cannot be killed: the call returns all the same, and that solver
    ends at its own time limit."""
    import tempfile

    import psutil
    import pulp

    me = psutil.Process()
    before = {c.pid for c in me.children(recursive=True)}
    failed: list = []

    def run():
        try:
            prob.solve(solver)
        except BaseException as e:      # raised again in the calling thread unless the solver was stopped
            failed.append(e)

    with tempfile.TemporaryDirectory(prefix="optsched-pulp-") as tmp:
        if hasattr(solver, "tmpDir"):
            solver.tmpDir = tmp
        worker = threading.Thread(target=run, daemon=True)
        worker.start()
        stop = threading.Event()
        if not _join(worker, stop, until, patient=False):
            why = "interrupted" if stop.is_set() else "time_limit"
            # PuLP may still be writing the model out, its solver not yet started: killed as it starts
            end = time.perf_counter() + _GRACE
            while True:
                for c in me.children(recursive=True):
                    with contextlib.suppress(psutil.Error):
                        if c.pid not in before and _started_by(c, solver):
                            c.kill()
                if not worker.is_alive() or time.perf_counter() > end:
                    return why
                worker.join(0.05)
    if failed:
        e = failed[0]
        if isinstance(e, pulp.PulpSolverError):
            raise OptschedError(f"PuLP solver {solver_name!r} failed: {e}",
                                hint="SolveOptions(verbose=True) shows the solver's own output") from None
        raise e
    return None


def _started_by(proc, solver) -> bool:
    """Whether the process runs the solver's program (any new child, for a solver PuLP drives without one)."""
    path = getattr(solver, "path", None)
    if not isinstance(path, str) or not path:
        return True
    cmd = proc.cmdline()
    return bool(cmd) and os.path.basename(cmd[0]) == os.path.basename(path)


pulp_cbc = pulp_solver("PULP_CBC_CMD")
