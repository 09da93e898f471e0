"""Figures of simulated schedules and comparison tables, drawn from what the
simulator and `optsched.compare` return, never from a solver's own model.

matplotlib is imported inside the functions, so `optsched` works without it;
with no display (and no backend chosen by the user or by Jupyter) the "Agg"
backend is used. Each device gets one colour everywhere, by its position in
the cluster's device list (`device_colors`).
"""

from __future__ import annotations

import os
import sys

import numpy as np

from .errors import OptschedError
from .formats import output_folder
from .schedule import Compute, Copy, Schedule
from .simulate import SimResult
from .units import format_size

PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22",
           "#17becf")   # matplotlib's tab10, fixed here so colours do not depend on the user's style
FIGURE_FORMATS = ("png", "pdf", "svg", "jpg", "jpeg")
_BYTES = ((1e9, "GB"), (1e6, "MB"), (1e3, "kB"), (1.0, "B"))
_SECONDS = ((1.0, "s"), (1e-3, "ms"), (1e-6, "us"))
_MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*", "h", "<")


def _unit(largest: float, units) -> tuple[float, str]:
    """The largest unit in which `largest` is at least 1, so ticks read 120 ms, not 0.12 s."""
    return next(((f, u) for f, u in units if largest >= f), units[-1])


def _pyplot():
    import matplotlib

    if "matplotlib.pyplot" not in sys.modules and not os.environ.get("MPLBACKEND") and not os.environ.get("DISPLAY"):
        matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _axes(ax, size=(8, 3.5)):
    if ax is not None:
        return ax
    _, ax = _pyplot().subplots(figsize=size, layout="constrained")
    return ax


def device_colors(names) -> dict[str, str]:
    """Device name -> colour, by position in the device list."""
    return {n: PALETTE[i % len(PALETTE)] for i, n in enumerate(names)}


def memory_timeline(result: SimResult, ax=None, devices=None):
    """Memory held on each device over the step (bytes against time, in the units
    that suit the figures), one line per device, its budget dashed in the same
    colour. `devices`: which to draw (default every device that holds anything)."""
    ax = _axes(ax)
    colors = device_colors(result.budget)
    names = [d for d in result.budget if d in result.timeline and len(result.timeline[d][0])] \
        if devices is None else list(devices)
    end = float(np.nanmax(result.end)) if np.isfinite(result.end).any() else 0.0
    top = max([result.peak[n] for n in names] + [min([result.budget[n] for n in names], default=0)])
    ts, tu = _unit(end, _SECONDS)
    bs, bu = _unit(top, _BYTES)
    for name in names:
        t, level = _instants(*result.timeline[name], end)
        ax.step(t / ts, level / bs, where="post", color=colors[name], lw=1.2,
                label=f"{name} (peak {format_size(result.peak[name])})")
        ax.axhline(result.budget[name] / bs, color=colors[name], ls="--", lw=1,
                   label=f"{name} budget {format_size(result.budget[name])}")
    ax.set_ylim(0, 1.1 * top / bs or 1)
    ax.set_xlim(0, end / ts or 1)
    ax.set_xlabel(f"time ({tu})")
    ax.set_ylabel(f"memory ({bu})")
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1), fontsize="small")
    return ax


def _instants(t, level, end):
    """One step per distinct instant, from 0 to `end`: the highest level reached at
    that instant (a zero-length peak stays visible), then where it settles, so
    a release and an allocation at the same moment draw no false dip."""
    if not len(t):
        return np.array([0.0, end]), np.zeros(2)
    first = np.flatnonzero(np.r_[True, t[1:] != t[:-1]])
    last = np.r_[first[1:], len(t)] - 1
    high, settled = np.maximum.reduceat(level, first), level[last]
    times = np.repeat(t[first], 2)
    levels = np.column_stack([high, settled]).ravel()
    return np.r_[0.0, times, max(end, t[-1])], np.r_[0, levels, settled[-1]]


def gantt(result: SimResult, schedule: Schedule, ax=None):
    """Each device's compute stream and each link's copy stream over the step:
    first computations solid in the device's colour, recomputations hatched,
    copies in the colour of the device they leave. (The simulator gives start
    and end per instruction; what ran where comes from the schedule.)"""
    ax = _axes(ax)
    colors = device_colors(result.budget)
    rows: dict[str, dict[str, list]] = {}    # stream -> {"compute"|"recompute"|"copy": [(start, length)]}
    colour_of: dict[str, str] = {}
    seen: set[str] = set()
    for x, s, e in zip(schedule.instructions, result.start, result.end, strict=True):
        if s != s:
            continue
        if type(x) is Compute:
            what = "recompute" if x.node in seen else "compute"
            seen.add(x.node)
            stream, colour_of[x.device] = x.device, colors[x.device]
        elif type(x) is Copy:
            what, stream = "copy", f"{x.src}\u2192{x.dst}"
            colour_of[stream] = colors[x.src]
        else:
            continue
        rows.setdefault(stream, {}).setdefault(what, []).append((s, e - s))
    order = [d for d in result.budget if d in rows] + sorted(r for r in rows if r not in result.budget)
    style = {"compute": {}, "recompute": {"hatch": "////", "edgecolor": "black", "alpha": 0.6},
             "copy": {"alpha": 0.5}}
    end = max((s + w for spans in rows.values() for part in spans.values() for s, w in part), default=0.0)
    ts, tu = _unit(end, _SECONDS)
    for y, stream in enumerate(order):
        for what, spans in rows[stream].items():
            ax.broken_barh([(s / ts, w / ts) for s, w in spans], (y - 0.4, 0.8), facecolor=colour_of[stream],
                           linewidth=0.3, **{"edgecolor": "white", **style[what]})
    ax.set_yticks(range(len(order)), order)
    ax.invert_yaxis()
    ax.set_xlabel(f"time ({tu})")
    ax.set_ylabel("stream")
    from matplotlib.patches import Patch

    ax.legend(handles=[Patch(facecolor="grey", label=what, **kw) for what, kw in style.items()], loc="upper left",
              bbox_to_anchor=(1.01, 1), fontsize="small")
    return ax


def schedule_figure(result: SimResult, schedule: Schedule, title: str = ""):
    """The Gantt chart over the memory timeline, one time axis: what `solve --plot` writes."""
    fig, (top, bottom) = _pyplot().subplots(2, 1, figsize=(10, 6), sharex=True, layout="constrained")
    gantt(result, schedule, top)
    memory_timeline(result, bottom)
    top.set_xlabel("")
    if title:
        fig.suptitle(title)
    return fig


def pareto(df, ax=None):
    """Step-time overhead against the memory budget, one line per solver, from a
    `sweep` table; valid schedules only. Where a solver reports a lower bound
    (the MILP) it is drawn dotted with the band up to the schedule shaded: no
    schedule in that solver's model is faster than the band's bottom. The
    y-axis fits the schedules, so a weak bound (near zero) falls below it; it is
    logarithmic beyond +-10% when a few schedules are far slower than the rest."""
    ax = _axes(ax, (8, 4.5))
    scale, unit = _unit(float(df["budget_bytes"].max()) if len(df) else 0.0, _BYTES)
    shown = []
    for i, name in enumerate(dict.fromkeys(df["solver"])):
        part = df[(df["solver"] == name) & df["valid"].astype(bool)].sort_values("budget_bytes")
        x, y, low = part["budget_bytes"] / scale, 100 * part["overhead"], 100 * part["bound_overhead"]
        colour = PALETTE[i % len(PALETTE)]
        ax.plot(x, y, marker=_MARKERS[i % len(_MARKERS)], ms=5, color=colour, label=name)
        shown.extend(y)
        if low.notna().any():
            ax.plot(x, low, ls=":", marker="v", ms=4, color=colour, label=f"{name}: lower bound")
            ax.fill_between(x, low, y, color=colour, alpha=0.15)
    if shown:
        lo, hi = min(min(shown), 0.0), max(max(shown), 1.0)
        if hi > _SPREAD and float(np.median(shown)) < hi / 10:
            # a few schedules far slower than the rest (gnmt without swapping: +900%, every operation on the
            # host) would flatten the others into one line: linear up to +-10%, logarithmic beyond
            ax.set_yscale("symlog", linthresh=10)
            ax.set_ylim(lo - 2, hi * 1.5)
        else:
            ax.set_ylim(lo - 0.08 * (hi - lo), hi + 0.08 * (hi - lo))
    ax.set_xlabel(f"memory budget ({unit})")
    ax.set_ylabel("step-time overhead vs keep-everything (%)")
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1), fontsize="small")
    return ax


_SPREAD = 100.0     # % overhead: beyond it, and ten times the median, the pareto plot's y-axis goes symlog


def figure_path(path: str) -> str:
    """Refuse, before any solving, a figure file matplotlib could not write."""
    ext = os.path.splitext(str(path))[1].lower().lstrip(".")
    if ext not in FIGURE_FORMATS:
        raise OptschedError(f"cannot write a figure to {path!r}", field="--plot",
                            hint="end the name in " + ", ".join("." + f for f in FIGURE_FORMATS))
    output_folder(path, "--plot")
    return str(path)


def save(fig, path: str) -> None:
    fig.savefig(figure_path(path), dpi=120)
    _pyplot().close(fig)


__all__ = ["device_colors", "memory_timeline", "gantt", "schedule_figure", "pareto", "figure_path", "save"]
