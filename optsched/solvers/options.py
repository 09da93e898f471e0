"""The one calling convention: every solver is `solver(graph, cluster, options) -> Schedule`."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

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
    progress: Callable[[dict], None] | None = None   # called with {incumbent, bound, gap, elapsed}
    verbose: bool = False
    params: Mapping = field(default_factory=dict)    # solver-specific knobs, e.g. {"segments": 8}
