"""Comparison tables: several solvers on one problem (`compare`), on a range of
memory budgets (`sweep`) or on any list of problems (`grid`: other clusters,
other graphs), one row per solve, every figure taken from the simulator, so a
row means the same thing whichever solver made the schedule.

A solver is named as in `optsched.SOLVERS` (or `pulp:NAME`), optionally with
a variant that restricts what it may do: `milp/recompute-only` (no swapping),
`milp/swap-only` (no recomputation). `MILP_VARIANTS` lists the three MILP
problems (joint, recompute-only, swap-only).

Row columns: solver, status (the solver's own status, `invalid` when the
simulator rejects its schedule, `infeasible` when it proves that none fits,
`no_incumbent` when it found none without proving that none exists (out of
time), `model_infeasible` when the MILP's stage model has none (a schedule
outside it may still fit), `error` when
it does not apply to the problem), valid, violation, step_time_s, overhead
(step time over keep-everything's, minus 1), compute/recompute/transfer
totals, bytes swapped out and in, peak_<device>_bytes per device, the
solver's objective_s, bound_s (a proven lower bound on its objective, within
its own model), bound_overhead, gap, solve_s (wall time of the solver call)
and message. Where there is no schedule the figures are NaN, and
memory_lower_bound_bytes and smallest_found_bytes (NaN elsewhere) bracket the
least budget that fits where the solver knows them (as `optsched solve --json`
gives them: `InfeasibleError.least`, `.found`), so that a sweep shows where
each solver's schedules end.
"""

from __future__ import annotations

import math
import os
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass, replace

import pandas as pd

from .cluster import Cluster, single_accelerator
from .errors import InfeasibleError, OptschedError
from .graph import Graph
from .schedule import Schedule
from .simulate import SimResult, simulate
from .solvers import get_solver, keep_everything
from .solvers.options import SolveOptions
from .summary import sim_summary
from .units import format_size

VARIANTS = {"joint": {}, "recompute-only": {"swap": False}, "swap-only": {"recompute": False}}
MILP_VARIANTS = ("milp", "milp/recompute-only", "milp/swap-only")
_NUMBERS = ("step_time_s", "overhead", "compute_s", "recompute_s", "recomputed_ops", "transfer_s", "transfer_bytes",
            "swap_out_bytes", "swap_in_bytes")


@dataclass(frozen=True)
class Run:
    """One solver on one problem: its schedule and simulation (None when it found
    none) and the table row, kept together so a notebook can plot what it tabulates."""

    solver: str
    schedule: Schedule | None
    result: SimResult | None
    row: dict


def parse_solver(spec: str, options: SolveOptions) -> tuple[Callable, SolveOptions]:
    """`name` or `name/variant` -> the solver function and the options it runs with."""
    name, _, variant = spec.partition("/")
    if variant and variant not in VARIANTS:
        raise OptschedError(f"unknown solver variant {variant!r} in {spec!r}",
                            hint="variants are " + ", ".join(VARIANTS))
    return get_solver(name), replace(options, **VARIANTS[variant or "joint"])


def reference_time(graph: Graph, cluster: Cluster) -> float:
    """Keep-everything's step time, the denominator of every overhead; it needs no
    memory budget to be defined, so an over-budget schedule still gives it (NaN
    when no accelerator can run the whole graph)."""
    try:
        return simulate(graph, cluster, keep_everything(graph, cluster)).makespan
    except OptschedError:
        return math.nan


def run_solver(graph: Graph, cluster: Cluster, solver: str, options: SolveOptions = SolveOptions(),
               base: float | None = None) -> Run:
    """Solve, simulate and tabulate one solver; `base` is `reference_time` (computed when not given)."""
    fn, opts = parse_solver(solver, options)
    base = reference_time(graph, cluster) if base is None else base
    devices = [d.name for d in cluster.devices]
    row = {"solver": solver, "status": "", "valid": False, "violation": ""}
    row.update(dict.fromkeys(_NUMBERS, math.nan))
    row.update({f"peak_{d}_bytes": math.nan for d in devices})
    row.update(objective_s=math.nan, bound_s=math.nan, bound_overhead=math.nan, gap=math.nan, solve_s=math.nan,
               message="", memory_lower_bound_bytes=math.nan, smallest_found_bytes=math.nan)
    t0 = time.perf_counter()
    try:
        sched = fn(graph, cluster, opts)
    except InfeasibleError as e:
        row.update(status=e.status, solve_s=time.perf_counter() - t0, message=e.render(),
                   memory_lower_bound_bytes=_num(e.least), smallest_found_bytes=_num(e.found))
        return Run(solver, None, None, row)
    except OptschedError as e:
        row.update(status="error", solve_s=time.perf_counter() - t0, message=e.render())
        return Run(solver, None, None, row)
    solve_s = time.perf_counter() - t0
    result = simulate(graph, cluster, sched)
    s = sim_summary(result, cluster)
    rep = sched.report
    row.update({k: s[k] for k in _NUMBERS if k in s})
    row.update({f"peak_{d['device']}_bytes": d["peak_bytes"] for d in s["devices"]})
    row.update(valid=result.valid, violation=s["violation"]["message"] if s["violation"] else "",
               status=(rep.status if rep else "") if result.valid else "invalid",
               overhead=result.makespan / base - 1, solve_s=solve_s)
    if rep is not None:
        row.update(objective_s=_num(rep.objective), bound_s=_num(rep.bound), gap=_num(rep.gap), message=rep.message)
        row["bound_overhead"] = row["bound_s"] / base - 1
    return Run(solver, sched, result, row)


def _num(x) -> float:
    return math.nan if x is None else float(x)


def table(runs: Iterable[Run]) -> pd.DataFrame:
    return pd.DataFrame([r.row for r in runs])


DEFAULT_SOLVERS = ("keep-everything", "chen-sqrt", "heuristic", "milp")


def compare(graph: Graph, cluster: Cluster, solvers: Sequence[str] = DEFAULT_SOLVERS,
            options: SolveOptions = SolveOptions()) -> pd.DataFrame:
    """One row per solver on the same graph and cluster (see the module docstring)."""
    for spec in solvers:     # a misspelt name is the caller's mistake: refuse before solving anything
        parse_solver(spec, options)
    base = reference_time(graph, cluster)
    return table(run_solver(graph, cluster, s, options, base) for s in solvers)


@dataclass(frozen=True)
class Problem:
    """One graph on one cluster for `grid`, with the columns that name it in the table
    (`{"budget_bytes": b}`, `{"graph": "gnmt", "accelerators": 2}`); `base` is its
    `reference_time`, computed when None."""

    columns: dict
    graph: Graph
    cluster: Cluster
    base: float | None = None


def _grid_job(k: int, problem: Problem, solver: str, options: SolveOptions) -> tuple[int, dict]:
    return k, {**problem.columns, **run_solver(problem.graph, problem.cluster, solver, options, problem.base).row}


def grid(problems: Sequence[Problem], solvers: Sequence[str], options: SolveOptions = SolveOptions(), *,
         processes: int | None = None, progress: bool = True) -> pd.DataFrame:
    """One row per (problem, solver), in that order: the problem's columns, then `run_solver`'s.
    The solves run in `processes` worker processes (default: one per CPU; 1 runs them here),
    with a progress bar on stderr. The options' progress callback cannot cross processes and is
    dropped; with several processes and `options.threads` unset each solve gets an equal share
    of the CPUs, so MILPs do not fight for cores. Workers start the platform's default way (fork
    on Linux); where that is spawn (macOS, Windows) the calling script needs an
    `if __name__ == "__main__":` guard."""
    for spec in solvers:     # a misspelt name is the caller's mistake: refuse before solving anything
        parse_solver(spec, options)
    processes = processes or os.cpu_count() or 1
    opts = replace(options, progress=None)
    if processes > 1 and opts.threads is None:
        opts = replace(opts, threads=max(1, (os.cpu_count() or 1) // processes))
    problems = [p if p.base is not None else replace(p, base=reference_time(p.graph, p.cluster)) for p in problems]
    jobs = [(p, s) for p in problems for s in solvers]
    bar = _Progress(len(jobs), sys.stderr if progress else None)
    rows: list[dict | None] = [None] * len(jobs)

    def done(k: int, row: dict) -> None:
        rows[k] = row
        p, s = jobs[k]
        bar.step(f"{s} @ " + ", ".join(format_size(v) if c.endswith("_bytes") else f"{c} {v}"
                                       for c, v in p.columns.items()))

    if processes == 1 or len(jobs) <= 1:
        for k, (p, s) in enumerate(jobs):
            done(*_grid_job(k, p, s, opts))
    else:
        with ProcessPoolExecutor(max_workers=min(processes, len(jobs))) as pool:
            futures = [pool.submit(_grid_job, k, p, s, opts) for k, (p, s) in enumerate(jobs)]
            try:
                for f in as_completed(futures):
                    done(*f.result())
            except BaseException:
                pool.shutdown(wait=False, cancel_futures=True)
                raise
    bar.close()
    return pd.DataFrame(rows)


def sweep(graph: Graph, budgets: Sequence[int], solvers: Sequence[str], options: SolveOptions = SolveOptions(), *,
          processes: int | None = None, progress: bool = True,
          make_cluster: Callable[[int], Cluster] = single_accelerator) -> pd.DataFrame:
    """One row per (budget, solver): `grid` over `make_cluster(budget)` (default
    `single_accelerator`; a `functools.partial` of it for more GPUs), every overhead
    against the same keep-everything step time."""
    budgets = [int(b) for b in budgets]
    base = reference_time(graph, make_cluster(max(budgets, default=0)))
    return grid([Problem({"budget_bytes": b}, graph, make_cluster(b), base) for b in budgets], solvers, options,
                processes=processes, progress=progress)


class _Progress:
    """`sweep [#####.....] 7/20 milp @ 1.00 GB` on one line of stderr."""

    def __init__(self, total: int, stream, width: int = 30):
        self.total, self.done, self.stream, self.width, self.shown = total, 0, stream, width, 0

    def step(self, what: str) -> None:
        self.done += 1
        if self.stream is None:
            return
        filled = self.width * self.done // max(self.total, 1)
        line = f"sweep [{'#' * filled}{'.' * (self.width - filled)}] {self.done}/{self.total} {what}"
        self.stream.write("\r" + line.ljust(self.shown))
        self.shown = len(line)
        self.stream.flush()

    def close(self) -> None:
        if self.stream is not None and self.done:
            self.stream.write("\n")
            self.stream.flush()
