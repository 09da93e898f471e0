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
"""

from __future__ import annotations

import numpy as np

from ..cluster import Cluster
from ..errors import InfeasibleError
from ..graph import Graph, memory_lower_bound, operation_memory
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


def not_found(graph: Graph, cluster: Cluster, message: str, hint: str | None = None,
              closest=None, found: int | None = None) -> InfeasibleError:
    """The error for a solver that found no schedule: proven when an operation fits no device of the cluster
    that can run it, or when the recomputation bound shows that nothing fits (with the budget below which
    nothing does), else unproven with `message` (what the solver tried), `closest`, its schedule with the
    smallest peak, and `found`, that peak in bytes (the solver simulated it already)."""
    from .bounds import least_budget
    from .milp_model import make_spec

    runs = runnable_mask(graph, cluster)
    budget = np.array([dev.memory for dev in cluster.devices], dtype=np.int64)
    why = unplaceable(graph, [dev.name for dev in cluster.devices], runs, budget)
    if why:
        return InfeasibleError(why, hint="raise the budget, or add a device with room for it",
                               least=memory_lower_bound(graph))
    least = least_budget(make_spec(graph, cluster), if_over=True)
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
