"""Lower bounds on the step time that hold for every schedule, in or out of the MILP's stage model.

The MILP reports the larger of its solver's dual bound and these: they stand in when its root LP does not finish,
and at tight budgets they beat the LP relaxation, whose fractional keep-or-recompute choices leave a gap that
branch and bound closes slowly.

- chain: the longest dependency chain, each operation at its cheapest device;
- work: the total of those cheapest times spread over the devices, each counted at its best speed relative to
  the cheapest (r[d] = max over operations of cheapest / cost on d: in L seconds d does at most r[d] L of that
  total; a host 20 times slower adds 1/20 of a device, not a whole one);
- recompute (one device computes everything and nothing can be copied off it: Checkmate's problem): every
  computation runs on that device one after another, so the step takes at least the work plus the time of the
  recomputations. Take any operation x and the moment it is first computed. Each ancestor v of x was computed
  before; if something computed later reads v (a descendant of x, or a recomputed ancestor) or v is a required
  result, v is either resident at that moment or computed again afterwards. The resident ones, with x's
  inputs, output and workspace, fit in the budget. The cheapest such choice is a small integer programme (a
  knapsack with precedence), and its HiGHS dual bound, at the operations where keep-everything holds the most,
  bounds the recomputation time of every schedule. The operations neither above nor below x (free: weight
  gradients of layers whose backward is done, say) are computed before x or after it, whichever the schedule
  likes: a 0/1 column each, closed under inputs. One computed before x and read by one computed after, or
  required, is resident at x or computed again, as an ancestor is; without them a schedule could drop at x the
  activations only a weight gradient reads and hold neither them nor the gradient (the transformer at 50% of its
  keep-everything memory: the coupled bound 1.162x -> 1.185x of keep-everything's time, which the MILP's schedule
  reaches; bert at 40%: 1.474x -> 1.487x). An op's other output (`Node.output_of`: a layer norm's statistics)
  is held from the end of its maker's latest run before it, so where the maker is computed before x and not
  again before the output, the output counts as computed before x: otherwise the bound could make it after x
  while holding only the maker, which the simulator does not allow (the transformer at 45%: 1.2241x -> 1.2320x).
  A maker computed once (a random op: attention with dropout) makes it once, so it is before x wherever the
  maker is, in `least_budget`'s programmes too (the transformer: 39.84% -> 40.14% of its keep-everything memory).
- coupled recompute (same setting): the moments x_1, ..., x_k of a chain of those operations, each an ancestor of
  the next (so first computed in that order), taken together. Between two moments the intervals are disjoint, so
  the recomputations in each add up; a value resident at x_{j+1} and computed before x_j was resident at x_j or
  computed again in between (nothing but a computation brings a value back on one device without copies); a value
  first read in the interval ending at x_{m} was resident at x_j or computed again before x_{m}; a recomputation
  in an interval reads inputs resident at its start or computed again within it; a free operation computed before
  x_j is computed before x_{j+1}. Dropping a value at the peak then costs its recomputation and the room it takes
  again later, where the single moment charged only the first (bert at 40% of its keep-everything memory: 1.36x ->
  1.47x of keep-everything's time). Each moment's own bound is a row of it (every schedule recomputes at least
  that much after the moment), so its LP starts at the best single one.
- ordered moments (same setting): the same programme holds for moments in any order consistent with ancestry,
  over the schedules that first compute them in that order (before x_j: the ancestors of x_1..x_j and the
  earlier moments; after it: the later moments and their descendants). Moments neither of which is above the
  other come in some order in every schedule, so the least bound over their orders holds for all (`_orders`, a
  branch and bound over the orders, each a programme with HiGHS cutting off at the target). A moment's own
  bound stays a row only where no later moment lies beside it, whose descendants its own bound may have counted.
  Where GPT-2's GELU backward reads the activations the moment plan recomputes, whichever of its operations comes
  first holds more than the single moment allowed (GPT-2 at 35% of its keep-everything memory: 1.2973x ->
  1.2980x of keep-everything's time, in 18 s over 5 orders of 3 operations). Where they run, the orders start
  with the operation that reads a moment's output beside the most other bytes and need not come before the next
  moment (`_reader`): a weight gradient holds the gradient a moment made together with an activation the chain
  may have dropped (BERT at 40%: the classifier's weight gradient, 1.4868x -> 1.5010x).
- blocking moments (same setting): where a schedule computes a value a third time, the operation first computed
  between the value's drop and that computation where the schedule had least memory to spare, too little to keep
  it (`blocking_moments`), is a moment worth adding to the bound's in each order its ancestry allows: the moment
  at the peak charges the value's recomputation once, the two together twice, where memory is that short in every
  schedule (the transformer at 45% of its keep-everything memory, over lp-rounding's 1.3119x schedule: the first
  layer's ReLU backward and a bias gradient beside the chain's moments, 1.2320x -> 1.2559x of keep-everything's
  time in 5 s).
- grown chains (same setting): before those orders, a chain grows from the best single moment one moment at a
  time, over the operations whose first computation left a schedule the least memory to spare (`tight_moments`,
  `_grow`): where memory binds in the schedule, a moment binds in the bound too, and a few such moments beat a
  long chain near the peak, whose programme HiGHS takes no further than its LP (the transformer at 45%: the
  loss's gradient, each layer's ReLU backward and the attention's gradient sum between them, 1.2559x -> 1.2807x;
  the 3-layer GPT-2 at 25%: 1.3603x -> 1.3983x in the 60 s solve). The operations are taken a tier at a time, the
  next where none of those before raises the bound. Each programme of the growth has a second, and the chains it
  ends with run again until solved, for a few seconds more, where that second stopped them short (the 3-layer
  GPT-2 at 25%: 1.3983x -> 1.4120x); given more seconds (the MILP on large models), the growth reaches the second
  tier there, the last layer's GELU backward, and 1.4454x. Where no tier raises the bound, the moments at which the
  best chain's own optimal point has no room join (`_separated`): GPT-2 at 30%, `add_14`, 1.6829x -> 1.6912x.
- pairs of moments (same setting): where the grown chain still falls short, its optimal point may recompute a
  value between two moments while it holds one from before for an operation y that reads both, and count the
  held one only at the moments. The pair of y's first computation and (u, y, 0), the last computation before y
  of a large ancestor u of what y reads that the point computes again, checks memory there too (`_paired`);
  the pairs whose programmes, with the chain's columns fixed at its point, reach the target in every order cut
  the point off (`_beyond`), and the orders take them; where none does, none runs (`_pair_orders`), unless a
  minute or more is left to the large models' growth: then every pair that cuts the point at all. The
  transformer at 45% of its keep-everything memory: `mm_7`, a weight gradient reading the first layer's ReLU
  backward (held from before `threshold_backward`'s moment) and what the recomputed first layer makes, with
  `relu`'s last computation before it, 1.2807x -> 1.2988x of keep-everything's time, within 1% of the 1.3119x
  schedule, in 4 s.

Only operations that some required result depends on count: a schedule need not compute the others.

The same relaxations prove that no schedule fits: when one has no point at all (what must be resident at some
moment exceeds the budget whatever is recomputed), `recompute` and `floor` are infinite. `least_budget` bisects the
budget for the smallest at which these relaxations have a point, a memory floor far above the largest operation's
(the GPT-2 training graph of 236 operations: 29.9% of its keep-everything memory, against 24.5% for its largest
operation; BERT: 38.8% against 31.8%). It leaves the free operations out: with them each check takes several times
longer, and in the same two seconds the bisection stopped at 24.5% on GPT-2.

Between two moments of a chain, every computation holds its inputs, output and workspace beside what is resident
all along: the values resident at both moments and not computed again between them (on one device, only a
computation brings back a dropped value). Those are the recomputations between them, the first computations of the
next moment's ancestors that come after the previous moment, and those of the free operations in between
(`_between`). The rows seldom raise the bound but slow its programmes, so only `no_fit` takes them: over the moments
where the schedule that came closest overflowed, in every order, they prove what `least_budget` cannot (GNMT at
99% of its keep-everything memory: its last decoder gradient and the output projection both read a 546 MB weight
and come in either order; the one first holds the weight while the other's 413 MB input is made, or that input
beside the other's input: no schedule fits, in 0.6 s).

A moment need not be a first computation. The final computation of a required result w (w, -1) is followed by w
held to the end and never computed again; the last computation of v before it (v, w) by v held until then. Their
order against first computations is known only where a first computation is of an ancestor (or of the same
operation), so `_orders` tries the rest. Whichever of several weight gradients is computed for the last time last,
the others are held from their own final computations on, beside the gradient input it reads and what its other
input is computed again from (`final_moments`, which `no_fit` tries first: the 37-node MLP at 75% of its
keep-everything memory, three 256 kB weight gradients each reading a 1 MB gradient that a 3 MB ReLU backward makes;
no schedule fits, in 0.4 s, where the first computations have a point in every order).

Nor a final one: (u, y, 0) is u's last computation before y's first, u an ancestor of y. Up to y (where the order
has it; else up to the moments before y in every schedule) u is not computed again, so what y reads that descends
from u is held from there, or computed again from what is held. Where a schedule computes u again with little memory
to spare (`tight_moments` with `recomputations`), y the next operation it first computes that u is an ancestor of,
the moment joins the growth of the chain where it lies above or below every moment there, and the orders take such
moments first after `_reader`'s (at most _AGAIN, each with its y among the moments): at BERT's 40% of its
keep-everything memory, GELU's recomputation before the classifier's weight gradient, which reads the last layer
norm's output. There every order that puts it before the loss's gradient has no point, and the others reach the
target: the bound 1.5010x -> 1.5152x of keep-everything's time, within 1% of the schedule's 1.5305x, proven in
the 60 s solve in a quiet hour (its orders take 41-58 s from run to run, their programmes without HiGHS's
sub-MIP heuristics: `_solve`'s `sub_mips`; and the next order takes its moment while the slowest programmes of the
one before still run).

Where many gradients are alike, their orders are too many to try, and `_latest` needs none: of the moments (v, w),
one per weight gradient w of a group, take whichever comes last. Every other gradient of the group was computed
for the last time before it and is held to the end, or is still to come, and then its input is held across it. One
programme per gradient, each with a row per other one, and where none has a point, no schedule fits (the 8-layer
MLP at 60% of its keep-everything memory, 0.1 s; none below 61.72%, where a schedule peaks at 61.84%). `no_fit` tries
it first.
"""

from __future__ import annotations

import bisect
import functools
import os
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from dataclasses import replace

import numpy as np

from ..graph import needed_mask
from ..schedule import Compute, Free
from .apart import Apart
from .milp_model import TIME_SCALE, ModelSpec, rank_of

_CANDIDATES = 24    # operations x tried with the LP (where keep-everything holds the most bytes)
_INTEGER = 4        # of those, the best few solved as integer programmes (their dual bound)
_SECONDS = 2.0      # at most, for the single-moment recompute bound
_MOMENTS = 16       # at most, in the coupled bound's chain
_COUPLED = 3.0      # seconds at most for the coupled bound
_ORDER_NEAR = 0.02  # the orders of moments are tried where the bound is this close to the target (relative)
_BLOCKING = 5.0     # seconds at most for the orders over the blocking moments (`blocking_moments`)
_TRY = 1.0          # seconds at most per programme when growing the chain of moments (`_grow`)
_TIGHT = 12         # operations tried in turn by `_grow` (`tight_moments`), a tier at a time
_SEPARATED_TRY = 12.0  # seconds at most per programme for a moment where the chain's point has no room (`_separated`)
_PAIRED = 8         # operations y whose pairs of moments (y, (u, y, 0)) `_paired` offers
_PAIR_US = 2        # operations u per y there
_PAIRS = 20.0       # seconds at most for those pairs' separation and orders (`_pair_orders`)
_DEEP = 60.0        # seconds left, at least, for the pairs that cut the point short of the target (`deep`)
_AGAIN = 4          # moments (u, y, 0) from `tight` first among those the orders take
_TIERS = 2          # tiers of them: the next joins when the chain stops growing on those before
_GROWING = 5.0      # seconds at most for `_grow`
_FINISH = 5.0       # seconds at most, beyond those, to finish the programmes of the chains `_grow` ends with
_FINALS = 3         # required results whose final computations `no_fit` tries first (`final_moments`)
_FINAL_SHARE = 0.3  # of `no_fit`'s seconds, at most for those (the rest for the tight moments)
_GROUP = 8          # required results, at most, in the group whose latest moment `no_fit` tries before (`_latest`)
_LATEST_SHARE = 0.2  # of `no_fit`'s seconds, at most, for that


def _unheard(value: float) -> None:
    """`rise` where no one listens: the bound search's progress goes nowhere."""


def lower_bounds(spec: ModelSpec, seconds: float = _SECONDS, target: float | None = None,
                 moments: Callable[[], Sequence[int]] | None = None, order_seconds: float = 0.0,
                 stop: threading.Event | None = None, blocking: Callable[[], Sequence[int]] | None = None,
                 blocking_seconds: float = 0.0, tight: Callable[[], Sequence[int]] | None = None,
                 grow_seconds: float | None = None, start: tuple | None = None, until: float | None = None,
                 tell: Callable[[float], None] | None = None) -> dict:
    """{"chain", "work", "recompute", "at", "floor", "grown"}: seconds every schedule of the graph on the model's
    devices needs (see the module docstring); recompute is None where it does not apply and infinite where no
    schedule fits, `at` the indices of the operations it came from (one, or the coupled bound's moments in the
    order of the weakest; None when no recomputation is forced), floor the largest; "grown" the chain of moments
    before any orders, (its bound in model time, its moments), or None.
    `target` (seconds): the coupled bound is not tried when the single moments already reach it. Where the bound
    falls short of it by less than _ORDER_NEAR, the coupled programme over the moments in every order (`_orders`)
    takes `moments()` (operation indices, most promising first: `order_moments`; called only then) for up to
    `order_seconds`; where the bound falls further short, or those are not given, the orders over `blocking()`
    (`blocking_moments`) take up to `blocking_seconds` (at most _BLOCKING). Before the latter, the chain grows by
    moments from `tight()` (`tight_moments`; `_grow`) for up to _GROWING of those seconds, and the orders start
    from it; `grow_seconds`, where given, replaces _GROWING and _FINISH: half of it for the growth, the rest to
    finish the programme of the chain it ends with (within `blocking_seconds`). `start`: an earlier call's "grown"
    over the same spec, where the chain grows from when it beats the best single moment: grown again from that
    moment, the chain need not get back there (GPT-2 at 30% of its keep-everything memory with a time limit of
    180 s: the growth beside the LP ends at 1.6829x of keep-everything's time in 6 s; grown again from the single
    moment, the chain was no higher after 69 s, and the pairs' orders over it reached 1.6978x; from the first
    chain, 1.7239x). `until` (perf_counter): nothing runs past it, whatever its seconds (the orders' count from
    where they start, after the single moments and the coupled bound: a 20 s solve of the 3-layer GPT-2 at 30% of
    its keep-everything memory took 23 s, a 5 s one at 25% 8.6 s); the single moments' LPs are solved all the
    same. `tell(seconds)`: called, from any thread, with the floor so far each time the recompute bound rises
    (after the single moments, the coupled chain, each chain the growth finds, each rise of the weakest order),
    so that live progress shows a bound while the orders run: BERT at 40% of its keep-everything memory showed
    none for the 48 s of its orders. A Ctrl-C (or `stop` set) ends them with the bound so far, `stop` set."""
    needed = _needed(spec)
    runnable = ~np.isnan(spec.ccost)
    cheapest = np.where(runnable, spec.ccost, np.inf).min(axis=0, initial=np.inf)
    cheapest[~np.isfinite(cheapest) | ~needed] = 0.0
    done = np.zeros(spec.n)
    for v in spec.order.tolist():
        ins = spec.in_idx[spec.in_ptr[v]:spec.in_ptr[v + 1]]
        done[v] = cheapest[v] + (done[ins].max() if ins.size else 0.0)
    with np.errstate(divide="ignore", invalid="ignore"):     # free operations add nothing to the total
        rel = np.where(runnable & (spec.ccost > 0), cheapest[None, :] / spec.ccost, 0.0)
    speed = float(rel.max(axis=1, initial=0.0).sum())
    work = float(cheapest.sum()) / speed if speed > 0 else 0.0
    out = {"chain": float(done.max(initial=0.0)) / TIME_SCALE, "work": work / TIME_SCALE, "recompute": None,
           "at": None, "grown": None}
    d = _sole_device(spec, needed)
    if d is not None:
        reach = None if target is None else target * TIME_SCALE - float(cheapest.sum())
        rise = _unheard
        if tell is not None:
            def rise(extra: float) -> None:     # model time recomputed -> the floor in seconds
                if np.isfinite(extra):
                    tell(max(out["chain"], out["work"], (float(cheapest.sum()) + extra) / TIME_SCALE))
        extra, out["at"], out["grown"] = _recompute(spec, d, needed, seconds, reach, float(cheapest.sum()), moments,
                                                    order_seconds, stop, blocking, blocking_seconds, tight,
                                                    grow_seconds, start, until, rise)
        out["recompute"] = (float(cheapest.sum()) + extra) / TIME_SCALE
    out["floor"] = max(v for k, v in out.items() if k in ("chain", "work", "recompute") and v is not None)
    return out


def least_budget(spec: ModelSpec, seconds: float = _SECONDS, if_over: bool = False) -> int | None:
    """Bytes of the sole device (see `_sole_device`) below which no schedule fits: the smallest budget, to within
    0.1%, at which the integer programme of every candidate moment, and the coupled one over the chain through the
    first, has a point (each is infeasible at every smaller budget too; one not proven infeasible within
    `seconds` counts as feasible). None where the recompute bound does not apply, or where the spec's budget
    cannot hold some operation (its cost is then missing: `nofit` reports that). About a second on graphs of
    300 operations. `if_over`: also None when the spec's own budget is not proven too small (one check there
    first, a fraction of that time)."""
    needed = _needed(spec)
    d = _sole_device(spec, needed)
    if d is None:
        return None
    t0 = time.perf_counter()
    dst = np.repeat(np.arange(spec.n), np.diff(spec.in_ptr))
    cands = _candidates(spec, needed, dst).tolist()
    anc = {x: _reach(spec.in_ptr, spec.in_idx, x, spec.n) for x in cands}
    chain = _chain(spec, cands[0], cands, anc) if cands else []
    budget = spec.budget.copy()

    def feasible(problem) -> bool:      # not proven infeasible, that is
        left = seconds - (time.perf_counter() - t0)
        return not np.isinf(_solve((np.zeros_like(problem[0]), *problem[1:]), True, left))

    def fits(b: int) -> bool:
        budget[d] = b
        at = replace(spec, budget=budget)
        for x in cands:
            programme = _at(at, d, x, needed, dst, anc[x], free=False)
            if programme is not None and not feasible(programme[0]):     # None: x has no ancestors
                return False
        return len(chain) < 2 or feasible(_coupled(at, d, chain, needed, dst, anc, {}, free=False)[0])

    ops = _op_need(spec, dst)     # each operation a schedule must compute holds these at once
    lo, hi = int(ops[needed].max(initial=0)) - 1, int(spec.nbytes.sum() + spec.ws.max(initial=0))
    if if_over:
        if fits(int(spec.budget[d])):
            return None
        lo = max(lo, int(spec.budget[d]))
    if lo < 0 or fits(lo + 1):
        return lo + 1
    # up from lo in steps that grow fourfold, then halving: a check below the answer ends at the first programme
    # without a point, one above it solves them all. Halving from the total bytes spent most checks above it: a
    # 30-operation graph from 45% of its keep-everything memory, the answer at 48%, took 1.7-2.0 s of its 2 s (252
    # of its 257 programmes above the answer), cut short under load, so the budget it proved varied run to run
    # (0.25% lower); 175 programmes, 1.3 s, this way. BERT at 35%: 1.25 s -> 0.8 s, the 3-layer GPT-2 at 20%:
    # 1.6 s -> 1.1 s, the same budgets to within 0.1%
    step = max(1, lo // 50)
    while lo + step < hi and time.perf_counter() - t0 < seconds:
        if fits(lo + step):
            hi = lo + step
            break
        lo, step = lo + step, 4 * step
    while hi - lo > max(1, hi // 1000) and time.perf_counter() - t0 < seconds:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if fits(mid) else (mid, hi)
    return lo + 1


def no_fit(spec: ModelSpec, ids, instructions, seconds: float, stop: threading.Event | None = None,
           upto: int | None = None) -> tuple[tuple, int, bool] | None:
    """(moments that prove no schedule on the sole device fits its budget, the budget below which nothing fits,
    whether the proof is the latest of them (`_latest`) rather than all in every order),
    or None where that is not proven within `seconds` (or `stop` is set). The moments are taken in every order
    their ancestry allows (`_orders`), in the coupled programme with the memory of the computations between moments
    (`_between`); where it has no point in any order, no schedule fits. First, for up to _LATEST_SHARE of the
    seconds, the latest of the moments where a weight gradient's input is computed for the last time before it
    (`_latest`: no orders, one programme per gradient; the 8-layer MLP at 60% of its keep-everything memory in
    0.1 s); then, for up to _FINAL_SHARE, the final computations of the largest weight gradients and the last
    computations of their inputs before them (`final_moments`); then the tight moments of `instructions`, the
    schedule that came closest (over the budget: `tight_moments`, where it had least memory to spare or
    overflowed). The third item of the result says which: True for the first. These find what
    `least_budget`'s moments, taken one at a time or along one chain, miss: GNMT at 99% of its keep-everything
    memory, where a 546 MB weight is read by two operations neither of which is an ancestor of the other (0.6 s),
    the CNN at 65%, and the 37-node MLP at 75%. `upto` (bytes, a budget at which a schedule was found): the budget
    is then raised by bisection, over the same moments, while the proof holds, in the seconds left."""
    needed = _needed(spec)
    d = _sole_device(spec, needed)
    if d is None:
        return None
    t0 = time.perf_counter()
    stop = stop or threading.Event()
    dst = np.repeat(np.arange(spec.n), np.diff(spec.in_ptr))

    def proof(ms: list, b: int, until: float, anc: dict) -> tuple | None:
        budget = spec.budget.copy()
        budget[d] = b
        val, at = _orders(replace(spec, budget=budget), d, needed, dst, anc, {}, (0.0, (ms[0],)), ms[1:],
                          None, until - time.perf_counter(), stop, between=True)
        return at if np.isinf(val) else None

    def latest(ms: list, b: int, until: float, anc: dict) -> tuple | None:
        group = _latest(spec, d, needed, dst, ms, b, anc, until, stop)
        return None if group is None else tuple(group)

    lo = int(spec.budget[d])
    for ms, share, check in ((_heavy_inputs(spec, needed, dst, _GROUP), _LATEST_SHARE, latest),
                             (final_moments(spec, needed, dst), _LATEST_SHARE + _FINAL_SHARE, proof),
                             (tight_moments(spec, ids, instructions), 1.0, proof)):
        if len(ms) < 2:
            continue
        anc = {ms[0]: _reach(spec.in_ptr, spec.in_idx, _op(ms[0]), spec.n)}
        at = check(ms, lo, t0 + share * seconds, anc)
        if at is None:
            continue
        hi = upto if upto is not None and upto > lo else lo + 1
        while hi - lo > max(1, hi // 1000) and time.perf_counter() - t0 < seconds and not stop.is_set():
            mid = (lo + hi) // 2
            more = check(ms, mid, t0 + seconds, anc)
            lo, hi, at = (mid, hi, more) if more is not None else (lo, mid, at)
        return at, lo + 1, check is latest
    return None


def _op_need(spec: ModelSpec, dst: np.ndarray) -> np.ndarray:
    """Per operation, its inputs, output and workspace in bytes (`dst[e]` reads the input `spec.in_idx[e]`)."""
    return np.bincount(dst, weights=spec.nbytes[spec.in_idx], minlength=spec.n) + spec.nbytes + spec.ws


def final_moments(spec: ModelSpec, needed: np.ndarray, dst: np.ndarray) -> list[tuple[int, int]]:
    """`no_fit`'s second moments: for the _FINALS largest required results that nothing reads and that are computed,
    not loaded (weight gradients), the final computation (w, -1) and the last computation before it of the input
    whose computation holds the most (its inputs, output and workspace: the gradient a ReLU backward makes, not
    the activation). Whichever of them is computed last, that input is made there beside the others, held since
    their own final computations, and beside what its other input is computed again from (the 37-node MLP at 75%
    of its keep-everything memory: three 256 kB weight gradients, each reading a 1 MB gradient that a 3 MB ReLU
    backward makes; no schedule fits, proven in 0.4 s, where the moments at first computations have a point in
    every order)."""
    return [m for v, w in _heavy_inputs(spec, needed, dst, _FINALS) for m in ((w, -1), (v, w))]


def _heavy_inputs(spec: ModelSpec, needed: np.ndarray, dst: np.ndarray, count: int) -> list[tuple[int, int]]:
    """(v, w) for the `count` largest required results w that nothing reads and that are computed, not loaded
    (weight gradients), v the input of w, computed too, whose computation holds the most (its inputs, output and
    workspace): the moment (v, w), v's last computation before w's final one."""
    ops = _op_need(spec, dst)
    grads = np.flatnonzero(spec.required & needed & ~spec.once & (np.diff(spec.out_ptr) == 0))
    out = []
    for w in grads[np.argsort(-spec.nbytes[grads], kind="stable")][:count].tolist():
        ins = np.unique(spec.in_idx[spec.in_ptr[w]:spec.in_ptr[w + 1]])
        ins = ins[~spec.once[ins]]
        if ins.size:
            out.append((int(ins[np.argmax(ops[ins])]), w))
    return out


def _latest(spec: ModelSpec, d: int, needed: np.ndarray, dst: np.ndarray, pairs: list[tuple[int, int]], b: int,
            anc: dict, until: float, stop: threading.Event) -> list[tuple[int, int]] | None:
    """The pairs (v, w) of `pairs` (`_heavy_inputs`) that prove no schedule fits at budget b, or None where that is
    not proven by `until` (perf_counter). In a schedule, take the pair whose moment (v, w), v's last computation
    before w's final one, comes last. Every other pair (v', w') had its moment before: so w' was computed for
    the last time before it and is held from then to the end, or it is not yet, and then v' is held from its
    moment to w''s final computation, across this one. So the coupled programme over (v, w), (w, -1), with a row
    s[w'] + s[v'] >= 1 at (v, w) per other pair (none where v' is v), holds for that schedule; where it has no
    point for any pair of the group, no schedule fits. No orders: one programme per pair (the 8-layer MLP at 60%
    of its keep-everything memory: seven weight gradients, each 256 kB, read with a 1 MB gradient that a 3 MB ReLU
    backward makes; whichever comes last holds the other six or their inputs beside it, 7.62 MB against the
    7.41 MB budget; proven in 0.1 s, where the orders of `final_moments` found nothing in 60 s). A pair whose
    programme has a point leaves the group, and the rest are tried again with one row fewer, until every
    programme left has none (the proof) or fewer than two pairs are left."""
    budget = spec.budget.copy()
    budget[d] = b
    at = replace(spec, budget=budget)
    group = list(pairs)
    built = {}      # pair -> its programme and columns, without the group's rows (the same in every round)
    while len(group) >= 2:
        out = []
        for v, w in group:
            left = until - time.perf_counter()
            if left <= 0 or stop.is_set():
                return None
            if (v, w) not in built:
                chain = [(v, w), (w, -1)]
                _ancestors(spec, anc, chain)
                built[(v, w)] = _coupled(at, d, chain, needed, dst, anc, {}, between=True)
            problem, (S, _, _) = built[(v, w)]
            rows = [(S[0, w2], S[0, v2]) for v2, w2 in group if w2 != w and v2 != v]
            problem = _with_rows(problem, [r for r in rows if min(r) >= 0], 1.0)
            if not np.isinf(_solve((np.zeros_like(problem[0]), *problem[1:]), True, left, stop=stop)):
                out.append((v, w))
        if not out:
            return group
        group = [p for p in group if p not in out]
    return None


def _with_rows(problem, rows: list, low: float):
    """The programme (`_coupled`'s arrays) with a row per tuple of columns: their sum at least `low`."""
    cost, lb, ub, lo, hi, start, idx, val = problem
    cols = np.array([c for r in rows for c in r], dtype=np.int64)
    ends = start[-1] + np.cumsum([len(r) for r in rows], dtype=np.int64)
    return (cost, lb, ub, np.concatenate([lo, np.full(len(rows), low)]),
            np.concatenate([hi, np.full(len(rows), np.inf)]), np.concatenate([start, ends]),
            np.concatenate([idx, cols]), np.concatenate([val, np.ones(cols.size)]))


def moment_plans(spec: ModelSpec, count: int = _INTEGER, seconds: float = _SECONDS,
                 chain_seconds: float = 0.0) -> tuple[list[list[tuple[int, np.ndarray]]], float]:
    """([plan], seconds every schedule needs), a plan being [(moment x, the operations to drop at x)]: the points
    of the recompute bound's integer programme at the `count` candidate moments whose LP values are largest,
    most first, one moment each, dropping what they compute again after it; then, with `chain_seconds`, the
    coupled programme's optimal point over the chain of moments through the best of them, where it proves more
    than they do, dropping at each moment what it does not hold there (where one moment's plan drops at the peak what
    later moments lack room to keep: bert at 40% of its keep-everything memory, 1.5305x of its time repaired
    and polished, where no single moment's plan can be repaired; dropping only what it computes again after
    each moment, none can either); and the bound they prove (the work plus the largest dual bound). Seeds for
    real schedules (`rounding.lp_rounding` repairs them in the simulator), which then start close to the bound.
    ([], 0) where the recompute bound does not apply."""
    needed = _needed(spec)
    d = _sole_device(spec, needed)
    if d is None:
        return [], 0.0
    t0 = time.perf_counter()
    dst = np.repeat(np.arange(spec.n), np.diff(spec.in_ptr))
    lp, anc = _ranked(spec, d, needed, dst, seconds)
    out, extra = [], 0.0
    single = {x: val for val, x, _ in lp}
    for k, (val, x, (problem, cols)) in enumerate(lp[:count]):
        if not 0 < val < np.inf:
            continue
        left = seconds - (time.perf_counter() - t0)
        bound, z = _solve(problem, True, max(left, 0.01) / (min(count, len(lp)) - k), point=True)
        extra, single[x] = max(extra, bound), max(val, bound)
        if z is not None:
            r = cols[1][0]
            v = np.flatnonzero(r >= 0)
            out.append([(x, v[z[r[v]] > 0.5])])
    coupled = _through_best(spec, d, needed, dst, anc, single) if chain_seconds > 0 and out else None
    if coupled is not None:
        chain, problem, cols = coupled
        bound, z = _solve(problem, True, chain_seconds, point=True)
        # only an optimal point: one cut off by the time limit depends on the machine's speed, and so would the
        # schedule (on a 40-node random graph the programme's root takes over 5 s)
        optimal = z is not None and float(problem[0] @ z) <= bound * (1 + 1e-6) + 1e-9
        if optimal and bound > extra * (1 + 1e-6):
            S = cols[0]
            out.append([(x, np.flatnonzero((S[j] >= 0) & (z[S[j]] < 0.5))) for j, x in enumerate(chain)])
        extra = max(extra, bound)
    return out, (float(np.nan_to_num(spec.ccost[d, needed]).sum()) + extra) / TIME_SCALE


def _replay(spec: ModelSpec, ids, instructions, at_last_read: bool = False):
    """Per computation or drop in a schedule on the sole device, in its order: (the value, the memory left to spare
    at its computation (budget less what is resident, its output and its workspace), or None for a drop).
    `at_last_read`: a drop takes effect right after the value's last reader before it, as the simulator releases
    it (the drops of a rounding's schedule come late in its list, up to 8 MB of the 3-layer GPT-2's at 25%)."""
    d = _sole_device(spec, _needed(spec))
    if d is None:
        return
    index = {v: i for i, v in enumerate(ids)}
    steps = [(index[x.node], isinstance(x, Free)) for x in instructions if isinstance(x, (Compute, Free))]
    at = list(range(len(steps)))            # where each step takes effect, a drop after the computation there
    if at_last_read:
        last: dict[int, int] = {}
        for i, (v, drop) in enumerate(steps):
            if drop:
                at[i] = last.get(v, i)
            else:
                last[v] = i
                for u in spec.in_idx[spec.in_ptr[v]:spec.in_ptr[v + 1]].tolist():
                    last[u] = i
    resident = np.zeros(spec.n, dtype=bool)
    held = 0
    for i in sorted(range(len(steps)), key=lambda i: (at[i], steps[i][1], i)):
        v, drop = steps[i]
        if drop:
            if resident[v]:
                resident[v] = False
                held -= int(spec.nbytes[v])
                yield v, None
            continue
        resident[v] = True
        held += int(spec.nbytes[v])
        yield v, float(spec.budget[d]) - held - float(spec.ws[v])


def _comebacks(spec: ModelSpec, ids, instructions):
    """Per computation of a value a third time or more in a schedule on the sole device, after a drop: (the value,
    the operations first computed since its last drop (-1 for recomputations), the memory each left to spare
    (`_replay`), the computations of each operation so far)."""
    count = np.zeros(spec.n, dtype=np.int64)
    dropped = {}
    spare, first = [], []       # per computation: memory to spare at it, the operation if computed the first time
    for v, room in _replay(spec, ids, instructions):
        if room is None:
            dropped[v] = len(first)
            continue
        spare.append(room)
        first.append(v if not count[v] else -1)
        count[v] += 1
        if count[v] >= 3 and v in dropped:
            yield v, first[dropped[v]:-1], spare[dropped[v]:-1], count


def tight_moments(spec: ModelSpec, ids, instructions, recomputations: bool = False) -> list:
    """The _TIGHT * _TIERS operations whose first computation left a schedule on the sole device the least memory
    to spare (`_replay`), least first: where memory binds in the schedule, moments of the bound bind too (`_grow`).
    `recomputations`: then, as many more, the moments (u, y, 0), u's last computation before y's first, where the
    schedule's computation of u again left it the least to spare, y the next operation it first computes that u is
    an ancestor of; after the others, so that `_grow` takes them only where those stop raising the bound (among
    them, they pushed out the operations GPT-2 at 30% of its keep-everything memory grows its chain with: 1.6481x
    -> 1.6235x of keep-everything's time)."""
    room: dict[int, float] = {}
    steps = [(v, spare) for v, spare in _replay(spec, ids, instructions, at_last_read=True) if spare is not None]
    firsts, again = [], []      # the steps that compute an operation for the first time, and those that do again
    for k, (v, spare) in enumerate(steps):
        (again if v in room else firsts).append(k)
        room.setdefault(v, spare)
    befores: list[tuple[int, int, int]] = []
    if recomputations:
        made = np.array([steps[f][0] for f in firsts], dtype=np.int64)
        for k in sorted(again, key=lambda k: steps[k][1]):      # least to spare first
            if len(befores) == _TIGHT * _TIERS:
                break
            v = steps[k][0]
            later = made[bisect.bisect_right(firsts, k):]
            later = later[_reach(spec.out_ptr, spec.out_idx, v, spec.n)[later]]
            if later.size and (v, int(later[0]), 0) not in befores:
                befores.append((v, int(later[0]), 0))
    return sorted(room, key=room.__getitem__)[:_TIGHT * _TIERS] + befores


def order_moments(spec: ModelSpec, ids, instructions) -> list[int]:
    """Operations worth ordering (`lower_bounds`' `moments`), from a schedule on the sole device: where it computes
    a value a third time or more, it dropped the value again because memory was short in between, so the
    operations first computed between that drop and the next computation which read the value (through others)
    and read a value computed again are where the bound's moment plan overflows too (GPT-2 at 35% of its
    keep-everything memory: the GELU backward of each layer, whose operations no ancestry orders). In the
    schedule's order, each once, those nothing reads last."""
    out, seen = [], set()
    for v, since, _, count in _comebacks(spec, ids, instructions):
        desc = _reach(spec.out_ptr, spec.out_idx, v, spec.n)
        for w in since:
            if (w >= 0 and desc[w] and w not in seen
                    and (count[spec.in_idx[spec.in_ptr[w]:spec.in_ptr[w + 1]]] > 1).any()):
                seen.add(w)
                out.append(w)
    # operations nothing reads (weight gradients) last: they come in no order with the rest, so they multiply the
    # orders without raising the bound (GPT-2 at 35%, `mm_4` first: 3 programmes, 15 s, no gain)
    return sorted(out, key=lambda w: spec.out_ptr[w + 1] == spec.out_ptr[w])


def blocking_moments(spec: ModelSpec, ids, instructions) -> list[int]:
    """Operations at which a schedule on the sole device had too little memory to keep a value it computes a third
    time or more (`lower_bounds`' `blocking`): per such computation, of the operations first computed between the
    value's last drop and it, the one where budget less what is resident, its output and its workspace is least,
    if that is below the value's bytes; least first, each once. A moment there, with the bound's own, charges the
    third computation, which the bound's moment alone leaves free (the transformer at 45% of its keep-everything
    memory, lp-rounding's schedule: the first layer's ReLU backward and a bias gradient, 1.2320x -> 1.2559x of
    keep-everything's time)."""
    out: dict[int, float] = {}
    for v, since, spare, _ in _comebacks(spec, ids, instructions):
        short = [(s, w) for s, w in zip(spare, since, strict=True) if w >= 0 and s < spec.nbytes[v]]
        if short:
            s, w = min(short)
            out[w] = min(out.get(w, s), s)
    return sorted(out, key=out.__getitem__)


def _ranked(spec: ModelSpec, d: int, needed: np.ndarray, dst: np.ndarray, seconds: float) -> tuple[list, dict]:
    """([(LP value, x, `_at`'s (programme, columns))] over the candidate moments, largest first; {x: x's
    ancestors}), the candidates taken in turn for about half of `seconds`."""
    t0 = time.perf_counter()
    lp, anc = [], {}
    for x in _candidates(spec, needed, dst).tolist():
        if time.perf_counter() - t0 > seconds / 2:
            break
        anc[x] = _reach(spec.in_ptr, spec.in_idx, x, spec.n)
        programme = _at(spec, d, x, needed, dst, anc[x])
        if programme is not None:
            lp.append((_solve(programme[0], False, seconds), x, programme))
    lp.sort(key=lambda z: -z[0])
    return lp, anc


def _needed(spec: ModelSpec) -> np.ndarray:
    """Operations some required result depends on (or required themselves)."""
    return needed_mask(spec.required, spec.order, spec.in_ptr, spec.in_idx)


def _sole_device(spec: ModelSpec, needed: np.ndarray) -> int | None:
    """The model device that computes everything when no other computes anything and no copy leaves it."""
    devs = np.flatnonzero(~np.isnan(spec.ccost).all(axis=1))
    if devs.size != 1 or np.isnan(spec.ccost[devs[0]][needed]).any():
        return None
    d = int(devs[0])
    if any(src == d for _, src, _ in spec.links):
        return None
    return d


def _reach(ptr: np.ndarray, idx: np.ndarray, start: int, n: int) -> np.ndarray:
    """Nodes reachable from `start` along the CSR adjacency (ptr, idx), `start` excluded."""
    seen = np.zeros(n, dtype=bool)
    front = np.array([start], dtype=np.int64)
    while front.size:
        counts = ptr[front + 1] - ptr[front]
        if not counts.sum():
            break
        offs = np.arange(counts.sum()) - np.repeat(np.cumsum(counts) - counts, counts)
        nxt = idx[np.repeat(ptr[front], counts) + offs]
        nxt = np.unique(nxt[~seen[nxt]])
        seen[nxt] = True
        front = nxt
    return seen


def _ancestors(spec: ModelSpec, anc: dict, moments) -> None:
    """Adds to `anc` the ancestors of each moment's operation (`_op`) that it lacks: found once per moment."""
    for m in moments:
        if m not in anc:
            anc[m] = _reach(spec.in_ptr, spec.in_idx, _op(m), spec.n)


def _candidates(spec: ModelSpec, needed: np.ndarray, dst: np.ndarray) -> np.ndarray:
    """The operations at which keeping everything (in the model's order) holds the most bytes; `dst[e]` reads
    the input `spec.in_idx[e]`."""
    n, order = spec.n, spec.order
    rank = np.empty(n, dtype=np.int64)
    rank[order] = np.arange(n)
    last = np.full(n, -1, dtype=np.int64)
    np.maximum.at(last, spec.in_idx, rank[dst])
    last = np.where(spec.required, n, last)
    held = last > rank
    diff = np.zeros(n + 2)
    np.add.at(diff, rank[held] + 1, spec.nbytes[held])
    np.add.at(diff, last[held] + 1, -spec.nbytes[held])
    score = np.cumsum(diff)[:n] + spec.nbytes[order] + spec.ws[order]
    best = np.argsort(-score, kind="stable")
    best = best[needed[order[best]]]      # a schedule computes the others, if at all, whenever it likes
    return order[best[:_CANDIDATES]]


def _recompute(spec: ModelSpec, d: int, needed: np.ndarray, seconds: float, reach: float | None, work: float = 0.0,
               moments=None, order_seconds: float = 0.0, stop: threading.Event | None = None, blocking=None,
               blocking_seconds: float = 0.0, tight=None, grow_seconds: float | None = None,
               start: tuple | None = None, until: float | None = None,
               rise: Callable[[float], None] = _unheard) -> tuple[float, tuple | None, tuple | None]:
    """(model time every schedule spends recomputing, at least; the moments it was found at; the chain of moments
    before any orders, with its bound), or (0, None, None).
    The orders start with `_reader`'s operation and the moments (u, y, 0) of `tight` whose y is a moment already.
    `start` (value, moments), where larger than the best single moment's, stands for it and for the coupled
    bound, and the chain grows from it. `reach`: the coupled bound is skipped when a single moment gets there;
    when it falls short, the orders over
    `moments` (`_orders`, for `order_seconds`) are tried where the bound plus `work` is within _ORDER_NEAR of it
    plus `work` (model time), else those over `blocking` (for `blocking_seconds`): on the 3-layer GPT-2 at 30% of
    its keep-everything memory, 5 s of them first left the orders over `moments` 0.02% short of the proof. Either
    way `_reader`'s operation comes first, but only where there are moments to order (on a 40-layer random graph
    at 50%, where there are none, it alone took the 5 s that the models without gap stages needed). Before the
    orders over `blocking`, `_grow` adds moments from `tight` to the chain, for up to _GROWING of their seconds
    (not before those over `moments`: on the 3-layer GPT-2 at 30% they then fell 0.02% short of the proof), and
    up to _FINISH more of them where its last chain's programme is not solved yet (half of `grow_seconds` each,
    where given); where the grown chain falls short, the orders over the pairs of moments that cut off its point
    (`_pair_orders`) take up to _PAIRS more, or, with `grow_seconds` and at least _DEEP of `blocking_seconds`
    left, all that is left of them; the orders over `blocking` take at most _BLOCKING seconds less what those
    took. `rise(value)` is told each larger bound as it comes (`lower_bounds`' `tell`)."""
    t0 = time.perf_counter()
    if until is not None:
        seconds = min(seconds, max(until - t0, 0.0))
    tight = functools.cache(tight) if tight is not None else None     # the growth and the orders both take it
    dst = np.repeat(np.arange(spec.n), np.diff(spec.in_ptr))     # the reader of each input edge
    lp, anc = _ranked(spec, d, needed, dst, seconds)
    single = {}                         # x -> what every schedule recomputes after x's first computation
    for k, (val, x, (problem, _)) in enumerate(lp):
        if k < _INTEGER and time.perf_counter() - t0 < seconds:
            val = max(val, _solve(problem, True, max(seconds - (time.perf_counter() - t0), 0.01) / (_INTEGER - k)))
        single[x] = val
    if not single:
        return 0.0, None, None
    top = max(single, key=single.get)
    best, at = single[top], (top,)
    origin = (best, at) if start is None or start[0] <= best else start     # where the chain grows from
    if origin is start:
        best, at = start        # its call tried the coupled bound already, and kept the larger
        _ancestors(spec, anc, at)   # its moments need not be among this call's candidates
    elif best > 0 and (reach is None or best < reach):
        coupled = _through_best(spec, d, needed, dst, anc, single)
        if coupled is not None:
            chain, problem, _ = coupled
            val = _solve(problem, True, _COUPLED if until is None else min(_COUPLED, until - time.perf_counter()))
            if val > best * (1 + 1e-9):
                best, at = val, tuple(chain)
    rise(best)
    grown = (best, at)      # the chain before any orders
    if reach is None or not 0 < best < reach:
        return best, at, grown
    stop = stop or threading.Event()
    cutoff = reach + 1e-7 * (work + reach)      # a hair above, so that reaching it proves a gap despite rounding
    if until is not None:
        left = until - time.perf_counter()
        order_seconds, blocking_seconds = min(order_seconds, left), min(blocking_seconds, left)

    def near() -> bool:     # the orders over `moments` have seconds left and the bound is within _ORDER_NEAR
        return moments is not None and order_seconds > 0 and work + best >= (1 - _ORDER_NEAR) * (work + reach)

    if tight is not None and blocking_seconds > 0 and not near():   # near, the orders' seconds are theirs alone
        t1 = time.perf_counter()
        growing, finish = (_GROWING, _FINISH) if grow_seconds is None else (grow_seconds / 2, grow_seconds / 2)
        best, at = grown = max(grown, _grow(spec, d, needed, dst, anc, single, origin, tight(), cutoff,
                                            min(growing, blocking_seconds), stop,
                                            min(finish, max(blocking_seconds - growing, 0.0)), rise),
                                  key=lambda v: v[0])
        if best < reach:
            left = blocking_seconds - (time.perf_counter() - t1)
            deep = grow_seconds is not None and left >= _DEEP
            best, at = _pair_orders(spec, d, needed, dst, anc, single, (best, at), cutoff,
                                    left if deep else min(_PAIRS, left), stop, deep, rise)
        spent = time.perf_counter() - t1
        order_seconds, blocking_seconds = order_seconds - spent, min(blocking_seconds, _BLOCKING) - spent
        if not best < reach:
            return best, at, grown
    if near():
        ms, seconds = moments, order_seconds
    elif blocking is not None and blocking_seconds > 0:
        ms, seconds = blocking, blocking_seconds
    else:
        return best, at, grown
    ms = list(ms())
    if not ms:          # the fastest schedule computed nothing a third time: no orders
        return best, at, grown
    head = _reader(spec, needed, at, anc)
    known = set(at) | set(head)     # a moment (u, y, 0) restricts u only up to y, where the chain has y
    again = [m for m in tight() if _last_before(m) and m[1] in known][:_AGAIN] if tight is not None else []
    ms = list(dict.fromkeys(head + again + ms))
    return *_orders(spec, d, needed, dst, anc, single, (best, at), ms, cutoff, seconds, stop, rise=rise), grown


def _grow(spec: ModelSpec, d: int, needed: np.ndarray, dst: np.ndarray, anc: dict, single: dict,
          start: tuple[float, tuple[int, ...]], cands: Sequence[int], reach: float, seconds: float,
          stop: threading.Event, finish: float = 0.0,
          rise: Callable[[float], None] = _unheard) -> tuple[float, tuple[int, ...]]:
    """(model time every schedule recomputes, at least; the chain of moments it was found at): the chain of `start`
    (its bound, its moments) grown one moment at a time. Each of `cands` (`tight_moments`) that comes before or
    after every moment in every schedule (`_precedes`) is tried in its place (the coupled programme, at most _TRY
    seconds, a core each); the one whose dual bound is largest joins, until none raises the bound, it reaches
    `reach`, `seconds` pass or `stop` is set; then the next tier of `cands` (_TIGHT each) joins, where there is one.
    When the last tier raises nothing either, the chain grows once more from `start` with every tier at once: the
    moments that joined first were chosen from the first tiers only.
    Where the _TRY seconds stopped the programme of the best chain short of its optimum, it runs again, and so do
    those of the chains it grew from that stopped short too, the latest first, a core each (the last one on every
    core where it is alone), for what is left of `seconds` and up to `finish` more (the 3-layer GPT-2 at 25% of
    its keep-everything memory: 1.3983x -> 1.4120x of keep-everything's time, the programme solved in 3.3 s): the
    best chain is not always the one solved in time. Not the last chains grown: a growth begun again from `start`
    grows others (there, with a time limit of 180 s, those left the best chain unfinished: 1.4154x; finished,
    1.4676x).
    Each chain's dual bound holds for every schedule, so the largest is the bound. A few moments where memory binds
    beat a long chain: `_chain` takes the operations where keep-everything holds the most, all near the peak, and
    over 16 moments HiGHS gets no further than the LP (the transformer at 45% of its keep-everything memory: the
    ReLU backward of each layer and the attention's gradient sum between them, with the loss's, 1.2559x -> 1.2807x
    of keep-everything's time). `rise(value)` is told each larger bound as it comes."""
    t0 = time.perf_counter()
    best, chain = start
    top = start                                 # the largest bound so far, and its chain
    back = False                                # the chain grew again from its start, with every tier, once
    unsolved: list[tuple[int, ...]] = []        # the chains grown whose try stopped short of the optimum
    rank = rank_of(spec)

    def place(m) -> float:      # a chain's moments in order: (u, y, 0) just before y
        return rank[m] if not isinstance(m, tuple) else rank[m[1]] - 0.5

    cands = [y for y in cands if needed[_op(y)]]
    _ancestors(spec, anc, cands)
    tier, failed = _TIGHT, set()      # how many of cands are tried (a tier at a time); those that raised nothing
    short, looked = set(), set()      # moments where a chain's point has no room (`_separated`); chains looked at

    def bound(y: int) -> tuple[float, bool]:
        left = seconds - (time.perf_counter() - t0)
        if left <= 0 or stop.is_set():
            return 0.0, True
        problem = _coupled(spec, d, sorted((*chain, y), key=place), needed, dst, anc, single)[0]
        return _solve(problem, True, min(_SEPARATED_TRY if y in short else _TRY, left), stop=stop, solved=True)

    with ThreadPoolExecutor(os.cpu_count() or 1) as pool:
        while best < reach and not stop.is_set() and time.perf_counter() - t0 < seconds:
            tried = [y for y in cands[:tier] if y not in chain and y not in failed and _placeable(anc, chain, y)]
            runs = [pool.submit(bound, y) for y in tried]
            _watched(stop, wait, runs)      # a Ctrl-C sets `stop`: the programmes running stop at once
            vals = [f.result() for f in runs]
            if not vals or max(vals)[0] <= best * (1 + 1e-9):
                if tier < len(cands):
                    failed.update(tried)    # the next tier joins, tried first on this chain
                    tier += _TIGHT
                    continue
                if not (back or top is start or tier <= _TIGHT):
                    # the moments joined before the later tiers were tried: the chain grows again from its start,
                    # with every tier at once (GPT-2 at 30% of its keep-everything memory: DTR's polished schedule
                    # has the third layer's GELU backward in its first tier, the fourth's in its second, which the
                    # bound needs: 1.6481x -> 1.6829x of keep-everything's time)
                    back = True
                    best, chain = start
                    failed = set()
                    continue
                # last, the moments where the best chain's own point has no room, which no tier offered
                best, chain = top
                if chain in looked:
                    break
                looked.add(chain)
                left = seconds - (time.perf_counter() - t0)
                more = [y for y in _separated(spec, d, needed, dst, anc, single, chain, best, left, stop)
                        if y not in cands]
                if not more:
                    break
                failed = set(cands)         # on this chain, only those are tried
                short.update(more)
                cands += more
                tier = len(cands)
                continue
            i = max(range(len(vals)), key=lambda i: vals[i][0])
            (best, solved), chain = vals[i], tuple(sorted((*chain, tried[i]), key=place))
            top = max(top, (best, chain), key=lambda v: v[0])
            rise(top[0])
            failed.clear()
            if not solved:
                unsolved.append(chain)
    best, chain = top
    left = seconds + finish - (time.perf_counter() - t0)
    # the best chain and those it grew from, the latest first: a growth begun again from `start` grows others
    unsolved = sorted(dict.fromkeys(c for c in unsolved if set(c) <= set(chain)), key=len)[-(os.cpu_count() or 1):]
    if chain in unsolved and best < reach and left > 0 and not stop.is_set():
        vals = _side_by_side([_coupled(spec, d, list(c), needed, dst, anc, single)[0] for c in unsolved], left,
                             reach, stop)
        i = max(range(len(vals)), key=vals.__getitem__)
        if vals[i] > best:
            best, chain = vals[i], unsolved[i]
            rise(best)
    return best, chain


def _pair_orders(spec: ModelSpec, d: int, needed: np.ndarray, dst: np.ndarray, anc: dict, single: dict,
                 start: tuple[float, tuple], reach: float, seconds: float,
                 stop: threading.Event, deep: bool = False,
                 rise: Callable[[float], None] = _unheard) -> tuple[float, tuple]:
    """`_orders` from the chain of `start` (its bound, its moments) over the pairs of moments (`_paired`) that cut
    off its optimal point as far as `reach` (`_beyond`), for up to `seconds` in all; `start` where none does.
    With the chain's columns fixed, a pair's value is at least what its orders can give, so where none reaches,
    one pair proves nothing and the orders' seconds go to the solver instead (the 8-layer MLP at 65% of its
    keep-everything memory: 20 s of orders over 7 pairs raised the bound 1.210x -> 1.252x of keep-everything's
    time, short of the 1.322x that proves its gap, and the stage model, left 15 s instead of 35, no longer
    proved it). `deep`: _DEEP seconds or more, on large models (`_recompute`'s `grow_seconds`), whose branch and
    bound from the root rarely betters anything at such budgets: every pair that cuts off the point at all is
    kept, the deepest first, and the orders take all the seconds (GPT-2 at 30% with a time limit of 180 s: `mm_1`
    with `mul_9`'s last computation before it cuts the point short of the target, and its orders raise the bound
    1.6829x -> 1.7239x of keep-everything's time). `rise`: as `_orders`'."""
    t0 = time.perf_counter()
    point = _point(spec, d, needed, dst, anc, single, start[1], seconds / 4, stop) if seconds > 0 else None
    if point is None:
        return start
    offered = _paired(spec, needed, dst, anc, start[1], point)
    pairs = _beyond(spec, d, needed, dst, anc, single, start[1], point, offered,
                    start[0] * (1 + 1e-9) if deep else reach, seconds / 2 - (time.perf_counter() - t0), stop,
                    cutoff=reach)
    if not pairs:
        return start
    return _orders(spec, d, needed, dst, anc, single, start, list(dict.fromkeys(m for _, p in pairs for m in p)),
                   reach, seconds - (time.perf_counter() - t0), stop, rise=rise)


def _separated(spec: ModelSpec, d: int, needed: np.ndarray, dst: np.ndarray, anc: dict, single: dict,
               chain: tuple, best: float, seconds: float, stop: threading.Event) -> list[int]:
    """The operations where the optimal point of the chain's programme has no room, most first: each one that
    comes before or after every moment in every schedule, as a moment of the chain with the chain's own columns
    (what is resident at its moments, and what came before them) fixed at that point. Where that programme's
    optimum (its dual bound after _TRY) exceeds `best`, the point recomputes too little for what a schedule holds
    there, and the moment may raise the bound: a separation, where the tiers of `tight_moments` offer only the
    moments where one schedule was short (GPT-2 at 30% of its keep-everything memory: of 160 operations, the
    programmes of `add_14` and `add_18`, the third and fourth tiers, exceed 1.6829x of keep-everything's time, in
    6.6 s; `add_14` joined, 1.6912x). For up to `seconds`."""
    t0 = time.perf_counter()
    point = _point(spec, d, needed, dst, anc, single, chain, seconds, stop)
    if point is None:
        return []
    ys = [y for y in np.flatnonzero(needed).tolist() if y not in chain]
    _ancestors(spec, anc, ys)
    ys = [y for y in ys if _placeable(anc, chain, y)]
    left = seconds - (time.perf_counter() - t0)
    return [g[0] for _, g in _beyond(spec, d, needed, dst, anc, single, chain, point, [(y,) for y in ys],
                                      best * (1 + 1e-9), left, stop)]


def _point(spec: ModelSpec, d: int, needed: np.ndarray, dst: np.ndarray, anc: dict, single: dict, chain: tuple,
           seconds: float, stop: threading.Event):
    """(the best point of the chain's programme found in `seconds`, its columns S, R, P: `_coupled`'s), or None."""
    problem, columns = _coupled(spec, d, list(chain), needed, dst, anc, single)
    _, point = _solve(problem, True, seconds, point=True, stop=stop)
    return None if point is None else (point, columns)


def _beyond(spec: ModelSpec, d: int, needed: np.ndarray, dst: np.ndarray, anc: dict, single: dict, chain: tuple,
            point, groups: list[tuple], least: float, seconds: float, stop: threading.Event,
            cutoff: float | None = None) -> list[tuple]:
    """[(value, group)] for the groups of moments that cut off the chain's `point` (`_point`) as far as `least`,
    most first: with the chain's own columns (what is resident at its moments, and what came before them) fixed
    there, the least of the programmes over every order of the chain and the group (`_places`, each at most _TRY
    seconds, `_solve` with `cutoff`), the value, is `least` or more. A group's orders stop at the first below it.
    Side by side, for up to `seconds`."""
    t0 = time.perf_counter()
    x, (S0, _, P0) = point

    def value(group: tuple) -> float:
        orders = [list(chain)]
        for m in group:
            orders = [o for seq in orders for o in _places(anc, seq, m)]
        val = np.inf
        for o in orders:
            left = seconds - (time.perf_counter() - t0)
            if left <= 0 or stop.is_set():
                return 0.0
            (cost, lb, ub, *rows), (S, _, P) = _coupled(spec, d, o, needed, dst, anc, single)
            lb, ub = lb.copy(), ub.copy()
            for j, m in enumerate(chain):
                k = o.index(m)
                for old, new in ((S0, S), (P0, P)):
                    on = (old[j] >= 0) & (new[k] >= 0)
                    lb[new[k][on]] = ub[new[k][on]] = np.round(x[old[j][on]])
            val = min(val, _solve((cost, lb, ub, *rows), True, min(_TRY, left), cutoff=cutoff, stop=stop))
            if val < least:
                break
        return val

    _ancestors(spec, anc, [m for group in groups for m in group])
    with ThreadPoolExecutor(os.cpu_count() or 1) as pool:      # HiGHS runs without the interpreter's lock
        found = [(v, g) for v, g in zip(pool.map(value, groups), groups, strict=True) if v >= least]
    return sorted(found, key=lambda f: -f[0])


def _paired(spec: ModelSpec, needed: np.ndarray, dst: np.ndarray, anc: dict, chain: tuple, point) -> list[tuple]:
    """Pairs of moments (y, (u, y, 0)) worth adding to the chain, from its optimal point (`_point`): y reads a
    value the point computes again between moments beside the most bytes it does not (held from before), at most
    _PAIRED of them, and u is one of the _PAIR_US largest ancestors of y that the point computes again (the latest
    first among equal ones). The moment at y alone counts what it reads; u's last computation before y also counts
    what is held across that recomputation until y reads it (the transformer at 45% of its keep-everything memory:
    `mm_7` reads the first layer's ReLU backward, held from before the moment at `threshold_backward`, and what the
    recomputed first layer makes, `relu` among it)."""
    x, (_, R, _) = point
    again = np.zeros(spec.n, dtype=bool)
    on = R >= 0
    again[np.nonzero(on)[1][x[R[on]] > 0.5]] = True
    n = spec.n
    pair = np.unique(dst * n + spec.in_idx)             # each input once (`dst[e]` reads the input e)
    v, u = pair // n, pair % n
    reads = np.bincount(v, weights=again[u], minlength=n) > 0
    held = np.bincount(v, weights=np.where(again[u], 0.0, spec.nbytes[u]), minlength=n)
    ys = np.flatnonzero(reads & needed & (held > 0))
    ys = [y for y in ys[np.argsort(-held[ys], kind="stable")].tolist() if y not in chain][:_PAIRED]
    _ancestors(spec, anc, ys)
    rank = rank_of(spec)
    out = []
    for y in ys:
        us = np.flatnonzero(again & anc[y])
        us = us[np.lexsort((-rank[us], -spec.nbytes[us]))][:_PAIR_US]
        out += [(y, (u, y, 0)) for u in us.tolist()]
    return out


def _placeable(anc: dict, chain, y) -> bool:
    """Whether moment y has ancestors and comes before or after every moment of the chain in every schedule: a
    place in it."""
    return bool(anc[y].any()) and all(_precedes(anc, x, y) or _precedes(anc, y, x) for x in chain)


def _reader(spec: ModelSpec, needed: np.ndarray, chain: Sequence[int], anc: dict) -> list[int]:
    """The operation (as a list of one, or none) that reads a moment's output beside the most other bytes and need
    not come before the next moment: a weight gradient reading the gradient the moment made and an activation. In
    every schedule these are resident together there, which no moment of the chain checks (BERT at 40% of its
    keep-everything memory: the classifier's weight gradient, which reads the 4 MB gradient of the logits and the
    last layer norm's output: 1.4868x -> 1.5010x of keep-everything's time in 9 s over its orders). One only, tried
    before the schedule's moments: each multiplies the orders, and with all of them first the 8-layer MLP at 65%
    was proven in 44 s instead of 11 (13 s with the one)."""
    on = set(chain)
    best, most = [], 0.0
    for j, x in enumerate(chain):
        if isinstance(x, tuple):
            continue
        nxt = anc[chain[j + 1]] if j + 1 < len(chain) else np.zeros(spec.n, dtype=bool)
        for w in spec.out_idx[spec.out_ptr[x]:spec.out_ptr[x + 1]].tolist():
            ins = spec.in_idx[spec.in_ptr[w]:spec.in_ptr[w + 1]]
            reads = float(spec.nbytes[ins].sum())
            if needed[w] and w not in on and not nxt[w] and (ins != x).any() and reads > most:
                best, most = [w], reads
    return best


def _orders(spec: ModelSpec, d: int, needed: np.ndarray, dst: np.ndarray, anc: dict, single: dict,
            start: tuple[float, tuple[int, ...]], moments, reach: float | None, seconds: float,
            stop: threading.Event, between: bool = False,
            rise: Callable[[float], None] = _unheard) -> tuple[float, tuple[int, ...]]:
    """(model time every schedule recomputes, at least; the moments of the order it was found at) from the coupled
    programme over moments taken in every order: the first computations of operations neither of which is an
    ancestor of the other come in one order or the other in each schedule, so the least of the programmes over
    the orders bounds them all. Branch and bound over the orders: the weakest order so far (`start`, the moments
    in order, and its bound) takes the next of `moments` (most promising first) at each place its ancestors and
    descendants leave, one programme each (on the cores: `_Runs`); the least bound over the orders is the
    bound. It stops when that reaches `reach`, the moments run out, `seconds` pass, or `stop` is set (the first
    Ctrl-C sets it; the programmes running stop at once). Each order's bound is at least its parent's (it restricts
    the same schedules). Among orders of equal bound, the one with the most moments goes on first: an order with
    every moment caps the bound at its own, so where the weakest are tied (at 0, where memory is not short at
    all) that ends the search at once, rather than after every shorter order has taken each next moment in turn
    (`no_fit` on a 14-operation training graph that fits: 5 s of orders, all of its time, before). A moment
    (u, y, 0) that raises no order at any of its places is left out: the order without it holds for all of them,
    and the moments after it are not tried at each of its places (the 6-layer MLP at 75% of keep-everything's
    memory: two such moments first, and its orders stopped short of those before them, 0.0546 -> 0.0409).
    The next weakest order takes its next moment as soon as every programme of those before has a core, not
    after the last of them is solved: every order must reach `reach` for the proof, whichever goes first, and a
    core would otherwise wait for the slowest programme of each (BERT at 40% of its keep-everything memory: the
    orders that prove its 1.5305x schedule within 1% take 41-43 s on two cores, not 48 s; their programmes take
    82 s of one). Yet a weaker order's programmes start before those still waiting for a stronger one (`_Runs`'
    rank), as in a search that takes the weakest each time: where the seconds run out, the bound is the weakest
    order's, and it is then as far on as it can be (GPT-2 at 30% with a time limit of 180 s: 1.7239x of
    keep-everything's time in two runs and in the code before, where a first-come queue gave 1.7177x in one
    of three). `rise(value)` is told the weakest order's bound each time it rises: it holds for every schedule
    all along (an order whose programmes still run stands at its own bound)."""
    t0 = time.perf_counter()
    told = [start[0]]
    _ancestors(spec, anc, moments)
    leaves = {start: None}      # order -> (the moment it takes, its orders, their programmes) while they run
    idle = set()                # moments (u, y, 0) that raised no order where they were taken: left out

    def key(leaf):
        return leaf[0], -len(leaf[1])       # on a tie, the order furthest on

    def next_moment(seq):
        return next((m for m in moments if m not in seq and m not in idle), None)

    def settle(leaf, vals) -> None:     # an order's programmes are solved: its orders stand for it
        val, seq = leaf
        y, orders, _ = leaves.pop(leaf)
        if _last_before(y) and max(vals) <= val * (1 + 1e-9):
            idle.add(y)     # the order as it was covers every place of y, and each later moment is not multiplied
            leaves[leaf] = None
            return
        leaves.update(((max(v, val), o), None) for v, o in zip(vals, orders, strict=True))

    def search(runs) -> None:
        while not stop.is_set() and time.perf_counter() - t0 < seconds:
            for leaf, run in list(leaves.items()):
                if run is not None and all(runs.solved(i) for i in run[2]):
                    settle(leaf, [runs.value(i) for i in run[2]])
            weakest = min(leaves, key=key)
            if weakest[0] > told[0]:
                told[0] = weakest[0]
                rise(weakest[0])
            if (reach is not None and weakest[0] >= reach) or not np.isfinite(weakest[0]):
                return
            if leaves[weakest] is None and next_moment(weakest[1]) is None:
                return      # the least bound can rise no more
            while True:     # the weakest order takes its moment where its programmes would be the next to start
                open_ = [leaf for leaf, run in leaves.items() if run is None and next_moment(leaf[1]) is not None
                         and np.isfinite(leaf[0]) and (reach is None or leaf[0] < reach)]
                leaf, queued = min(open_, key=key, default=None), runs.next_rank()
                if leaf is None or (queued is not None and key(leaf) >= queued):
                    break
                y = next_moment(leaf[1])
                orders = _places(anc, leaf[1], y)
                leaves[leaf] = y, orders, [runs.add(_coupled(spec, d, list(o), needed, dst, anc, single,
                                                             between=between)[0], key(leaf)) for o in orders]
            runs.step()

    with _Runs(t0 + seconds, reach, stop, sub_mips=False) as runs:
        _watched(stop, search, runs)
    for leaf, run in list(leaves.items()):     # stopped: each programme's value is its dual bound so far
        if run is not None:
            settle(leaf, [runs.value(i) for i in run[2]])
    return min(leaves, key=key)


def _places(anc: dict, seq: Sequence, m) -> list:
    """The orders (of seq's type) with moment m inserted into seq at each place its ancestry leaves: after every
    moment that comes before it in every schedule, before every one that comes after it."""
    lo = max((i + 1 for i, x in enumerate(seq) if _precedes(anc, x, m)), default=0)
    hi = min((i for i, x in enumerate(seq) if _precedes(anc, m, x)), default=len(seq))
    return [seq[:p] + type(seq)((m,)) + seq[p:] for p in range(lo, hi + 1)]


def _op(m) -> int:
    """The operation computed at moment m: x for x (its first computation), w for (w, -1) (the final computation
    of a required result w, resident from there to the end), v for (v, w) (v's last computation before w's final
    one, v held from there to it), u for (u, y, 0) (u's last computation before y's first, u an ancestor of y)."""
    return m[0] if isinstance(m, tuple) else m


def _last_before(m) -> bool:
    """Whether moment m is (u, y, 0): u's last computation before y's first."""
    return isinstance(m, tuple) and len(m) == 3


def moment_name(ids, m) -> str:
    """A moment (see `_op`) in words, by the names `ids` of its operations."""
    if not isinstance(m, tuple):
        return ids[m]
    if _last_before(m):
        return f"{ids[m[0]]} (last before {ids[m[1]]})"
    return f"{ids[m[0]]} (final)" if m[1] < 0 else f"{ids[m[0]]} (last before the final {ids[m[1]]})"


def _precedes(anc: dict, a, b) -> bool:
    """Whether moment a comes before moment b, or at it, in every schedule (`anc[m]`: the ancestors of m's
    operation): a's operation is an ancestor of b's, or b's too (a first computation before any other), or
    a = (v, w) and b = (w, -1), or a = (u, y, 0) and b computes y or a descendant of y (after y's first
    computation)."""
    if isinstance(a, tuple):
        if _last_before(a):
            return _op(b) == a[1] or bool(anc[b][a[1]])
        return a[1] >= 0 and b == (a[1], -1)
    return bool(anc[b][a]) or (isinstance(b, tuple) and b[0] == a)


class _Runs:
    """Integer programmes (`_solve` with `cutoff`, until the perf_counter time `until`) on the cores, one run each
    at a time; programmes added while others run wait for a free core, the least `rank` first (then the first
    added). A core that nothing waits for takes a copy of a programme still running, under another random seed,
    and the first of its runs to finish gives its value (the others stop): branch and bound times vary with the
    seed by up to twice (the 3-layer GPT-2 at 30% of its keep-everything memory, one order of 4 moments:
    18-35 s). `stop` set, `until` passed, or the runs closed: each programme's value is the best dual bound of its
    runs. `sub_mips`: as `_solve`'s. A context manager: on exit every run is asked to stop and waited for."""

    def __init__(self, until: float, cutoff: float | None, stop: threading.Event, sub_mips: bool = True):
        self.until, self.cutoff, self.stop, self.sub_mips = until, cutoff, stop, sub_mips
        self.cores = os.cpu_count() or 1
        self.pool = ThreadPoolExecutor(self.cores)     # HiGHS frees the GIL
        self.problems: list = []
        self.runs: list[list] = []
        self.ends: list[threading.Event] = []      # set: that programme's runs stop
        self.first: list = []                       # the run that finished first, per programme
        self.queue: list[tuple] = []                # (rank, index) of the programmes not started yet

    def __enter__(self) -> _Runs:
        return self

    def __exit__(self, *exc) -> None:
        for end in self.ends:
            end.set()
        self.queue.clear()
        self.pool.shutdown(wait=True)

    def add(self, problem, rank: tuple = ()) -> int:
        """Queue a programme; its index."""
        self.problems.append(problem)
        self.runs.append([])
        self.ends.append(threading.Event())
        self.first.append(None)
        bisect.insort(self.queue, (rank, len(self.problems) - 1))
        return len(self.problems) - 1

    def next_rank(self) -> tuple | None:
        """The rank of the programme that starts next, or None where none waits."""
        return self.queue[0][0] if self.queue else None

    def solved(self, i: int) -> bool:
        return self.first[i] is not None

    def value(self, i: int) -> float:
        """Programme i's value: its first finished run's, else the best dual bound of its runs (0 if none ran);
        the caller has the runs stopped first (`stop`, `until` or the exit)."""
        if self.first[i] is not None:
            return self.first[i].result()
        return max((r.result() for r in self.runs[i]), default=0.0)

    def _start(self, i: int) -> None:
        self.runs[i].append(self.pool.submit(_solve, self.problems[i], True, self.until - time.perf_counter(),
                                             cutoff=self.cutoff, stop=self.ends[i], seed=len(self.runs[i]),
                                             sub_mips=self.sub_mips))

    def step(self) -> bool:
        """Note the programmes solved since (and return at once where there are any, so that the caller may queue
        more before a core takes the next), else start what the free cores can take and wait a little for the next
        to finish: False when nothing runs or waits any more, `until` has passed, or `stop` is set."""
        solved = False
        for i, rs in enumerate(self.runs):
            if self.first[i] is None and (f := next((f for f in rs if f.done()), None)) is not None:
                self.first[i] = f
                self.ends[i].set()
                solved = True
        if self.stop.is_set() or time.perf_counter() >= self.until:
            return False
        if solved:
            return True
        running = [f for rs in self.runs for f in rs if not f.done()]
        while self.queue and len(running) < self.cores:
            _, i = self.queue.pop(0)
            self._start(i)
            running.append(self.runs[i][-1])
        if not running:
            return False
        open_ = [i for i, rs in enumerate(self.runs) if self.first[i] is None and rs]
        if len(running) < self.cores and open_ and self.until - time.perf_counter() > 0.1:
            self._start(min(open_, key=lambda i: len(self.runs[i])))
        else:
            wait(running, timeout=0.05, return_when=FIRST_COMPLETED)
        return True


def _side_by_side(problems: list, seconds: float, cutoff: float | None, stop: threading.Event,
                  sub_mips: bool = True) -> list[float]:
    """Each integer programme's value (`_solve` with `cutoff`), on the cores (`_Runs`, for `seconds`)."""
    with _Runs(time.perf_counter() + seconds, cutoff, stop, sub_mips) as runs:
        ids = [runs.add(p) for p in problems]

        def drive() -> None:
            while runs.step():
                pass

        _watched(stop, drive)
    return [runs.value(i) for i in ids]


def _watched(stop: threading.Event, work: Callable, *args) -> None:
    """`work(*args)` on a worker thread while this one waits for it (`milp._join`): the first Ctrl-C sets `stop`, which
    the HiGHS runs poll, and a second raises; an error in `work` is raised again here."""
    from .milp import _join

    call = Apart(work, *args, child=False)     # a thread here: the HiGHS runs it starts share this process's stop
    _join(call.thread, stop)
    call.result()


def _chain(spec: ModelSpec, top: int, cands: list[int], anc: dict) -> list[int]:
    """The longest chain of candidates through `top`, each an ancestor of the next, at most _MOMENTS of them
    (evenly thinned, `top` kept)."""
    rank = rank_of(spec)
    cands = sorted(cands, key=rank.__getitem__)
    before = [x for x in cands if anc[top][x]]
    after = [x for x in cands if anc[x][top]]

    def longest(xs: list[int]) -> list[int]:
        length, prev = {}, {}
        for x in xs:
            length[x], prev[x] = 1, None
            for y in xs:
                if y == x:
                    break
                if anc[x][y] and length[y] + 1 > length[x]:
                    length[x], prev[x] = length[y] + 1, y
        x = max(xs, key=length.get, default=None)
        out = []
        while x is not None:
            out.append(x)
            x = prev[x]
        return out[::-1]

    chain = longest(before) + [top] + longest(after)
    if len(chain) > _MOMENTS:
        i = chain.index(top)
        keep = set(np.linspace(0, len(chain) - 1, _MOMENTS - 1).round().astype(int).tolist()) | {i}
        chain = [x for j, x in enumerate(chain) if j in keep]
    return chain


def _through_best(spec: ModelSpec, d: int, needed: np.ndarray, dst: np.ndarray, anc: dict, single: dict):
    """(the chain of candidate moments through the one whose own bound `single[x]` is largest (`_chain`), the
    coupled programme over it and its columns (`_coupled`)), or None where that chain is the one moment."""
    chain = _chain(spec, max(single, key=single.get), list(single), anc)
    return (chain, *_coupled(spec, d, chain, needed, dst, anc, single)) if len(chain) > 1 else None


def _at(spec: ModelSpec, d: int, x: int, needed: np.ndarray, dst: np.ndarray, anc: np.ndarray, free: bool = True):
    """(the integer programme at operation x (`anc`: its ancestors) as arrays, its columns (`_coupled`'s S, R, P)),
    or None when x has no ancestors or cannot hold (x's inputs, output and workspace over the budget: `nofit`
    says so)."""
    inputs = spec.in_idx[spec.in_ptr[x]:spec.in_ptr[x + 1]]
    if not anc.any() or spec.nbytes[inputs].sum() > spec.budget[d] - spec.nbytes[x] - spec.ws[x]:
        return None
    return _coupled(spec, d, [x], needed, dst, {x: anc}, {}, free)


def _coupled(spec: ModelSpec, d: int, chain: list[int], needed: np.ndarray, dst: np.ndarray, anc: dict,
             single: dict, free: bool = True, between: bool = False):
    """(the integer programme over the chain's moments (see the module docstring) as arrays, (S, R, P)): per
    moment j, for each ancestor of x_j and each operation neither before nor after it in every order (free),
    s_j[v] (resident at x_j; the column S[j, v]) and r_j[v] (computed again before x_{j+1}, or after x_k for the
    last; the column R[j, v]), and for each free one p_j[v] (computed before x_j; the column P[j, v]); -1 where
    there is no such column. `single[x]`: what every schedule recomputes after x, a row where known. `free` False
    leaves the free operations out (a weaker programme, several times faster to prove infeasible). `between`
    adds the memory of the computations between moments (`_between`): rows that rarely raise the bound but slow
    its programmes (the 3-layer GPT-2 at 25% of its keep-everything memory: 1.4454x -> 1.4225x of keep-everything's
    time in the 60 s solve), so only the proof that nothing fits (`no_fit`) takes them."""
    n, k, src = spec.n, len(chain), spec.in_idx
    # pre[j, v]: 1 v is computed before x_j in every schedule of the chain's order (an ancestor of x_j, or an
    # earlier moment or its ancestor), -1 either way (a column p_j[v]), 0 neither (after it, x_j itself, or no
    # schedule needs it); after[j, v]: v is computed after x_j (a later moment or a descendant of one) and some
    # schedule needs it
    ops = [_op(m) for m in chain]
    pre = np.zeros((k, n), dtype=np.int8)
    after = np.zeros((k, n), dtype=bool)
    below = np.zeros(n, dtype=bool)
    for j, (m, x) in enumerate(zip(chain, ops, strict=True)):
        below |= anc[m]
        pre[j, below] = 1
        pre[j, x] = 0       # computed at x_j (at a final moment, maybe again)
        below[x] = True
    made = None if spec.output_of is None or (spec.output_of < 0).all() else spec.output_of
    above = np.zeros(n, dtype=bool)
    own = np.ones(k, dtype=bool)        # own[j]: every later moment, and what it computes, lies below x_j
    for j in range(k - 1, -1, -1):
        # only a first computation has its descendants after it, and comes after the moments before it
        desc = np.zeros(n, dtype=bool) if isinstance(chain[j], tuple) else _reach(spec.out_ptr, spec.out_idx,
                                                                                  chain[j], n)
        own[j] = not (above & ~desc).any()
        above |= desc
        after[j] = needed & above
        if not isinstance(chain[j], tuple):
            above[ops[j]] = True
        if made is not None:
            # an op's other output whose maker is computed before x_j, once: made by that run, so before x_j too
            o = np.flatnonzero((made >= 0) & needed & (pre[j] == 0) & ~after[j])
            o = o[(pre[j, made[o]] == 1) & spec.once[made[o]] & (o != ops[j])]
            pre[j, o] = 1
        if free:
            pre[j, needed & (pre[j] == 0) & ~after[j]] = -1
            pre[j, ops[j]] = 0
    V = [np.flatnonzero(p != 0) for p in pre]           # per moment: the operations with columns s, r
    F = [np.flatnonzero(p == -1) for p in pre]          # and the free ones among them, with a column p
    S, R, P = (np.full((k, n), -1, dtype=np.int64) for _ in range(3))
    ncol = 0
    for j, (v, f) in enumerate(zip(V, F, strict=True)):
        S[j, v] = ncol + np.arange(v.size)
        R[j, v] = ncol + v.size + np.arange(v.size)
        P[j, f] = ncol + 2 * v.size + np.arange(f.size)
        ncol += 2 * v.size + f.size
    # at a final moment, x_j's computation there: r_j[x_j] fixed at 1 (it may be its first), for the rows that ask
    # whether x_j was computed since an earlier moment
    finals = np.array([j for j, m in enumerate(chain) if isinstance(m, tuple)], dtype=np.int64)
    R[finals, np.asarray(ops, dtype=np.int64)[finals]] = ncol + np.arange(finals.size)
    ncol += finals.size
    # between x_j and x_{j+1}: a_j[u] (u resident at both and not computed again between, so all along), A_j
    # (their bytes)
    W = [np.intersect1d(V[j], V[j + 1], assume_unique=True) for j in range(k - 1)] if between else []
    a = np.full((len(W), n), -1, dtype=np.int64)
    A = np.zeros(len(W), dtype=np.int64)
    for j, w in enumerate(W):
        a[j, w] = ncol + np.arange(w.size)
        A[j] = ncol + w.size
        ncol += w.size + 1
    cost, lb, ub = np.zeros(ncol), np.zeros(ncol), np.ones(ncol)
    ub[A] = np.inf
    lb[R[finals, np.asarray(ops, dtype=np.int64)[finals]]] = 1.0
    for j, (x, v) in enumerate(zip(ops, V, strict=True)):
        lb[S[j, src[spec.in_ptr[x]:spec.in_ptr[x + 1]]]] = 1.0
        cost[R[j, v]] = np.nan_to_num(spec.ccost[d, v])
        ub[R[j, v[spec.once[v]]]] = 0.0
        # held from a final moment (w, -1) to the end, and from (v, w) to w's final moment, and not computed again
        if isinstance(chain[j], tuple) and not _last_before(chain[j]):
            until = k if chain[j][1] < 0 else next((i for i in range(j + 1, k) if chain[i] == (chain[j][1], -1)), j)
            held = np.array([i for i in range(j + 1, until) if ops[i] != x], dtype=np.int64)
            lb[S[held, x][S[held, x] >= 0]] = 1.0
            ub[R[held, x][R[held, x] >= 0]] = 0.0
        # (u, y, 0): u not computed again in the intervals that end at y's first computation or before it: up to
        # y where the chain (in the order it is taken) has it, else up to the moments before y in every schedule
        elif _last_before(chain[j]):
            y = chain[j][1]
            if y in chain[j + 1:]:
                until = chain.index(y, j + 1)
            else:
                _ancestors(spec, anc, [y])
                until = next((i for i in range(j + 1, k) if not _precedes(anc, chain[i], y)), k) - 1
            # a later moment that computes u before y is the same computation: its own column stays
            later = np.array([R[i, x] for i in range(j + 1, until) if ops[i] != x], dtype=np.int64)
            ub[later[later >= 0]] = 0.0
    upto = np.full((k, n), k, dtype=np.int64)           # upto[j, w]: the first i > j with w = x_i or above it
    for i in range(k - 1, 0, -1):
        mine = anc[chain[i]].copy()
        mine[ops[i]] = True
        upto[:i, mine] = i
    ri, ci, vi, lo, hi = [], [], [], [], []             # entries (row, column, value) and row bounds

    def add(rows: np.ndarray, cols: np.ndarray, val) -> None:
        ri.append(rows)
        ci.append(cols)
        vi.append(np.broadcast_to(np.asarray(val, dtype=float), cols.shape))

    def new_rows(m: int, low, high) -> np.ndarray:
        first = len(lo)
        lo.extend(np.broadcast_to(np.asarray(low, dtype=float), (m,)).tolist())
        hi.extend(np.broadcast_to(np.asarray(high, dtype=float), (m,)).tolist())
        return np.arange(first, first + m)

    for j, (x, v, f) in enumerate(zip(ops, V, F, strict=True)):
        # memory at x_j
        add(np.repeat(new_rows(1, -np.inf, spec.budget[d] - spec.nbytes[x] - spec.ws[x]), v.size), S[j, v],
            spec.nbytes[v])
        # a free operation is resident at x_j, or computed again after it, only if computed before it
        for cols in (S, R):
            rid = new_rows(f.size, -np.inf, 0.0)
            add(rid, cols[j, f], 1.0)
            add(rid, P[j, f], -1.0)
        # computed before x_j: so are its inputs; and it is computed before x_{j+1}
        e = (pre[j, src] == -1) & (pre[j, dst] == -1)
        rid = new_rows(int(e.sum()), -np.inf, 0.0)
        add(rid, P[j, dst[e]], 1.0)
        add(rid, P[j, src[e]], -1.0)
        if j + 1 < k:
            g = f[pre[j + 1, f] == -1]
            rid = new_rows(g.size, -np.inf, 0.0)
            add(rid, P[j, g], 1.0)
            add(rid, P[j + 1, g], -1.0)
        # an op's other output is held from its maker's latest run before it: with the maker computed before x_j
        # and not again before the output, it counts as computed before x_j. p_o + sum r_m - p_m >= 0
        if made is not None:
            o = f[made[f] >= 0]
            m = made[o]
            o, m = o[pre[j, m] != 0], m[pre[j, m] != 0]
            fm = pre[j, m] == -1
            rid = new_rows(o.size, np.where(fm, 0.0, 1.0), np.inf)
            add(rid, P[j, o], 1.0)
            add(rid[fm], P[j, m[fm]], -1.0)
            last = upto[j, o] - 1          # the output is computed before x_{last + 1}
            for i in range(j, k):
                on = (last >= i) & (R[i, m] >= 0)
                add(rid[on], R[i, m[on]], 1.0)
        # v computed before x_j and read by w computed after it (a descendant a schedule needs, or a free operation
        # not computed before x_j; w first computed before x_upto[j, w]), or required: resident at x_j or computed
        # again before that read. s + sum r - p_v + p_w >= 0, p_v = 1 for an ancestor
        later = after[j, dst] | (pre[j, dst] == -1)
        e = (pre[j, src] != 0) & later
        req = v[spec.required[v]]
        es, ew = np.concatenate([src[e], req]), np.concatenate([dst[e], np.full(req.size, -1)])
        until = np.where(ew >= 0, upto[j, ew] - 1, k - 1)
        rid = new_rows(es.size, (pre[j, es] == 1).astype(float), np.inf)
        add(rid, S[j, es], 1.0)
        for i in range(j, k):
            on = until >= i
            add(rid[on], R[i, es[on]], 1.0)
        fv, fw = pre[j, es] == -1, (ew >= 0) & (pre[j, ew] == -1)
        add(rid[fv], P[j, es[fv]], -1.0)
        add(rid[fw], P[j, ew[fw]], 1.0)
        # a recomputation before x_{j+1} reads inputs resident at x_j or computed again before it (x_j itself, at a
        # final moment, is computed there: its r_j is 1)
        e = (pre[j, dst] != 0) & ~spec.once[dst]
        rid = new_rows(int(e.sum()), 0.0, np.inf)
        on = S[j, src[e]] >= 0
        add(rid[on], S[j, src[e][on]], 1.0)
        add(rid, R[j, src[e]], 1.0)
        add(rid, R[j, dst[e]], -1.0)
        # resident at x_{j+1} and computed before x_j: resident at x_j or computed again in between
        if j + 1 < k:
            w = v[S[j + 1, v] >= 0]
            fr = pre[j, w] == -1
            rid = new_rows(w.size, np.where(fr, -1.0, 0.0), np.inf)
            add(rid, S[j, w], 1.0)
            add(rid, R[j, w], 1.0)
            add(rid, S[j + 1, w], -1.0)
            add(rid[fr], P[j, w[fr]], -1.0)
        if between and j + 1 < k:
            _between(spec, d, j, x, ops[j + 1], pre, after, dst, S, R, P, a, A, W[j], add, new_rows)
        # every schedule recomputes at least x_j's own bound after it, counted over x_j's columns: only where no
        # later moment takes some of them (an operation beside x_j below a later moment, computed again after it)
        if single.get(chain[j], 0.0) > 0 and own[j]:
            cs = R[j:, v].ravel()
            cs = cs[cs >= 0]
            add(np.repeat(new_rows(1, single[chain[j]], np.inf), cs.size), cs, cost[cs])
    rows, cols, vals = np.concatenate(ri), np.concatenate(ci), np.concatenate(vi)
    by = np.argsort(rows, kind="stable")
    start = np.searchsorted(rows[by], np.arange(len(lo) + 1))
    return (cost, lb, ub, np.array(lo), np.array(hi), start, cols[by], vals[by]), (S, R, P)


def _between(spec: ModelSpec, d: int, j: int, x: int, y: int, pre, after, dst, S, R, P, a, A, w, add,
             new_rows) -> None:
    """`_coupled`'s rows for the interval between moments x = x_j and y = x_{j+1}: each computation there holds its
    inputs, output and workspace beside the values resident all along (at x and at y, and not computed again
    between: on one device without copies only a computation brings a dropped value back), within the budget.
    The computations there: the recomputations (r_j), the first computations of y's ancestors that come after x,
    and those of the free operations computed before y but not before x. The values resident all along are
    only counted, not placed: the bound is still a relaxation, but it no longer lets a value be computed where
    what must stay resident around it leaves no room (GNMT at 99% of its keep-everything memory: its last
    decoder gradient needs 453 MB while the 546 MB weight that both its moment and the next one read is held)."""
    rid = new_rows(w.size, -1.0, np.inf)           # a_j[u] >= s_j[u] + s_{j+1}[u] - r_j[u] - 1
    add(rid, a[j, w], 1.0)
    add(rid, S[j, w], -1.0)
    add(rid, S[j + 1, w], -1.0)
    add(rid, R[j, w], 1.0)
    rid = new_rows(1, 0.0, np.inf)                  # A_j >= their bytes
    add(rid, A[j:j + 1], 1.0)
    add(np.repeat(rid, w.size), a[j, w], -spec.nbytes[w])
    n = spec.n

    def holds(vs: np.ndarray, cols: list[tuple[np.ndarray, float]], const: np.ndarray) -> None:
        """Per v in vs, a row: A_j - (what of v and its inputs A_j counts) + need(v) * (sum of coef * col) <=
        budget - need(v) * const, need(v) being v's inputs, output and workspace."""
        row = np.full(n, -1, dtype=np.int64)
        row[vs] = np.arange(vs.size)
        e = np.flatnonzero(row[dst] >= 0)
        pair = np.unique(dst[e] * n + spec.in_idx[e])          # each input once
        v, u = pair // n, pair % n
        need = (np.bincount(row[v], weights=spec.nbytes[u], minlength=vs.size) + spec.nbytes[vs] + spec.ws[vs])
        rid = new_rows(vs.size, -np.inf, float(spec.budget[d]) - need * const)
        add(rid, np.full(vs.size, A[j]), 1.0)
        v, u = np.concatenate([v, vs]), np.concatenate([u, vs])
        on = a[j, u] >= 0
        add(rid[row[v[on]]], a[j, u[on]], -spec.nbytes[u[on]])
        for c, coef in cols:
            add(rid, c, coef * need)

    v = np.flatnonzero((R[j] >= 0) & ~spec.once)
    holds(v, [(R[j, v], 1.0)], np.zeros(v.size))
    first = (pre[j + 1] == 1) & after[j]
    first[[x, y]] = False
    v = np.flatnonzero(first)
    holds(v, [], np.ones(v.size))
    v = np.flatnonzero((pre[j + 1] == 1) & (pre[j] == -1))
    v = v[v != y]
    holds(v, [(P[j, v], -1.0)], np.ones(v.size))
    v = np.flatnonzero((pre[j + 1] == -1) & (pre[j] == -1))
    holds(v, [(P[j + 1, v], 1.0), (P[j, v], -1.0)], np.zeros(v.size))


def _solve(problem, integer: bool, seconds: float, point: bool = False, cutoff: float | None = None,
           stop: threading.Event | None = None, seed: int = 0, solved: bool = False, sub_mips: bool = True):
    """The LP optimum, or the integer programme's dual bound after at most `seconds`; infinite when the programme
    has no point (no schedule fits), 0 when nothing else came of it. `point`: (that value, the best point found or
    None). `cutoff`: only whether the optimum reaches it matters, so HiGHS prunes every node whose bound does
    (and looks for no points): the value is then at most `cutoff`, and `cutoff` where no point lies below (the
    3-moment programme of GPT-2 at 35% of its keep-everything memory: 4.7 s, not 10 s). `sub_mips` False, with
    `cutoff`: nor does it run the sub-MIP heuristics (RINS, RENS, root reduced cost) that a heuristic effort of 0
    leaves on. Where most programmes reach `cutoff` (the orders of moments), their points only take time: BERT
    at 40% of its keep-everything memory, 26% less time over its orders' 85 programmes, its orders 61 s -> 43 s.
    Where they fall short, the points prune nodes: the chains the 3-layer GPT-2 at 25% grows, solved to their
    cutoff, 1.4454x -> 1.4245x of keep-everything's time in the 60 s solve without them. `stop` set: HiGHS stops at its
    next check, with the dual bound so far. `seed`: HiGHS's random seed. `solved`: (that value, whether HiGHS
    finished: the programme's optimum, or no point)."""
    import highspy

    from .milp import run_highs  # releases HiGHS's thread pool for the solves after this one

    cost, lb, ub, row_lo, row_hi, start, idx, val = problem
    if idx.size and idx.min() < 0:     # HiGHS would write out of bounds and corrupt the process's heap
        raise ValueError("a bound's programme names a column it does not have (a chain of moments out of order?)")
    h = highspy.Highs()
    h.setOptionValue("output_flag", False)
    h.setOptionValue("time_limit", float(max(seconds, 0.01)))
    h.setOptionValue("random_seed", int(seed))
    ncol = cost.size
    h.passModel(ncol, row_lo.size, int(idx.size), 2, 1, 0.0, cost, lb, ub, row_lo, row_hi,
                start.astype(np.int32), idx.astype(np.int32), val,
                np.full(ncol, 1 if integer else 0, dtype=np.int32))
    if stop is not None:
        def poll(e):
            if stop.is_set():
                e.interrupt()

        for cb in (h.cbSimplexInterrupt, h.cbMipInterrupt):
            cb.subscribe(poll)
    if cutoff is not None and integer:
        h.setOptionValue("objective_bound", float(cutoff))
        h.setOptionValue("mip_heuristic_effort", 0.0)
        if not sub_mips:
            for heuristic in ("rins", "rens", "root_reduced_cost"):
                h.setOptionValue(f"mip_heuristic_run_{heuristic}", False)
        h.setOptionValue("mip_pscost_minreliable", 0)
    run_highs(h)
    st = h.getModelStatus()
    info = h.getInfo()
    if cutoff is not None and integer:
        MS = highspy.HighsModelStatus
        done = st in (MS.kInfeasible, MS.kOptimal, MS.kObjectiveBound)
        value = float(info.mip_dual_bound) if abs(info.mip_dual_bound) < 1e30 else 0.0
        value = cutoff if done else min(value, cutoff)
        if done and info.primal_solution_status >= 1:
            value = min(value, float(info.objective_function_value))
        return max(value, 0.0)
    if st == highspy.HighsModelStatus.kInfeasible:
        value = np.inf      # no point of the relaxation, so no schedule (each would give one)
    elif integer:
        value = float(info.mip_dual_bound) if abs(info.mip_dual_bound) < 1e30 else 0.0
    else:
        value = float(info.objective_function_value) if st == highspy.HighsModelStatus.kOptimal else 0.0
    if solved:
        return value, st in (highspy.HighsModelStatus.kOptimal, highspy.HighsModelStatus.kInfeasible)
    if not point:
        return value
    found = info.primal_solution_status >= 1 and np.isfinite(value)
    return value, (np.asarray(h.getSolution().col_value) if found else None)
