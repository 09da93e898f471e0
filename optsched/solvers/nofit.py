"""Why a solver returns no schedule, and whether that is proven.

Two things prove that no schedule fits a cluster: an operation whose inputs, output and workspace exceed the
budget of every device that can run it; and, where one device computes everything and nothing can be copied off
it, a recomputation relaxation of every schedule without a point (`bounds.lower_bounds`: at some operation's
first computation, what must be resident exceeds the budget whatever is recomputed). A heuristic or a baseline
that finds nothing proves nothing (another solver may find a schedule), so its error says "no schedule found",
not "no schedule fits", unless one of those two holds (the second is checked at the budget, and the error then
gives `bounds.least_budget`). The MILP, where it finds none, also tries the relaxation over the final computations of
the largest weight gradients and over the moments where its closest candidate overflowed, in every order and with
the memory between them (`bounds.no_fit`).

What a user needs next is a budget that fits. The peak of a solver's closest schedule at a budget too small is
often far above it (GPT-2 at 25% of its keep-everything memory: the MILP's candidates came closest at 54.6%, where
DTR finds a schedule at 29.96%, 0.11 points above the least budget, in half a second), so the MILP bisects for a
smaller one with its fast candidates (`smaller_found`).
"""

from __future__ import annotations

import threading
import time
from dataclasses import replace

import numpy as np

from ..cluster import Cluster
from ..errors import InfeasibleError
from ..graph import Graph, memory_lower_bound, operation_memory
from ..simulate import simulate
from ..units import format_size
from .partition import runnable_mask


def unplaceable(graph: Graph, names: list[str], runs: np.ndarray, budget: np.ndarray) -> str:
    """Why no schedule exists when an operation's inputs, output and workspace exceed the budget of every device
    that can run it (`runs[d, v]`, `budget[d]` bytes); "" otherwise."""
    need = operation_memory(graph)
    room = np.where(runs, np.asarray(budget, dtype=np.float64)[:, None], -np.inf).max(axis=0, initial=-np.inf)
    bad = np.flatnonzero(need > room)
    if not bad.size:
        return ""
    v = int(bad[np.argmax(need[bad] - room[bad])])
    where = [f"{names[d]} {format_size(budget[d])}" for d in np.flatnonzero(runs[:, v])]
    return (f"operation {graph.arrays.ids[v]!r} needs {format_size(need[v])} while it runs (inputs, output, "
            f"workspace), more than the budget of any device that can run it ({', '.join(where) or 'none'})")


def no_room(graph: Graph, at, between: bool = False, latest: bool = False) -> str:
    """Why no schedule fits when the recomputation relaxation at the moments `at` has no point (`between`: taken
    in every order, with the computations between them: `bounds.no_fit`; `latest`: at whichever of them comes
    last, `bounds._latest`). A moment is an operation's first computation, (w, -1) w's final one, or (v, w) v's
    last computation before w's final one."""
    ids = graph.arrays.ids
    if latest:
        pairs = ", ".join(f"{ids[v]!r} before {ids[w]!r}" for v, w in at)
        return (f"whichever of its last computations of {pairs} comes last, the other results computed for the "
                f"last time or what they read still held beside it, every schedule must hold more than the budget, "
                f"whatever it recomputes")
    firsts = [repr(ids[m]) for m in at if not isinstance(m, tuple)]
    finals = [repr(ids[m[0]]) for m in at if isinstance(m, tuple) and m[1] < 0]
    befores = [f"{ids[m[0]]!r} before {ids[m[1]]!r}" for m in at if isinstance(m, tuple) and m[1] >= 0]
    parts = [f"first computes {', '.join(firsts)}"] if firsts else []
    parts += [f"computes {', '.join(finals)} for the last time"] if finals else []
    parts += [f"last computes {', '.join(befores)}"] if befores else []
    names = ", and ".join(parts)
    if between:
        names = f"{names}, in whichever order, or between them"
    return f"when it {names}, every schedule must hold more than the budget, whatever it recomputes"


_PROOFS: list = []      # (graph, cluster, least budget or None): the last few `_least_budget` gave
_PROOFS_LOCK = threading.Lock()


def _least_budget(graph: Graph, cluster: Cluster) -> int | None:
    """`bounds.least_budget(make_spec(graph, cluster), if_over=True)`, once per graph and cluster of the last few:
    it depends on nothing else, and the solvers that find nothing at one budget ask again (the MILP's candidates,
    each a solver of its own: six times on the transformer at 45% of its keep-everything memory, 0.39 s each)."""
    from .bounds import least_budget
    from .milp_model import make_spec

    with _PROOFS_LOCK:
        for g, c, least in _PROOFS:
            if g is graph and c == cluster:
                return least
    least = least_budget(make_spec(graph, cluster), if_over=True)
    with _PROOFS_LOCK:
        _PROOFS.append((graph, cluster, least))
        del _PROOFS[:-4]
    return least


def not_found(graph: Graph, cluster: Cluster, message: str, hint: str | None = None,
              closest=None, found: int | None = None) -> InfeasibleError:
    """The error for a solver that found no schedule: proven when an operation fits no device of the cluster
    that can run it, or when the recomputation bound shows that nothing fits (with the budget below which
    nothing does), else unproven with `message` (what the solver tried), `closest`, its schedule with the
    smallest peak, and `found`, that peak in bytes (the solver simulated it already)."""
    runs = runnable_mask(graph, cluster)
    budget = np.array([dev.memory for dev in cluster.devices], dtype=np.int64)
    why = unplaceable(graph, [dev.name for dev in cluster.devices], runs, budget)
    if why:
        return InfeasibleError(why, hint="raise the budget, or add a device with room for it",
                               least=memory_lower_bound(graph))
    least = _least_budget(graph, cluster)
    if least is not None:
        budgets = ", ".join(f"{dev.name} {format_size(dev.memory)}" for dev in cluster.devices)
        return InfeasibleError(f"budget {budgets}; whatever it recomputes, no schedule fits under "
                               f"{format_size(least)} ({least} bytes)",
                               hint="raise the budget, add devices, or allow swapping", least=least)
    return InfeasibleError(message, hint=hint, proven=False, closest=closest, found=found)


def smallest_peak(cluster: Cluster, peaks) -> int | None:
    """The least, over schedules (`peaks`: bytes per device name, each), of the largest peak on an accelerator
    (on every device where the cluster has none): the smallest budget at which one of them was found."""
    names = [d.name for d in cluster.accelerators] or [d.name for d in cluster.devices]
    return min((max(pk.get(nm, 0) for nm in names) for pk in peaks), default=None)


_FOUND_WITHIN = 0.005   # `smaller_found` stops where the budgets bracketing it are this close (relative)


def smaller_found(graph: Graph, cluster: Cluster, options, lo: int, hi: int, seconds: float):
    """(The least budget the tries prove, 0 where none does; the smallest budget at which DTR, the list-scheduling
    heuristic or lp-rounding, tried in that order (the fastest first, each with half the seconds left), find a
    schedule, `hi` where they find none below it; that schedule, or None.) They run with every accelerator's budget
    (every device's, where the cluster has none) set between `lo` (bytes: below it nothing fits, or nothing was
    found) and `hi` (the smallest peak found so far), by bisection, until the two are within _FOUND_WITHIN or
    `seconds` pass (the solver running then finishes its try; Ctrl-C ends the search with what it has). A
    schedule found moves `hi` to its `smallest_peak` (one over the budget tried too: a try's closest), a try that
    proves nothing fits moves `lo` to the least budget its proof gives. `options`: the caller's, whose swapping
    and recomputation flags they keep."""
    from .heuristics import dtr, heuristic  # they report through this module
    from .milp import _candidate
    from .rounding import lp_rounding

    until = time.perf_counter() + seconds
    least, best = 0, None
    names = {d.name for d in (cluster.accelerators or cluster.devices)}

    def with_budget(b: int) -> Cluster:
        return replace(cluster, devices=tuple(replace(d, memory=b) if d.name in names else d for d in cluster.devices))

    try:
        while hi - lo > _FOUND_WITHIN * hi and time.perf_counter() < until:
            mid = (lo + hi) // 2
            at = with_budget(mid)
            for fn in (dtr, heuristic, lp_rounding):
                left = until - time.perf_counter()
                if left <= 0:
                    break
                try:        # its schedule, or the closest it came (over `mid`), or None
                    sched = _candidate(graph, at, replace(options, time_limit=left), fn, 0.5, proofs=True)
                except InfeasibleError as e:    # proven: nothing fits there, nor below the proof's least budget
                    least = max(least, mid + 1, e.least)
                    lo = max(lo, least)
                    break
                if sched is None:
                    continue
                r = simulate(graph, at, sched)
                peak = smallest_peak(at, [r.peak])
                if peak < hi and (r.valid or simulate(graph, with_budget(peak), sched).valid):
                    hi, best = peak, sched
                if r.valid:
                    break
            else:
                lo = max(lo, mid)
    except KeyboardInterrupt:
        pass
    return least, hi, best
