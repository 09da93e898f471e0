"""Graph importers: MSR device-placement graphs, Checkmate/Moccasin node-link
JSON, format detection, user-facing errors and the shipped examples."""

from __future__ import annotations

import json
import math
from collections import Counter, defaultdict
from pathlib import Path

import pytest

from optsched.errors import FormatError, OptschedError
from optsched.formats import load_graph, save_graph
from optsched.formats.importers import (
    FORMATS,
    detect_format,
    example_graph_path,
    example_names,
    import_graph,
    msr_to_graph,
    node_link_to_graph,
)
from optsched.graph import check_graph

DATA = Path(__file__).resolve().parent / "data"
SHARED = Path(__file__).resolve().parents[2] / "shared" / "data"
MSR_DIR = SHARED / "msr-dnn-partitioning"
MSR_FILES = ["gnmt_training.json", "bert_l-3_training.json", "resnet50_training.json"]
needs_shared = pytest.mark.skipif(not MSR_DIR.is_dir(),
                                  reason=f"shared MSR graphs not found at {MSR_DIR} (outside this repository)")


def _raw(path: Path) -> dict:
    return json.loads(path.read_text())


def _write(tmp_path: Path, data, name: str = "graph.json") -> Path:
    p = tmp_path / name
    p.write_text(json.dumps(data))
    return p


# --- the published MSR graphs ---------------------------------------------------------------------

@needs_shared
@pytest.mark.parametrize("fname", MSR_FILES)
def test_msr_graph_imports_and_matches_source(fname):
    path = MSR_DIR / fname
    raw = _raw(path)
    g = import_graph(path)
    assert check_graph(g) is g
    assert detect_format(path) == "msr"
    assert g.meta["importer"] == "msr" and g.meta["source"] == fname
    for key in ("maxSizePerFPGA", "maxFPGAs", "maxCPUs"):
        assert g.meta[key] == raw[key]

    by_id = {f"n{n['id']}": n for n in raw["nodes"]}
    added = [n for n in g.nodes if n.id not in by_id]
    assert all(n.kind == "param" for n in added)
    # node and edge counts: the source's, plus the added param nodes and their edges
    assert len(g) == len(raw["nodes"]) + len(added)
    added_ids = {n.id for n in added}
    param_edges = sum(1 for n in g.nodes for x in n.inputs if x in added_ids)
    assert g.num_edges == len({(e["sourceId"], e["destId"]) for e in raw["edges"]}) + param_edges

    incoming = Counter(e["destId"] for e in raw["edges"])
    outgoing = defaultdict(list)
    for e in raw["edges"]:
        outgoing[e["sourceId"]].append(e["size"])
    for n in raw["nodes"]:
        node = g.node(f"n{n['id']}")
        assert node.op == n["name"]
        out = math.ceil(max(outgoing[n["id"]], default=0))
        if not incoming[n["id"]]:  # sources: weights or inputs, free and never recomputed
            assert node.kind == ("param" if n["size"] > 0 else "input")
            assert not node.recomputable and not node.inputs
            assert node.cost == {"cuda": 0.0, "cpu": 0.0}
            assert node.bytes == (max(math.ceil(n["size"]), out) if n["size"] > 0 else out)
            continue
        # forward/backward split follows isBackwardNode
        assert node.kind == ("backward" if n["isBackwardNode"] else "forward")
        # costs: milliseconds -> seconds
        assert node.cost["cpu"] == pytest.approx(n["cpuLatency"] / 1000)
        if n["supportedOnFpga"]:
            assert node.cost["cuda"] == pytest.approx(n["fpgaLatency"] / 1000)
        else:
            assert "cuda" not in node.cost
        # output bytes: the largest outgoing edge (node size too, for operator graphs)
        if g.meta["node_size"] == "output":
            assert node.bytes == max(out, math.ceil(n["size"]))
        else:
            assert node.bytes == out
        assert node.required == (not outgoing[n["id"]])
        assert node.recomputable
        if "colorClass" in n:
            assert g.meta["color_class"][node.id] == n["colorClass"]


@needs_shared
def test_msr_layer_graph_counts_each_layers_weights_once():
    raw = _raw(MSR_DIR / "gnmt_training.json")
    g = import_graph(MSR_DIR / "gnmt_training.json")
    assert g.meta["node_size"] == "state"
    assert (len(g), g.num_edges) == (276, 412)
    params = [n for n in g.nodes if n.kind == "param"]
    dst = {e["destId"] for e in raw["edges"]}
    classes = defaultdict(list)
    for n in raw["nodes"]:
        if n["id"] in dst and n["size"] > 0:
            classes[n["colorClass"]].append(n)
    # one param node per class, holding the class's largest size, read by every member with size > 0
    assert len(params) == len(classes) == 84
    assert sum(p.bytes for p in params) == sum(max(m["size"] for m in ms) for ms in classes.values())
    for cls, members in classes.items():
        (pid,) = [p.id for p in params if g.meta["color_class"][p.id] == cls]
        for m in members:
            node = g.node(f"n{m['id']}")
            assert [x for x in node.inputs if g.node(x).kind == "param"] == [pid]
    # forward and backward node of a layer share its weights
    readers = Counter(x for n in g.nodes for x in n.inputs if g.node(x).kind == "param")
    assert set(readers.values()) == {2}
    # GNMT's edge costs are in seconds: 2 GiB/s, not 2 TiB/s
    assert g.meta["link_bandwidth"] == pytest.approx(2 ** 31)
    assert "seconds" in g.meta["link_bandwidth_note"]


@needs_shared
@pytest.mark.parametrize("fname,nodes,edges,weights", [
    ("bert_l-3_training.json", 600, 817, 65),
    ("resnet50_training.json", 1243, 1806, 161),
])
def test_msr_operator_graph_weights_are_the_source_nodes(fname, nodes, edges, weights):
    raw = _raw(MSR_DIR / fname)
    g = import_graph(MSR_DIR / fname)
    assert g.meta["node_size"] == "output"
    assert (len(g), g.num_edges) == (nodes, edges)
    params = [n for n in g.nodes if n.kind == "param"]
    assert len(params) == weights
    dst = {e["destId"] for e in raw["edges"]}
    assert sum(p.bytes for p in params) == sum(math.ceil(n["size"]) for n in raw["nodes"] if n["id"] not in dst)
    assert g.meta["link_bandwidth"] == pytest.approx(2 ** 31)
    assert "link_bandwidth_note" not in g.meta


# --- a small MSR fixture (runs without ../shared) ------------------------------------------------

def test_msr_fixture_layer_graph():
    g = import_graph(DATA / "msr_small.json")
    assert (len(g), g.num_edges) == (11, 15)
    assert g.name == "msr_small"
    assert g.node("w.c1").bytes == 4000          # max over the class (4000 forward, 3000 backward)
    assert g.node("w.c2").bytes == 8000
    assert g.node("w.n3").bytes == 2000          # no colorClass: a param of its own
    assert g.node("n7").inputs == ("n6", "n1", "w.c1")
    assert g.node("n3").cost == {"cpu": 0.003}   # supportedOnFpga 0
    assert g.node("n1").cost == {"cuda": 0.0005, "cpu": 0.005}
    assert g.node("n0").kind == "input" and g.node("n0").bytes == 1000
    assert [n.id for n in g.nodes if n.required] == ["n7"]
    assert g.node("n5").kind == "backward" and g.node("n2").kind == "forward"
    assert g.meta["link_bandwidth"] == pytest.approx(2e9)
    assert g.meta["color_class"]["w.c2"] == 2


def test_msr_node_size_option():
    raw = _raw(DATA / "msr_small.json")
    as_output = msr_to_graph(raw, node_size="output")
    assert len(as_output) == 8 and not any(n.kind == "param" for n in as_output.nodes)
    assert as_output.node("n1").bytes == 4000    # max(size, largest out-edge)
    with pytest.raises(OptschedError, match="node_size"):
        msr_to_graph(raw, node_size="weights")


# --- Checkmate / Moccasin node-link ---------------------------------------------------------------

def test_checkmate_fixture_cost_cpu_variant():
    g = import_graph(DATA / "checkmate_mlp.json")
    assert detect_format(DATA / "checkmate_mlp.json") == "checkmate"
    assert (len(g), g.num_edges) == (10, 13)
    assert g.node("n0").kind == "input" and not g.node("n0").recomputable
    assert g.node("n4").kind == "loss" and g.node("n4").required
    assert Counter(n.kind for n in g.nodes) == {"input": 1, "forward": 3, "loss": 1, "backward": 5}
    assert {n.id for n in g.nodes if n.required} == {"n4", "n6", "n9"}
    assert g.node("n1").cost == {"cuda": 2.1e-05, "cpu": pytest.approx(2.1e-04)}
    assert g.node("n9").bytes == 802816
    assert g.meta["importer"] == "checkmate" and g.meta["cost_fields"] == ["cost_cpu/cost_ram"]


def test_moccasin_fixture_duration_variant_and_options():
    path = DATA / "moccasin_mlp.json"
    assert detect_format(path) == "checkmate"
    g = import_graph(path, time_unit="ms", cpu_slowdown=4)
    ref = import_graph(DATA / "checkmate_mlp.json", cpu_slowdown=4)
    assert (len(g), g.num_edges) == (10, 13)
    assert g.node("fc1").cost == {"cuda": pytest.approx(2.1e-05), "cpu": pytest.approx(8.4e-05)}
    assert g.node("loss").kind == "loss"
    # the same network as the cost_cpu fixture, up to ids
    rename = dict(zip([n.id for n in g.nodes], [n.id for n in ref.nodes], strict=True))
    for a, b in zip(g.nodes, ref.nodes, strict=True):
        assert (a.op, a.kind, a.bytes, a.required, tuple(rename[x] for x in a.inputs)) == \
               (b.op, b.kind, b.bytes, b.required, b.inputs)
        assert a.cost["cuda"] == pytest.approx(b.cost["cuda"])
        assert a.cost["cpu"] == pytest.approx(b.cost["cpu"])
    us = import_graph(path, time_unit="us")
    assert us.node("fc1").cost["cuda"] == pytest.approx(2.1e-08)


@pytest.mark.parametrize("edges_key", ["links", "edges"])
@pytest.mark.parametrize("seed", range(4))
def test_networkx_node_link_data_of_a_training_graph(tmp_path, seed, edges_key):
    """A graph written by networkx's own `node_link_data` imports with the same structure."""
    import networkx as nx

    from optsched.generate import random_training_graph

    ref = random_training_graph(25, seed)
    g = nx.DiGraph(loss_node="loss")
    for n in ref.nodes:
        g.add_node(n.id, name=n.op, backward=n.kind == "backward", cost_cpu=n.cost["cuda"], cost_ram=n.bytes)
    for n in ref.nodes:
        for x in n.inputs:
            g.add_edge(x, n.id)
    path = _write(tmp_path, nx.node_link_data(g, edges=edges_key), "nx.json")
    got = import_graph(path)
    assert [n.id for n in got.nodes] == [n.id for n in ref.nodes]
    assert got.num_edges == ref.num_edges
    expect_kind = {"param": "input", "input": "input"}
    for a, b in zip(got.nodes, ref.nodes, strict=True):
        assert set(a.inputs) == set(b.inputs)
        assert a.kind == expect_kind.get(b.kind, b.kind)
        assert a.bytes == b.bytes and a.recomputable == b.recomputable
        assert a.cost["cpu"] == pytest.approx(b.cost["cpu"])
        assert a.required or not b.required


# --- detection and format selection ---------------------------------------------------------------

def test_detection_and_explicit_format(tmp_path):
    p = tmp_path / "own.json"
    save_graph(import_graph(DATA / "msr_small.json"), p)
    assert detect_format(p) == "optsched"
    assert import_graph(p) == load_graph(p)
    assert import_graph(p, fmt="optsched") == load_graph(p)
    assert import_graph(DATA / "msr_small.json", fmt="msr") == import_graph(DATA / "msr_small.json")
    assert import_graph(DATA / "checkmate_mlp.json", fmt="checkmate").num_edges == 13
    assert import_graph(DATA / "moccasin_mlp.json", fmt="moccasin").num_edges == 13
    # MSR detected by fpgaLatency alone, node-link by links + cost fields
    raw = _raw(DATA / "msr_small.json")
    del raw["maxSizePerFPGA"]
    assert detect_format(_write(tmp_path, raw, "msr_nohdr.json")) == "msr"
    cm = _raw(DATA / "checkmate_mlp.json")
    cm["edges"] = cm.pop("links")
    assert detect_format(_write(tmp_path, cm, "cm_edges.json")) == "checkmate"
    assert FORMATS == ("optsched", "msr", "checkmate")


@pytest.mark.parametrize("content", [
    {"nodes": [{"id": 1}], "links": []},
    [1, 2, 3],
    {"hello": "world"},
    {"format": "optsched-cluster", "version": 1, "devices": []},
])
def test_undetectable_format_names_file_formats_and_flag(tmp_path, content):
    p = _write(tmp_path, content, "mystery.json")
    with pytest.raises(FormatError) as e:
        import_graph(p)
    msg = str(e.value)
    assert str(p) in msg and "--from" in msg
    for fmt in FORMATS:
        assert fmt in msg


def test_unknown_format_and_option(tmp_path):
    with pytest.raises(FormatError, match=r"unknown graph format 'onnx'.*--from"):
        import_graph(DATA / "msr_small.json", fmt="onnx")
    with pytest.raises(OptschedError, match=r"msr_small.json.*unknown option.*cpu_slowdown"):
        import_graph(DATA / "msr_small.json", cpu_slowdown=3)
    with pytest.raises(OptschedError, match=r"checkmate_mlp.json.*time_unit"):
        import_graph(DATA / "checkmate_mlp.json", time_unit="fortnights")
    with pytest.raises(OptschedError, match=r"checkmate_mlp.json.*cpu_slowdown"):
        import_graph(DATA / "checkmate_mlp.json", cpu_slowdown=-1)


def test_wrong_explicit_format_hints_the_detected_one():
    with pytest.raises(FormatError, match=r"checkmate_mlp.json.*try --from checkmate"):
        import_graph(DATA / "checkmate_mlp.json", fmt="msr")


def test_file_errors(tmp_path):
    with pytest.raises(FormatError, match="no such file"):
        import_graph(tmp_path / "absent.json")
    bad = tmp_path / "bad.json"
    bad.write_text("{\"nodes\": [")
    with pytest.raises(FormatError, match=r"bad.json.*not valid JSON"):
        import_graph(bad)


# --- every user mistake is an OptschedError naming file, node and field ----------------------------

def _msr_node(d, i):
    return d["nodes"][i]


MSR_BAD = [
    ("missing latency", lambda d: _msr_node(d, 2).pop("cpuLatency"), "n2", "cpuLatency"),
    ("missing fpga latency", lambda d: _msr_node(d, 2).pop("fpgaLatency"), "n2", "fpgaLatency"),
    ("missing size", lambda d: _msr_node(d, 1).pop("size"), "n1", "size"),
    ("latency wrong type", lambda d: _msr_node(d, 2).update(fpgaLatency="fast"), "n2", "fpgaLatency"),
    ("negative size", lambda d: _msr_node(d, 6).update(size=-8.0), "n6", "size"),
    ("NaN latency", lambda d: _msr_node(d, 4).update(cpuLatency=float("nan")), "n4", "cpuLatency"),
    ("infinite latency", lambda d: _msr_node(d, 4).update(cpuLatency=float("inf")), "n4", "cpuLatency"),
    ("flag wrong type", lambda d: _msr_node(d, 5).update(isBackwardNode="yes"), "n5", "isBackwardNode"),
    ("supported wrong type", lambda d: _msr_node(d, 5).update(supportedOnFpga=2), "n5", "supportedOnFpga"),
    ("name wrong type", lambda d: _msr_node(d, 3).update(name=3), "n3", "name"),
    ("color class wrong type", lambda d: _msr_node(d, 3).update(colorClass=[1]), "n3", "colorClass"),
    ("duplicate id", lambda d: _msr_node(d, 7).update(id=3), "n3", "id"),
    ("missing id", lambda d: _msr_node(d, 7).pop("id"), "nodes[7]", "id"),
    ("id wrong type", lambda d: _msr_node(d, 7).update(id=[7]), "nodes[7]", "id"),
    ("node not an object", lambda d: d["nodes"].__setitem__(3, 3), None, "nodes"),
    ("edge to unknown node", lambda d: d["edges"][4].update(destId=99), "n4", "destId"),
    ("edge from unknown node", lambda d: d["edges"][4].update(sourceId=-1), "edges[4]", "sourceId"),
    ("edge without source", lambda d: d["edges"][4].pop("sourceId"), "edges[4]", "sourceId"),
    ("edge size negative", lambda d: d["edges"][1].update(size=-1), "n1", "size"),
    ("edge size missing", lambda d: d["edges"][1].pop("size"), "n1", "size"),
    ("edge cost NaN", lambda d: d["edges"][1].update(cost=float("nan")), "n1", "cost"),
    ("self loop", lambda d: d["edges"][1].update(destId=1), "n1", "destId"),
    ("cycle", lambda d: d["edges"].append({"sourceId": 6, "destId": 2, "cost": 0.0, "size": 1.0}), "n", "edges"),
    ("nodes not a list", lambda d: d.update(nodes={"a": 1}), None, "nodes"),
    ("edges missing", lambda d: d.pop("edges"), None, "edges"),
    ("header wrong type", lambda d: d.update(maxFPGAs="six"), None, "maxFPGAs"),
]


@pytest.mark.parametrize("what,mutate,node,field", MSR_BAD, ids=[c[0] for c in MSR_BAD])
def test_msr_bad_input(tmp_path, what, mutate, node, field):
    data = _raw(DATA / "msr_small.json")
    mutate(data)
    p = _write(tmp_path, data, "broken_msr.json")
    with pytest.raises(OptschedError) as e:
        import_graph(p)
    err = e.value
    msg = str(err)
    assert str(p) in msg and err.file == str(p)
    assert f"field {field!r}" in msg
    if node is not None:
        assert f"node '{node}" in msg


def test_msr_cycle_names_the_cycle(tmp_path):
    data = _raw(DATA / "msr_small.json")
    data["edges"].append({"sourceId": 6, "destId": 2, "cost": 0.0, "size": 1.0})
    with pytest.raises(OptschedError, match=r"cycle: n\d -> n\d -> n\d"):
        import_graph(_write(tmp_path, data))


CM_BAD = [
    ("missing cost", lambda d: d["nodes"][3].pop("cost_cpu"), "n3", "cost_cpu"),
    ("missing bytes", lambda d: d["nodes"][3].pop("cost_ram"), "n3", "cost_ram"),
    ("cost wrong type", lambda d: d["nodes"][3].update(cost_cpu="1ms"), "n3", "cost_cpu"),
    ("negative bytes", lambda d: d["nodes"][2].update(cost_ram=-5), "n2", "cost_ram"),
    ("NaN cost", lambda d: d["nodes"][2].update(cost_cpu=float("nan")), "n2", "cost_cpu"),
    ("backward wrong type", lambda d: d["nodes"][6].update(backward="true"), "n6", "backward"),
    ("duplicate id", lambda d: d["nodes"][6].update(id=5), "n5", "id"),
    ("link to unknown node", lambda d: d["links"][2].update(target=42), "n2", "target"),
    ("link from unknown node", lambda d: d["links"][2].update(source="n2"), "links[2]", "source"),
    ("link without source", lambda d: d["links"][2].pop("source"), "links[2]", "source"),
    ("cycle", lambda d: d["links"].append({"source": 8, "target": 2}), "n", "links"),
    ("loss node unknown", lambda d: d["graph"].update(loss_node=77), None, "graph.loss_node"),
]


@pytest.mark.parametrize("what,mutate,node,field", CM_BAD, ids=[c[0] for c in CM_BAD])
def test_checkmate_bad_input(tmp_path, what, mutate, node, field):
    data = _raw(DATA / "checkmate_mlp.json")
    mutate(data)
    p = _write(tmp_path, data, "broken_cm.json")
    with pytest.raises(OptschedError) as e:
        import_graph(p)
    msg = str(e.value)
    assert str(p) in msg
    assert f"field {field!r}" in msg
    if node is not None:
        assert f"node '{node}" in msg


def test_moccasin_missing_out_cost(tmp_path):
    data = _raw(DATA / "moccasin_mlp.json")
    data["nodes"][1].pop("out_cost")
    p = _write(tmp_path, data)
    with pytest.raises(FormatError, match=r"node 'fc1', field 'out_cost'"):
        import_graph(p)


def test_dict_level_functions_raise_without_file():
    with pytest.raises(FormatError):
        msr_to_graph([])
    with pytest.raises(FormatError, match="links"):
        node_link_to_graph({"nodes": []})


# --- round trip and shipped examples ---------------------------------------------------------------

ROUND_TRIP = [DATA / "msr_small.json", DATA / "checkmate_mlp.json", DATA / "moccasin_mlp.json"] + \
    [MSR_DIR / f for f in MSR_FILES]


@pytest.mark.parametrize("path", ROUND_TRIP, ids=[p.stem for p in ROUND_TRIP])
def test_round_trip_is_lossless(tmp_path, path):
    if not path.exists():
        pytest.skip(f"{path} not found (shared data outside this repository)")
    g = import_graph(path)
    out = tmp_path / "saved.json"
    save_graph(g, out)
    back = load_graph(out)
    assert back == g
    assert back.name == g.name and back.meta == g.meta
    assert [dict(n.cost) for n in back.nodes] == [dict(n.cost) for n in g.nodes]


def test_example_names_and_paths():
    assert {"tiny", "gnmt", "bert_l3"} <= set(example_names())
    for name in example_names():
        p = example_graph_path(name)
        assert p.is_file() and p.suffix == ".json"
        g = load_graph(p)
        assert g.name == name
    assert example_graph_path("tiny.json") == example_graph_path("tiny")
    with pytest.raises(OptschedError, match=r"no example graph named 'vgg'.*available: .*tiny"):
        example_graph_path("vgg")


def test_tiny_example_is_a_training_step():
    g = load_graph(example_graph_path("tiny"))
    kinds = Counter(n.kind for n in g.nodes)
    assert kinds == {"input": 2, "param": 2, "forward": 3, "loss": 1, "backward": 5}
    assert {n.id for n in g.nodes if n.required} == {"loss", "g_w1", "g_w2"}
    assert g.node("g_w1").bytes == g.node("w1").bytes and g.node("g_w2").bytes == g.node("w2").bytes


@needs_shared
@pytest.mark.parametrize("name,fname", [("gnmt", "gnmt_training.json"), ("bert_l3", "bert_l-3_training.json")])
def test_shipped_example_matches_fresh_import(name, fname):
    shipped = load_graph(example_graph_path(name))
    fresh = import_graph(MSR_DIR / fname, name=name)
    assert shipped == fresh


def test_public_names_exported():
    import optsched.formats as f

    for name in ("import_graph", "detect_format", "example_graph_path", "example_names"):
        assert hasattr(f, name)



def test_examples_found_from_any_working_directory(tmp_path):
    import subprocess
    import sys

    code = "from optsched.formats.importers import example_graph_path; print(example_graph_path('tiny'))"
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, check=True)
    assert Path(out.stdout.strip()) == example_graph_path("tiny")
