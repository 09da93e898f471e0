"""Tiny graphs and clusters for the MILP tests."""

from __future__ import annotations

import numpy as np

from optsched.cluster import Cluster, Device, Link
from optsched.graph import Graph, Node, check_graph


def small_dag(n: int, seed: int, *, ws: bool = False, output: bool = False) -> Graph:
    """n nodes: node 0 an input (not recomputable), the others read 1-2 earlier
    nodes; sinks are required; random bytes, costs (cpu 3x slower), workspace.
    `output`: node 1's op also makes "m1" (`Node.output_of`), which the last node reads."""
    rng = np.random.default_rng(seed)
    nodes = [Node("n0", "in", "input", (), {"cuda": 0.0, "cpu": 0.0}, int(rng.integers(1, 4)) * 100,
                  recomputable=False)]
    consumers = [0] * n
    for i in range(1, n):
        k = int(rng.integers(1, min(2, i) + 1))
        ins = sorted(set(rng.choice(i, size=k, replace=False).tolist()))
        for j in ins:
            consumers[j] += 1
        c = float(rng.integers(1, 6))
        nodes.append(Node(f"n{i}", "op", "forward", tuple(f"n{j}" for j in ins), {"cuda": c, "cpu": 3 * c},
                          int(rng.integers(1, 4)) * 100, int(rng.integers(0, 2)) * 50 if ws else 0))
    if output and n > 2:
        consumers.append(0)
        consumers[1] += 1
        nodes.append(Node("m1", "op", "forward", ("n1",), {"cuda": 0.0, "cpu": 0.0}, int(rng.integers(1, 4)) * 100,
                          recomputable=False, output_of="n1"))
        last = nodes[n - 1]
        nodes[n - 1] = Node(last.id, last.op, last.kind, (*last.inputs, "m1"), last.cost, last.bytes, last.workspace)
        consumers[n] += 1
    nodes = [Node(x.id, x.op, x.kind, x.inputs, x.cost, x.bytes, x.workspace, x.recomputable,
                  required=consumers[i] == 0, output_of=x.output_of) for i, x in enumerate(nodes)]
    return check_graph(Graph(tuple(nodes), name=f"dag-{n}-{seed}"))


def one_gpu(mem: int) -> Cluster:
    return Cluster((Device("gpu0", "cuda", int(mem)),))


def ke_peak(g: Graph) -> int:
    """Keep-everything's peak on one accelerator: the unit the tests' budgets are fractions of."""
    from optsched.simulate import simulate
    from optsched.solvers.baselines import keep_everything

    big = one_gpu(10**12)
    return simulate(g, big, keep_everything(g, big)).peak["gpu0"]


def gpu_host(mem: int, bandwidth: float = 200.0, host_compute: bool = True, issue: float = 0.0) -> Cluster:
    devs = (Device("gpu0", "cuda", int(mem)), Device("host", "cpu", 10**9))
    return Cluster(devs, (Link("gpu0", "host", bandwidth, 0.0, issue), Link("host", "gpu0", bandwidth, 0.0, issue)))


def two_gpus(mem: int, bandwidth: float = 200.0) -> Cluster:
    devs = (Device("gpu0", "cuda", int(mem)), Device("gpu1", "cuda", int(mem)))
    return Cluster(devs, (Link("gpu0", "gpu1", bandwidth), Link("gpu1", "gpu0", bandwidth)))


def blocks_graph(blocks: int, chain: int = 3) -> Graph:
    """A training graph of `blocks` layers, each a chain of `chain` cheap pointwise ops whose last output the
    backward reads: the intermediates have one reader each, so coarsening folds them."""
    z = {"cuda": 0.0, "cpu": 0.0}
    nodes = [Node("x", "data", "input", (), z, 400, recomputable=False)]
    prev, saved = "x", []
    for b in range(blocks):
        for i in range(chain):
            nodes.append(Node(f"f{b}_{i}", "op", "forward", (prev,), {"cuda": 1.0, "cpu": 3.0}, 400))
            prev = f"f{b}_{i}"
        saved.append(prev)
    nodes.append(Node("loss", "loss", "loss", (prev,), {"cuda": 1.0, "cpu": 3.0}, 8, required=True))
    grad = "loss"
    for b in reversed(range(blocks)):
        nodes.append(Node(f"g{b}", "op", "backward", (grad, saved[b]), {"cuda": 2.0, "cpu": 6.0}, 400,
                          required=b == 0))
        grad = f"g{b}"
    return check_graph(Graph(tuple(nodes), name=f"blocks-{blocks}x{chain}"))


def captured(builder: str, name: str | None = None, **kw) -> Graph:
    """A built-in model's training step (`optsched.capture.models.BUILTIN[builder](**kw)`), captured; skips without
    torch."""
    import pytest

    torch = pytest.importorskip("torch")
    from optsched.capture import capture
    from optsched.capture.models import BUILTIN

    torch.manual_seed(0)
    ex = BUILTIN[builder](**kw)
    return capture(ex["model"], ex["inputs"], ex["loss_fn"], targets=ex.get("targets"), name=name or builder)


def captured_mlp(depth: int) -> Graph:
    """The built-in MLP's training step (batch 1024) with `depth` layers, captured; skips without torch."""
    return captured("mlp", f"mlp-{depth}", batch=1024, depth=depth)
