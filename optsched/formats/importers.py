"""Importers for training graphs that other tools published.

`import_graph(path)` reads a file in any of these formats and returns a checked
`Graph`; `fmt` (the CLI's `--from`) names the format when detection is not
wanted:

- ``optsched``: optsched's own ``optsched-graph`` JSON (`load_graph`).
- ``msr``: the graphs of Tarnawski et al., "Efficient Algorithms for Device
  Placement of DNN Graph Operators" (NeurIPS 2020): top-level
  ``maxSizePerFPGA``, ``maxFPGAs``, ``maxCPUs``, ``nodes`` (``id``, ``name``,
  ``cpuLatency``, ``fpgaLatency`` in milliseconds, ``isBackwardNode``,
  ``supportedOnFpga``, ``colorClass``, ``size``) and ``edges`` (``sourceId``,
  ``destId``, ``size`` in bytes, ``cost``).
- ``checkmate``: networkx node-link JSON as Checkmate and Moccasin graphs are
  written: ``nodes`` with ``id``, optional ``name`` and ``backward``, and either
  ``cost_cpu`` + ``cost_ram`` or ``duration`` + ``out_cost``; ``links`` (or
  ``edges``) of ``{source, target}``.

Every mistake in a file raises a `FormatError` or `GraphError` that names the
file, the node and the field.

How the MSR fields map onto optsched's model
--------------------------------------------
- Node ids become strings (``12`` -> ``"n12"``); the original ``name`` is the op.
- ``fpgaLatency`` -> ``cost["cuda"]``, ``cpuLatency`` -> ``cost["cpu"]``, both
  milliseconds -> seconds; ``supportedOnFpga`` false -> no ``cuda`` cost.
- A node's output bytes are the largest ``size`` among its outgoing edges
  (rounded up to whole bytes: some operator graphs carry 0.125-byte edges).
- ``isBackwardNode`` -> kind ``backward``, else ``forward``. Nodes without
  incoming edges are sources (cost 0, not recomputable): kind ``param`` when
  their ``size`` > 0 (bytes = max(size, largest out-edge)), else ``input``.
  Sinks are required results.
- A non-source node's ``size`` means different things at the two
  granularities of the published graphs, so the importer decides per graph
  (option ``node_size``, default ``"auto"``):

  * ``"state"`` -- layer graphs (GNMT) have no weight nodes; a layer's
    ``size`` is its resident weights and state, repeated on its forward and
    backward node. One extra ``param`` node per ``colorClass`` (per node
    without one) holds the largest size of the class and feeds every member
    with size > 0, so the weights are counted once and shared.
  * ``"output"`` -- operator graphs (BERT, ResNet-50) list the weights as
    source nodes already; there a non-source node's ``size`` is the tensor it
    produces (it equals its outgoing edge size wherever edges carry real sizes,
    and stands in for the 0.125-byte placeholder edges elsewhere). Its bytes
    are max(size, largest out-edge) and no param node is added. Reading these
    sizes as weights instead would invent gigabytes of state (2.1 GB on
    BERT-L3, 4.2 GB on ResNet-50, against 30 MB and 100 MB of real weights) and
    count each weight gradient's class twice.

  ``"auto"`` picks ``"output"`` when some source node has size > 0 (explicit
  weights) and ``"state"`` otherwise; the choice is recorded in
  ``meta["node_size"]``.
- ``graph.meta`` keeps the provenance: source file, importer, the cluster
  hints ``maxSizePerFPGA``/``maxFPGAs``/``maxCPUs``, ``color_class`` (node id ->
  class, for placement constraints) and ``link_bandwidth`` in bytes/s, the
  median of edge ``size``/``cost`` (costs read as milliseconds, or as seconds
  when milliseconds would give more than 1 TB/s, as in GNMT; then
  ``meta["link_bandwidth_note"]`` says so).

Checkmate / Moccasin node-link files
------------------------------------
Costs go to ``cost["cuda"]`` as given and to ``cost["cpu"]`` times
``cpu_slowdown`` (default 10); ``time_unit`` (``"s"``, ``"ms"``, ``"us"``)
scales both to seconds. Bytes are ``cost_ram``/``out_cost``. Nodes without
inputs are ``input`` nodes (not recomputable, costs kept as given), nodes
with ``backward`` true are ``backward``, the node named by the optional graph
attribute ``loss_node`` is the ``loss``, the rest ``forward``; sinks are
required.
"""

from __future__ import annotations

import math
import os
import statistics
from collections.abc import Callable
from pathlib import Path

from ..errors import FormatError, GraphError, OptschedError
from ..graph import Graph, Node, check_graph
from .jsonio import graph_from_dict, read_json

FORMATS = ("optsched", "msr", "checkmate")
_ALIASES = {"optsched-graph": "optsched", "json": "optsched", "moccasin": "checkmate", "node-link": "checkmate"}
_DESCRIPTIONS = {
    "optsched": "optsched-graph JSON",
    "msr": "MSR device-placement graphs (maxSizePerFPGA, nodes with fpgaLatency)",
    "checkmate": "Checkmate/Moccasin node-link JSON (nodes with cost_cpu or duration, links)",
}
_OPTIONS = {
    "optsched": ("name",),
    "msr": ("name", "node_size"),
    "checkmate": ("name", "cpu_slowdown", "time_unit"),
}
_TIME_UNITS = {"s": 1.0, "ms": 1e-3, "us": 1e-6}
_MS = 1e-3
_MAX_PLAUSIBLE_BANDWIDTH = 1e12  # bytes/s; above this the edge costs cannot be milliseconds


# --- public API -------------------------------------------------------------------------------

def import_graph(path: str | os.PathLike, fmt: str | None = None, **opts) -> Graph:
    """Read a graph file in any supported format and return a checked `Graph`.

    fmt: 'optsched', 'msr' or 'checkmate'; None detects it from the content.
    opts: `name` (every format; default the file's stem), `node_size` (msr:
    'auto', 'state' or 'output'), `cpu_slowdown` and `time_unit` (checkmate).
    """
    p = Path(path)
    data = _read(p)
    detected = _detect(data)
    if fmt is None:
        if detected is None:
            raise FormatError(_undetectable(data), file=str(p), hint=_formats_hint())
        fmt = detected
    else:
        fmt = _canonical(fmt, p)
    bad = sorted(set(opts) - set(_OPTIONS[fmt]))
    if bad:
        raise OptschedError(f"unknown option(s) {bad} for format {fmt!r}", file=str(p), field=bad[0],
                            hint="options of this format: " + ", ".join(_OPTIONS[fmt]))
    name = opts.pop("name", None)
    if name is not None and not isinstance(name, str):
        raise OptschedError(f"option name must be a string, not {name!r}", file=str(p), field="name")
    try:
        if fmt == "optsched":
            graph = graph_from_dict(data)
            graph = Graph(nodes=graph.nodes, name=name or graph.name or p.stem, meta=graph.meta)
        else:
            graph = _IMPORTERS[fmt](data, source=p.name, name=name or p.stem, **opts)
    except OptschedError as e:
        if detected is not None and detected != fmt and e.hint is None:
            e.hint = f"the file looks like the {detected!r} format; try --from {detected}"
            e.args = (e.render(),)
        raise e.in_file(str(p)) from None
    return graph


def detect_format(path: str | os.PathLike) -> str:
    """The format `import_graph` would read the file as: 'optsched', 'msr' or 'checkmate'."""
    p = Path(path)
    data = _read(p)
    fmt = _detect(data)
    if fmt is None:
        raise FormatError(_undetectable(data), file=str(p), hint=_formats_hint())
    return fmt


def msr_to_graph(data, *, source: str = "", name: str = "", node_size: str = "auto") -> Graph:
    """A `Graph` from the parsed JSON of an MSR device-placement graph (see the module notes)."""
    if node_size not in ("auto", "state", "output"):
        raise OptschedError(f"option node_size must be 'auto', 'state' or 'output', not {node_size!r}",
                            field="node_size")
    if not isinstance(data, dict):
        raise FormatError("expected a JSON object with nodes and edges (MSR format)")
    meta: dict = {"source": source, "importer": "msr"}
    for key, integer in (("maxSizePerFPGA", True), ("maxFPGAs", True), ("maxCPUs", True)):
        if key in data:
            meta[key] = _int_like(_number(data[key], None, key), None, key) if integer else data[key]
    raw_nodes = _list(data, "nodes")
    raw_edges = _list(data, "edges")

    # nodes
    ids: dict[object, str] = {}  # original id -> our id
    taken: set[str] = set()
    recs = []
    for i, d in enumerate(raw_nodes):
        nid, op = _register_node(d, i, ids, taken)
        supported = _flag(d, nid, "supportedOnFpga", True)
        cpu = _number(_req(d, nid, "cpuLatency"), nid, "cpuLatency")
        fpga = _number(_req(d, nid, "fpgaLatency"), nid, "fpgaLatency") if supported or "fpgaLatency" in d else None
        size = _number(_req(d, nid, "size"), nid, "size")
        cls = d.get("colorClass")
        if cls is not None:
            if isinstance(cls, bool) or not isinstance(cls, (int, float, str)):
                raise FormatError(f"must be an integer or a string, not {cls!r}", node=nid, field="colorClass")
            if isinstance(cls, float):
                cls = _int_like(_number(cls, nid, "colorClass"), nid, "colorClass")
        recs.append({"id": nid, "op": op, "cpu": cpu, "fpga": fpga if supported else None, "size": size,
                     "backward": _flag(d, nid, "isBackwardNode", False), "cls": cls})

    # edges
    inputs: dict[str, list[str]] = {r["id"]: [] for r in recs}
    out_bytes: dict[str, int] = {r["id"]: 0 for r in recs}
    has_out: set[str] = set()
    ratios = []
    for j, e in enumerate(raw_edges):
        if not isinstance(e, dict):
            raise FormatError(f"edges[{j}] must be an object", field="edges")
        src = _endpoint(e, j, "sourceId", ids)
        dst = _endpoint(e, j, "destId", ids, node=src)
        if src == dst:
            raise FormatError(f"edges[{j}] goes from the node to itself", node=src, field="destId")
        size = _number(_req(e, src, "size", f"edges[{j}]"), src, "size", f"edges[{j}]")
        cost = _number(e["cost"], src, "cost", f"edges[{j}]") if "cost" in e else 0.0
        if src not in inputs[dst]:
            inputs[dst].append(src)
        has_out.add(src)
        out_bytes[src] = max(out_bytes[src], math.ceil(size))
        if size > 0 and cost > 0:
            ratios.append(size / cost)

    sources = [r for r in recs if not inputs[r["id"]]]
    if node_size == "auto":
        node_size = "output" if any(r["size"] > 0 for r in sources) else "state"
    meta["node_size"] = node_size
    meta["node_size_note"] = (
        "non-source node sizes read as output tensor bytes (the weights are source nodes)"
        if node_size == "output" else
        "non-source node sizes read as resident layer state: one param node per colorClass")

    # one param node per colorClass for resident state (layer graphs)
    taken = set(inputs)
    param_of: dict[str, str] = {}   # member id -> param id
    param_bytes: dict[str, int] = {}
    param_cls: dict[str, object] = {}
    class_param: dict[object, str] = {}
    if node_size == "state":
        for r in recs:
            if not inputs[r["id"]] or r["size"] <= 0:
                continue
            base = f"w.c{r['cls']}" if r["cls"] is not None else f"w.{r['id']}"
            pid = class_param.get(r["cls"]) if r["cls"] is not None else None
            if pid is None:
                pid = base
                k = 1
                while pid in taken:
                    k += 1
                    pid = f"{base}.{k}"
                taken.add(pid)
                param_cls[pid] = r["cls"]
                if r["cls"] is not None:
                    class_param[r["cls"]] = pid
                param_bytes[pid] = 0
            param_of[r["id"]] = pid
            param_bytes[pid] = max(param_bytes[pid], math.ceil(r["size"]))

    zero = {"cuda": 0.0, "cpu": 0.0}
    nodes: list[Node] = []
    placed: set[str] = set()
    color: dict[str, object] = {}
    for r in recs:
        nid = r["id"]
        pid = param_of.get(nid)
        if pid is not None and pid not in placed:
            placed.add(pid)
            what = f"colorClass {param_cls[pid]}" if param_cls[pid] is not None else f"node {r['op'] or nid}"
            nodes.append(Node(pid, f"weights of {what}", "param", (), dict(zero), param_bytes[pid],
                              recomputable=False))
            if param_cls[pid] is not None:
                color[pid] = param_cls[pid]
        if r["cls"] is not None:
            color[nid] = r["cls"]
        if not inputs[nid]:
            kind = "param" if r["size"] > 0 else "input"
            nbytes = max(math.ceil(r["size"]), out_bytes[nid]) if kind == "param" else out_bytes[nid]
            nodes.append(Node(nid, r["op"], kind, (), dict(zero), nbytes, recomputable=False,
                              required=nid not in has_out))
            continue
        cost = {}
        if r["fpga"] is not None:
            cost["cuda"] = r["fpga"] * _MS
        cost["cpu"] = r["cpu"] * _MS
        nbytes = out_bytes[nid]
        if node_size == "output":
            nbytes = max(nbytes, math.ceil(r["size"]))
        ins = tuple(inputs[nid]) + ((pid,) if pid is not None else ())
        nodes.append(Node(nid, r["op"], "backward" if r["backward"] else "forward", ins, cost, nbytes,
                          required=nid not in has_out))
    meta["color_class"] = color
    if ratios:
        per_unit = statistics.median(ratios)
        if per_unit / _MS > _MAX_PLAUSIBLE_BANDWIDTH:
            meta["link_bandwidth"] = float(per_unit)
            meta["link_bandwidth_note"] = (
                f"edge costs read as seconds: as milliseconds they would give {per_unit / _MS:.3g} B/s")
        else:
            meta["link_bandwidth"] = float(per_unit / _MS)
    return _checked(nodes, name, meta, "edges")


def node_link_to_graph(data, *, source: str = "", name: str = "", cpu_slowdown: float = 10.0,
                       time_unit: str = "s") -> Graph:
    """A `Graph` from parsed Checkmate/Moccasin node-link JSON (see the module notes)."""
    if isinstance(cpu_slowdown, bool) or not isinstance(cpu_slowdown, (int, float)) \
            or not math.isfinite(cpu_slowdown) or cpu_slowdown <= 0:
        raise OptschedError(f"option cpu_slowdown must be a positive number, not {cpu_slowdown!r}",
                            field="cpu_slowdown")
    if time_unit not in _TIME_UNITS:
        raise OptschedError(f"option time_unit must be one of {list(_TIME_UNITS)}, not {time_unit!r}",
                            field="time_unit")
    scale = _TIME_UNITS[time_unit]
    if not isinstance(data, dict):
        raise FormatError("expected a JSON object with nodes and links (node-link format)")
    raw_nodes = _list(data, "nodes")
    link_key = "links" if "links" in data else "edges"
    if link_key not in data:
        raise FormatError("missing: a list of {source, target} links", field="links")
    raw_links = _list(data, link_key)
    attrs = data.get("graph", {})
    if not isinstance(attrs, dict):
        raise FormatError("must be an object of graph attributes", field="graph")

    ids: dict[object, str] = {}
    taken: set[str] = set()
    recs = []
    variants = set()
    for i, d in enumerate(raw_nodes):
        nid, op = _register_node(d, i, ids, taken)
        if "cost_cpu" in d:
            cost_f = "cost_cpu"
        elif "duration" in d:
            cost_f = "duration"
        else:
            raise FormatError("missing compute cost", node=nid, field="cost_cpu",
                              hint="give cost_cpu and cost_ram, or duration and out_cost")
        bytes_f = "cost_ram" if "cost_ram" in d else "out_cost" if "out_cost" in d else None
        if bytes_f is None:
            fld = "cost_ram" if cost_f == "cost_cpu" else "out_cost"
            raise FormatError("missing output bytes", node=nid, field=fld,
                              hint="give cost_cpu and cost_ram, or duration and out_cost")
        variants.add(f"{cost_f}/{bytes_f}")
        sec = _number(d[cost_f], nid, cost_f) * scale
        nbytes = math.ceil(_number(d[bytes_f], nid, bytes_f))
        recs.append({"id": nid, "op": op, "sec": sec, "bytes": nbytes,
                     "backward": _flag(d, nid, "backward", False)})

    inputs: dict[str, list[str]] = {r["id"]: [] for r in recs}
    has_out: set[str] = set()
    for j, e in enumerate(raw_links):
        if not isinstance(e, dict):
            raise FormatError(f"{link_key}[{j}] must be an object with source and target", field=link_key)
        src = _endpoint(e, j, "source", ids, link_key)
        dst = _endpoint(e, j, "target", ids, link_key, node=src)
        if src == dst:
            raise FormatError(f"{link_key}[{j}] goes from the node to itself", node=src, field="target")
        if src not in inputs[dst]:
            inputs[dst].append(src)
        has_out.add(src)

    loss = None
    if attrs.get("loss_node") is not None:
        lk = _id_key(attrs["loss_node"])
        if lk not in ids:
            raise FormatError(f"loss_node {attrs['loss_node']!r} is not a node", field="graph.loss_node")
        loss = ids[lk]

    nodes = []
    for r in recs:
        nid = r["id"]
        cost = {"cuda": r["sec"], "cpu": r["sec"] * cpu_slowdown}
        if not inputs[nid]:
            nodes.append(Node(nid, r["op"], "input", (), cost, r["bytes"], recomputable=False,
                              required=nid not in has_out))
            continue
        kind = "loss" if nid == loss else "backward" if r["backward"] else "forward"
        nodes.append(Node(nid, r["op"], kind, tuple(inputs[nid]), cost, r["bytes"],
                          required=nid not in has_out or nid == loss))
    meta = {"source": source, "importer": "checkmate", "time_unit": time_unit, "cpu_slowdown": float(cpu_slowdown),
            "cost_fields": sorted(variants)}
    if attrs:
        meta["graph_attributes"] = attrs
    return _checked(nodes, name, meta, link_key)


def example_names() -> list[str]:
    """Names of the example graphs shipped with optsched."""
    return sorted(p.name[:-5] for p in _examples_dir().iterdir() if p.name.endswith(".json"))


def example_graph_path(name: str) -> Path:
    """Path of a shipped example graph ('tiny', 'gnmt', 'bert_l3'), ready for `load_graph`."""
    stem = name[:-5] if isinstance(name, str) and name.endswith(".json") else name
    names = example_names()
    if stem not in names:
        raise OptschedError(f"no example graph named {name!r}", hint="available: " + ", ".join(names))
    return _examples_dir() / f"{stem}.json"


# --- helpers ----------------------------------------------------------------------------------

def _examples_dir() -> Path:
    # The folder beside this package, not importlib.resources: an editable
    # install can make `optsched` a namespace package, which resources rejects.
    return Path(__file__).resolve().parent.parent / "examples"


def _read(p: Path):
    try:
        return read_json(p)
    except OptschedError as e:
        raise e.in_file(str(p)) from None


def _canonical(fmt, p: Path) -> str:
    key = _ALIASES.get(str(fmt).lower(), str(fmt).lower()) if isinstance(fmt, str) else None
    if key not in FORMATS:
        raise FormatError(f"unknown graph format {fmt!r}", file=str(p), field="--from", hint=_formats_hint())
    return key


def _formats_hint() -> str:
    return "known formats: " + "; ".join(f"{k} ({v})" for k, v in _DESCRIPTIONS.items()) \
        + "; name one with --from FORMAT, e.g. `optsched import FILE --from msr -o graph.json`"


def _detect(data) -> str | None:
    if not isinstance(data, dict):
        return None
    if data.get("format") == "optsched-graph":
        return "optsched"
    if "format" in data:
        return None
    nodes = data.get("nodes")
    nodes = nodes if isinstance(nodes, list) else []
    if "maxSizePerFPGA" in data or any(isinstance(n, dict) and "fpgaLatency" in n for n in nodes):
        return "msr"
    links = data.get("links", data.get("edges"))
    if isinstance(links, list) and (not links or any(isinstance(e, dict) and "source" in e for e in links)) \
            and any(isinstance(n, dict) and ("cost_cpu" in n or "duration" in n) for n in nodes):
        return "checkmate"
    return None


def _undetectable(data) -> str:
    if isinstance(data, dict) and isinstance(data.get("format"), str) and data["format"] != "optsched-graph":
        return f"a {data['format']!r} file, not a graph"
    return "cannot tell which graph format this file is in"


def _list(data: dict, key: str) -> list:
    if key not in data:
        raise FormatError("missing: a list is required here", field=key)
    if not isinstance(data[key], list):
        raise FormatError(f"must be a list, not {type(data[key]).__name__}", field=key)
    return data[key]


def _id_key(x):
    """Original ids compared by value: 3 and 3.0 are the same node."""
    if isinstance(x, float) and x.is_integer():
        return int(x)
    return x



def _register_node(d, i: int, ids: dict, taken: set) -> tuple[str, str]:
    """Check raw node record i, map its original id to ours in `ids` (our ids
    so far in `taken`); return (our id, its name)."""
    if not isinstance(d, dict):
        raise FormatError(f"nodes[{i}] must be an object", field="nodes")
    key, nid = _node_id(d, i, "id")
    if nid in taken:
        raise FormatError(f"duplicate node id (nodes[{i}])", node=nid, field="id", hint="every node id must be unique")
    ids[key] = nid
    taken.add(nid)
    op = d.get("name", "")
    if not isinstance(op, str):
        raise FormatError(f"must be a string, not {op!r}", node=nid, field="name")
    return nid, op

def _node_id(d: dict, i: int, fld: str) -> tuple[object, str]:
    if fld not in d:
        raise FormatError(f"nodes[{i}] has no id", node=f"nodes[{i}]", field=fld)
    raw = _id_key(d[fld])
    if isinstance(raw, bool) or not (isinstance(raw, int) or (isinstance(raw, str) and raw)):
        raise FormatError(f"nodes[{i}]: id must be an integer or a non-empty string, not {d[fld]!r}",
                          node=f"nodes[{i}]", field=fld)
    return raw, (f"n{raw}" if isinstance(raw, int) else raw)


def _endpoint(e: dict, j: int, fld: str, ids: dict, where: str = "edges", node: str | None = None) -> str:
    """Our id of the node an edge field names; errors name `node` (the edge's
    other, known end) or else the edge itself."""
    node = node or f"{where}[{j}]"
    if fld not in e:
        raise FormatError(f"{where}[{j}] has no {fld}", node=node, field=fld)
    nid = ids.get(_id_key(e[fld])) if not isinstance(e[fld], (list, dict, bool)) else None
    if nid is None:
        raise FormatError(f"{where}[{j}] names {e[fld]!r}, which is not a node", node=node, field=fld,
                          hint="every edge must join two listed nodes")
    return nid


def _req(d: dict, nid: str, fld: str, where: str = ""):
    if fld not in d:
        raise FormatError(f"{where + ': ' if where else ''}missing field", node=nid, field=fld)
    return d[fld]


def _number(x, nid, fld: str, where: str = "") -> float:
    pre = f"{where}: " if where else ""
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        raise FormatError(f"{pre}must be a number, not {x!r}", node=nid, field=fld)
    if not math.isfinite(x) or x < 0:
        raise FormatError(f"{pre}must be finite and non-negative, not {x!r}", node=nid, field=fld)
    return float(x) if isinstance(x, float) else x


def _int_like(x, nid, fld: str) -> int:
    if isinstance(x, float):
        if not x.is_integer():
            raise FormatError(f"must be a whole number, not {x!r}", node=nid, field=fld)
        return int(x)
    return x


def _flag(d: dict, nid: str, fld: str, default: bool) -> bool:
    x = d.get(fld, default)
    if isinstance(x, bool):
        return x
    if isinstance(x, int) and x in (0, 1):
        return bool(x)
    raise FormatError(f"must be true or false (or 1 or 0), not {x!r}", node=nid, field=fld)


def _checked(nodes: list[Node], name: str, meta: dict, edge_field: str) -> Graph:
    """Check the graph, naming a node on a cycle and the cycle itself when there is one."""
    cycle = _find_cycle(nodes)
    if cycle:
        raise GraphError("the graph has a cycle: " + " -> ".join(cycle + [cycle[0]]), node=cycle[0],
                         field=edge_field, hint="a training graph must be a DAG")
    return check_graph(Graph(nodes=tuple(nodes), name=name, meta=meta))


def _find_cycle(nodes: list[Node]) -> list[str] | None:
    """Kahn's algorithm; if nodes are left, walk back through left-over inputs
    (every left-over node has one) until a node repeats: that loop is a cycle."""
    ins = {n.id: [x for x in n.inputs] for n in nodes}
    outs: dict[str, list[str]] = {n.id: [] for n in nodes}
    for n in nodes:
        for x in n.inputs:
            outs.setdefault(x, []).append(n.id)
    indeg = {k: len(set(v)) for k, v in ins.items()}
    ready = [k for k, v in indeg.items() if v == 0]
    done = set()
    while ready:
        k = ready.pop()
        done.add(k)
        for j in set(outs.get(k, ())):
            indeg[j] -= 1
            if indeg[j] == 0:
                ready.append(j)
    if len(done) == len(ins):
        return None
    start = next(n.id for n in nodes if n.id not in done)
    path, seen = [], {}
    cur = start
    while cur not in seen:
        seen[cur] = len(path)
        path.append(cur)
        cur = next(x for x in ins[cur] if x in ins and x not in done)
    loop = path[seen[cur]:]
    loop.reverse()  # producer -> consumer order
    return loop


_IMPORTERS: dict[str, Callable[..., Graph]] = {"msr": msr_to_graph, "checkmate": node_link_to_graph}
