"""The training step's dataflow graph: the IR every part of optsched shares.

One node is one operation producing one output tensor (multi-output operations
are split, views are folded into the node owning the storage). A split
operation's other outputs name, in `output_of`, the node whose computation
makes them (its first output, which carries the cost): such an output exists
from that computation on its device, not from its own zero-cost compute. Edges are the
nodes' `inputs`; a node's output is the tensor every consumer reads. Costs are
seconds per device kind (`cuda`, `cpu`); a kind missing from `cost` means the
operation cannot run there.

`Graph` and `Node` are plain frozen data. `graph.arrays` is a derived, cached
index (CSR adjacency and numpy columns) for the hot loops of the simulator and
the solvers.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from functools import cached_property

import numpy as np

from .errors import GraphError

KINDS = ("forward", "backward", "loss", "param", "input", "optimizer")
SOURCE_KINDS = frozenset({"param", "input"})
DEVICE_KINDS = ("cuda", "cpu")


@dataclass(frozen=True, slots=True)
class Node:
    id: str
    op: str = ""
    kind: str = "forward"
    inputs: tuple[str, ...] = ()
    cost: Mapping[str, float] = field(default_factory=dict)
    bytes: int = 0
    workspace: int = 0
    recomputable: bool = True
    required: bool = False
    output_of: str = ""     # the node whose computation also makes this output (a multi-output op's other output)


@dataclass(frozen=True)
class GraphArrays:
    """Integer-indexed view of a graph: position i is `ids[i]`."""

    ids: tuple[str, ...]
    index: dict[str, int]
    topo: np.ndarray
    in_ptr: np.ndarray
    in_idx: np.ndarray
    out_ptr: np.ndarray
    out_idx: np.ndarray
    bytes: np.ndarray
    workspace: np.ndarray
    recomputable: np.ndarray
    required: np.ndarray
    kind: np.ndarray
    cost: dict[str, np.ndarray]
    output_of: np.ndarray      # index of `Node.output_of`, -1 where empty
    inputs: tuple[tuple[str, ...], ...]     # each node's distinct inputs by id, as in the CSR: for loops over names

    def inputs_of(self, i: int) -> np.ndarray:
        return self.in_idx[self.in_ptr[i]:self.in_ptr[i + 1]]

    def outputs_of(self, i: int) -> np.ndarray:
        return self.out_idx[self.out_ptr[i]:self.out_ptr[i + 1]]


@dataclass(frozen=True)
class Graph:
    nodes: tuple[Node, ...]
    name: str = ""
    meta: Mapping = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.nodes)

    @cached_property
    def arrays(self) -> GraphArrays:
        return _build_arrays(self)

    def node(self, node_id: str) -> Node:
        return self.nodes[self.arrays.index[node_id]]

    @property
    def num_edges(self) -> int:
        return int(self.arrays.in_idx.size)


def _csr(n: int, lists: list[list[int]]) -> tuple[np.ndarray, np.ndarray]:
    ptr = np.zeros(n + 1, dtype=np.int64)
    ptr[1:] = np.cumsum([len(x) for x in lists])
    flat = np.fromiter((j for x in lists for j in x), dtype=np.int64, count=int(ptr[-1]))
    return ptr, flat


def _build_arrays(graph: Graph) -> GraphArrays:
    ids = tuple(n.id for n in graph.nodes)
    index = {nid: i for i, nid in enumerate(ids)}
    if len(index) != len(ids):
        seen: set[str] = set()
        dup = next(x for x in ids if x in seen or seen.add(x))
        raise GraphError("duplicate node id", node=dup, field="id", hint="every node id must be unique")
    n = len(ids)
    ins: list[list[int]] = []
    outs: list[list[int]] = [[] for _ in range(n)]
    for i, node in enumerate(graph.nodes):
        uniq = []
        for src in dict.fromkeys(node.inputs):
            j = index.get(src)
            if j is None:
                raise GraphError(f"input {src!r} is not a node of the graph", node=node.id, field="inputs",
                                 hint="add the producing node or remove the input")
            if j == i:
                raise GraphError("node reads its own output", node=node.id, field="inputs")
            uniq.append(j)
            outs[j].append(i)
        ins.append(uniq)
    in_ptr, in_idx = _csr(n, ins)
    out_ptr, out_idx = _csr(n, outs)
    topo = _topological_order(ids, in_ptr, out_ptr, out_idx)
    kinds = {k: i for i, k in enumerate(KINDS)}
    cost_kinds = sorted({k for node in graph.nodes for k in node.cost})
    cost = {k: np.array([node.cost.get(k, np.nan) for node in graph.nodes], dtype=np.float64) for k in cost_kinds}
    return GraphArrays(
        ids=ids, index=index, topo=topo, in_ptr=in_ptr, in_idx=in_idx, out_ptr=out_ptr, out_idx=out_idx,
        bytes=np.array([node.bytes for node in graph.nodes], dtype=np.int64),
        workspace=np.array([node.workspace for node in graph.nodes], dtype=np.int64),
        recomputable=np.array([node.recomputable for node in graph.nodes], dtype=bool),
        required=np.array([node.required for node in graph.nodes], dtype=bool),
        kind=np.array([kinds.get(node.kind, -1) for node in graph.nodes], dtype=np.int8),
        cost=cost,
        output_of=np.array([_maker(index, node) for node in graph.nodes], dtype=np.int64),
        inputs=tuple(tuple(ids[j] for j in u) for u in ins),
    )


def _maker(index: dict[str, int], node: Node) -> int:
    """Index of `node.output_of`, -1 where empty."""
    if not node.output_of:
        return -1
    if node.output_of not in index:
        raise GraphError(f"{node.output_of!r} is not a node of the graph", node=node.id, field="output_of")
    return index[node.output_of]


def _topological_order(ids, in_ptr, out_ptr, out_idx) -> np.ndarray:
    """Kahn's order, stable: among ready nodes, the one listed first goes first."""
    import heapq

    n = len(ids)
    indeg = np.diff(in_ptr).tolist()
    ready = [i for i in range(n) if indeg[i] == 0]
    heapq.heapify(ready)
    order = []
    out_ptr_l, out_idx_l = out_ptr.tolist(), out_idx.tolist()
    while ready:
        i = heapq.heappop(ready)
        order.append(i)
        for j in out_idx_l[out_ptr_l[i]:out_ptr_l[i + 1]]:
            indeg[j] -= 1
            if indeg[j] == 0:
                heapq.heappush(ready, j)
    if len(order) != n:
        stuck = next(i for i in range(n) if indeg[i] > 0)
        raise GraphError("the graph has a cycle through this node", node=ids[stuck], field="inputs",
                         hint="a training graph must be a DAG; check the inputs of the nodes on the cycle")
    return np.array(order, dtype=np.int64)


def _bad_number(x, integer: bool) -> bool:
    if isinstance(x, bool) or not isinstance(x, (int, float, np.integer, np.floating)):
        return True
    if integer and isinstance(x, float) and not x.is_integer():
        return True
    return not math.isfinite(float(x)) or x < 0


def check_graph(graph: Graph) -> Graph:
    """Raise `GraphError` naming the node and field of the first broken rule."""
    for node in graph.nodes:
        if not isinstance(node.id, str) or not node.id:
            raise GraphError("node id must be a non-empty string", node=node.id, field="id")
        if node.kind not in KINDS:
            raise GraphError(f"unknown kind {node.kind!r}", node=node.id, field="kind",
                             hint="use one of " + ", ".join(KINDS))
        for fld in ("bytes", "workspace"):
            if _bad_number(getattr(node, fld), integer=True):
                raise GraphError(f"must be a finite, non-negative integer, not {getattr(node, fld)!r}",
                                 node=node.id, field=fld)
        if not node.cost:
            raise GraphError("no device kind can run this node", node=node.id, field="cost",
                             hint="give seconds per device kind, e.g. {\"cuda\": 1e-4, \"cpu\": 2e-3}")
        for kind, sec in node.cost.items():
            if kind not in DEVICE_KINDS:
                raise GraphError(f"unknown device kind {kind!r}", node=node.id, field="cost",
                                 hint="use " + " or ".join(DEVICE_KINDS))
            if _bad_number(sec, integer=False):
                raise GraphError(f"cost on {kind} must be finite and non-negative, not {sec!r}",
                                 node=node.id, field="cost")
        if node.kind in SOURCE_KINDS:
            if node.inputs:
                raise GraphError(f"a {node.kind} node has no inputs", node=node.id, field="inputs")
            if node.recomputable:
                raise GraphError(f"a {node.kind} node cannot be recomputed", node=node.id, field="recomputable",
                                 hint="set recomputable to false")
        if node.output_of:
            if node.output_of not in node.inputs:
                raise GraphError(f"output_of {node.output_of!r} is not one of its inputs", node=node.id,
                                 field="output_of", hint="an operation's other output reads the node that makes it")
            if node.recomputable:
                raise GraphError("an operation's other output cannot be recomputed on its own", node=node.id,
                                 field="recomputable", hint="set recomputable to false (its op runs again only "
                                 f"as {node.output_of!r})")
    _ = graph.arrays  # builds the index: duplicate ids, dangling inputs and cycles raise here
    return graph


def needed_mask(required: np.ndarray, topo: np.ndarray, in_ptr: np.ndarray, in_idx: np.ndarray) -> np.ndarray:
    """Per node: is it required, or does a required result depend on it? Over CSR inputs and a topological order,
    so that the graph (`unneeded`) and the MILP's index space (`bounds`) share it."""
    need = required.copy()
    for v in topo[::-1].tolist():
        if need[v]:
            need[in_idx[in_ptr[v]:in_ptr[v + 1]]] = True
    return need


def unneeded(graph: Graph) -> list[str]:
    """Operations that no required result depends on, in graph order: a valid schedule need not run them (a
    graph built by autodiff has none; a hand-made or generated file may). Empty when nothing is required."""
    a = graph.arrays
    if not a.required.any():
        return []
    need = needed_mask(a.required, a.topo, a.in_ptr, a.in_idx)
    return [a.ids[i] for i in np.flatnonzero(~need)]


def drop_unneeded(graph: Graph) -> Graph:
    """The graph without `unneeded` operations (torch.fx's dead-code elimination for training steps): every
    schedule of the result is a valid schedule of the graph, and no slower."""
    gone = set(unneeded(graph))
    if not gone:
        return graph
    return Graph(tuple(n for n in graph.nodes if n.id not in gone), name=graph.name, meta=graph.meta)


def attach_outputs(graph: Graph, order) -> np.ndarray:
    """The topological `order` with each operation's other outputs (`Node.output_of`) right after the node that
    makes them, or after their last other input where that comes later (a captured output reads only what its
    maker reads, which comes before; before such an input, the order would not be topological, and a chain of
    moments ordered by it would not be one): the simulator counts such an output from that node's computation, so
    computing it later only holds it longer."""
    order = np.asarray(order, dtype=np.int64)
    a = graph.arrays
    of = a.output_of
    if not (of >= 0).any():
        return order
    key = np.empty(len(order), dtype=np.float64)
    key[order] = np.arange(len(order))
    made = np.flatnonzero(of >= 0)
    for o in made[np.argsort(key[made])]:   # in order, so an input that is itself moved is placed first
        ins = a.in_idx[a.in_ptr[o]:a.in_ptr[o + 1]]
        key[o] = key[ins].max() + 0.5 * (key[o] + 1) / (len(order) + 1)   # outputs of one maker in their order
    return order[np.argsort(key[order], kind="stable")]


def operation_memory(graph: Graph) -> np.ndarray:
    """Bytes each operation holds on its device while it runs: its distinct
    inputs, its output and its workspace, all live at once."""
    a = graph.arrays
    n = len(a.ids)
    owner = np.repeat(np.arange(n), np.diff(a.in_ptr))
    inputs = np.bincount(owner, weights=a.bytes[a.in_idx].astype(np.float64), minlength=n)
    return inputs.astype(np.int64) + a.bytes + a.workspace


def largest_operation(graph: Graph, among: Iterable[str] | None = None) -> tuple[str, int]:
    """The operation needing the most memory while it runs (see
    `operation_memory`) and that amount; of the ids `among` (those not in
    the graph left out) where given."""
    index = graph.arrays.index
    idx = np.arange(len(graph.arrays.ids)) if among is None else \
        np.array(sorted({index[v] for v in among if v in index}), dtype=np.int64)
    if idx.size == 0:
        return "", 0
    need = operation_memory(graph)[idx]
    j = int(need.argmax())
    return graph.arrays.ids[int(idx[j])], int(need[j])


def memory_lower_bound(graph: Graph) -> int:
    """Bytes that no schedule can do with less of on the device running the
    largest operation (see `largest_operation`)."""
    return largest_operation(graph)[1]


def to_networkx(graph: Graph):
    """A `networkx.DiGraph` with the node fields as attributes; lossless."""
    import networkx as nx

    g = nx.DiGraph(name=graph.name, meta=dict(graph.meta))
    for node in graph.nodes:
        g.add_node(node.id, op=node.op, kind=node.kind, inputs=list(node.inputs), cost=dict(node.cost),
                   bytes=node.bytes, workspace=node.workspace, recomputable=node.recomputable,
                   required=node.required, output_of=node.output_of)
    for node in graph.nodes:
        for src in node.inputs:
            g.add_edge(src, node.id)
    return g


def from_networkx(g) -> Graph:
    """A Graph from a DiGraph whose nodes carry (some of) the Node fields.

    Input order comes from the `inputs` attribute when present, else from the
    predecessors in insertion order. Missing fields take Node's defaults; sources
    of kind param/input default to not recomputable.
    """
    nodes = []
    for nid, attrs in g.nodes(data=True):
        preds = [str(p) for p in g.predecessors(nid)]
        inputs = attrs.get("inputs")
        if inputs is None or set(map(str, inputs)) != set(preds):
            inputs = preds
        kind = attrs.get("kind", "forward")
        nodes.append(Node(
            id=str(nid), op=str(attrs.get("op", "")), kind=kind, inputs=tuple(map(str, inputs)),
            cost=dict(attrs.get("cost", {})), bytes=attrs.get("bytes", 0), workspace=attrs.get("workspace", 0),
            recomputable=attrs.get("recomputable", kind not in SOURCE_KINDS), required=attrs.get("required", False),
            output_of=str(attrs.get("output_of", "")),
        ))
    return check_graph(Graph(nodes=tuple(nodes), name=g.graph.get("name", ""), meta=dict(g.graph.get("meta", {}))))
