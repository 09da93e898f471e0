"""Large-neighbourhood search on the MILP's own model, for a core that branch and bound leaves idle, and for a
model too large for branch and bound in the time left (its sub-MIPs presolve the fixed columns away).

Each round frees every column of a random set of values (all stages, devices and links), fixes the others at the
incumbent, and has HiGHS solve that small sub-MIP for a few seconds; a better point becomes the incumbent. A round
can trade keeping one value from the forward to the backward pass against dropping others, a move that spans the
whole model and that branch and bound from the root rarely reaches at tight budgets, where its incumbent stays the
warm start for the whole time limit (60 s on 2 cores: the transformer at 45% of its keep-everything memory 1.359x
-> 1.351x of keep-everything's step time, BERT at 40% 1.577x -> 1.559x, GPT-2 at 50% 1.167x -> 1.165x). Every
point is a point of the model, so the model's bound holds for it.
"""

from __future__ import annotations

import time

import numpy as np

from .milp_model import MilpArrays

_SIZE = 60      # values freed per round
_STEP = 4.0     # seconds at most per round


def improve(model: MilpArrays, x: np.ndarray, until: float, stopped, goal: float = -np.inf,
            seed: int = 0, found=None) -> tuple[np.ndarray, dict]:
    """(the best point found from `x` by `until` (perf_counter), {"rounds", "improved"}). `stopped()` ends it
    early (checked between rounds and inside HiGHS), and so does a point at or below `goal` (model units).
    `found(objective)` (model units) is called with each better point (the progress lines)."""
    from .milp import highs_model, run_highs

    node = np.full(model.ncol, -1, dtype=np.int64)       # the value each R, S and C column is about
    for arr in (model.R, model.S, model.C):
        at = arr >= 0
        node[arr[at]] = np.nonzero(at)[-1]
    n = model.spec.n
    size = min(_SIZE, max(1, n // 2))
    rng = np.random.default_rng(seed)
    best = np.where(model.integ == 1, np.round(x), x)
    if stopped():       # before the HiGHS model: passing a large one takes seconds (a Ctrl-C waited 3-4 s for it)
        return best, {"rounds": 0, "improved": 0}
    obj = float(model.cost @ best)
    h = highs_model(model)
    h.setOptionValue("output_flag", False)
    h.setOptionValue("threads", 1)

    def poll(e):
        if stopped():
            e.interrupt()

    h.cbMipInterrupt.subscribe(poll)
    cols = np.arange(model.ncol, dtype=np.int32)
    rounds = improved = 0
    while not stopped() and obj > goal and until - time.perf_counter() > 0.5:
        free = np.zeros(n + 1, dtype=bool)
        free[rng.choice(n, size, replace=False)] = True
        keep = ~free[np.where(node >= 0, node, n)] & (node >= 0)
        h.changeColsBounds(model.ncol, cols, np.where(keep, best, model.lb), np.where(keep, best, model.ub))
        h.setOptionValue("time_limit", float(min(_STEP, until - time.perf_counter())))
        h.setSolution(int(best.size), cols, best)
        run_highs(h)
        rounds += 1
        if h.getInfo().primal_solution_status >= 1:
            y = np.asarray(h.getSolution().col_value)
            y = np.where(model.integ == 1, np.round(y), y)
            if float(model.cost @ y) < obj * (1 - 1e-9):
                best, obj = y, float(model.cost @ y)
                improved += 1
                if found is not None:
                    found(obj)
    return best, {"rounds": rounds, "improved": improved}
