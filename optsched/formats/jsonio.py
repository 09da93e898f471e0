"""optsched's JSON formats: `optsched-graph`, `optsched-cluster`,
`optsched-schedule`, each versioned and described by a JSON Schema shipped in
`optsched/formats/schemas/`. Readers check every field themselves so that an
error names the file, the node and the field; writers write atomically.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
from importlib import resources
from pathlib import Path

from ..cluster import Cluster, Device, Link, check_cluster
from ..errors import FormatError, OptschedError
from ..graph import SOURCE_KINDS, Graph, Node, check_graph
from ..schedule import Compute, Copy, Free, Schedule, SolveReport, Sync
from ..units import parse_bandwidth, parse_size, parse_time

VERSION = 1
_NODE_FIELDS = {"id", "op", "kind", "inputs", "cost", "bytes", "workspace", "recomputable", "required", "output_of"}


def schema(name: str) -> dict:
    """The JSON Schema of format `name` ('graph', 'cluster' or 'schedule')."""
    text = resources.files("optsched.formats").joinpath("schemas", f"{name}.schema.json").read_text()
    return json.loads(text)


def read_json(path: str | os.PathLike) -> object:
    p = Path(path)
    if not p.exists():
        raise FormatError("no such file", file=str(p))
    if p.is_dir():
        raise FormatError("is a folder, not a file", file=str(p))
    try:
        with open(p, encoding="utf-8") as f:
            return json.load(f)
    except json.JSONDecodeError as e:
        raise FormatError(f"not valid JSON: {e.msg} at line {e.lineno}, column {e.colno}", file=str(p)) from None
    except UnicodeDecodeError:
        raise FormatError("not a UTF-8 text file", file=str(p)) from None


def output_folder(path: str | os.PathLike, what: str | None = None) -> Path:
    """The folder a file will be written to, refused when it is missing or not writable: the CLI checks its
    outputs this way before any solving, so that a long solve is not lost to a typo in the path. `what`: the
    option that named the file."""
    p = Path(path)
    parent = p.parent if str(p.parent) else Path(".")
    if p.is_dir():
        raise FormatError("is a folder, not a file", file=str(p), field=what, hint="name a file in it")
    if not parent.is_dir():
        raise FormatError("folder does not exist", file=str(parent), field=what,
                          hint="create it first, or name a file in an existing folder")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise FormatError("folder is not writable", file=str(parent), field=what)
    return parent


def write_atomic(path: str | os.PathLike, write, suffix: str = ".tmp", what: str | None = None) -> None:
    """Write all or nothing: `write(tmp)` fills a temporary file beside the target (its name ends in `suffix`),
    then a rename. `what`: the option that named the file, for the error."""
    p = Path(path)
    parent = output_folder(p, what)
    fd, tmp = tempfile.mkstemp(prefix=f".{p.name}.", suffix=suffix, dir=parent)
    os.close(fd)
    try:
        write(tmp)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)   # mkstemp makes it private; a saved file is an ordinary one
        os.replace(tmp, p)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def write_json(path: str | os.PathLike, data: object) -> None:
    """Write all or nothing (`write_atomic`)."""
    def dump(tmp: str) -> None:
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(data, f, separators=(",", ":") if _large(data) else None, indent=None if _large(data) else 1)
            f.write("\n")

    write_atomic(path, dump)


def _large(data) -> bool:
    return isinstance(data, dict) and len(data.get("nodes", data.get("instructions", ()))) > 2000


def _header(data, fmt: str) -> None:
    if not isinstance(data, dict):
        raise FormatError(f"expected a JSON object with \"format\": \"{fmt}\"")
    if data.get("format") != fmt:
        hint = None
        if fmt == "optsched-graph":
            hint = "run `optsched import FILE -o graph.json` to convert another tool's graph"
        raise FormatError(f"not an {fmt} file (format is {data.get('format')!r})", field="format", hint=hint)
    if data.get("version") != VERSION:
        raise FormatError(f"unsupported version {data.get('version')!r}; this optsched reads version {VERSION}",
                          field="version")


# --- graph ------------------------------------------------------------------------------------

def graph_to_dict(graph: Graph) -> dict:
    nodes = []
    for n in graph.nodes:
        d = {"id": n.id, "op": n.op, "kind": n.kind, "inputs": list(n.inputs), "cost": dict(n.cost),
             "bytes": int(n.bytes)}
        if n.workspace:
            d["workspace"] = int(n.workspace)
        if n.recomputable != (n.kind not in SOURCE_KINDS):
            d["recomputable"] = n.recomputable
        if n.required:
            d["required"] = True
        if n.output_of:
            d["output_of"] = n.output_of
        nodes.append(d)
    return {"format": "optsched-graph", "version": VERSION, "name": graph.name, "meta": dict(graph.meta),
            "nodes": nodes}


def _node_from_dict(i: int, d) -> Node:
    if not isinstance(d, dict):
        raise FormatError(f"nodes[{i}] must be an object", field="nodes")
    nid = d.get("id")
    if not isinstance(nid, str) or not nid:
        raise FormatError(f"nodes[{i}] needs a non-empty string id", node=None if nid is None else str(nid),
                          field="id")
    extra = set(d) - _NODE_FIELDS
    if extra:
        raise FormatError(f"unknown field(s) {sorted(extra)}", node=nid, field=sorted(extra)[0],
                          hint="node fields are " + ", ".join(sorted(_NODE_FIELDS)))
    inputs = d.get("inputs", [])
    if not isinstance(inputs, list) or not all(isinstance(x, str) for x in inputs):
        raise FormatError("must be a list of node ids (strings)", node=nid, field="inputs")
    cost = d.get("cost")
    if not isinstance(cost, dict):
        raise FormatError("must be an object of seconds per device kind, e.g. {\"cuda\": 1e-4}", node=nid,
                          field="cost")
    kind = d.get("kind", "forward")
    for fld in ("bytes", "workspace"):
        v = d.get(fld, 0)
        if isinstance(v, float) and v.is_integer():
            d = {**d, fld: int(v)}
    for fld in ("recomputable", "required"):
        if fld in d and not isinstance(d[fld], bool):
            raise FormatError(f"must be true or false, not {d[fld]!r}", node=nid, field=fld)
    if not isinstance(d.get("output_of", ""), str):
        raise FormatError("must be the id (a string) of the node whose computation makes this output", node=nid,
                          field="output_of")
    return Node(id=nid, op=str(d.get("op", "")), kind=kind, inputs=tuple(inputs), cost=cost,
                bytes=d.get("bytes", 0), workspace=d.get("workspace", 0),
                recomputable=d.get("recomputable", kind not in SOURCE_KINDS), required=d.get("required", False),
                output_of=d.get("output_of", ""))


def graph_from_dict(data) -> Graph:
    _header(data, "optsched-graph")
    nodes = data.get("nodes")
    if not isinstance(nodes, list):
        raise FormatError("must be a list of nodes", field="nodes")
    meta = data.get("meta", {})
    if not isinstance(meta, dict):
        raise FormatError("must be an object", field="meta")
    graph = Graph(nodes=tuple(_node_from_dict(i, d) for i, d in enumerate(nodes)), name=str(data.get("name", "")),
                  meta=meta)
    return check_graph(graph)


def load_graph(path: str | os.PathLike) -> Graph:
    try:
        graph = graph_from_dict(read_json(path))
    except OptschedError as e:
        raise e.in_file(str(path)) from None
    if not graph.name:
        graph = Graph(nodes=graph.nodes, name=Path(path).stem, meta=graph.meta)
    return graph


def save_graph(graph: Graph, path: str | os.PathLike) -> None:
    write_json(path, graph_to_dict(graph))


# --- cluster ----------------------------------------------------------------------------------

def cluster_to_dict(cluster: Cluster) -> dict:
    return {"format": "optsched-cluster", "version": VERSION,
            "devices": [{"name": d.name, "kind": d.kind, "memory": d.memory, "speed": d.speed}
                        for d in cluster.devices],
            "links": [{"src": lk.src, "dst": lk.dst, "bandwidth": lk.bandwidth, "latency": lk.latency,
                       **({"issue": lk.issue} if lk.issue else {})}
                      for lk in cluster.links]}


def cluster_from_dict(data) -> Cluster:
    """Devices and links; sizes, bandwidths, latencies and issue times may be human strings
    ('16GB', '25GB/s', '5us'). `"bidirectional": true` on a link adds its reverse."""
    _header(data, "optsched-cluster")
    devs = data.get("devices")
    if not isinstance(devs, list) or not devs:
        raise FormatError("must be a non-empty list of devices", field="devices")
    devices = []
    for i, d in enumerate(devs):
        if not isinstance(d, dict) or "name" not in d or "memory" not in d:
            raise FormatError(f"devices[{i}] needs at least a name and a memory", field="devices")
        try:
            speed = float(d.get("speed", 1.0))
        except (TypeError, ValueError):
            raise FormatError(f"device {d['name']!r}: speed must be a number", field="speed") from None
        devices.append(Device(name=str(d["name"]), kind=d.get("kind", "cuda"),
                              memory=parse_size(d["memory"], f"memory of device {d['name']!r}"), speed=speed))
    links = []
    for i, lk in enumerate(data.get("links", [])):
        if not isinstance(lk, dict) or not {"src", "dst", "bandwidth"} <= set(lk):
            raise FormatError(f"links[{i}] needs src, dst and bandwidth", field="links")
        bw = parse_bandwidth(lk["bandwidth"], f"bandwidth of link {lk['src']}->{lk['dst']}")
        lat = parse_time(lk.get("latency", 0.0), f"latency of link {lk['src']}->{lk['dst']}")
        issue = parse_time(lk.get("issue", 0.0), f"issue time of link {lk['src']}->{lk['dst']}")
        links.append(Link(str(lk["src"]), str(lk["dst"]), bw, lat, issue))
        if lk.get("bidirectional"):
            links.append(Link(str(lk["dst"]), str(lk["src"]), bw, lat, issue))
    return check_cluster(Cluster(tuple(devices), tuple(links)))


def load_cluster(path: str | os.PathLike) -> Cluster:
    try:
        return cluster_from_dict(read_json(path))
    except OptschedError as e:
        raise e.in_file(str(path)) from None


def save_cluster(cluster: Cluster, path: str | os.PathLike) -> None:
    write_json(path, cluster_to_dict(cluster))


# --- schedule ---------------------------------------------------------------------------------

def _finite(x):
    return x if x is None or (isinstance(x, (int, float)) and math.isfinite(x)) else None


def schedule_to_dict(schedule: Schedule) -> dict:
    ins = []
    for x in schedule.instructions:
        t = type(x)
        if t is Compute:
            ins.append(["compute", x.node, x.device])
        elif t is Copy:
            ins.append(["copy", x.node, x.src, x.dst])
        elif t is Free:
            ins.append(["free", x.node, x.device])
        else:
            ins.append(["sync"])
    out = {"format": "optsched-schedule", "version": VERSION, "graph": schedule.graph, "instructions": ins}
    r = schedule.report
    if r is not None:
        out["report"] = {"solver": r.solver, "status": r.status, "objective": _finite(r.objective),
                         "bound": _finite(r.bound), "gap": _finite(r.gap), "solve_time": r.solve_time,
                         "message": r.message, "extra": dict(r.extra)}
    return out


_ARITY = {"compute": 3, "copy": 4, "free": 3, "sync": 1}


def schedule_from_dict(data) -> Schedule:
    _header(data, "optsched-schedule")
    raw = data.get("instructions")
    if not isinstance(raw, list):
        raise FormatError("must be a list", field="instructions")
    ins = []
    for i, x in enumerate(raw):
        if not isinstance(x, list) or not x or x[0] not in _ARITY or len(x) != _ARITY[x[0]] \
                or not all(isinstance(s, str) for s in x):
            raise FormatError(f"instruction {i} is {x!r}; expected [\"compute\", node, device], "
                              "[\"copy\", node, src, dst], [\"free\", node, device] or [\"sync\"]",
                              field="instructions")
        op = x[0]
        ins.append(Compute(x[1], x[2]) if op == "compute" else Copy(x[1], x[2], x[3]) if op == "copy"
                   else Free(x[1], x[2]) if op == "free" else Sync())
    report = None
    if isinstance(data.get("report"), dict):
        r = data["report"]
        report = SolveReport(solver=str(r.get("solver", "")), status=str(r.get("status", "feasible")),
                             objective=r.get("objective"), bound=r.get("bound"), gap=r.get("gap"),
                             solve_time=float(r.get("solve_time") or 0.0), message=str(r.get("message", "")),
                             extra=r.get("extra") or {})
    return Schedule(instructions=tuple(ins), report=report, graph=str(data.get("graph", "")))


def load_schedule(path: str | os.PathLike) -> Schedule:
    try:
        return schedule_from_dict(read_json(path))
    except OptschedError as e:
        raise e.in_file(str(path)) from None


def save_schedule(schedule: Schedule, path: str | os.PathLike) -> None:
    write_json(path, schedule_to_dict(schedule))
