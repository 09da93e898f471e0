"""Baseline schedules on one device, to compare every other solver against.

- keep-everything: every node once, in topological order, each value freed
  after its last reader: what a framework needs without checkpointing.
- chen-sqrt: Chen et al. (2016) sqrt(n) checkpointing: of the forward nodes
  (topological order) keep every ceil(n/k)-th with k = round(sqrt(n)) segments;
  the rest are dropped after the forward pass and recomputed, from the nearest
  kept ancestors, when the backward pass first needs them. A node that reads
  a backward node (directly or not) belongs to the backward pass, whatever its kind.
"""

from __future__ import annotations

import math
import time

from ..cluster import Cluster
from ..errors import OptschedError
from ..graph import KINDS, Graph
from ..schedule import Schedule, SolveReport
from .options import SolveOptions
from .sequential import pick_device, sequential_instructions

_FORWARD = KINDS.index("forward")
_BACKWARD = (KINDS.index("backward"), KINDS.index("optimizer"))
_SOURCES = (KINDS.index("param"), KINDS.index("input"))


def keep_everything(graph: Graph, cluster: Cluster, options: SolveOptions = SolveOptions()) -> Schedule:
    t0 = time.perf_counter()
    dev = pick_device(graph, cluster, options.device)
    ins = sequential_instructions(graph, dev.name, graph.arrays.topo.tolist())
    return Schedule(tuple(ins), SolveReport("keep-everything", "heuristic", solve_time=time.perf_counter() - t0),
                    graph=graph.name)


def chen_sqrt(graph: Graph, cluster: Cluster, options: SolveOptions = SolveOptions()) -> Schedule:
    t0 = time.perf_counter()
    dev = pick_device(graph, cluster, options.device)
    a = graph.arrays
    topo = a.topo.tolist()
    kind = a.kind.tolist()
    if not any(kind[v] in _BACKWARD for v in topo):
        raise OptschedError("chen-sqrt needs a graph whose nodes are tagged forward and backward; this one has no "
                            "backward node", hint="use keep-everything, or tag the nodes' kind")
    in_ptr, in_idx = a.in_ptr.tolist(), a.in_idx.tolist()
    late = [t in _BACKWARD for t in kind]   # backward phase: backward nodes and whatever reads them
    for v in topo:
        if not late[v] and any(late[in_idx[j]] for j in range(in_ptr[v], in_ptr[v + 1])):
            late[v] = True
    forward = [v for v in topo if kind[v] == _FORWARD and a.recomputable[v] and not late[v]]
    k = int(options.params.get("segments", max(1, round(math.sqrt(len(forward))))))
    if k < 1:
        raise OptschedError("chen-sqrt: segments must be at least 1")
    step = max(1, math.ceil(len(forward) / k)) if forward else 1
    dropped = set(forward) - set(forward[step - 1::step])

    # parameters and inputs that only the backward pass reads are loaded when it first needs them
    out_ptr, out_idx = a.out_ptr.tolist(), a.out_idx.tolist()
    deferred = {v for v in topo if kind[v] in _SOURCES and out_ptr[v] < out_ptr[v + 1]
                and all(late[c] for c in out_idx[out_ptr[v]:out_ptr[v + 1]])}
    computes = [v for v in topo if not late[v] and v not in deferred]
    resident = set(computes) - dropped

    def ensure(root: int) -> None:
        """Recompute `root` after its missing ancestors, depth first, iteratively."""
        stack = [(root, False)]
        while stack:
            v, expanded = stack.pop()
            if v in resident:
                continue
            if expanded:
                computes.append(v)
                resident.add(v)
                continue
            stack.append((v, True))
            for j in range(in_ptr[v + 1] - 1, in_ptr[v] - 1, -1):
                if in_idx[j] not in resident:
                    stack.append((in_idx[j], False))

    for v in topo:
        if late[v]:
            for j in range(in_ptr[v], in_ptr[v + 1]):
                ensure(in_idx[j])
            computes.append(v)
            resident.add(v)
    ins = sequential_instructions(graph, dev.name, computes)
    return Schedule(tuple(ins), SolveReport("chen-sqrt", "heuristic", solve_time=time.perf_counter() - t0,
                                            extra={"segments": k, "checkpoints": len(forward) - len(dropped)}),
                    graph=graph.name)
