"""Shared by the single-device solvers: turn an ordered list of computations
(recomputations included) into instructions, freeing each value right after
its last reader. Required results are kept to the end."""

from __future__ import annotations

from ..cluster import Cluster, Device
from ..errors import OptschedError
from ..graph import Graph
from ..schedule import Compute, Free, Instruction


def pick_device(graph: Graph, cluster: Cluster, name: str | None) -> Device:
    """The named device, else the first accelerator, else the first device;
    refuse plainly if some node cannot run on its kind."""
    if name is not None:
        dev = cluster.device(name)
    else:
        dev = next(iter(cluster.accelerators), cluster.devices[0])
    costs = graph.arrays.cost.get(dev.kind)
    if costs is None or (costs != costs).any():
        bad = graph.arrays.ids[int((costs != costs).argmax())] if costs is not None else graph.arrays.ids[0]
        raise OptschedError(f"node {bad!r} cannot run on a {dev.kind} device, and this solver runs every node "
                            f"on {dev.name!r}", hint="pick another device with --device or use a multi-device solver")
    return dev


def sequential_instructions(graph: Graph, device: str, computes: list[int]) -> list[Instruction]:
    """Instructions for `computes` (node positions, in order) on one device.

    Each computation makes a new instance of its node; the instance is freed
    after its last reader, i.e. before the next computation of the same node.
    """
    a = graph.arrays
    in_ptr, in_idx = a.in_ptr.tolist(), a.in_idx.tolist()
    required = a.required.tolist()
    n = len(computes)
    free_after: list[list[int]] = [[] for _ in range(n)]
    latest_reader: dict[int, int] = {}
    seen: set[int] = set()
    for p in range(n - 1, -1, -1):
        v = computes[p]
        last = latest_reader.pop(v, p)
        if not (required[v] and v not in seen):
            free_after[last].append(v)
        seen.add(v)
        for j in range(in_ptr[v], in_ptr[v + 1]):
            latest_reader.setdefault(in_idx[j], p)
    ids = a.ids
    out: list[Instruction] = []
    for p, v in enumerate(computes):
        out.append(Compute(ids[v], device))
        for u in free_after[p]:
            out.append(Free(ids[u], device))
    return out
