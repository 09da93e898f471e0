"""The multi-device experiment (experiments/multi_device.py) on small graphs: its
schedules are valid in the simulator and keep every accelerator within the
budget that keep-everything overflows, a second accelerator runs two parallel
branches faster, and the command writes its CSV (machine line first) and figure."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pandas as pd
import pytest

from optsched.compare import grid
from optsched.generate import training_graph

SCRIPT = Path(__file__).resolve().parents[1] / "experiments" / "multi_device.py"


@pytest.fixture(scope="module")
def md():
    spec = importlib.util.spec_from_file_location("multi_device", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def two_branches():
    """Two independent 4-layer branches from the input, joined before the loss."""
    ins = [[-1], [0], [1], [2], [-1], [4], [5], [6], [3, 7]]
    return training_graph(ins, act_bytes=[100_000] * 9, cost=[1e-3] * 9, param_bytes=[50_000] * 9, name="branches")


def test_second_accelerator_runs_parallel_branches_faster_within_budget(md):
    problems, info = md.problems([two_branches()], [1, 2], 0.5, md.PEER_BANDWIDTH)
    budget = problems[0].columns["budget_bytes"]
    assert info["keep_peak_bytes"][0] > budget          # keep-everything does not fit on one accelerator
    assert len(problems[1].cluster.accelerators) == 2 and problems[1].cluster.link("gpu0", "gpu1")
    df = md.with_speedup(grid(problems, ["heuristic"], processes=1, progress=False))
    assert df["valid"].all(), df["violation"]
    one, two = df.itertuples()
    assert one.peak_gpu0_bytes <= budget
    assert two.peak_gpu0_bytes <= budget and 0 < two.peak_gpu1_bytes <= budget
    assert one.speedup == 1 and two.speedup == pytest.approx(one.step_time_s / two.step_time_s)
    assert two.speedup > 1.3


def test_command_writes_csv_and_figure(md, tmp_path):
    stem = tmp_path / "md"
    assert md.main(["--quick", "--solvers", "heuristic", "--jobs", "1", "--out", str(stem)]) == 0
    lines = stem.with_suffix(".csv").read_text().splitlines()
    assert lines[0].startswith("# machine:") and "command: python experiments/multi_device.py --quick" in lines[0]
    df = pd.read_csv(stem.with_suffix(".csv"), skiprows=1)
    assert list(df["accelerators"]) == [1, 2] and df["valid"].all()
    assert (df[["peak_gpu0_bytes", "peak_gpu1_bytes"]].max(axis=1) <= df["budget_bytes"]).all()
    assert stem.with_suffix(".png").read_bytes()[:4] == b"\x89PNG"
