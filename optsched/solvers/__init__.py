"""Solvers: each is `solver(graph, cluster, options) -> Schedule`, found by
name in `SOLVERS`, so a notebook swaps one for another in one line. Solvers
import the IR and the simulator, never torch."""

from __future__ import annotations

from ..cluster import Cluster
from ..errors import OptschedError
from ..graph import Graph
from ..schedule import Schedule
from .baselines import articulation, chen_greedy, chen_sqrt, keep_everything
from .heuristics import dtr, heuristic, metf, offload_all
from .milp import milp, pulp_cbc, pulp_solver
from .options import SolveOptions
from .rounding import lp_rounding

SOLVERS = {
    "keep-everything": keep_everything,
    "chen-sqrt": chen_sqrt,
    "chen-greedy": chen_greedy,
    "articulation": articulation,
    "offload-all": offload_all,
    "dtr": dtr,
    "heuristic": heuristic,
    "metf": metf,
    "lp-rounding": lp_rounding,
    "milp": milp,
    "pulp": pulp_cbc,
}


def get_solver(name: str):
    if name.startswith("pulp:") and len(name) > 5:
        return pulp_solver(name[5:])
    try:
        return SOLVERS[name]
    except KeyError:
        raise OptschedError(f"unknown solver {name!r}", hint="solvers are " + ", ".join(SOLVERS)) from None


def solve(graph: Graph, cluster: Cluster, solver: str = "keep-everything", options: SolveOptions | None = None,
          **kwargs) -> Schedule:
    """Run the named solver; keyword arguments override fields of `options`."""
    from dataclasses import replace

    opts = replace(options or SolveOptions(), **kwargs)
    return get_solver(solver)(graph, cluster, opts)


__all__ = ["SOLVERS", "SolveOptions", "get_solver", "solve", "keep_everything", "chen_sqrt"]
