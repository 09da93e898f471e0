"""Hypothesis strategies for optsched's tests: graphs, clusters and schedules.

Import them from any test module (pytest puts `tests/` on `sys.path`)::

    from strategies import training_graphs, random_dags, clusters, placed_schedules

Every strategy draws objects that pass optsched's own checks (`check_graph`,
`check_cluster`), so a test can feed them straight to a solver or to the
simulator. Everything is small by default so that a property runs in
milliseconds per example; raise the `max_*` arguments for heavier checks.

Strategies
----------
- `training_graphs`: training graphs as `optsched.generate.training_graph`
  builds them (random forward DAG mirrored into an autodiff backward pass),
  with sizes and costs drawn by Hypothesis so that failures shrink well.
- `seeded_training_graphs`: `optsched.generate.random_training_graph(n, seed)`,
  i.e. the generator's own size and cost distributions.
- `random_dags`: arbitrary DAGs, not necessarily training-shaped: any kinds,
  random sizes and workspaces (zero included), zero costs, duplicate inputs,
  required results, parameters and inputs, listed in a shuffled order.
- `clusters`: accelerators and an optional host with random budgets and
  speeds, joined by random links.
- `topological_orders`: a random topological order of a graph's nodes.
- `sequential_schedules`: every node once on one device, in a random
  topological order, each value freed after its last reader.
- `placed_schedules`: every node once on a random runnable device, inputs
  copied over links where needed, random frees and `sync`s; valid by
  construction when budgets are large enough.

Helpers (plain functions)
-------------------------
- `with_memory(cluster, device, memory)`: the same cluster with one budget changed.
- `big_cluster(...)`: a single accelerator (plus host) with a budget nothing exceeds.
"""

from __future__ import annotations

from dataclasses import replace

from hypothesis import strategies as st

from optsched.cluster import Cluster, Device, Link, check_cluster, single_accelerator
from optsched.generate import random_training_graph, training_graph
from optsched.graph import KINDS, SOURCE_KINDS, Graph, Node, check_graph
from optsched.schedule import Compute, Copy, Free, Schedule, Sync
from optsched.solvers.sequential import sequential_instructions

HUGE = 10**15   # a budget that no drawn graph comes near


def big_cluster(memory: int = HUGE, *, gpus: int = 1) -> Cluster:
    """`single_accelerator(memory)`: devices gpu0.. and host, PCIe links both ways."""
    return single_accelerator(memory, host_memory=HUGE, gpus=gpus)


def with_memory(cluster: Cluster, device: str, memory: int) -> Cluster:
    """The same cluster with `device`'s budget set to `memory` bytes."""
    devices = tuple(replace(d, memory=int(memory)) if d.name == device else d for d in cluster.devices)
    return check_cluster(Cluster(devices, cluster.links))


# --- graphs ------------------------------------------------------------------------------------

@st.composite
def forward_dags(draw, min_forward: int = 1, max_forward: int = 20, max_inputs: int = 3, window: int = 5):
    """Inputs of n forward nodes in `random_forward_dag`'s convention: node 0
    reads the data input (-1), node i > 0 reads i-1 and up to max_inputs-1
    others among the `window` nodes before it."""
    n = draw(st.integers(min_forward, max_forward))
    ins = []
    for i in range(n):
        if i == 0:
            ins.append([-1])
            continue
        pool = list(range(max(0, i - window), i - 1))
        extra = draw(st.lists(st.sampled_from(pool), max_size=max_inputs - 1, unique=True)) if pool else []
        ins.append(sorted(set(extra) | {i - 1}))
    return ins


@st.composite
def training_graphs(draw, min_forward: int = 1, max_forward: int = 20, *, params: bool | None = None,
                    max_bytes: int = 10**6, zero_sizes: bool = True):
    """A training graph from `optsched.generate.training_graph`: forward nodes
    f0.., a loss, backward nodes g0.., parameters p_i with required gradients
    gp_i (when `params` is True; None draws it), the data input's gradients
    required when there are no parameters (and maybe when there are), so
    that there is a backward pass.
    Activation sizes are drawn in
    [0 or 1, max_bytes], costs in [1e-6, 1e-2] seconds."""
    ins = draw(forward_dags(min_forward, max_forward))
    n = len(ins)
    lo = 0 if zero_sizes else 1
    act = draw(st.lists(st.integers(lo, max_bytes), min_size=n, max_size=n))
    cost = draw(st.lists(st.floats(1e-6, 1e-2, allow_nan=False), min_size=n, max_size=n))
    with_params = draw(st.booleans()) if params is None else params
    pb = draw(st.lists(st.integers(0, max_bytes), min_size=n, max_size=n)) if with_params else None
    input_grad = draw(st.booleans()) if with_params and any(pb) else True
    return training_graph(ins, act_bytes=act, cost=cost, param_bytes=pb, input_grad=input_grad,
                          name=f"hyp-train-{n}")


@st.composite
def seeded_training_graphs(draw, min_forward: int = 1, max_forward: int = 40, statistics: bool = False):
    """`optsched.generate.random_training_graph(n, seed, ...)` with drawn n,
    seed, fan-in and window: the generator's own distributions. `statistics`:
    drawn too (ops with a second output, `Node.output_of`)."""
    n = draw(st.integers(min_forward, max_forward))
    seed = draw(st.integers(0, 2**31 - 1))
    return random_training_graph(n, seed, max_inputs=draw(st.integers(1, 3)), window=draw(st.integers(1, 6)),
                                 params=draw(st.booleans()), statistics=statistics and draw(st.booleans()))


@st.composite
def random_dags(draw, min_nodes: int = 1, max_nodes: int = 20, *, runnable_on: tuple[str, ...] = ("cuda",),
                max_bytes: int = 10**6, workspace: bool = True, zero_costs: bool = True,
                kinds: tuple[str, ...] = KINDS, shuffle: bool = True):
    """An arbitrary DAG that passes `check_graph`.

    Node i may read any earlier node (the same one twice, too); sources get a
    kind among `kinds` (param and input ones are not recomputable), other nodes
    a non-source kind; some nodes are required, some not recomputable. Every
    node can run on every kind in `runnable_on` (and maybe on the other kind as
    well). The nodes are listed in a shuffled order unless `shuffle` is False,
    so a test cannot rely on the listing being topological.
    """
    n = draw(st.integers(min_nodes, max_nodes))
    inner_kinds = [k for k in kinds if k not in SOURCE_KINDS] or ["forward"]
    cost_value = st.floats(0.0 if zero_costs else 1e-6, 1e-2, allow_nan=False)
    nodes = []
    for i in range(n):
        if i:
            inputs = draw(st.lists(st.integers(0, i - 1), max_size=3))
        else:
            inputs = []
        if inputs:
            kind = draw(st.sampled_from(inner_kinds))
        else:
            kind = draw(st.sampled_from(kinds))
        source = kind in SOURCE_KINDS
        cost = {k: draw(cost_value) for k in runnable_on}
        for other in ("cuda", "cpu"):
            if other not in cost and draw(st.booleans()):
                cost[other] = draw(cost_value)
        nodes.append(Node(
            id=f"n{i}", op=draw(st.sampled_from(["", "mm", "relu", "add"])), kind=kind,
            inputs=tuple(f"n{j}" for j in inputs), cost=cost, bytes=draw(st.integers(0, max_bytes)),
            workspace=draw(st.integers(0, max_bytes)) if workspace and not source and draw(st.booleans()) else 0,
            recomputable=False if source else draw(st.booleans() | st.just(True)),
            required=draw(st.booleans()) and draw(st.booleans()),
        ))
    if shuffle:
        nodes = draw(st.permutations(nodes))
    return check_graph(Graph(tuple(nodes), name=f"hyp-dag-{n}"))


# --- clusters ----------------------------------------------------------------------------------

@st.composite
def clusters(draw, min_accelerators: int = 1, max_accelerators: int = 3, *, host: bool | None = None,
             memory: st.SearchStrategy[int] | None = None, full_links: bool | None = None):
    """Accelerators gpu0.. (kind cuda) and, when `host` (None draws it), a
    `host` device of kind cpu, with budgets from `memory` (default: up to
    HUGE), speeds in [0.25, 4], and directed links with bandwidths in
    [1e6, 1e11] bytes/s and latencies in [0, 1e-4] s. With `full_links`
    (None draws it) every ordered pair is linked, else a random subset."""
    k = draw(st.integers(min_accelerators, max_accelerators))
    has_host = draw(st.booleans()) if host is None else host
    mem = memory if memory is not None else st.integers(0, HUGE)
    speed = st.floats(0.25, 4.0, allow_nan=False)
    devices = [Device(f"gpu{i}", "cuda", draw(mem), draw(speed)) for i in range(k)]
    if has_host:
        devices.append(Device("host", "cpu", draw(mem), draw(speed)))
    full = draw(st.booleans()) if full_links is None else full_links
    links = []
    for a in devices:
        for b in devices:
            if a is not b and (full or draw(st.booleans())):
                links.append(Link(a.name, b.name, draw(st.floats(1e6, 1e11)), draw(st.floats(0.0, 1e-4))))
    return check_cluster(Cluster(tuple(devices), tuple(links)))


# --- schedules ---------------------------------------------------------------------------------

@st.composite
def topological_orders(draw, graph: Graph):
    """A random topological order of `graph`'s node positions."""
    a = graph.arrays
    n = len(a.ids)
    indeg = [int(a.in_ptr[i + 1] - a.in_ptr[i]) for i in range(n)]
    ready = sorted(i for i in range(n) if indeg[i] == 0)
    order = []
    while ready:
        v = ready.pop(draw(st.integers(0, len(ready) - 1)))
        order.append(v)
        for w in a.outputs_of(v).tolist():
            indeg[w] -= 1
            if indeg[w] == 0:
                ready.append(w)
    return order


@st.composite
def sequential_schedules(draw, graph: Graph, device: str = "gpu0"):
    """Every node once on `device` in a random topological order, each value
    freed right after its last reader (required results kept), as the
    single-device baselines emit it."""
    order = draw(topological_orders(graph))
    return Schedule(tuple(sequential_instructions(graph, device, order)), graph=graph.name)


@st.composite
def placed_schedules(draw, graph: Graph, cluster: Cluster):
    """A multi-device schedule that is valid whenever the budgets are large:
    each node, in a random topological order, runs on a random device that has
    a cost for it and from which each of its inputs can be reached (directly
    over a link from a device holding it); missing inputs are copied first.
    After each step some no-longer-needed copies are freed and sometimes a
    `sync` is inserted; required results stay resident. Returns None when the
    cluster cannot run the graph this way (a node with no usable device); use
    `.filter(lambda s: s is not None)` or `assume`."""
    a = graph.arrays
    order = draw(topological_orders(graph))
    pos = {v: p for p, v in enumerate(order)}
    readers_left = [len(a.outputs_of(v)) for v in range(len(a.ids))]
    where: dict[int, list[str]] = {}          # node -> devices it is resident on
    ins: list = []
    links = cluster.link_index
    for v in order:
        inputs = a.inputs_of(v).tolist()
        options = []
        for d in cluster.devices:
            costs = a.cost.get(d.kind)
            if costs is None or costs[v] != costs[v]:
                continue
            if all(d.name in where[u] or any((s, d.name) in links for s in where[u]) for u in inputs):
                options.append(d.name)
        if not options:
            return None
        dev = draw(st.sampled_from(options))
        for u in sorted(inputs, key=pos.__getitem__):
            if dev not in where[u]:
                srcs = [s for s in where[u] if (s, dev) in links]
                ins.append(Copy(a.ids[u], draw(st.sampled_from(srcs)), dev))
                where[u].append(dev)
        ins.append(Compute(a.ids[v], dev))
        where[v] = [dev]
        for u in inputs:
            readers_left[u] -= 1
        # free inputs with no reader left, or spare copies of them, at random
        for u in inputs:
            locs = where[u]
            if readers_left[u] == 0 and not a.required[u]:
                for d in list(locs):
                    if draw(st.booleans()):
                        ins.append(Free(a.ids[u], d))
                        locs.remove(d)
            elif len(locs) > 1 and draw(st.booleans()):
                d = draw(st.sampled_from(locs))
                ins.append(Free(a.ids[u], d))
                locs.remove(d)
        if not a.required[v] and readers_left[v] == 0 and draw(st.booleans()):
            ins.append(Free(a.ids[v], dev))
            where[v].remove(dev)
        if draw(st.integers(0, 9)) == 0:
            ins.append(Sync())
    return Schedule(tuple(ins), graph=graph.name)
