"""The command line: every command works on a real graph, and every user
mistake ends with one message naming the problem and exit status 2."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import replace

import pytest

from optsched.cli import main
from optsched.formats import graph_to_dict, load_graph, load_schedule, save_graph
from optsched.generate import chain_graph
from optsched.graph import drop_unneeded, memory_lower_bound
from optsched.schedule import SolveReport


@pytest.fixture
def graph_file(tmp_path):
    path = tmp_path / "chain.json"
    save_graph(chain_graph(16), path)
    return path


def run(capsys, *argv):
    code = main([str(a) for a in argv])
    out = capsys.readouterr()
    return code, out.out, out.err


def write(tmp_path, name, data):
    p = tmp_path / name
    p.write_text(data if isinstance(data, str) else json.dumps(data))
    return p


def test_validate_and_info(capsys, graph_file):
    code, out, _ = run(capsys, "validate", graph_file)
    assert code == 0 and "34 nodes" in out
    code, out, _ = run(capsys, "info", graph_file, "--json")
    info = json.loads(out)
    assert code == 0
    assert info["nodes"] == 34 and info["kinds"]["forward"] == 16 and info["kinds"]["backward"] == 16
    # 16 activations of 1 MB, the input and the 4-byte loss live at once before backward starts
    assert info["baselines"]["keep-everything"]["peak_bytes"] == 17_000_004
    assert info["baselines"]["chen-sqrt"]["peak_bytes"] < info["baselines"]["keep-everything"]["peak_bytes"]
    assert info["memory_lower_bound"] == 3_000_000
    # one accelerator without swapping needs at least that, and no more than keeping everything
    assert 3_000_000 <= info["recompute_floor"] <= 17_000_004
    code, out, _ = run(capsys, "info", graph_file)
    assert code == 0 and "keep-everything" in out and "lower bound" in out and "whatever is recomputed" in out


def test_solve_then_simulate(capsys, graph_file, tmp_path):
    out_file = tmp_path / "s.json"
    code, out, err = run(capsys, "solve", graph_file, "--mem", "10MB", "--solver", "chen-sqrt", "-o", out_file)
    assert code == 0, err
    assert "step time" in out and "gpu0" in out
    sched = load_schedule(out_file)
    assert sched.report.solver == "chen-sqrt"
    code, out, _ = run(capsys, "simulate", graph_file, out_file, "--mem", "10MB", "--json")
    s = json.loads(out)
    assert code == 0 and s["valid"] and s["recomputed_ops"] > 0
    assert s["devices"][0]["peak_bytes"] <= 10_000_000



def test_solve_reads_the_gap_as_a_fraction_or_a_percentage_and_refuses_what_no_solver_can_honour(
        capsys, graph_file, monkeypatch):
    import optsched.solvers as S

    seen = []       # the options the chosen solver was called with (not those of the CLI's baseline)
    chosen = S.SOLVERS["chen-sqrt"]
    monkeypatch.setitem(S.SOLVERS, "chen-sqrt", lambda g, cl, o: seen.append(o) or chosen(g, cl, o))
    for text, gap in (("5%", 0.05), ("0.05", 0.05), ("0", 0.0)):
        code, _, err = run(capsys, "solve", graph_file, "--mem", "100MB", "--solver", "chen-sqrt", "--gap", text)
        assert code == 0, err
        assert seen[-1].gap == pytest.approx(gap, rel=1e-12)
    for flag, value in (("--gap", "2"), ("--gap", "-1"), ("--gap", "1GB"), ("--threads", "0"), ("--devices", "0")):
        code, out, err = run(capsys, "solve", graph_file, "--mem", "100MB", "--solver", "chen-sqrt", flag, value)
        assert code == 2 and flag in err and "Traceback" not in err and not out, (flag, value, err)
    assert len(seen) == 3       # none of the refused ones reached a solver

def test_solve_leaves_out_what_no_required_result_depends_on_and_says_so(capsys, tmp_path):
    # the chain's input gradient g0 no longer required: no backward operation feeds a required result (the loss)
    g = chain_graph(4)
    data = graph_to_dict(g)
    for v in data["nodes"]:
        if v["id"] == "g0":
            v["required"] = False
    path = write(tmp_path, "g.json", data)
    out_file = tmp_path / "s.json"
    code, out, err = run(capsys, "solve", path, "--mem", "100MB", "--solver", "keep-everything", "-o", out_file,
                         "--json")
    assert code == 0, err
    s, s_out = json.loads(out), out
    assert s["left_out"] == ["g3", "g2", "g1", "g0"]
    assert "left out 4 operations that no required result depends on: g3, g2, g1, g0" in err
    # the schedule is valid for the whole graph file, and runs none of them
    code, out, _ = run(capsys, "simulate", path, out_file, "--mem", "100MB", "--json")
    assert code == 0 and json.loads(out)["valid"]
    assert not {i.node for i in load_schedule(out_file).instructions} & {"g0", "g1", "g2", "g3"}
    # info names them too
    code, out, _ = run(capsys, "info", path, "--json")
    info = json.loads(out)
    assert code == 0 and info["unneeded"] == ["g3", "g2", "g1", "g0"]
    # and its lower bound and baselines are those of what solve works on: a backward operation needs more memory
    # than any forward one, but none has to run
    whole = load_graph(path)
    assert info["memory_lower_bound"] == memory_lower_bound(drop_unneeded(whole)) < memory_lower_bound(whole)
    assert info["baselines"]["keep-everything"]["peak_bytes"] == json.loads(s_out)["devices"][0]["peak_bytes"]
    code, out, _ = run(capsys, "info", path)
    assert "unneeded       4 operations no required result depends on (solve leaves them out): g3, g2, g1, g0" in out


def test_solve_reports_the_whole_call_time_beside_the_solvers_own(capsys, graph_file):
    # the MILP's solve_time is its HiGHS run only; the candidates, bounds and model come before it
    code, out, err = run(capsys, "solve", graph_file, "--mem", "60%", "--time-limit", "20", "--json")
    assert code == 0, err
    sv = json.loads(out)["solver"]
    assert sv["wall_time_s"] >= sv["solve_time_s"] >= 0 and sv["wall_time_s"] > 0
    code, out, err = run(capsys, "solve", graph_file, "--mem", "60%", "--time-limit", "20")
    assert code == 0, err
    line = next(x for x in out.splitlines() if x.startswith("solver milp: "))
    assert " in " in line and "(highs " in line


def test_a_budget_as_a_share_of_the_keep_everything_peak(capsys, graph_file):
    # the chain's keep-everything peak is 17_000_004 bytes (test_validate_and_info)
    code, out, err = run(capsys, "solve", graph_file, "--mem", "50%", "--solver", "chen-sqrt", "--json")
    assert code == 0, err
    gpu = json.loads(out)["devices"][0]
    assert gpu["budget_bytes"] == 8_500_002 and gpu["peak_bytes"] <= 8_500_002
    code, out, err = run(capsys, "sweep", graph_file, "--mem", "60%..100%", "--steps", "2", "--solvers",
                         "keep-everything", "--json")
    assert code == 0, err
    rows = json.loads(out)["rows"]
    assert [r["budget_bytes"] for r in rows] == [10_200_002, 17_000_004] and rows[1]["valid"] and not rows[0]["valid"]
    code, _, err = run(capsys, "solve", graph_file, "--mem", "half%")
    assert code == 2 and "cannot read --mem 'half%'" in err


def test_solve_with_a_recomputing_solver_and_no_recompute_says_why(capsys, graph_file):
    code, out, err = run(capsys, "solve", graph_file, "--mem", "8MB", "--solver", "dtr", "--no-recompute")
    assert code != 0 and not out and "Traceback" not in err
    assert "dtr drops activations and computes them again" in err and "--no-recompute" in err


def test_solve_that_does_not_fit_writes_nothing(capsys, graph_file, tmp_path):
    out_file = tmp_path / "s.json"
    code, _, err = run(capsys, "solve", graph_file, "--mem", "5MB", "--solver", "keep-everything", "-o", out_file)
    assert code == 1
    assert "over its budget" in err and "nothing written" in err
    assert not out_file.exists()


def test_simulate_reports_over_budget(capsys, graph_file, tmp_path):
    out_file = tmp_path / "s.json"
    assert run(capsys, "solve", graph_file, "--mem", "1GB", "--solver", "keep-everything", "-o", out_file)[0] == 0
    code, out, _ = run(capsys, "simulate", graph_file, out_file, "--mem", "10MB")
    assert code == 1 and "INVALID" in out and "over its budget" in out


def test_simulate_checks_a_budget_against_the_operations_the_schedule_runs_on_that_device(capsys, tmp_path):
    # gnmt at 25%: its largest operation needs more than the accelerator holds, and the heuristic runs it on the
    # host; the flags that solved it simulate it (it was refused: the check took every operation for the GPU's)
    out_file = tmp_path / "s.json"
    code, _, err = run(capsys, "solve", "example:gnmt", "--mem", "25%", "--solver", "heuristic", "-o", out_file)
    assert code == 0, err
    code, out, err = run(capsys, "simulate", "example:gnmt", out_file, "--mem", "25%", "--json")
    assert code == 0 and json.loads(out)["valid"], err
    # a schedule that runs it on the accelerator is still refused there, before simulating, and the operation named
    assert run(capsys, "solve", "example:gnmt", "--mem", "2GB", "--solver", "keep-everything", "-o", out_file)[0] == 0
    code, out, err = run(capsys, "simulate", "example:gnmt", out_file, "--mem", "25%")
    assert code == 2 and "below the memory lower bound" in err and "'n192'" in err and "give at least" in err


def test_import_round_trip(capsys, graph_file, tmp_path):
    out_file = tmp_path / "copy.json"
    code, out, _ = run(capsys, "import", graph_file, "-o", out_file)
    assert code == 0 and json.loads(out_file.read_text()) == graph_to_dict(chain_graph(16))


def _bad_graphs():
    g = graph_to_dict(chain_graph(3))
    cyc = json.loads(json.dumps(g))
    cyc["nodes"][1]["inputs"] = ["f2"]
    dangling = json.loads(json.dumps(g))
    dangling["nodes"][2]["inputs"] = ["nowhere"]
    neg = json.loads(json.dumps(g))
    neg["nodes"][2]["bytes"] = -5
    dup = json.loads(json.dumps(g))
    dup["nodes"][3]["id"] = "f0"
    return {
        "bad JSON": ("{not json", ["not valid JSON", "line 1"]),
        "cycle": (cyc, ["cycle", "inputs"]),
        "dangling input": (dangling, ["'nowhere'", "node 'f1'", "inputs"]),
        "negative size": (neg, ["node 'f1'", "bytes", "-5"]),
        "NaN size": (json.dumps(g).replace('"bytes": 1000000', '"bytes": NaN', 1), ["bytes", "nan"]),
        "duplicate ids": (dup, ["duplicate", "'f0'"]),
        "wrong format": ({"format": "something"}, ["format", "optsched import"]),
    }


@pytest.mark.parametrize("case", list(_bad_graphs()))
def test_bad_graph_files(capsys, tmp_path, case):
    data, needles = _bad_graphs()[case]
    path = write(tmp_path, "g.json", data)
    code, out, err = run(capsys, "validate", path)
    assert code == 2, (out, err)
    assert str(path) in err
    for needle in needles:
        assert needle in err, (needle, err)
    assert "Traceback" not in err


def test_missing_file(capsys, tmp_path):
    code, _, err = run(capsys, "info", tmp_path / "nope.json")
    assert code == 2 and "no such file" in err and "nope.json" in err


def test_budget_below_lower_bound(capsys, graph_file):
    code, _, err = run(capsys, "solve", graph_file, "--mem", "1MB", "--solver", "chen-sqrt")
    assert code == 2 and "lower bound" in err and "3.00 MB" in err


@pytest.mark.parametrize("argv, needle", [
    (["--mem", "lots"], "cannot read --mem 'lots'"),
    (["--mem=-3GB"], "cannot read --mem '-3GB'"),
    ([], "no memory budget"),
    (["--mem", "1GB", "--device", "gpu7"], "unknown device 'gpu7'"),
    (["--mem", "1GB", "--solver", "magic"], "unknown solver 'magic'"),
])
def test_bad_solve_options(capsys, graph_file, argv, needle):
    code, _, err = run(capsys, "solve", graph_file, *argv)
    assert code == 2 and needle in err, err


def test_schedule_for_another_cluster(capsys, graph_file, tmp_path):
    sched = write(tmp_path, "s.json", {"format": "optsched-schedule", "version": 1,
                                       "instructions": [["compute", "x", "gpu3"]]})
    code, _, err = run(capsys, "simulate", graph_file, sched, "--mem", "1GB")
    assert code == 2 and "unknown device 'gpu3'" in err and "s.json" in err


def test_solve_goes_on_from_a_warm_start_and_refuses_one_that_is_not_for_this_graph_or_budget(capsys, graph_file,
                                                                                              tmp_path):
    warm = tmp_path / "warm.json"
    code, out, err = run(capsys, "solve", graph_file, "--mem", "8MB", "--solver", "dtr", "--json", "-o", warm)
    assert code == 0, err
    before = json.loads(out)["step_time_s"]
    code, out, err = run(capsys, "solve", graph_file, "--mem", "8MB", "--no-swap", "--time-limit", "5",
                         "--warm-start", warm, "--json")
    s = json.loads(out)
    assert code == 0 and s["valid"] and s["step_time_s"] <= before * (1 + 1e-9)
    assert s["solver"]["warm_start"].startswith("user: accepted")
    # not a MILP; a schedule of another graph; one over this budget: each a plain error before any solve
    code, _, err = run(capsys, "solve", graph_file, "--mem", "8MB", "--solver", "dtr", "--warm-start", warm)
    assert code == 2 and "--warm-start applies to the MILP" in err
    other = write(tmp_path, "other.json", {"format": "optsched-schedule", "version": 1,
                                           "instructions": [["compute", "conv9", "gpu0"]]})
    code, _, err = run(capsys, "solve", graph_file, "--mem", "8MB", "--warm-start", other)
    assert code == 2 and "other.json" in err and "conv9" in err and "made for this graph" in err
    code, _, err = run(capsys, "solve", graph_file, "--mem", "5MB", "--warm-start", warm)
    assert code == 2 and "warm.json" in err and "the warm start does not fit" in err and "5.00 MB" in err, err


def test_bad_cluster_file(capsys, graph_file, tmp_path):
    cl = write(tmp_path, "c.json", {"format": "optsched-cluster", "version": 1,
                                    "devices": [{"name": "gpu0", "kind": "tpu", "memory": "16GB"}]})
    code, _, err = run(capsys, "solve", graph_file, "--cluster", cl, "--solver", "chen-sqrt")
    assert code == 2 and "c.json" in err and "'tpu'" in err


def test_console_script_has_no_traceback(tmp_path):
    bad = write(tmp_path, "bad.json", "[1, 2")
    proc = subprocess.run([sys.executable, "-m", "optsched.cli", "info", str(bad)], capture_output=True, text=True)
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr and "bad.json" in proc.stderr


def test_no_schedule_found_is_exit_1_and_claims_no_proof(capsys, tmp_path):
    # chen-greedy finds nothing in 800 MB (its smallest peak is 862 MB), but the heuristic does (it runs some
    # operations on the host): a solver that finds nothing must not say that nothing fits
    out_file = tmp_path / "s.json"
    code, _, err = run(capsys, "solve", "example:bert_l3", "--mem", "800MB", "--solver", "chen-greedy", "-o", out_file)
    assert code == 1 and "no schedule found: chen-greedy" in err and "800.00 MB" in err
    assert "no schedule fits" not in err and not out_file.exists()
    code, _, _ = run(capsys, "solve", "example:bert_l3", "--mem", "800MB", "--solver", "heuristic", "-o", out_file)
    assert code == 0 and out_file.exists()
    # --json says the same to a script: not proven, with the smallest peak chen-greedy reached
    code, out, _ = run(capsys, "solve", "example:bert_l3", "--mem", "800MB", "--solver", "chen-greedy", "--json")
    res = json.loads(out)
    assert code == 1 and res["status"] == "no_incumbent" and not res["proven"]
    assert res["memory_lower_bound_bytes"] is None and 800 * 10**6 < res["smallest_found_bytes"] < 863 * 10**6
    assert res["message"].startswith("no schedule found: chen-greedy")


@pytest.mark.parametrize("graph, mem, least, why", [
    # every schedule needs 350 bytes, more than the largest operation's 250 (test_bounds)
    ("forced_recompute_graph", 349, 350, "whatever it recomputes"),
    # a weight read by two operations that come in either order: nothing fits under 920 bytes, which only the
    # moments taken in every order, with the memory between them, show
    ("shared_weight_graph", 919, 920, "in whichever order"),
])
def test_json_of_a_budget_no_schedule_fits_gives_the_least_that_does(capsys, tmp_path, graph, mem, least, why):
    import test_bounds

    from optsched.formats.jsonio import save_graph

    path = tmp_path / "g.json"
    save_graph(getattr(test_bounds, graph)(), path)
    code, out, err = run(capsys, "solve", path, "--mem", str(mem), "--no-swap", "--devices", "1",
                         "--no-host-compute", "--time-limit", "10", "--json")
    res = json.loads(out)
    assert code == 1 and res["status"] == "infeasible" and res["proven"]
    assert res["memory_lower_bound_bytes"] == least and res["message"].startswith("no schedule fits: ")
    assert why in res["message"] and "no schedule fits" in err and "Traceback" not in err


def test_milp_without_a_schedule_in_time_says_so_once(capsys, tmp_path):
    # no baseline fits this graph at 40% of its keep-everything peak and 0.05 s is too short for the MILP: the
    # message must not claim that no schedule fits (none was proven), nor say "no schedule" twice. The host
    # computes nothing here: where it may, every operation on it is a schedule (a candidate of its own)
    from optsched.cluster import Cluster, Device
    from optsched.formats.jsonio import save_graph
    from optsched.generate import random_training_graph
    from optsched.simulate import simulate
    from optsched.solvers import keep_everything

    g = random_training_graph(40, 11, window=2)
    big = Cluster((Device("gpu0", "cuda", 10**15),))
    mem = int(0.4 * simulate(g, big, keep_everything(g, big)).peak["gpu0"])
    path = tmp_path / "g.json"
    save_graph(g, path)
    out_file = tmp_path / "s.json"
    code, _, err = run(capsys, "solve", path, "--mem", str(mem), "--no-swap", "--devices", "1", "--time-limit", "0.05",
                       "--no-host-compute", "-o", out_file)
    assert code == 1 and not out_file.exists()
    assert "no schedule found: " in err and "the MILP found none (time_limit)" in err
    assert "--time-limit, now 0.05 s" in err
    assert "no schedule fits" not in err and err.count("no schedule") == 1, err


@pytest.mark.parametrize("solver", ["heuristic", "dtr", "offload-all"])
def test_heuristic_solvers_through_cli(capsys, solver):
    code, out, err = run(capsys, "solve", "example:bert_l3", "--mem", "1GB", "--solver", solver, "--json")
    assert code == 0, err
    s = json.loads(out)
    assert s["valid"] and s["devices"][0]["peak_bytes"] <= 10**9 and s["overhead"] >= 0


def test_lp_rounding_through_cli(capsys):
    code, out, err = run(capsys, "solve", "example:tiny", "--mem", "1.1MB", "--solver", "lp-rounding", "--json")
    assert code == 0, err
    s = json.loads(out)
    assert s["valid"] and s["devices"][0]["peak_bytes"] <= 1_100_000 and s["solver"]["name"] == "lp-rounding"


@pytest.mark.parametrize("solver,extra", [("milp", ()), ("pulp", ()), ("milp", ("--within-stage",))])
def test_milp_through_cli(capsys, tmp_path, solver, extra):
    model = tmp_path / "model.lp"
    out_file = tmp_path / "s.json"
    code, out, err = run(capsys, "solve", "example:tiny", "--mem", "1.1MB", "--solver", solver, "--json",
                         "--write-model", model, "-o", out_file, *extra)
    assert code == 0, err
    s = json.loads(out)
    assert s["valid"] and s["solver"]["status"] == "optimal"
    assert s["step_time_s"] <= s["solver"]["objective_s"] * (1 + 1e-9)
    assert s["solver"]["bound_s"] <= s["solver"]["objective_s"]
    assert s["devices"][0]["peak_bytes"] <= 1_100_000
    assert model.read_text().strip() and load_schedule(out_file).report.solver.startswith(solver)
    assert (" F_0_" in model.read_text()) == bool(extra)     # the within-stage count's FREE columns



@pytest.mark.parametrize("flag,name,needle", [
    ("-o", "missing/s.json", "folder does not exist"),
    ("--write-model", "missing/m.lp", "folder does not exist"),     # HiGHS crashed the process on this path
    ("--write-model", "m.txt", "end the name in .mps or .lp"),
    ("-o", ".", "is a folder, not a file"),
    ("--plot", "missing/p.png", "folder does not exist"),
])
def test_solve_refuses_an_output_it_cannot_write_before_solving(capsys, tmp_path, monkeypatch, flag, name, needle):
    import optsched.solvers as S

    def never(*a, **k):
        raise AssertionError("solved before the output path was checked")

    monkeypatch.setattr(S, "get_solver", lambda name: never)
    code, _, err = run(capsys, "solve", "example:tiny", "--mem", "1.1MB", flag, tmp_path / name)
    assert code == 2 and needle in err and len(err.strip().splitlines()) == 1, err
    assert sorted(os.listdir(tmp_path)) == []


def test_write_model_into_a_missing_folder_is_a_plain_error(tmp_path):
    # from Python as well: the model is written all or nothing, and nothing is left behind
    from optsched.cluster import single_accelerator
    from optsched.errors import OptschedError
    from optsched.formats import example_graph_path
    from optsched.solvers import SolveOptions, solve

    g = load_graph(example_graph_path("tiny"))
    with pytest.raises(OptschedError, match="folder does not exist"):
        solve(g, single_accelerator(1_100_000), "milp", SolveOptions(time_limit=5,
                                                                      write_model=str(tmp_path / "no" / "m.mps")))
    assert os.listdir(tmp_path) == []

def test_cuts_option(capsys):
    base = ["solve", "example:tiny", "--mem", "1.1MB", "--json"]
    for depth in ("2",):
        code, out, err = run(capsys, *base, "--cuts", depth)
        assert code == 0 and json.loads(out)["solver"]["status"] == "optimal", err
    for extra, needle in ((["--cuts", "-1"], "--cuts must be 0 (off)"),
                          (["--cuts", "2", "--solver", "pulp"], "not to 'pulp'")):
        code, _, err = run(capsys, *base, *extra)
        assert code == 2 and needle in err and len(err.strip().splitlines()) == 1, err


def test_no_host_compute_takes_the_host_out_of_a_one_device_recompute_only_solve(capsys):
    base = ["solve", "example:tiny", "--mem", "1.1MB", "--no-swap", "--devices", "1", "--json"]
    code, out, err = run(capsys, *base, "--no-host-compute")
    d = json.loads(out)
    assert code == 0 and d["solver"]["status"] == "optimal" and d["valid"], err
    assert {x["device"]: x["busy_s"] for x in d["devices"]}["host"] == 0
    for solver in ("dtr", "lp-rounding"):
        code, _, err = run(capsys, *base, "--no-host-compute", "--solver", solver)
        assert code == 2 and f"not to '{solver}'" in err and len(err.strip().splitlines()) == 1, err


def test_no_polish_asks_the_milp_for_its_models_own_schedule(capsys, monkeypatch):
    import optsched.solvers as solvers

    seen = []
    real = solvers.get_solver

    def spy(name):
        fn = real(name)
        return lambda g, cl, opts: seen.append((name, opts.params)) or fn(g, cl, opts)

    monkeypatch.setattr(solvers, "get_solver", spy)
    base = ["solve", "example:tiny", "--mem", "1.1MB", "--no-swap", "--json"]
    for flags, polish in (([], True), (["--no-polish"], False)):
        code, out, err = run(capsys, *base, *flags)
        assert code == 0 and json.loads(out)["valid"], err
        assert [p.get("polish", True) for name, p in seen if name == "milp"][-1] is polish
    code, _, err = run(capsys, *base, "--no-polish", "--solver", "dtr")
    assert code == 2 and "not to 'dtr'" in err and len(err.strip().splitlines()) == 1, err


def test_highs_options(capsys):
    from optsched.cli import _highs_options

    assert _highs_options(["mip_pscost_minreliable=2", "mip_heuristic_effort=0.3", "presolve=off",
                           "mip_detect_symmetry=false"]) == {"mip_pscost_minreliable": 2, "mip_heuristic_effort": 0.3,
                                                            "presolve": "off", "mip_detect_symmetry": False}
    base = ["solve", "example:tiny", "--mem", "1.1MB", "--json"]
    code, out, err = run(capsys, *base, "--highs", "mip_pscost_minreliable=4")
    assert code == 0 and json.loads(out)["solver"]["status"] == "optimal", err
    for extra, needle in ((["--highs", "no_such_option=1"], "HiGHS refused option no_such_option=1"),
                          (["--highs", "mip_pscost_minreliable"], "expected KEY=VALUE"),
                          (["--highs", "presolve=off", "--solver", "chen-sqrt"], "not of 'chen-sqrt'")):
        code, _, err = run(capsys, *base, *extra)
        assert code == 2 and needle in err and len(err.strip().splitlines()) == 1, err


def test_sweep_writes_table_and_figure(capsys, graph_file, tmp_path):
    csv, png = tmp_path / "sweep.csv", tmp_path / "pareto.png"
    code, out, err = run(capsys, "sweep", graph_file, "--mem", "9MB..17MB", "--steps", "3", "--solvers",
                         "chen-sqrt,keep-everything", "--processes", "1", "-o", csv, "--plot", png)
    assert code == 0, err
    import pandas as pd

    df = pd.read_csv(csv)
    assert len(df) == 6 and sorted(set(df["budget_bytes"])) == [9_000_000, 13_000_000, 17_000_000]
    # keep-everything peaks 4 bytes over 17 MB: over every budget; chen-sqrt (8 MB) fits them all
    assert list(df[df.solver == "keep-everything"]["status"]) == ["invalid"] * 3
    assert df[df.solver == "chen-sqrt"]["valid"].all()
    assert png.stat().st_size > 1000 and "wrote" in out and "chen-sqrt" in out
    code, out, _ = run(capsys, "sweep", graph_file, "--mem", "10MB", "--solvers", "chen-sqrt", "--json")
    assert code == 0 and [r["solver"] for r in json.loads(out)["rows"]] == ["chen-sqrt"]


@pytest.mark.parametrize("argv, needle", [
    (["--mem", "16MB..4MB"], "runs backwards"),
    (["--mem", "4MB..16MB", "--steps", "1"], "at least 2 steps"),
    (["--mem", "4MB..lots"], "cannot read --mem"),
    (["--mem", "4MB", "--solvers", "chen-sqrt,nope"], "unknown solver"),
    (["--mem", "4MB", "--plot", "p.gif"], "cannot write a figure"),
])
def test_bad_sweep_arguments(capsys, graph_file, argv, needle):
    code, _, err = run(capsys, "sweep", graph_file, *argv)
    assert code == 2 and needle in err and len(err.strip().splitlines()) == 1


def test_solve_plot(capsys, graph_file, tmp_path):
    png = tmp_path / "s.png"
    code, out, err = run(capsys, "solve", graph_file, "--mem", "10MB", "--solver", "chen-sqrt", "--plot", png)
    assert code == 0, err
    assert png.read_bytes()[:4] == b"\x89PNG"


def test_solve_does_not_import_torch(graph_file):
    """Only `capture` needs PyTorch: solving a graph file starts without importing it."""
    code = ("import sys; from optsched.cli import main; "
            f"rc = main(['solve', {str(graph_file)!r}, '--mem', '10MB', '--solver', 'heuristic', '--json']); "
            "sys.exit(rc or ('torch' in sys.modules and 3))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


def test_the_command_line_does_not_wait_at_exit_for_a_run_abandoned_after_a_ctrl_c():
    # a HiGHS run given up after a Ctrl-C (its root LP checks no interrupt) goes on to its own time limit; the
    # command, its output written, leaves at once with its own exit status (before: at the end of that run)
    code = ("import importlib, sys, threading, time; from optsched.cli import main; "
            "M = importlib.import_module('optsched.solvers.milp'); "
            "t = threading.Thread(target=time.sleep, args=(120,), daemon=True); t.start(); M._abandon(t); "
            "sys.argv = ['optsched', 'examples']; sys.exit(main())")
    t = time.perf_counter()
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=100)
    assert r.returncode == 0, r.stderr
    assert "gnmt" in r.stdout and time.perf_counter() - t < 60


def test_solve_says_where_its_bound_comes_from(capsys):
    # one device, no copies: the recompute bound every schedule obeys proves the MILP's schedule optimal
    code, out, err = run(capsys, "solve", "example:tiny", "--mem", "1.1MB", "--devices", "1", "--no-swap",
                         "--no-host-compute", "--json")
    assert code == 0, err
    sv = json.loads(out)["solver"]
    assert sv["status"] == "optimal" and sv["bound_from"].endswith("holds for every schedule")
    # a heuristic reports no bound, so nothing to attribute
    code, out, err = run(capsys, "solve", "example:tiny", "--mem", "1.1MB", "--solver", "heuristic", "--json")
    assert code == 0 and json.loads(out)["solver"]["bound_from"] is None, err
    code, out, err = run(capsys, "solve", "example:tiny", "--mem", "1.1MB", "--devices", "1", "--no-swap",
                         "--no-host-compute")
    line = next(x for x in out.splitlines() if x.startswith("solver milp: "))
    assert "bound 85.0 us (the work and the recomputation memory forces; holds for every schedule)" in line


def test_the_bound_is_attributed_to_the_term_that_reaches_it():
    from optsched.cli import _bound_from

    lb = {"chain": 2.0, "work": 1.0, "recompute": None, "floor": 2.0}
    rep = SolveReport("milp", "time_limit", objective=3.0, bound=2.0, extra={"lower_bounds": lb})
    assert _bound_from(rep).startswith("longest dependency chain")
    assert _bound_from(replace(rep, extra={"lower_bounds": {**lb, "work": 3.0, "floor": 3.0}})).startswith(
        "the work spread over the devices")
    # above every schedule's bound: the solver's own, which holds only in its stage model
    assert _bound_from(replace(rep, bound=2.5)).startswith("the MILP's dual bound")
    assert _bound_from(replace(rep, bound=None)) is None and _bound_from(replace(rep, extra={})) is None
