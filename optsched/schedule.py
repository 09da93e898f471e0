"""A schedule: the ordered instruction list every solver emits and the
simulator and executor consume (DESIGN.md, "The schedule contract").

  compute v @ d    run v on d; its inputs must be resident on d
  copy v a->b      move a copy of v over the a->b link; v stays on a
  free v @ d       release v on d once its earlier readers there are done
  sync             nothing after it starts before everything before it ends
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class Compute:
    node: str
    device: str


@dataclass(frozen=True, slots=True)
class Copy:
    node: str
    src: str
    dst: str


@dataclass(frozen=True, slots=True)
class Free:
    node: str
    device: str


@dataclass(frozen=True, slots=True)
class Sync:
    pass


Instruction = Compute | Copy | Free | Sync

STATUSES = ("optimal", "feasible", "time_limit", "interrupted", "heuristic", "infeasible", "error")


@dataclass(frozen=True)
class SolveReport:
    """How a solver got its schedule. `objective` is the solver's own model of
    the step time (seconds); `bound` a proven lower bound on it, when known."""

    solver: str
    status: str = "heuristic"
    objective: float | None = None
    bound: float | None = None
    gap: float | None = None
    solve_time: float = 0.0
    message: str = ""
    extra: Mapping = field(default_factory=dict)


@dataclass(frozen=True)
class Schedule:
    instructions: tuple[Instruction, ...]
    report: SolveReport | None = None
    graph: str = ""   # name of the graph it was made for, informative
