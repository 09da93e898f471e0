"""Figures draw what the simulator computed: one memory line per device that
reaches the device's peak, its budget dashed in the same colour; one Gantt row
per stream with one bar per computation or copy; one Pareto line per solver."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

from optsched import simulate, single_accelerator, solve  # noqa: E402
from optsched.compare import sweep  # noqa: E402
from optsched.errors import OptschedError  # noqa: E402
from optsched.generate import chain_graph  # noqa: E402
from optsched.plot import device_colors, figure_path, gantt, memory_timeline, pareto, save, schedule_figure  # noqa: E402
from optsched.schedule import Compute, Copy  # noqa: E402
from optsched.solvers import SolveOptions  # noqa: E402

GRAPH = chain_graph(12)      # 1 MB activations, 1 ms layers: keep-everything peaks at 13 MB


@pytest.fixture(autouse=True)
def close_figures():
    yield
    plt.close("all")


def solved(solver, mem=6_000_000):
    cl = single_accelerator(mem)
    s = solve(GRAPH, cl, solver)
    return s, simulate(GRAPH, cl, s)


def test_memory_timeline_one_line_per_device_at_its_peak():
    _, r = solved("offload-all")      # uses gpu0 and the host
    ax = memory_timeline(r)
    assert ax.get_xlabel() == "time (ms)" and ax.get_ylabel() == "memory (MB)"
    solid = [ln for ln in ax.get_lines() if ln.get_linestyle() == "-"]
    dashed = [ln for ln in ax.get_lines() if ln.get_linestyle() == "--"]
    assert [ln.get_label().split()[0] for ln in solid] == ["gpu0", "host"]
    colors = device_colors(r.budget)
    for ln, name in zip(solid, ["gpu0", "host"], strict=True):
        assert ln.get_color() == colors[name]
        assert np.max(ln.get_ydata()) * 1e6 == pytest.approx(r.peak[name])
        assert np.max(ln.get_xdata()) * 1e-3 == pytest.approx(r.makespan)
    assert [ln.get_ydata()[0] * 1e6 for ln in dashed] == pytest.approx([6e6, 256e9])


def test_gantt_one_bar_per_computation_and_copy_recompute_hatched():
    s, r = solved("chen-sqrt")
    ax = gantt(r, s)
    assert ax.get_xlabel() == "time (ms)" and ax.get_ylabel() == "stream"
    assert [t.get_text() for t in ax.get_yticklabels()] == ["gpu0"]
    bars = {("hatched" if c.get_hatch() else "solid"): len(c.get_paths()) for c in ax.collections}
    n_compute = sum(type(x) is Compute for x in s.instructions)
    assert bars["hatched"] == r.recomputed > 0
    assert bars["solid"] + bars["hatched"] == n_compute
    s, r = solved("offload-all")
    ax = gantt(r, s)
    assert [t.get_text() for t in ax.get_yticklabels()] == ["gpu0", "gpu0\u2192host", "host\u2192gpu0"]
    assert sum(len(c.get_paths()) for c in ax.collections) == sum(type(x) in (Compute, Copy) for x in s.instructions)
    gpu_bars = ax.collections[0]
    assert matplotlib.colors.to_hex(gpu_bars.get_facecolor()[0]) == device_colors(r.budget)["gpu0"]


def test_pareto_one_line_per_solver_and_bound_shaded(tmp_path):
    budgets = [5_000_000, 8_000_000]       # chain-6: keep-everything peaks at 7 MB
    df = sweep(chain_graph(6), budgets, ["chen-sqrt", "keep-everything", "milp"], SolveOptions(time_limit=5),
               processes=1, progress=False)
    ax = pareto(df)
    assert ax.get_xlabel() == "memory budget (MB)" and "overhead" in ax.get_ylabel()
    lines = {ln.get_label(): ln for ln in ax.get_lines()}
    assert set(lines) == {"chen-sqrt", "keep-everything", "milp", "milp: lower bound"}
    # keep-everything fits only the larger budget, with no overhead
    assert list(lines["keep-everything"].get_xdata()) == [8.0] and list(lines["keep-everything"].get_ydata()) == [0]
    milp = df[df.solver == "milp"]
    assert milp["bound_s"].notna().all() and len(ax.collections) == 1    # the shaded band under the MILP
    assert list(lines["milp: lower bound"].get_ydata()) == pytest.approx(list(100 * milp["bound_overhead"]))
    assert ax.get_yscale() == "linear"
    save(ax.figure, tmp_path / "p.png")
    assert (tmp_path / "p.png").stat().st_size > 1000


def test_pareto_goes_symlog_when_a_few_schedules_are_far_slower():
    # gnmt without swapping runs every operation on the host (+900%): on a linear axis the other solvers' 0-70%
    # would be one flat line
    import pandas as pd

    def rows(name, overheads):
        return [{"solver": name, "valid": True, "budget_bytes": b, "overhead": o, "bound_overhead": float("nan")}
                for b, o in zip((1e8, 2e8, 3e8), overheads, strict=True)]

    ax = pareto(pd.DataFrame(rows("host", [9.0, 9.0, 9.0]) + rows("a", [0.6, 0.2, 0.0]) + rows("b", [0.7, 0.3, 0.1])
                             + rows("c", [0.5, 0.1, 0.0])))
    assert ax.get_yscale() == "symlog" and ax.get_ylim()[1] >= 900
    ax = pareto(pd.DataFrame(rows("a", [0.6, 0.2, 0.0]) + rows("b", [2.0, 1.5, 0.1])))
    assert ax.get_yscale() == "linear"


def test_schedule_figure_and_paths(tmp_path):
    s, r = solved("heuristic")
    fig = schedule_figure(r, s, "chain")
    assert len(fig.axes) == 2
    save(fig, tmp_path / "s.svg")
    assert (tmp_path / "s.svg").read_text().lstrip().startswith("<?xml")
    with pytest.raises(OptschedError, match="figure"):
        figure_path("plot.gif")
