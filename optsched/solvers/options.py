"""The one calling convention: every solver is `solver(graph, cluster, options) -> Schedule`."""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from ..errors import OptschedError
from ..schedule import Schedule


@dataclass(frozen=True)
class SolveOptions:
    time_limit: float = 60.0          # seconds of solver wall time
    gap: float = 0.01                 # relative optimality gap at which a MILP stops
    threads: int | None = None        # solver threads; None lets the solver choose
    device: str | None = None         # single-device solvers: which device (default: first accelerator)
    devices: int | None = None        # use at most this many accelerators
    swap: bool = True                 # may copy tensors to host memory and back
    recompute: bool = True            # may drop and recompute activations
    warm_start: Schedule | None = None   # a feasible schedule to start from (MILP: its incumbent)
    write_model: str | None = None       # MILP: also write the model to this .mps or .lp file
    progress: Callable[[dict], None] | None = None   # called with {incumbent, bound, gap, elapsed} (s from the call)
    verbose: bool = False
    params: Mapping = field(default_factory=dict)    # solver-specific knobs, e.g. {"segments": 8}

    def __post_init__(self):
        """Refuses what no solver can honour, at once and by name (the CLI's flags read the same), rather than
        letting it through: with a gap of nan, the MILP called a schedule at a 57% gap optimal."""
        for name, low in (("time_limit", 0.0), ("gap", 0.0)):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, numbers.Real) or not math.isfinite(v) or v < low:
                raise OptschedError(f"{name} (--{name.replace('_', '-')}) must be a finite number of at least {low:g},"
                                    f" not {v!r}", hint=_HINTS[name])
        if self.gap > 1:
            raise OptschedError(f"gap (--gap) must be a fraction from 0 to 1, not {self.gap!r}", hint=_HINTS["gap"])
        for name in ("threads", "devices"):
            v = getattr(self, name)
            if v is not None and (isinstance(v, bool) or not isinstance(v, numbers.Integral) or v < 1):
                raise OptschedError(f"{name} (--{name}) must be a whole number of at least 1, not {v!r}",
                                    hint=_HINTS[name])


def recomputing(name: str, options: SolveOptions) -> None:
    """Refuses, by name, a solver that recomputes by design where `options` forbid recomputation (--no-recompute),
    rather than returning a schedule that recomputes all the same."""
    if not options.recompute:
        raise OptschedError(f"{name} drops activations and computes them again: it cannot run with recomputation off",
                            hint="drop --no-recompute, or pick a solver that runs without it: keep-everything, "
                                 "offload-all, heuristic or milp")


_HINTS = {"time_limit": "seconds of solver wall time, e.g. 60",
          "gap": "the relative gap to the bound at which to stop: 0.01 (or 1%) for 1%, 0 to prove optimality",
          "threads": "leave it out to let the solver choose",
          "devices": "leave it out to use every accelerator"}
