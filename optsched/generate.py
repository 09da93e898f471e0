"""Synthetic graphs for tests, property checks and scale benchmarks.

`training_graph` mirrors a random forward DAG into a backward pass the way
reverse-mode autodiff does: the gradient of a forward node reads the gradients
of its consumers and the activations its own computation read, and each
parameter gets a required gradient node. `chain_graph` is the classic
checkpointing benchmark (a linear network).
"""

from __future__ import annotations

import numpy as np

from .graph import Graph, Node, check_graph, drop_unneeded


def random_forward_dag(n: int, rng: np.random.Generator, *, max_inputs: int = 2, window: int = 4) -> list[list[int]]:
    """Inputs of n forward nodes, each reading 1..max_inputs of the `window`
    nodes before it (node 0 reads the data input, written -1)."""
    ins = []
    for i in range(n):
        if i == 0:
            ins.append([-1])
            continue
        lo = max(0, i - window)
        k = int(rng.integers(1, max_inputs + 1))
        pool = np.arange(lo, i)
        picks = sorted(set(rng.choice(pool, size=min(k, len(pool)), replace=False).tolist()) | {i - 1})
        ins.append(picks)
    return ins


def training_graph(forward_inputs: list[list[int]], *, act_bytes, cost, param_bytes=None, cpu_slowdown: float = 10.0,
                   input_grad: bool = False, stat_bytes=None, name: str = "synthetic") -> Graph:
    """Forward nodes f0..f{n-1} (inputs as from `random_forward_dag`, -1 is the
    data input), a loss on the last, and the autodiff backward pass.

    act_bytes[i], cost[i]: output bytes and accelerator seconds of forward node i;
    its backward nodes cost twice as much. param_bytes[i] > 0 gives node i a
    parameter whose gradient is a required result; `input_grad` makes the
    gradients g{i} of the nodes that read the data input required results too.
    stat_bytes[i] > 0 gives node i another output s{i} of that many bytes
    (`Node.output_of`: a layer norm's statistics), which its gradient reads.
    As in autodiff, the backward pass holds only what a required result
    depends on (`drop_unneeded`).
    """
    n = len(forward_inputs)
    param_bytes = [0] * n if param_bytes is None else param_bytes
    stat_bytes = [0] * n if stat_bytes is None else stat_bytes

    def c(sec):
        return {"cuda": float(sec), "cpu": float(sec) * cpu_slowdown}

    zero = {"cuda": 0.0, "cpu": 0.0}
    nodes = [Node("x", "data", "input", (), zero, int(act_bytes[0]), recomputable=False)]
    consumers: list[list[int]] = [[] for _ in range(n)]
    for i, ins in enumerate(forward_inputs):
        names = ["x" if j < 0 else f"f{j}" for j in ins]
        if param_bytes[i]:
            nodes.append(Node(f"p{i}", "param", "param", (), zero, int(param_bytes[i]), recomputable=False))
            names.append(f"p{i}")
        for j in ins:
            if j >= 0:
                consumers[j].append(i)
        nodes.append(Node(f"f{i}", "op", "forward", tuple(names), c(cost[i]), int(act_bytes[i])))
        if stat_bytes[i]:
            nodes.append(Node(f"s{i}", "stat", "forward", (f"f{i}", *names), zero, int(stat_bytes[i]),
                              recomputable=False, output_of=f"f{i}"))
    nodes.append(Node("loss", "loss", "loss", (f"f{n - 1}",), c(min(cost)), 4, required=True))
    consumers[n - 1].append(-1)
    for i in reversed(range(n)):
        grads = tuple("loss" if k < 0 else f"g{k}" for k in consumers[i])
        saved = tuple("x" if j < 0 else f"f{j}" for j in forward_inputs[i])
        if stat_bytes[i]:
            saved += (f"s{i}",)
        nodes.append(Node(f"g{i}", "grad", "backward", grads + saved, c(2 * cost[i]), int(act_bytes[i]),
                          required=input_grad and -1 in forward_inputs[i]))
        if param_bytes[i]:
            nodes.append(Node(f"gp{i}", "grad_param", "backward", (f"g{i}",) + saved, c(cost[i]),
                              int(param_bytes[i]), required=True))
    return drop_unneeded(check_graph(Graph(tuple(nodes), name=name)))


def random_training_graph(n_forward: int, seed: int = 0, *, max_inputs: int = 2, window: int = 4,
                          params: bool = True, statistics: bool = False) -> Graph:
    """A random training graph with n_forward forward nodes, sizes 1-100 kB and
    costs 0.1-10 ms, reproducible from the seed. Without parameters, the
    gradient of the data input is required (else no backward pass would be).
    `statistics`: about half the forward nodes make a second output of 1-10 kB
    that their gradient reads (`training_graph`'s stat_bytes)."""
    rng = np.random.default_rng(seed)
    ins = random_forward_dag(n_forward, rng, max_inputs=max_inputs, window=window)
    act = rng.integers(1, 101, size=n_forward) * 1000
    cost = rng.uniform(1e-4, 1e-2, size=n_forward)
    pb = (rng.integers(0, 51, size=n_forward) * 1000 * (rng.random(n_forward) < 0.5)) if params else None
    sb = (rng.integers(1, 11, size=n_forward) * 1000 * (rng.random(n_forward) < 0.5)).tolist() if statistics else None
    return training_graph(ins, act_bytes=act.tolist(), cost=cost.tolist(),
                          param_bytes=None if pb is None else pb.tolist(), input_grad=pb is None or not pb.any(),
                          stat_bytes=sb, name=f"random-{n_forward}-{seed}" + ("-stats" if statistics else ""))


def chain_graph(n: int, *, act_bytes: int = 1_000_000, cost: float = 1e-3, name: str | None = None) -> Graph:
    """A linear network of n equal layers, no parameters, the gradient of its input required (so the whole
    backward pass runs): sqrt(n) checkpointing's home ground."""
    ins = [[i - 1] for i in range(n)]
    return training_graph(ins, act_bytes=[act_bytes] * n, cost=[cost] * n, input_grad=True,
                          name=name or f"chain-{n}")
