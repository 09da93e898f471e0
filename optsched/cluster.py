"""The machine a step runs on: devices with memory budgets and the links between them.

A node's time on a device is `node.cost[device.kind] / device.speed`. A copy of
`b` bytes over a link takes `latency + b / bandwidth`. Each device has one
compute stream and each directed link one copy stream (DESIGN.md). A link's
`issue` is the time each copy also takes from the compute streams of its ends:
the thread that runs their computations hands the copy over. Zero for CUDA,
whose host thread runs ahead of the GPU; on a CPU replay, where one thread
computes and wakes a copy worker, `execute.measure_copy_issue` measures it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from functools import cached_property

from .errors import ClusterError
from .graph import SOURCE_KINDS, Graph
from .units import format_size

DEFAULT_HOST_MEMORY = 256 * 10**9       # bytes of host RAM usable as swap space
DEFAULT_PCIE_BANDWIDTH = 16 * 10**9     # bytes/s per direction, PCIe 4.0 x16 in practice
DEFAULT_PCIE_LATENCY = 10e-6            # seconds per transfer


@dataclass(frozen=True, slots=True)
class Device:
    name: str
    kind: str           # "cuda" or "cpu"
    memory: int         # budget in bytes
    speed: float = 1.0  # divides every cost on this device


@dataclass(frozen=True, slots=True)
class Link:
    src: str
    dst: str
    bandwidth: float    # bytes per second
    latency: float = 0.0
    issue: float = 0.0  # seconds of each end's compute stream per copy

    def time(self, nbytes: int) -> float:
        return self.latency + nbytes / self.bandwidth


@dataclass(frozen=True)
class Cluster:
    devices: tuple[Device, ...]
    links: tuple[Link, ...] = ()

    @cached_property
    def device_index(self) -> dict[str, int]:
        return {d.name: i for i, d in enumerate(self.devices)}

    @cached_property
    def link_index(self) -> dict[tuple[str, str], int]:
        return {(lk.src, lk.dst): i for i, lk in enumerate(self.links)}

    def device(self, name: str) -> Device:
        i = self.device_index.get(name)
        if i is None:
            raise ClusterError(f"unknown device {name!r}", hint="devices are " + ", ".join(self.device_index))
        return self.devices[i]

    def link(self, src: str, dst: str) -> Link | None:
        i = self.link_index.get((src, dst))
        return None if i is None else self.links[i]

    @property
    def accelerators(self) -> tuple[Device, ...]:
        return tuple(d for d in self.devices if d.kind == "cuda")


def single_accelerator(memory: int, *, host_memory: int = DEFAULT_HOST_MEMORY,
                       bandwidth: float = DEFAULT_PCIE_BANDWIDTH, latency: float = DEFAULT_PCIE_LATENCY,
                       gpus: int = 1, issue: float = 0.0) -> Cluster:
    """What `--mem 16GB` means: `gpus` accelerators with that budget each, plus
    the host (RAM as swap space; it may compute too), joined by PCIe both ways."""
    devices = [Device(f"gpu{i}", "cuda", int(memory)) for i in range(gpus)]
    devices.append(Device("host", "cpu", int(host_memory)))
    links = []
    for d in devices[:-1]:
        links.append(Link(d.name, "host", bandwidth, latency, issue))
        links.append(Link("host", d.name, bandwidth, latency, issue))
    return check_cluster(Cluster(tuple(devices), tuple(links)))


def hold_sources(graph: Graph, cluster: Cluster, device: str) -> tuple[Graph, Cluster]:
    """The problem for a model that holds its parameters and its step's inputs on `device` all step, as a PyTorch
    model on the GPU and its batch do: those nodes weigh nothing (dropping or swapping one out frees nothing) and
    `device`'s budget is smaller by their bytes. A schedule for it holds at most `device`'s budget there with all
    of them resident, and is a schedule for the plain problem too (on `device`)."""
    held = sum(n.bytes for n in graph.nodes if n.kind in SOURCE_KINDS)
    dev = cluster.device(device)
    if held >= dev.memory:
        raise ClusterError(f"the parameters and inputs alone take {format_size(held)}, all of {device}'s budget "
                           f"of {format_size(dev.memory)}", field="memory",
                           hint="raise the budget, or let the schedule move them (no --hold-model; hold=False)")
    nodes = tuple(replace(n, bytes=0) if n.kind in SOURCE_KINDS else n for n in graph.nodes)
    devices = tuple(replace(d, memory=d.memory - held) if d.name == device else d for d in cluster.devices)
    return Graph(nodes, graph.name, graph.meta), replace(cluster, devices=devices)


def check_cluster(cluster: Cluster) -> Cluster:
    """Raise `ClusterError` naming the device or link that breaks a rule."""
    if not cluster.devices:
        raise ClusterError("a cluster needs at least one device")
    names = set()
    for d in cluster.devices:
        if not isinstance(d.name, str) or not d.name:
            raise ClusterError("device name must be a non-empty string", field="name")
        if d.name in names:
            raise ClusterError(f"duplicate device name {d.name!r}", field="name")
        names.add(d.name)
        if d.kind not in ("cuda", "cpu"):
            raise ClusterError(f"device {d.name!r}: unknown kind {d.kind!r}", field="kind", hint="use cuda or cpu")
        if isinstance(d.memory, bool) or not isinstance(d.memory, int) or d.memory < 0:
            raise ClusterError(f"device {d.name!r}: memory must be a non-negative number of bytes", field="memory")
        if not (isinstance(d.speed, (int, float)) and math.isfinite(d.speed) and d.speed > 0):
            raise ClusterError(f"device {d.name!r}: speed must be a positive number", field="speed")
    pairs = set()
    for lk in cluster.links:
        for end in (lk.src, lk.dst):
            if end not in names:
                raise ClusterError(f"link {lk.src}->{lk.dst} names unknown device {end!r}", field="links",
                                   hint="devices are " + ", ".join(sorted(names)))
        if lk.src == lk.dst:
            raise ClusterError(f"link {lk.src}->{lk.dst} joins a device to itself", field="links")
        if (lk.src, lk.dst) in pairs:
            raise ClusterError(f"duplicate link {lk.src}->{lk.dst}", field="links")
        pairs.add((lk.src, lk.dst))
        if not (math.isfinite(lk.bandwidth) and lk.bandwidth > 0):
            raise ClusterError(f"link {lk.src}->{lk.dst}: bandwidth must be positive", field="bandwidth")
        if not (math.isfinite(lk.latency) and lk.latency >= 0):
            raise ClusterError(f"link {lk.src}->{lk.dst}: latency must be non-negative", field="latency")
        if not (math.isfinite(lk.issue) and lk.issue >= 0):
            raise ClusterError(f"link {lk.src}->{lk.dst}: issue must be non-negative", field="issue")
    return cluster
