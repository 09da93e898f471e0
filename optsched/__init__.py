"""optsched: the optimal way to run one training step under memory budgets.

The IR (`Graph`, `Cluster`, `Schedule`), the simulator that judges schedules,
and the solvers that make them. Torch-dependent parts (capture, execute) are
imported lazily and are optional.
"""

from .cluster import Cluster, Device, Link, single_accelerator
from .errors import OptschedError
from .formats import load_cluster, load_graph, load_schedule, save_cluster, save_graph, save_schedule
from .graph import Graph, Node, from_networkx, memory_lower_bound, to_networkx
from .schedule import Compute, Copy, Free, Schedule, SolveReport, Sync
from .simulate import SimResult, Violation, simulate
from .solvers import SOLVERS, SolveOptions, solve

__version__ = "0.1.0"

__all__ = [
    "Cluster", "Device", "Link", "single_accelerator", "OptschedError", "load_cluster", "load_graph",
    "load_schedule", "save_cluster", "save_graph", "save_schedule", "Graph", "Node", "from_networkx",
    "memory_lower_bound", "to_networkx", "Compute", "Copy", "Free", "Schedule", "SolveReport", "Sync",
    "SimResult", "Violation", "simulate", "SOLVERS", "SolveOptions", "solve",
]
