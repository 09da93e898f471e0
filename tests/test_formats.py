"""optsched's JSON formats: lossless round trips, schemas, reader errors, atomic writes."""

from __future__ import annotations

import json
import math
import os
import stat

import jsonschema
import pytest
from hypothesis import HealthCheck, given, settings
from strategies import clusters, random_dags, training_graphs

from optsched.cluster import Cluster, Device, Link
from optsched.errors import FormatError, GraphError, OptschedError
from optsched.formats import (
    cluster_from_dict,
    cluster_to_dict,
    graph_from_dict,
    graph_to_dict,
    load_cluster,
    load_graph,
    load_schedule,
    read_json,
    save_cluster,
    save_graph,
    save_schedule,
    schedule_from_dict,
    schedule_to_dict,
    schema,
    write_json,
)
from optsched.generate import random_training_graph
from optsched.graph import Graph, Node
from optsched.schedule import Compute, Copy, Free, Schedule, SolveReport, Sync

TMP_SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


def validator(name: str) -> jsonschema.Draft202012Validator:
    s = schema(name)
    jsonschema.Draft202012Validator.check_schema(s)
    return jsonschema.Draft202012Validator(s)


def hand_graph() -> Graph:
    return Graph((
        Node("x", "data", "input", (), {"cuda": 0.0, "cpu": 0.0}, 64, recomputable=False),
        Node("w", "param", "param", (), {"cuda": 0.0}, 32, recomputable=False),
        Node("y", "aten.mm", "forward", ("x", "w", "x"), {"cuda": 1.5e-4, "cpu": 3e-3}, 128, workspace=16),
        Node("r", "dropout", "forward", ("y",), {"cuda": 1e-5}, 128, recomputable=False),
        Node("l", "loss", "loss", ("r",), {"cuda": 1e-6}, 4, required=True),
        Node("gw", "mm_bwd", "backward", ("l", "x"), {"cuda": 3e-4}, 32, required=True),
    ), name="hand", meta={"source": "test", "n": 3, "nested": {"a": [1, 2]}})


def hand_schedule() -> Schedule:
    return Schedule((Compute("x", "gpu0"), Copy("x", "gpu0", "host"), Free("x", "gpu0"), Sync(),
                     Copy("x", "host", "gpu0"), Compute("w", "gpu0")),
                    report=SolveReport("milp", "time_limit", objective=1.25, bound=1.0, gap=0.2, solve_time=3.5,
                                       message="stopped", extra={"nodes": 10, "why": ["a", "b"]}),
                    graph="hand")


def hand_cluster() -> Cluster:
    return Cluster((Device("gpu0", "cuda", 16 * 10**9, 1.0), Device("gpu1", "cuda", 2**34 + 1, 2.5),
                    Device("host", "cpu", 256 * 10**9, 0.1)),
                   (Link("gpu0", "host", 16e9, 1e-5, 4e-5), Link("host", "gpu0", 16e9 / 3, 0.0),
                    Link("gpu0", "gpu1", 0.5)))


# --- round trips ----------------------------------------------------------------------------------

def test_graph_round_trip_through_a_file(tmp_path):
    g = hand_graph()
    save_graph(g, tmp_path / "g.json")
    back = load_graph(tmp_path / "g.json")
    assert back == g
    assert back.node("y").inputs == ("x", "w", "x")


def test_graph_dict_is_plain_json():
    d = graph_to_dict(hand_graph())
    assert json.loads(json.dumps(d)) == d
    assert d["format"] == "optsched-graph" and d["version"] == 1
    # defaults are left out, non-defaults written
    nodes = {x["id"]: x for x in d["nodes"]}
    assert "recomputable" not in nodes["x"] and "recomputable" not in nodes["y"]
    assert nodes["r"]["recomputable"] is False
    assert nodes["y"]["workspace"] == 16 and "workspace" not in nodes["x"]
    assert nodes["l"]["required"] is True and "required" not in nodes["y"]


def test_an_ops_other_output_keeps_its_maker_through_a_file(tmp_path):
    g = hand_graph()
    x = g.node("x")
    made = Graph(g.nodes + (Node("y2", x.op, "forward", ("y", "x"), {"cuda": 0.0}, 8, recomputable=False,
                                 output_of="y"),), name=g.name)
    save_graph(made, tmp_path / "g.json")
    assert load_graph(tmp_path / "g.json") == made
    assert {n["id"]: n for n in graph_to_dict(made)["nodes"]}["y2"]["output_of"] == "y"
    assert "output_of" not in {n["id"]: n for n in graph_to_dict(made)["nodes"]}["y"]
    bad = graph_to_dict(made)
    bad["nodes"][-1]["output_of"] = 3
    with pytest.raises(FormatError, match="the id") as info:
        graph_from_dict(bad)
    assert info.value.node == "y2" and info.value.field == "output_of"


def test_unnamed_graph_takes_the_file_stem(tmp_path):
    g = Graph(hand_graph().nodes)
    save_graph(g, tmp_path / "resnet.json")
    assert load_graph(tmp_path / "resnet.json").name == "resnet"


@TMP_SETTINGS
@given(g=random_dags(max_nodes=15))
def test_graph_round_trip_random_dags(tmp_path, g):
    assert graph_from_dict(json.loads(json.dumps(graph_to_dict(g)))) == g
    save_graph(g, tmp_path / "g.json")
    assert load_graph(tmp_path / "g.json") == g


@settings(max_examples=20, deadline=None)
@given(g=training_graphs(max_forward=10))
def test_graph_round_trip_training_graphs(g):
    assert graph_from_dict(json.loads(json.dumps(graph_to_dict(g)))) == g


def test_large_graph_round_trip_compact(tmp_path):
    g = random_training_graph(1000, seed=3)
    assert len(g) > 2000
    save_graph(g, tmp_path / "big.json")
    text = (tmp_path / "big.json").read_text()
    assert "\n " not in text                      # compact separators for large files
    assert load_graph(tmp_path / "big.json") == g


def test_cluster_round_trip_through_a_file(tmp_path):
    c = hand_cluster()
    save_cluster(c, tmp_path / "c.json")
    assert load_cluster(tmp_path / "c.json") == c


@settings(max_examples=40, deadline=None)
@given(c=clusters())
def test_cluster_round_trip_random(c):
    assert cluster_from_dict(json.loads(json.dumps(cluster_to_dict(c)))) == c


def test_cluster_human_strings_and_bidirectional():
    c = cluster_from_dict({"format": "optsched-cluster", "version": 1,
                           "devices": [{"name": "gpu0", "memory": "16GiB"},
                                       {"name": "host", "kind": "cpu", "memory": "512GB", "speed": 0.25}],
                           "links": [{"src": "gpu0", "dst": "host", "bandwidth": "25GB/s", "latency": "5us",
                                      "bidirectional": True}]})
    assert c.device("gpu0").memory == 16 * 2**30 and c.device("gpu0").kind == "cuda"
    assert c.device("host").memory == 512 * 10**9 and c.device("host").speed == 0.25
    for src, dst in (("gpu0", "host"), ("host", "gpu0")):
        lk = c.link(src, dst)
        assert lk.bandwidth == 25e9 and lk.latency == pytest.approx(5e-6)


def test_schedule_round_trip_through_a_file(tmp_path):
    s = hand_schedule()
    save_schedule(s, tmp_path / "s.json")
    assert load_schedule(tmp_path / "s.json") == s


def test_schedule_without_report_round_trip():
    s = Schedule((Compute("a", "d"), Free("a", "d")), graph="g")
    assert schedule_from_dict(schedule_to_dict(s)) == s


def test_schedule_non_finite_numbers_become_null():
    s = Schedule((Sync(),), report=SolveReport("x", objective=math.inf, bound=math.nan, gap=None))
    d = schedule_to_dict(s)
    json.dumps(d, allow_nan=False)
    assert d["report"]["objective"] is None and d["report"]["bound"] is None


# --- schemas ------------------------------------------------------------------------------------

def test_schemas_validate_what_the_writers_write():
    validator("graph").validate(graph_to_dict(hand_graph()))
    validator("graph").validate(graph_to_dict(random_training_graph(30, seed=1)))
    validator("cluster").validate(cluster_to_dict(hand_cluster()))
    validator("schedule").validate(schedule_to_dict(hand_schedule()))
    validator("schedule").validate(schedule_to_dict(Schedule(())))
    validator("schedule").validate(schedule_to_dict(Schedule((Sync(),), report=SolveReport("x", bound=math.nan))))


@settings(max_examples=40, deadline=None)
@given(g=random_dags(max_nodes=12), c=clusters())
def test_schemas_validate_random_writes(g, c):
    validator("graph").validate(json.loads(json.dumps(graph_to_dict(g))))
    validator("cluster").validate(json.loads(json.dumps(cluster_to_dict(c))))


def test_cluster_schema_accepts_human_strings():
    validator("cluster").validate({"format": "optsched-cluster", "version": 1,
                                   "devices": [{"name": "g", "memory": "16GB"}],
                                   "links": [{"src": "g", "dst": "g2", "bandwidth": "16GB/s", "latency": "10us",
                                              "bidirectional": True}]})


@pytest.mark.parametrize("name, mutate", [
    ("graph", lambda d: d["nodes"][0].update(colour="red")),
    ("graph", lambda d: d["nodes"][0].update(bytes=-1)),
    ("graph", lambda d: d["nodes"][0].update(cost={})),
    ("graph", lambda d: d["nodes"][0].update(cost={"tpu": 1.0})),
    ("graph", lambda d: d["nodes"][0].update(kind="activation")),
    ("graph", lambda d: d.update(version=2)),
    ("cluster", lambda d: d["devices"][0].update(kind="tpu")),
    ("cluster", lambda d: d["devices"][0].update(speed=0)),
    ("cluster", lambda d: d.update(devices=[])),
    ("schedule", lambda d: d["instructions"].append(["compute", "a"])),
    ("schedule", lambda d: d["instructions"].append(["copy", "a", "b"])),
    ("schedule", lambda d: d["instructions"].append(["sync", "now"])),
    ("schedule", lambda d: d["instructions"].append(["launch", "a", "b"])),
    ("schedule", lambda d: d["report"].update(status="great")),
])
def test_schemas_reject_malformed(name, mutate):
    d = {"graph": lambda: graph_to_dict(hand_graph()), "cluster": lambda: cluster_to_dict(hand_cluster()),
         "schedule": lambda: schedule_to_dict(hand_schedule())}[name]()
    validator(name).validate(d)
    mutate(d)
    with pytest.raises(jsonschema.ValidationError):
        validator(name).validate(d)


# --- reader errors ---------------------------------------------------------------------------------

def write(path, data):
    path.write_text(json.dumps(data) if not isinstance(data, str) else data)
    return path


def test_reader_errors_name_file_node_and_field(tmp_path):
    d = graph_to_dict(hand_graph())
    d["nodes"][2]["colour"] = "red"
    p = write(tmp_path / "bad.json", d)
    with pytest.raises(FormatError) as info:
        load_graph(p)
    e = info.value
    assert e.file == str(p) and e.node == "y" and e.field == "colour"
    assert str(p) in str(e) and "'y'" in str(e)


def test_reader_graph_rule_errors_carry_the_file(tmp_path):
    d = graph_to_dict(hand_graph())
    d["nodes"][2]["bytes"] = -5
    p = write(tmp_path / "neg.json", d)
    with pytest.raises(GraphError) as info:
        load_graph(p)
    assert (info.value.file, info.value.node, info.value.field) == (str(p), "y", "bytes")


@pytest.mark.parametrize("node_patch, field", [
    ({"inputs": "x"}, "inputs"),
    ({"cost": 1.0}, "cost"),
    ({"recomputable": "yes"}, "recomputable"),
    ({"required": 1}, "required"),
])
def test_reader_field_type_errors(node_patch, field):
    d = graph_to_dict(hand_graph())
    d["nodes"][2].update(node_patch)
    with pytest.raises(FormatError) as info:
        graph_from_dict(d)
    assert info.value.node == "y" and info.value.field == field


def test_reader_integral_float_bytes_are_ints():
    d = graph_to_dict(hand_graph())
    d["nodes"][2]["bytes"] = 128.0
    g = graph_from_dict(d)
    assert g.node("y").bytes == 128 and isinstance(g.node("y").bytes, int)


@pytest.mark.parametrize("data, match", [
    ({"format": "optsched-cluster", "version": 1, "nodes": []}, "not an optsched-graph"),
    ({"format": "optsched-graph", "version": 7, "nodes": []}, "unsupported version"),
    ([1, 2], "JSON object"),
    ({"format": "optsched-graph", "version": 1, "nodes": {}}, "list of nodes"),
])
def test_reader_header_errors(tmp_path, data, match):
    p = write(tmp_path / "h.json", data)
    with pytest.raises(FormatError, match=match) as info:
        load_graph(p)
    assert info.value.file == str(p)


def test_reader_file_errors(tmp_path):
    with pytest.raises(FormatError, match="no such file"):
        read_json(tmp_path / "missing.json")
    with pytest.raises(FormatError, match="folder"):
        read_json(tmp_path)
    with pytest.raises(FormatError, match="not valid JSON.*line 2"):
        read_json(write(tmp_path / "broken.json", '{\n  "a": ,\n}'))
    (tmp_path / "bin.json").write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(FormatError, match="UTF-8"):
        read_json(tmp_path / "bin.json")


def test_schedule_reader_rejects_bad_instructions():
    d = schedule_to_dict(hand_schedule())
    d["instructions"].append(["free", "x"])
    with pytest.raises(FormatError, match="instruction 6") as info:
        schedule_from_dict(d)
    assert info.value.field == "instructions"


def test_cluster_reader_errors():
    base = {"format": "optsched-cluster", "version": 1}
    with pytest.raises(FormatError):
        cluster_from_dict({**base, "devices": []})
    with pytest.raises(FormatError):
        cluster_from_dict({**base, "devices": [{"name": "g"}]})
    with pytest.raises(OptschedError, match="memory of device 'g'"):
        cluster_from_dict({**base, "devices": [{"name": "g", "memory": "lots"}]})
    with pytest.raises(FormatError, match="speed"):
        cluster_from_dict({**base, "devices": [{"name": "g", "memory": 1, "speed": "fast"}]})
    with pytest.raises(FormatError, match="links\\[0\\]"):
        cluster_from_dict({**base, "devices": [{"name": "g", "memory": 1}], "links": [{"src": "g"}]})


# --- atomic writes ----------------------------------------------------------------------------------

def test_failed_write_leaves_old_file_and_no_temporary(tmp_path):
    target = tmp_path / "g.json"
    save_graph(hand_graph(), target)
    before = target.read_bytes()
    bad = Graph(hand_graph().nodes, name="bad", meta={"x": object()})   # not JSON-serialisable, fails mid-dump
    with pytest.raises(TypeError):
        save_graph(bad, target)
    assert target.read_bytes() == before
    assert sorted(os.listdir(tmp_path)) == ["g.json"]


def test_failed_write_creates_nothing(tmp_path):
    with pytest.raises(ValueError, match="boom"):
        write_json(tmp_path / "n.json", {"a": [1, 2, 3], "b": _Exploding([0])})
    assert os.listdir(tmp_path) == []


class _Exploding(list):
    """A list that fails half-way through serialisation."""

    def __iter__(self):
        yield 1
        raise ValueError("boom")


def test_write_into_missing_folder(tmp_path):
    with pytest.raises(FormatError, match="folder does not exist"):
        write_json(tmp_path / "nope" / "x.json", {})
    assert os.listdir(tmp_path) == []


def test_saved_files_get_ordinary_permissions(tmp_path):
    umask = os.umask(0o022)
    try:
        save_graph(hand_graph(), tmp_path / "g.json")
    finally:
        os.umask(umask)
    assert stat.S_IMODE(os.stat(tmp_path / "g.json").st_mode) == 0o644


def test_write_replaces_existing_file(tmp_path):
    target = tmp_path / "s.json"
    target.write_text("old")
    save_schedule(hand_schedule(), target)
    assert load_schedule(target) == hand_schedule()
    assert sorted(os.listdir(tmp_path)) == ["s.json"]
