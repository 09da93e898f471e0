"""LP rounding (Checkmate's two-phase approximation) on one accelerator, recomputation only.

Solve the linear relaxation of the MILP's stage model (`milp_model`, whole-stage memory count: its LP is the
fast one), round its residency S[t, v] >= theta to a keep-set, and derive the rest: each stage computes its
node after recomputing, in order, whatever of its inputs is missing (a second rounding of each keep-set also
recomputes, a stage early, what the keep-set holds next); each value is freed right after its last
use in the stage unless kept. Every rounding is checked in the simulator. One that overflows the budget is
repaired (`repair`: drop kept values at the overflow until it fits), and near the smallest budget that is the
only way to a schedule (gpt2, 3 layers, at 25%: every rounding overflows by 1.4-2.9x, and the LP is
infeasible at 90% of the budget). Where nothing fits, the LP is solved again at a smaller budget, as Checkmate
does, so that its keep-set leaves room for the recomputations. Where no keep-set over the topological order fits
(the seeded ones below included), the stage model over `baselines.memory_order` is rounded the same way: its
backward pass releases values before it starts new ones (the 8-layer MLP at 65%: 1.46x, where none fitted).

At tight budgets the baselines and the list-scheduling heuristic recompute far too much (gpt2 at 40% of its
keep-everything memory: 3.1x) or find nothing; this gives the MILP a good incumbent there, and a schedule
in seconds to a user who does not want to wait for the MILP.

Where the LP's roundings are not within 1% of the recompute lower bound, keep-sets seeded by that bound follow
(`_seeded`): keep everything, but drop at moment x what the bound's integer programme at x recomputes
(`bounds.moment_plans`), and repair by trial (`repair` with `tries`: each drop tried in the simulator, the
fastest kept). They start at the bound's own plan, which overflows only a little where the bound is near the
optimum: GPT-2 at 50% of its keep-everything memory, 1.145x its time against 1.167x for the LP's best rounding
(the bound: 1.138x); the 3-layer GPT-2 at 40-50%, 1.190x and 1.112x against 1.198x and 1.130x; BERT at 50%,
1.2097x, the bound itself. Where the coupled programme over the chain of moments proves more than the single
moments, its point seeds one more: at each moment, what it does not hold there is dropped (BERT at 40%: no
single moment's keep-set can be repaired, the coupled one gives 1.5305x, against 1.5419x before from the MILP).

The fastest roundings then keep, where the real budget allows, what they would recompute (`polish.py`, which
also defers past the peak what the order computed too early to make that room), and the fastest polished one is
returned: a rounding of the LP at a reduced budget, or a repaired one, leaves room
under the real budget.

`options.params`: thresholds (sequence of theta), budget_scales (sequence of LP budget factors), polish (bool,
default true), seeds (how many of the bound's moments seed keep-sets, default 2; 0: none), lp (bool, default true;
false: the seeded keep-sets only, which the MILP runs beside the LP's), remake (bool, default true: the polish
computes an op's other outputs after its op's last run before their readers, `polish.remade_outputs`; the MILP
sets it false, as its stage model counts them from the op's first run), stop (a threading.Event: once set, the
call ends with OptschedError after the LP solve under way, without rounding; the MILP's Ctrl-C: its LP is not
interrupted, as an interrupt callback made it slower, 27,000 calls into Python in the 3-layer GPT-2's LP (then
25 s), whose worker runs beside the bounds). The report's
`extra["seed"]` says where the returned schedule came from ("lp", or "bound at NODE").
"""

from __future__ import annotations

import itertools
import threading
import time
from dataclasses import replace

import numpy as np

from ..cluster import Cluster
from ..errors import OptschedError
from ..graph import Graph
from ..schedule import Compute, Free, Schedule, SolveReport
from ..simulate import SimResult, simulate
from .baselines import memory_order
from .bounds import moment_plans
from .milp_model import ModelSpec, build_model, column_values, last_uses, make_spec, rank_of
from .nofit import not_found
from .options import SolveOptions, recomputing
from .polish import keep_instead_of_recompute
from .sequential import pick_device

THRESHOLDS = (0.99, 0.9, 0.7, 0.5, 0.3, 0.1, 0.01)
BUDGET_SCALES = (1.0, 0.9, 0.8, 0.7, 0.6)
_POLISHED = 3   # the fastest roundings polished; the best polished one is returned
_SEEDS = 2      # keep-sets seeded by the lower bound's plans at its tightest moments (`_seeded`)
_SEED_SHARE = 0.45  # of the time limit kept from the LP's roundings for them (unless the LP takes it)
# drops tried at each overflow when repairing a seeded keep-set. More are not better (each step takes the fastest
# drop, greedily): gpt2 at 50%, 1.145x keep-everything's time with 12, 1.165x with 32
_TRIES = 12
_PLAN_SECONDS = 2.0     # at most, for the bound's plans (their LPs and integer programmes)
# at most, for the coupled plan over the chain of moments: bert at 40% reaches its optimum in 1.1 s in a quiet hour and
# 2.9 s in a slow one, where 2 s lost the plan and with it the 1.5305x schedule (1.5362x instead); where the
# programme does not finish (gpt2 at 30-40%, the 3-layer gpt2 at 25-30%: not in 12 s) the limit is time lost
_CHAIN_SECONDS = 5.0
_ROOM = 0.01    # no seeded keep-sets for a rounding within 1% of their bound


class _Relaxation:
    """The stage model's LP relaxation in one HiGHS instance. `solve(scale)` re-solves it with the memory budget
    scaled by changing the memory rows' right-hand side only: dual simplex restarts from the last basis, about
    3x faster than a fresh solve (gpt2, 236 nodes: 1.0-1.2 s against 3.2-4.0 s). Without HiGHS's simplex scaling:
    the model's rows are already in units of the budget and of TIME_SCALE, and scaling them again made the first
    solve 4-5x slower (the 3-layer GPT-2 at 25% of its keep-everything memory: 20.3 s -> 5.1 s, at 30%: 22.8 s ->
    4.1 s; BERT at 40%: 1.5 s -> 0.7 s; same optimum), so that a 30 s solve there ended before its LP, on a
    schedule at 3.7x keep-everything's step time instead of 1.55x."""

    def __init__(self, spec: ModelSpec, threads: int | None):
        from .milp import highs_model

        self.model = build_model(spec)
        self.h = highs_model(replace(self.model, integ=np.zeros_like(self.model.integ)))
        self.timed_out = False
        if threads:
            self.h.setOptionValue("threads", int(threads))
        self.h.setOptionValue("simplex_scale_strategy", 0)      # off
        first = [r for r, kind in self.model.row_kind if kind.startswith("memory@")]
        # rows in units of the budget; none where the budget holds every byte (any rounding fits there)
        self.rows = np.arange(first[0], first[0] + spec.T, dtype=np.int32) if first else None

    def solve(self, scale: float, time_limit: float) -> tuple[np.ndarray | None, bool]:
        """(S[t, v] on the first device or None, and whether the LP is proven infeasible); `timed_out` tells
        whether the last solve stopped on the time limit."""
        import highspy

        from .milp import run_highs

        if self.rows is not None:
            n = self.rows.size
            self.h.changeRowsBounds(n, self.rows, np.full(n, -np.inf), np.full(n, float(scale)))
        self.h.setOptionValue("time_limit", float(max(time_limit, 0.1)))
        if run_highs(self.h) == highspy.HighsStatus.kError:
            status = self.h.modelStatusToString(self.h.getModelStatus())
            raise RuntimeError(f"HiGHS failed on the LP relaxation ({status})")
        status = self.h.getModelStatus()
        self.timed_out = status == highspy.HighsModelStatus.kTimeLimit
        if status != highspy.HighsModelStatus.kOptimal:
            return None, status == highspy.HighsModelStatus.kInfeasible
        return column_values(np.asarray(self.h.getSolution().col_value), self.model.S[0]), False


def round_keep(graph: Graph, spec: ModelSpec, keep: np.ndarray, device: str,
               lazy: bool = True) -> tuple[list, np.ndarray] | None:
    """Instructions for a keep-set, and the index of each stage's first instruction: keep[t, v] = v may stay
    resident into stage t (t = 1..T). `lazy`: a value is kept only while it is resident, and one the keep-set
    wants back after it was dropped is recomputed where a stage reads it, not early just to be held (at tight
    budgets the LP's fractional residency would otherwise recompute long chains only to keep them: bert at 40%
    of its keep-everything memory, 518 recomputations against 342); not lazy, it is recomputed in the stage
    before the keep-set wants it, where its inputs may still be at hand (mlp at 80%: only such a rounding fits,
    and no lazy one can be repaired). Values that cannot be recomputed and required
    results are kept from their computation to their last use (or the end). None if a stage needs a value that
    can be neither kept nor recomputed."""
    a = graph.arrays
    n, T = spec.n, spec.T
    ids = a.ids
    ins = [spec.in_idx[spec.in_ptr[v]:spec.in_ptr[v + 1]].tolist() for v in range(n)]
    rank = rank_of(spec)
    t_ = np.arange(T + 1)[:, None]
    hold = (spec.once | spec.required)[None, :] & (t_ > spec.pos[None, :]) & (t_ <= spec.s_hi[None, :])
    keep = (keep | hold) & (t_ >= spec.s_lo[None, :]) & (t_ <= spec.s_hi[None, :])
    present: set[int] = set()
    held = np.zeros(n, dtype=bool)      # `present` as an array
    out, starts = [], np.empty(T, dtype=np.int64)
    rows = keep.tolist()        # indexing Python lists, not arrays, in the loops below: 3x faster
    for t in range(T):
        starts[t] = len(out)
        v = int(spec.order[t])
        nxt = rows[t + 1]
        comp: set[int] = set()
        stack = list(ins[v])
        if not lazy:
            stack += [u for u in np.flatnonzero(keep[t + 1]).tolist() if u not in present and spec.pos[u] < t]
        while stack:
            u = stack.pop()
            if u in present or u in comp:
                continue
            if spec.once[u]:
                return None
            comp.add(u)
            stack.extend(w for w in ins[u] if w not in present and w not in comp)
        seq = sorted(comp, key=rank.__getitem__) + [v]
        last = last_uses(spec, seq)
        gone = np.flatnonzero(held & ~keep[t + 1]).tolist()
        out.extend(Free(ids[u], device) for u in gone if u not in last)
        frees: list[list[int]] = [[] for _ in seq]
        for u, i in last.items():
            if not nxt[u]:
                frees[i].append(u)
        for k, fr in zip(seq, frees, strict=True):
            out.append(Compute(ids[k], device))
            out.extend(Free(ids[u], device) for u in fr)
        present.difference_update(gone)
        present.update(u for u in seq if nxt[u])
        held[gone] = False
        held[[u for u in seq if nxt[u]]] = True
    return out, starts


def repair(graph: Graph, cluster: Cluster, spec: ModelSpec, keep: np.ndarray, device: str,
           deadline: float, lazy: bool = True, tries: int = 1) -> tuple[Schedule, SimResult, bool] | None:
    """The rounding of a keep-set, its simulation, and whether it had to be repaired to fit the budget: at the
    first instruction over the budget, a resident value not read in that stage is dropped from its last read
    before that stage up to its next read: the one that frees the most bytes per unit of recomputation; until
    the rounding fits. With `tries` > 1, of the `tries` such values of most bytes per unit, the one whose rounding
    is fastest among those that move the overflow later or make it smaller (each tried in the simulator; the
    next `tries` when none of them does; blind drops from the start when none at all), and a
    lazy rounding drops it only up to the overflow's stage: recomputed where next read, it is then kept (a blind
    drop keeps it away to that read, which fits more often: gpt2 at 35% of its keep-everything memory, 1.33x
    against 1.37x; a tried one shows what keeping it costs). The rounding as it is is always tried;
    None if it cannot be made, if it fails for another reason than memory, if nothing kept can be dropped at the
    overflow, or at the deadline. Near the smallest budget every rounding of the LP overflows (gpt2, 3 layers,
    at 25% of its keep-everything memory: by 1.4-2.9x) and the LP is infeasible at any smaller budget: this is
    what finds a schedule there."""
    gain = spec.nbytes / np.maximum(np.nan_to_num(spec.ccost[0]), 1e-12)     # bytes per unit of recomputation
    movable = ~(spec.once | spec.required)
    read_at = _reads(graph, spec)

    def attempt(k: np.ndarray):
        rounded = round_keep(graph, spec, k, device, lazy)
        if rounded is None:
            return None
        ins, starts = rounded
        sched = Schedule(tuple(ins), graph=graph.name)
        return sched, simulate(graph, cluster, sched), starts

    start, cur, dropped = keep, attempt(keep), False
    while cur is not None:
        sched, r, starts = cur
        if r.valid:
            return sched, r, dropped
        if r.violation.code != "over-budget" or (dropped and time.perf_counter() > deadline):
            return None
        at = _overflow(r, starts)
        t = at[0]
        resident = keep[t] & movable & (spec.pos < t) & (spec.s_lo <= t) & (t <= spec.s_hi)
        opts = []
        for u in np.flatnonzero(resident).tolist():
            later = read_at[u][read_at[u] >= t]
            if later.size and later[0] > t:
                opts.append((-gain[u], u, int(later[0])))
        opts.sort()
        best = None
        for i, (_, u, nxt) in enumerate(opts if tries > 1 else opts[:1]):
            if best is not None and i % tries == 0:
                break                   # the next batch only when none of this one helped
            k = _drop_until(keep, read_at[u], u, t, t if lazy and tries > 1 else nxt, spec)
            c = attempt(k)
            if c is None:
                continue
            if tries > 1 and not c[1].valid and (c[1].violation.code != "over-budget" or _overflow(c[1], c[2]) <= at):
                continue
            if best is None or c[1].makespan < best[1][1].makespan:
                best = (k, c)
        if best is None and tries > 1:      # no tried drop helps: blind ones from the start
            return repair(graph, cluster, spec, start, device, deadline, lazy)
        if best is None:
            return None
        keep, cur = best
        dropped = True
    return None


def _overflow(r: SimResult, starts: np.ndarray) -> tuple[int, int, int]:
    """Where a rounding first overflows, later and smaller being larger: (stage, instruction, -bytes over)."""
    return int(np.searchsorted(starts, r.violation.index, side="right")) - 1, r.violation.index, -r.violation.over


def _reads(graph: Graph, spec: ModelSpec) -> list[np.ndarray]:
    """The stages that read each value, sorted."""
    a = graph.arrays
    return [np.sort(spec.pos[a.outputs_of(u)]) for u in range(spec.n)]


def _drop_until(keep: np.ndarray, reads: np.ndarray, u: int, t: int, until: int, spec: ModelSpec) -> np.ndarray:
    """The keep-set with u not kept from its last read before stage t (or its computation) up to stage `until`."""
    before = reads[reads < t]
    k = keep.copy()
    k[(int(before[-1]) if before.size else int(spec.pos[u])) + 1:until + 1, u] = False
    return k


def lp_rounding(graph: Graph, cluster: Cluster, options: SolveOptions = SolveOptions()) -> Schedule:
    t0 = time.perf_counter()
    recomputing("lp-rounding", options)
    deadline = t0 + options.time_limit
    p = options.params
    dev = pick_device(graph, cluster, options.device)
    thresholds = tuple(p.get("thresholds", THRESHOLDS))
    scales = tuple(p.get("budget_scales", BUDGET_SCALES))
    def spec_over(order=None) -> ModelSpec:      # one spec for every scale
        return make_spec(graph, Cluster((dev,)), order=order, swap=False, instage=False)

    spec = spec_over()
    seeds = int(p.get("seeds", _SEEDS))
    lp_deadline = deadline - (_SEED_SHARE * options.time_limit if seeds else 0.0)
    polish = p.get("polish", True)
    best = _POLISHED if polish else 1
    stop = p.get("stop") or threading.Event()      # never set: the call runs to its end
    found, tried, lp = (_lp_roundings(graph, cluster, spec, dev.name, thresholds, scales, options.threads,
                                      lp_deadline, deadline, best, stop) if p.get("lp", True) else ([], 0, None))
    if stop.is_set():
        raise OptschedError("lp-rounding: stopped before its roundings were done")
    if seeds:
        seeded, n = _seeded(graph, cluster, spec, dev.name, seeds, deadline, found[0][1].makespan if found else np.inf)
        found += seeded
        tried += n
    if not found and lp is not None and time.perf_counter() < deadline:
        # every keep-set over the topological order overflows: the same over an order whose readers release values
        # first (the 8-layer MLP at 65% of its keep-everything memory: 1.46x its time, where none fitted)
        spec = spec_over(memory_order(graph))
        found, more, lp = _lp_roundings(graph, cluster, spec, dev.name, thresholds, scales, options.threads,
                                        deadline, deadline, best, stop)
        tried += more
    if not found and lp is not None and lp.timed_out and not tried:
        raise not_found(graph, cluster, f"lp-rounding: its LP relaxation ({lp.model.ncol} columns, "
                        f"{lp.model.nrow} rows) did not finish within the time limit of {options.time_limit:g} s",
                        hint="raise --time-limit")
    if not found:
        if tried:
            what = f"none of {tried} roundings fits the budget of {dev.name}, nor could they be repaired"
        elif lp is None:
            what = "the lower bound has no plan to seed a keep-set with"
        else:
            what = f"the linear relaxation of its stage model has no solution within the budget of {dev.name}"
        raise not_found(graph, cluster, f"lp-rounding: {what}",
                        hint="use the MILP, allow swapping, or raise the budget")
    # polishing reorders them (bert at 40%: 3.08x as rounded, 1.63x polished; 2.21x repaired, 1.58x polished)
    done = []
    for sched, r0, repaired, scale, theta, lazy, seed in found:
        sched, r = (keep_instead_of_recompute(graph, cluster, sched, deadline=deadline, remake=p.get("remake", True))
                    if polish else (sched, r0))
        done.append((sched, r, scale, theta, repaired, lazy, r0.recomputed, seed))
    sched, r, scale, theta, repaired, _, rounded, seed = min(done, key=lambda f: (f[1].makespan, f[5]))
    return Schedule(sched.instructions, SolveReport(
        "lp-rounding", "heuristic", objective=r.makespan, solve_time=time.perf_counter() - t0,
        extra={"peak": r.peak, "recomputed": r.recomputed, "recomputed_as_rounded": rounded, "seed": seed,
               "lp_budget_scale": scale, "threshold": theta, "repaired": repaired}),
        graph=graph.name)


def _lp_roundings(graph: Graph, cluster: Cluster, spec: ModelSpec, device: str, thresholds, scales, threads,
                  lp_deadline: float, deadline: float, best: int,
                  stop: threading.Event) -> tuple[list, int, _Relaxation]:
    """(`lp_rounding`'s found entries, how many keep-sets were tried, the relaxation): the `best` fastest roundings
    of the LP over `spec` at the first budget scale where one fits or can be repaired; `stop` set ends them."""
    found, tried = [], 0
    lp = _Relaxation(spec, threads)
    infeasible_at = 0.0
    for scale in scales:
        left = deadline - time.perf_counter()
        if left <= 0 or stop.is_set():
            break
        if scale <= infeasible_at:
            continue                   # a smaller budget than an infeasible one
        S, infeasible = lp.solve(scale, left)
        if infeasible:
            infeasible_at = scale
        if S is None:
            continue
        # a slow LP leaves no time to the seeds: its roundings then take it all (gpt2, 3 layers, at 25-30%)
        until = lp_deadline if time.perf_counter() < lp_deadline else deadline
        keeps = {}
        for theta, lazy in itertools.product(thresholds, (True, False)):
            keep = S >= theta - 1e-9
            keeps.setdefault((keep.tobytes(), lazy), (theta, keep, lazy))
        # repaired overflows often beat the roundings that fit (bert at 40%: 1.58x keep-everything against 1.62x)
        for k, (theta, keep, lazy) in enumerate(keeps.values()):
            if stop.is_set():
                break
            tried += 1
            share = (until - time.perf_counter()) / (len(keeps) - k + 1)
            fixed = repair(graph, cluster, spec, keep, device, time.perf_counter() + share, lazy)
            if fixed is not None:
                found.append((*fixed, scale, theta, lazy, "lp"))
        if found:
            break
    # on a tie the rounding that recomputes a stage early: it is the LP's own staging, so it fits the MILP's stage
    # model without gap stages more often (transformer at 60%: 8 gap stages lazily, none so; optimal in 21 s, not
    # 1.6% gap in 60 s); then the rounding that fits as it is
    found.sort(key=lambda f: (f[1].makespan, f[5], f[2]))
    return found[:best], tried, lp


def _seeded(graph: Graph, cluster: Cluster, spec: ModelSpec, device: str, count: int, deadline: float,
            best: float) -> tuple[list, int]:
    """Keep-sets from the lower bound's own plans (`bounds.moment_plans`: one moment's, and the coupled one over
    the chain of moments where it proves more): everything kept, but what the plan drops at each of its moments
    dropped there; repaired by trial (`repair`, `_TRIES`); entries as `lp_rounding`'s `found`, and how many were
    tried. Nothing when `best` (seconds, the fastest rounding so far) is within _ROOM of the plans' bound, or when
    no time is left."""
    if time.perf_counter() >= deadline:
        return [], 0
    everything = np.ones((spec.T + 1, spec.n), dtype=bool)     # round_keep holds values only while they live
    reads = _reads(graph, spec)
    left = (deadline - time.perf_counter()) / 3
    plans, bound = moment_plans(spec, count, min(_PLAN_SECONDS, left), min(_CHAIN_SECONDS, left))
    if best <= bound / (1 - _ROOM):
        return [], 0
    out = []
    for k, plan in enumerate(plans):
        keep = everything
        for x, drop in plan:
            at = int(spec.pos[x])
            for u in drop.tolist():
                keep = _drop_until(keep, reads[u], u, at, at, spec)
        share = (deadline - time.perf_counter()) / (len(plans) - k)
        fixed = repair(graph, cluster, spec, keep, device, time.perf_counter() + share, True, _TRIES)
        if fixed is not None:
            out.append((*fixed, 1.0, None, True, "bound at " + ", ".join(graph.arrays.ids[x] for x, _ in plan)))
    return out, len(plans)
