"""`optsched`: the command line. Reads graphs (any supported format), clusters
and schedules, runs solvers and the simulator, prints tables or `--json`.

Exit status: 0 done; 1 a schedule is invalid or none fits; 2 a mistake in the
input (the message names the file, node and field); 130 interrupted.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import replace

from .cluster import Cluster, check_cluster, single_accelerator
from .errors import InfeasibleError, OptschedError
from .formats import output_folder
from .graph import Graph, drop_unneeded, largest_operation, unneeded
from .units import format_size, format_time, parse_bandwidth, parse_fraction, parse_size, parse_time


def _load_graph(arg: str) -> Graph:
    from .formats.importers import example_graph_path, import_graph

    if arg.startswith("example:"):
        return import_graph(example_graph_path(arg.split(":", 1)[1]))
    return import_graph(arg)


def _first(names: list[str], k: int = 5) -> str:
    return ", ".join(names[:k]) + (f" and {len(names) - k} more" if len(names) > k else "")


def _to_solve(graph: Graph) -> tuple[Graph, list[str]]:
    """The graph a solve works on, and what it leaves out: operations that no required result depends on (a
    schedule need not run them; every schedule of the rest is valid for the whole graph), said on stderr."""
    gone = unneeded(graph)
    if gone:
        print(f"optsched: left out {len(gone)} operations that no required result depends on: {_first(gone)} "
              "(mark a result `required` in the graph file to have it computed)", file=sys.stderr)
    return drop_unneeded(graph), gone


def _cluster(args, graph: Graph) -> Cluster:
    if args.cluster and args.mem:
        raise OptschedError("give either --mem or --cluster, not both")
    if args.cluster:
        from .formats import load_cluster

        return load_cluster(args.cluster)
    if not args.mem:
        raise OptschedError("no memory budget given", hint="add --mem 16GB or --cluster cluster.json")
    return check_cluster(single_accelerator(parse_size(args.mem, "--mem", _whole(graph, args.mem)), gpus=args.gpus,
                                            host_memory=parse_size(args.host_mem, "--host-mem"),
                                            bandwidth=parse_bandwidth(args.bandwidth, "--bandwidth")))


def _whole(graph: Graph, mem: str) -> int | None:
    """What a budget of '50%' is a share of: the keep-everything peak (`info` prints it); None unless asked."""
    from .solvers.baselines import keep_everything_peak

    return keep_everything_peak(graph) if "%" in mem else None


def _check_budget(graph: Graph, cluster: Cluster, runs: dict) -> None:
    """A budget below the largest operation a device must run is a user mistake, not a result. `runs`: device name
    -> the operations it runs (a schedule's; the others may run elsewhere, as on the host), or None: any of them."""
    for d in cluster.devices:
        if d.name not in runs:
            continue
        node, need = largest_operation(graph, runs[d.name])
        if d.memory < need:
            raise OptschedError(f"the budget of {d.name} ({format_size(d.memory)}) is below the memory lower bound "
                                f"of {format_size(need)}: operation {node!r} needs its inputs, output and workspace "
                                "at once", field="--mem", hint=f"give at least {format_size(need)}")


# --- rendering ---------------------------------------------------------------------------------

def _table(rows: list[list[str]], header: list[str]) -> str:
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]

    def line(r):
        cells = enumerate(zip(r, widths, strict=True))
        return "  ".join(str(c).rjust(w) if i else str(c).ljust(w) for i, (c, w) in cells)
    return "\n".join([line(header), line(["-" * w for w in widths]), *map(line, rows)])


def _print_sim(s: dict, base: float | None = None) -> None:
    over = "" if base in (None, 0) else f"  ({(s['step_time_s'] / base - 1) * 100:+.1f}% vs keep-everything)"
    print(f"step time      {format_time(s['step_time_s'])}{over}")
    print(f"compute        {format_time(s['compute_s'])}")
    print(f"recompute      {format_time(s['recompute_s'])} in {s['recomputed_ops']} operations")
    print(f"transfers      {format_time(s['transfer_s'])}, {format_size(s['transfer_bytes'])} "
          f"(swap out {format_size(s['swap_out_bytes'])}, in {format_size(s['swap_in_bytes'])})")
    rows = [[d["device"], d["kind"], format_size(d["peak_bytes"]), format_size(d["budget_bytes"]),
             f"{100 * d['peak_bytes'] / d['budget_bytes']:.0f}%" if d["budget_bytes"] else "-",
             format_time(d["busy_s"])] for d in s["devices"]]
    print(_table(rows, ["device", "kind", "peak", "budget", "used", "busy"]))


_BOUND_FROM = {"chain": "longest dependency chain; holds for every schedule",
               "work": "the work spread over the devices; holds for every schedule",
               "recompute": "the work and the recomputation memory forces; holds for every schedule"}


def _bound_from(rep) -> str | None:
    """Where a solver's reported bound comes from, so that a gap reads right: one of the lower bounds every schedule
    obeys (`bounds.lower_bounds`, which the MILP records), or the MILP's own dual bound, which holds only for the
    schedules of its stage model (its fixed order and stage barriers)."""
    lb = (rep.extra or {}).get("lower_bounds") if rep is not None and rep.bound is not None else None
    if not lb:
        return None
    if rep.bound > lb["floor"] * (1 + 1e-9):
        return "the MILP's dual bound; holds for the schedules of its stage model"
    return next((_BOUND_FROM[k] for k in ("recompute", "chain", "work") if lb.get(k) == lb["floor"]), None)


def _emit(args, data: dict) -> None:
    print(json.dumps(data, indent=1, default=str))


# --- commands ----------------------------------------------------------------------------------

def cmd_validate(args) -> int:
    g = _load_graph(args.graph)
    if args.json:
        _emit(args, {"valid": True, "graph": g.name, "nodes": len(g.nodes), "edges": g.num_edges})
    else:
        print(f"{args.graph}: valid graph {g.name!r}, {len(g.nodes)} nodes, {g.num_edges} edges")
    return 0


def _baseline(g: Graph, name: str) -> dict:
    """A baseline solver's simulated peak and step time with unbounded memory (or why it failed)."""
    from .simulate import simulate
    from .solvers import solve
    from .solvers.baselines import unbounded

    cl = unbounded(g)
    try:
        r = simulate(g, cl, solve(g, cl, name))
    except OptschedError as e:
        return {"error": e.message}
    dev = next(d for d in cl.devices if r.busy[d.name] > 0 or d is cl.devices[-1])
    return {"device": dev.name, "peak_bytes": r.peak[dev.name], "step_time_s": r.makespan,
            "recompute_s": r.recompute_time}


def _recompute_floor(g: Graph) -> int | None:
    """Bytes one accelerator needs at least when it computes everything and swaps nothing (`bounds.least_budget`,
    never below the largest operation's); None without cuda costs."""
    from .cluster import Device
    from .solvers.bounds import least_budget
    from .solvers.milp_model import make_spec

    total = int(g.arrays.bytes.sum() + g.arrays.workspace.max(initial=0))
    least = least_budget(make_spec(g, Cluster((Device("gpu0", "cuda", max(total, 1)),)), swap=False))
    return None if least is None else max(least, largest_operation(g)[1])


def cmd_info(args) -> int:
    from .summary import graph_summary

    g = _load_graph(args.graph)
    info = graph_summary(g)
    run = drop_unneeded(g)      # what solve works on: the bounds and baselines hold for it
    baselines = {name: _baseline(run, name) for name in ("keep-everything", "chen-sqrt")}
    info["baselines"] = baselines
    info["recompute_floor"] = _recompute_floor(run)
    if args.json:
        _emit(args, info)
        return 0
    print(f"graph {info['name']!r}: {info['nodes']} nodes, {info['edges']} edges, "
          f"{info['required']} required results")
    print("kinds          " + ", ".join(f"{k} {v}" for k, v in sorted(info["kinds"].items())))
    print("total compute  " + ", ".join(f"{k} {format_time(v)}" for k, v in info["total_compute_s"].items()))
    print(f"lower bound    {format_size(info['memory_lower_bound'])} (operation {info['largest_operation']!r})")
    if info["recompute_floor"] is not None:
        print(f"               {format_size(info['recompute_floor'])} on one accelerator without swapping, whatever "
              "is recomputed")
    if info["unneeded"]:
        print(f"unneeded       {len(info['unneeded'])} operations no required result depends on (solve leaves them "
              f"out): {_first(info['unneeded'])}")
    rows = [[n, b.get("device", "-"), format_size(b["peak_bytes"]) if "peak_bytes" in b else "-",
             format_time(b["step_time_s"]) if "step_time_s" in b else "-",
             format_time(b["recompute_s"]) if "recompute_s" in b else b.get("error", "")]
            for n, b in baselines.items()]
    print(_table(rows, ["baseline", "device", "peak memory", "step time", "recompute"]))
    return 0


def cmd_import(args) -> int:
    from .formats import save_graph
    from .formats.importers import import_graph

    g = import_graph(args.file, fmt=args.from_format)
    save_graph(g, args.output)
    if args.json:
        _emit(args, {"output": args.output, "graph": g.name, "nodes": len(g.nodes), "edges": g.num_edges})
    else:
        print(f"wrote {args.output}: graph {g.name!r}, {len(g.nodes)} nodes, {g.num_edges} edges")
    return 0


def cmd_simulate(args) -> int:
    from .formats import load_schedule
    from .schedule import Compute
    from .summary import sim_summary

    g = _load_graph(args.graph)
    sched = load_schedule(args.schedule)
    cl = _cluster(args, g)
    runs: dict = {}
    for x in sched.instructions:
        if type(x) is Compute:
            runs.setdefault(x.device, set()).add(x.node)
    _check_budget(g, cl, runs)
    r = _simulated(g, cl, sched, args.schedule)
    s = sim_summary(r, cl)
    if args.json:
        _emit(args, s)
    else:
        print(f"schedule {args.schedule}: {len(sched.instructions)} instructions, "
              + ("valid" if r.valid else "INVALID"))
        if not r.valid:
            print(f"  {s['violation']['message']}")
        _print_sim(s)
    return 0 if r.valid else 1


def _simulated(graph: Graph, cluster: Cluster, sched, path: str):
    """The schedule read from `path`, simulated; an error naming the file and the node where it is not one for this
    graph and cluster (a node, device or link they lack), rather than a schedule that merely does not fit."""
    from .simulate import describe, simulate

    r = simulate(graph, cluster, sched)
    if r.violation is not None and r.violation.code in ("unknown-node", "unknown-device", "no-link"):
        raise OptschedError(describe(r.violation), file=path, node=r.violation.node, field="instructions",
                            hint="was the schedule made for this graph and cluster?")
    return r


def _warm_start(graph: Graph, cluster: Cluster, path: str):
    """The schedule `--warm-start` names, checked before the solve: one that does not fit the budget would leave
    the MILP nothing to start from, after minutes of candidates."""
    from .formats import load_schedule
    from .simulate import describe

    sched = load_schedule(path)
    r = _simulated(graph, cluster, sched, path)
    if not r.valid:
        raise OptschedError(f"the warm start does not fit: {describe(r.violation)}", file=path,
                            node=r.violation.node, hint="give a schedule made at this budget or a larger one "
                            "(solve -o writes one), or solve without --warm-start")
    return sched


def _progress_printer(quiet: bool):
    last = [0.0]

    def show(p: dict) -> None:
        now = time.monotonic()
        if quiet or now - last[0] < 1.0:
            return
        last[0] = now
        inc, bound, gap = p.get("incumbent"), p.get("bound"), p.get("gap")
        print(f"  {p.get('elapsed', 0):7.1f} s  incumbent {format_time(inc) if inc is not None else '-':>10}  "
              f"bound {format_time(bound) if bound is not None else '-':>10}  "
              f"gap {f'{100 * gap:.2f}%' if gap is not None else '-':>8}", file=sys.stderr, flush=True)
    return show


def _highs_options(pairs: list[str]) -> dict:
    """--highs KEY=VALUE pairs as HiGHS options: numbers as numbers, true/false as booleans, the rest as text."""
    def value(text: str):
        if text.strip().lower() in ("true", "false"):
            return text.strip().lower() == "true"
        for kind in (int, float):
            try:
                return kind(text)
            except ValueError:
                pass
        return text

    out = {}
    for p in pairs:
        key, eq, text = p.partition("=")
        if not eq or not key.strip():
            raise OptschedError(f"--highs {p!r}: expected KEY=VALUE, e.g. --highs mip_heuristic_effort=0.2")
        out[key.strip()] = value(text)
    return out


def cmd_solve(args) -> int:
    from .formats import save_schedule
    from .simulate import simulate
    from .solvers import SolveOptions, get_solver, solve
    from .solvers.sequential import pick_device
    from .summary import sim_summary

    g, left_out = _to_solve(_load_graph(args.graph))
    cl = _cluster(args, g)
    held = 0
    if args.hold_model:
        from .cluster import hold_sources

        if len(cl.accelerators) != 1:
            raise OptschedError(f"--hold-model needs one accelerator, the one the model sits on; the cluster has "
                                f"{len(cl.accelerators)}")
        held = cl.accelerators[0].memory
        g, cl = hold_sources(g, cl, cl.accelerators[0].name)
        held -= cl.accelerators[0].memory
    solver = get_solver(args.solver)
    milp_solver = args.solver == "milp" or args.solver.startswith("pulp")
    if args.warm_start and not milp_solver:
        raise OptschedError(f"--warm-start applies to the MILP (milp, pulp), not to {args.solver!r}")
    warm = _warm_start(g, cl, args.warm_start) if args.warm_start else None
    opts = SolveOptions(time_limit=parse_time(args.time_limit, "--time-limit"), gap=parse_fraction(args.gap, "--gap"),
                        threads=args.threads, device=args.device, devices=args.devices, swap=not args.no_swap,
                        recompute=not args.no_recompute, write_model=args.write_model, warm_start=warm,
                        progress=_progress_printer(args.json or not sys.stderr.isatty()),
                        params={**{k: True for k, on in (("coarsen", args.coarsen), ("instage", args.within_stage))
                                   if on}, **({"highs": _highs_options(args.highs)} if args.highs else {}),
                                **({"host_compute": False} if args.no_host_compute else {}),
                                **({"polish": False} if args.no_polish else {}),
                                **({"cuts": args.cuts} if args.cuts is not None else {})})
    if args.cuts is not None and args.cuts < 0:
        raise OptschedError(f"--cuts must be 0 (off) or a depth of inputs, 1 or more, not {args.cuts}")
    if args.cuts and args.solver != "milp":
        raise OptschedError(f"--cuts applies to the milp solver (HiGHS), not to {args.solver!r}")
    if args.no_host_compute and not milp_solver:
        raise OptschedError(f"--no-host-compute applies to the MILP (milp, pulp), not to {args.solver!r}",
                            hint="the single-device solvers run on one accelerator already (--device)")
    if args.no_polish and not milp_solver:
        raise OptschedError(f"--no-polish applies to the MILP (milp, pulp), not to {args.solver!r}")
    if args.highs and args.solver != "milp":
        raise OptschedError(f"--highs sets options of the milp solver (HiGHS), not of {args.solver!r}")
    if args.plot:
        from .plot import figure_path

        figure_path(args.plot)
    if args.output:
        output_folder(args.output, "--output")     # before the solve: its result is not lost to a typo in the path
    if args.write_model:
        from .solvers.milp import model_path

        model_path(args.write_model)
    if args.solver in ("keep-everything", "chen-sqrt") or args.device:
        _check_budget(g, cl, {pick_device(g, cl, args.device).name: None})
    else:
        _check_budget(g, cl, {max(cl.devices, key=lambda d: d.memory).name: None})
    t0 = time.perf_counter()
    sched = solver(g, cl, opts)
    wall = time.perf_counter() - t0
    r = simulate(g, cl, sched)
    s = sim_summary(r, cl)
    from .solvers.baselines import unbounded

    base_cl = unbounded(g)
    base = simulate(g, base_cl, solve(g, base_cl, "keep-everything")).makespan if "cuda" in g.arrays.cost else None
    rep = sched.report
    s["solver"] = {"name": args.solver, "status": rep.status if rep else None,
                   "objective_s": rep.objective if rep else None, "bound_s": rep.bound if rep else None,
                   "bound_from": _bound_from(rep), "gap": rep.gap if rep else None,
                   "solve_time_s": rep.solve_time if rep else None, "wall_time_s": wall,
                   "message": rep.message if rep else "",
                   "warm_start": (rep.extra or {}).get("warm_start") if rep else None}
    s["keep_everything_step_time_s"] = base
    s["left_out"] = left_out
    s["overhead"] = None if not base else s["step_time_s"] / base - 1
    if not r.valid:
        msg = s["violation"]["message"]
        if args.json:
            _emit(args, s)
        print(f"optsched: {args.solver} found no schedule that fits: {msg}; nothing written "
              "(try --solver heuristic or milp, or a larger --mem)", file=sys.stderr)
        return 1
    if args.output:
        save_schedule(replace(sched, graph=g.name), args.output)
    if args.plot:
        from .plot import save, schedule_figure

        save(schedule_figure(r, sched, f"{g.name}: {args.solver}, step time {format_time(r.makespan)}"), args.plot)
    if args.json:
        s["output"] = args.output
        s["plot"] = args.plot
        _emit(args, s)
        return 0
    print(f"graph {g.name!r} on " + ", ".join(f"{d.name} ({format_size(d.memory)})" for d in cl.devices))
    if held:
        print(f"--hold-model: the parameters and inputs ({format_size(held)}) stay on {cl.accelerators[0].name} all "
              f"step; the budget above is what is left beside them")
    sv = s["solver"]
    # the whole call: a MILP's own solve_time is its solver's run only (the candidates, bounds and model build
    # come before it), so it alone reads as if the call took milliseconds where the model was too large to run
    line = f"solver {args.solver}: {sv['status']} in {format_time(wall)}"
    backend = (rep.extra or {}).get("backend") if rep else None
    if backend and sv["solve_time_s"] is not None:
        line += f" ({backend} {format_time(sv['solve_time_s'])})"
    if sv["bound_s"] is not None:
        line += f", objective {format_time(sv['objective_s'])}, bound {format_time(sv['bound_s'])}"
        if sv["bound_from"]:
            line += f" ({sv['bound_from']})"
    if sv["gap"] is not None:
        line += f", gap {100 * sv['gap']:.2f}%"
    print(line)
    for note in (sv["message"], (rep.extra or {}).get("warm_start") if rep else None):
        if note:
            print(f"  {note}")
    _print_sim(s, base)
    if args.output:
        print(f"wrote {args.output} ({len(sched.instructions)} instructions)")
    if args.plot:
        print(f"wrote {args.plot}")
    return 0


def cmd_sweep(args) -> int:
    from functools import partial

    from .compare import sweep
    from .solvers import SolveOptions
    from .units import parse_size_range

    g = _to_solve(_load_graph(args.graph))[0]
    budgets = parse_size_range(args.mem, args.steps, "--mem", _whole(g, args.mem))
    solvers = [s.strip() for s in args.solvers.split(",") if s.strip()]
    if not solvers:
        raise OptschedError("--solvers names no solver")
    if args.processes is not None and args.processes < 1:
        raise OptschedError("--processes must be at least 1")
    if args.gpus < 1:
        raise OptschedError("--gpus must be at least 1")
    if args.plot:
        from .plot import figure_path

        figure_path(args.plot)
    if args.output:
        output_folder(args.output, "--output")
    make = partial(single_accelerator, gpus=args.gpus, host_memory=parse_size(args.host_mem, "--host-mem"),
                   bandwidth=parse_bandwidth(args.bandwidth, "--bandwidth"))
    opts = SolveOptions(time_limit=parse_time(args.time_limit, "--time-limit"), gap=parse_fraction(args.gap, "--gap"))
    df = sweep(g, budgets, solvers, opts, processes=args.processes, progress=not args.json and sys.stderr.isatty(),
               make_cluster=make)
    if args.output:
        df.to_csv(args.output, index=False)
    if args.plot:
        from .plot import pareto, save

        ax = pareto(df)
        ax.set_title(f"{g.name}: step time against memory budget")
        save(ax.figure, args.plot)
    if args.json:
        _emit(args, {"graph": g.name, "output": args.output, "plot": args.plot,
                     "rows": json.loads(df.to_json(orient="records"))})
        return 0
    rows = [[format_size(r.budget_bytes), r.solver, r.status, format_time(r.step_time_s) if r.valid else "-",
             f"{100 * r.overhead:+.1f}%" if r.valid else "-", f"{100 * r.bound_overhead:+.1f}%"
             if r.bound_overhead == r.bound_overhead else "-", format_time(r.solve_s)] for r in df.itertuples()]
    print(_table(rows, ["budget", "solver", "status", "step time", "overhead", "bound", "solve time"]))
    for path in (args.output, args.plot):
        if path:
            print(f"wrote {path}")
    return 0


def _shape(text: str) -> list[int]:
    try:
        shape = [int(x) for x in text.split(",")]
    except ValueError:
        shape = []
    if not shape or min(shape) < 1:
        raise OptschedError(f"bad input shape {text!r}", field="--input-shape",
                            hint="give positive sizes separated by commas, e.g. 8,3,224,224")
    return shape


def _factory(spec: str):
    """A built-in model's factory, or FACTORY from MODULE:FACTORY (a dotted module, also found from the working
    directory, or a .py file)."""
    import importlib
    import importlib.util
    import os
    from pathlib import Path

    from .capture.models import BUILTIN

    if spec in BUILTIN:
        return BUILTIN[spec]
    where, _, name = spec.rpartition(":")
    if not where or not name:
        raise OptschedError(f"unknown model {spec!r}", field="MODEL",
                            hint=f"give MODULE:FACTORY, path/to/file.py:FACTORY or one of {', '.join(BUILTIN)}")
    try:
        if where.endswith(".py") or os.sep in where:
            loader = importlib.util.spec_from_file_location(Path(where).stem, where)
            module = importlib.util.module_from_spec(loader)
            loader.loader.exec_module(module)
        else:
            if os.getcwd() not in sys.path:  # the console script's path does not include the working directory
                sys.path.insert(0, os.getcwd())
            module = importlib.import_module(where)
    except Exception as e:  # noqa: BLE001 - whatever the user's module raises is one line for them
        raise OptschedError(f"cannot import {where!r}: {type(e).__name__}: {e}", field="MODEL") from e
    fn = getattr(module, name, None)
    if not callable(fn):
        raise OptschedError(f"{where!r} has no function {name!r}", field="MODEL")
    return fn


def _example_builder(model: str, shapes: list, kinds: list, vocab: int | None):
    """A factory for capture_factory: the user's factory, its failures as one line, inputs of the given shapes."""
    factory = _factory(model)

    def build():
        import torch

        from .capture import CaptureError, normalize_example

        try:
            ex = factory()
        except OptschedError:
            raise
        except Exception as e:  # noqa: BLE001 - the user's factory failing is one line, not a traceback
            raise CaptureError(f"the factory {model!r} raised {type(e).__name__}: {e}") from e
        ex = normalize_example(ex)
        if shapes:  # made here, so that under --fake they are fake too
            ex["inputs"] = tuple(torch.randint(0, vocab, s) if k == "long" else torch.randn(s)
                                 for s, k in zip(shapes, kinds, strict=True))
        return ex

    return build


def cmd_capture(args) -> int:
    import torch

    from .capture import capture_factory
    from .formats import save_graph
    from .summary import graph_summary

    shapes = [_shape(s) for s in args.input_shape or ()]
    kinds = args.input_dtype or ["float"]
    if len(kinds) not in (1, len(shapes)):
        raise OptschedError(f"{len(kinds)} --input-dtype for {len(shapes)} --input-shape", field="--input-dtype",
                            hint="give one for all inputs or one per input")
    kinds = kinds * len(shapes) if len(kinds) == 1 else kinds
    if "long" in kinds[:len(shapes)] and not args.vocab:
        raise OptschedError("long inputs need --vocab N (token ids are drawn from 0..N-1)", field="--vocab")
    build = _example_builder(args.model, shapes, kinds, args.vocab)

    dtypes = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
    output_folder(args.output, "--output")     # before the capture, which may take minutes
    start = time.perf_counter()
    g = capture_factory(build, fake=args.fake, dtype=dtypes.get(args.dtype), optimizer=args.optimizer,
                        cuda=args.cuda_preset, profile=args.profile, name=args.model)
    seconds = time.perf_counter() - start
    cap = g.meta["capture"]
    cap["source"] = {"model": args.model, "input_shapes": shapes or None, "input_dtype": kinds if shapes else None,
                     "vocab": args.vocab, "dtype": args.dtype, "fake": args.fake}
    save_graph(g, args.output)
    info = graph_summary(g)
    info.update(capture_s=seconds, parameters=cap["parameters"], cost=cap["cost"], cuda_model=cap["cuda_model"],
                parameter_bytes=sum(n.bytes for n in g.nodes if n.id in cap["params"]),
                keep_everything=_baseline(g, "keep-everything"), profile_failed=cap.get("profile_failed", []),
                scratch_bytes=cap.get("scratch_bytes", {}), output=args.output)
    if args.json:
        _emit(args, info)
        return 0
    ke = info["keep_everything"]
    print(f"captured {args.model!r} in {format_time(seconds)}: {info['nodes']} nodes, {info['edges']} edges, "
          f"{info['required']} required results")
    print("kinds          " + ", ".join(f"{k} {v}" for k, v in sorted(info["kinds"].items())))
    print(f"parameters     {info['parameters']:,} ({format_size(info['parameter_bytes'])})")
    print(f"costs          {info['cost']}; cuda: {info['cuda_model']}; total "
          + ", ".join(f"{k} {format_time(v)}" for k, v in info["total_compute_s"].items()))
    if info["profile_failed"]:
        print(f"               {len(info['profile_failed'])} operations could not be profiled (roofline kept)")
    if scratch := info["scratch_bytes"]:
        print(f"scratch        {len(scratch)} operations, up to {format_size(max(scratch.values()))} each "
              f"(measured while they run; held as their workspace)")
    print(f"lower bound    {format_size(info['memory_lower_bound'])} (operation {info['largest_operation']!r})")
    print("peak memory    " + (f"{format_size(ke['peak_bytes'])} keeping everything (step time "
                                f"{format_time(ke['step_time_s'])} on {ke['device']})" if "peak_bytes" in ke
                                else ke["error"]))
    print(f"wrote {args.output}")
    return 0


def cmd_run(args) -> int:
    """Replay a schedule for real on the model the graph was captured from; measured beside predicted."""
    import statistics

    import torch

    from .capture import export_step, normalize_example
    from .execute import Replayer
    from .formats import load_schedule

    graph = _load_graph(args.graph)
    cluster = _cluster(args, graph)
    schedule = load_schedule(args.schedule)
    source = (graph.meta.get("capture") or {}).get("source") or {}
    model_arg = args.model or source.get("model")
    if not model_arg:
        raise OptschedError("no model to run", hint="give --model MODULE:FACTORY (the one the graph was captured from)")
    if source.get("fake"):
        raise OptschedError("the graph was captured with --fake; the run needs real weights",
                            hint="capture again without --fake for a model that fits this machine")
    shapes = [tuple(s) for s in source.get("input_shapes") or ()]
    ex = normalize_example(_example_builder(model_arg, shapes, source.get("input_dtype") or [], source.get("vocab"))())
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(source.get("dtype"))
    model = ex["model"].to(dtype) if dtype else ex["model"]
    inputs = tuple(t.to(dtype) if dtype and t.is_floating_point() else t for t in ex["inputs"])
    targets = tuple(ex.get("targets") or ())
    devices = dict(kv.split("=", 1) for kv in args.device_map.split(",")) if args.device_map else None
    if devices is None and torch.cuda.is_available():
        model = model.cuda()
        inputs = tuple(t.cuda() for t in inputs)
        targets = tuple(t.cuda() for t in targets)
    step = export_step(model, inputs, targets, ex.get("loss_fn"))
    replay = Replayer(model, step, graph, cluster, schedule, devices)
    runs = [replay.run(inputs, targets, allocator=(k == 0)) for k in range(args.steps)]
    model.zero_grad(set_to_none=True)
    pred = replay.predicted
    wall = statistics.median(r.wall_time for r in runs[1:]) if len(runs) > 1 else runs[0].wall_time
    first = runs[0]
    data = {"devices": {d: {"torch_device": str(replay.dev[d]), "budget_bytes": pred.budget[d],
                            "predicted_peak_bytes": pred.peak[d], "measured_peak_bytes": first.peak[d],
                            "peak_with_model_tensors_bytes": first.peak_with_model_tensors[d]}
                        for d in replay.dev},
            "allocator_peak_bytes": first.allocator_peak, "predicted_step_s": pred.makespan,
            "measured_step_s": wall, "steps": args.steps, "losses": [r.loss for r in runs]}
    if args.json:
        _emit(args, data)
        return 0
    rows = [[d, v["torch_device"], format_size(v["budget_bytes"]), format_size(v["predicted_peak_bytes"]),
             format_size(v["measured_peak_bytes"]), format_size(v["peak_with_model_tensors_bytes"])]
            for d, v in data["devices"].items()]
    print(_table(rows, ["device", "runs on", "budget", "predicted peak", "measured peak", "with the model's tensors"]))
    for dev, b in first.allocator_peak.items():
        print(f"allocator peak on {dev}: {format_size(b)} (all schedule devices mapped to it together)")
    for d, v in data["devices"].items():
        if v["peak_with_model_tensors_bytes"] > v["budget_bytes"]:
            print(_held_note(d, v["peak_with_model_tensors_bytes"], v["budget_bytes"]))
    print(f"step time: predicted {format_time(pred.makespan)}, measured {format_time(wall)} "
          f"(median of {max(len(runs) - 1, 1)} step(s){', first step excluded' if len(runs) > 1 else ''})")
    print("losses: " + ", ".join(f"{x:.6g}" for x in data["losses"]))
    return 0


def _held_note(device: str, peak: int, budget: int) -> str:
    """Why a device holds more than its budget once the model's parameters and the inputs are counted all step."""
    return (f"note: the schedule frees or swaps out parameters or inputs that the model and the caller still hold on "
            f"{device}, so they stay in memory: with them the step holds {format_size(peak)} there, over its budget "
            f"of {format_size(budget)} (solve with --hold-model to make room for them, or raise --mem)")


def cmd_examples(args) -> int:
    from .formats.importers import example_graph_path

    try:
        example_graph_path("")
    except OptschedError as e:
        print(e.hint or e.message)
    return 0


# --- parser ------------------------------------------------------------------------------------

def _add_cluster_args(p) -> None:
    p.add_argument("--mem", help="budget of the accelerator, e.g. 16GB, 16GiB, 512MB, 1.5e9, or 50%% of the "
                   "keep-everything peak (plus the host)")
    p.add_argument("--cluster", help="a cluster.json describing devices and links instead of --mem")
    p.add_argument("--gpus", type=int, default=1, help="with --mem: number of accelerators (default 1)")
    p.add_argument("--host-mem", default="256GB", help="with --mem: host RAM usable as swap (default 256GB)")
    p.add_argument("--bandwidth", default="16GB/s", help="with --mem: host link bandwidth (default 16GB/s)")


def build_parser() -> argparse.ArgumentParser:
    from .solvers import SOLVERS

    ap = argparse.ArgumentParser(prog="optsched", description="Optimal memory-constrained scheduling of one "
                                 "training step. GRAPH is a graph file in any supported format, or example:NAME.")
    ap.add_argument("--version", action="version", version="optsched 0.1.0")
    sub = ap.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("validate", help="check a graph file")
    p.add_argument("graph")
    p.add_argument("--json", action="store_true")
    p.set_defaults(fn=cmd_validate)

    p = sub.add_parser("info", help="summarise a graph: sizes, compute, baseline memory, lower bound")
    p.add_argument("graph")
    p.add_argument("--json", action="store_true")
    p.set_defaults(fn=cmd_info)

    p = sub.add_parser("import", help="convert another tool's graph file to optsched-graph JSON")
    p.add_argument("file")
    p.add_argument("-o", "--output", required=True)
    p.add_argument("--from", dest="from_format", choices=["optsched", "msr", "checkmate"],
                   help="the input format (default: detected)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(fn=cmd_import)

    p = sub.add_parser("simulate", help="check a schedule and compute its time and memory")
    p.add_argument("graph")
    p.add_argument("schedule")
    _add_cluster_args(p)
    p.add_argument("--json", action="store_true")
    p.set_defaults(fn=cmd_simulate)

    p = sub.add_parser("solve", help="find a schedule that fits the budget")
    p.add_argument("graph")
    _add_cluster_args(p)
    p.add_argument("--solver", default="milp" if "milp" in SOLVERS else "chen-sqrt",
                   help="one of " + ", ".join(SOLVERS) + (", pulp:NAME" if "pulp" in SOLVERS else ""))
    p.add_argument("-o", "--output", help="write the schedule here")
    p.add_argument("--time-limit", default="60", help="solver time limit (default 60s)")
    p.add_argument("--gap", default="0.01", help="relative optimality gap to stop at: 0.01 or 1%% (default 1%%)")
    p.add_argument("--threads", type=int, help="solver threads")
    p.add_argument("--device", help="single-device solvers: the device to use")
    p.add_argument("--devices", type=int, help="use at most this many accelerators")
    p.add_argument("--no-swap", action="store_true", help="never copy tensors to the host and back")
    p.add_argument("--no-recompute", action="store_true", help="never recompute an operation")
    p.add_argument("--hold-model", action="store_true",
                   help="the parameters and inputs stay on the accelerator all step, as a PyTorch model on the GPU "
                        "and its batch do: the schedule makes room for them rather than moving them")
    p.add_argument("--no-host-compute", action="store_true",
                   help="MILP: the host runs no operation, it only holds swapped tensors; with --no-swap and "
                        "--devices 1 this is Checkmate's problem (one accelerator, recompute only), whose "
                        "recomputation lower bound then applies")
    p.add_argument("--no-polish", action="store_true",
                   help="MILP: return the model's own schedule; by default, where it recomputes and is more than "
                        "--gap above the bound, values are kept instead (room made by deferring what the model's "
                        "order computed early) and a faster schedule outside the model is returned")
    p.add_argument("--warm-start", metavar="SCHEDULE",
                   help="MILP: start from this schedule (one that fits the budget: -o of an earlier solve, say, to "
                        "go on from it with more --time-limit); the result is never slower than it")
    p.add_argument("--write-model", help="MILP: also write the model as .mps or .lp")
    p.add_argument("--coarsen", action="store_true",
                   help="MILP: fold chains of cheap operations first (a smaller model, no bound for the full graph)")
    p.add_argument("--within-stage", action="store_true",
                   help="MILP: track memory within each stage (Checkmate's exact count; a larger, slower model)")
    p.add_argument("--cuts", type=int, metavar="DEPTH",
                   help="MILP: recomputation-chain cuts before branching, following inputs DEPTH deep "
                   "(e.g. 2; default 0: off)")
    p.add_argument("--highs", action="append", default=[], metavar="KEY=VALUE",
                   help="MILP: set a HiGHS option (repeatable), e.g. --highs mip_heuristic_effort=0.2")
    p.add_argument("--plot", help="write a figure of the schedule (streams over time, memory per device): "
                   ".png, .pdf, .svg")
    p.add_argument("--json", action="store_true")
    p.set_defaults(fn=cmd_solve)

    p = sub.add_parser("sweep", help="run several solvers over a range of memory budgets (a Pareto table)")
    p.add_argument("graph")
    p.add_argument("--mem", required=True,
                   help="budgets of the accelerator: 2GB..16GB (with --steps), 1GB,2GB,4GB, 30%%..90%% of the "
                   "keep-everything peak, or one")
    p.add_argument("--steps", type=int, default=6, help="budgets in a LO..HI range, both ends included (default 6)")
    p.add_argument("--solvers", default="milp,heuristic,chen-sqrt,keep-everything",
                   help="comma-separated solver names; NAME/recompute-only or NAME/swap-only restricts one "
                   "(default milp,heuristic,chen-sqrt,keep-everything)")
    p.add_argument("--gpus", type=int, default=1, help="accelerators, each with the budget (default 1)")
    p.add_argument("--host-mem", default="256GB", help="host RAM usable as swap (default 256GB)")
    p.add_argument("--bandwidth", default="16GB/s", help="host link bandwidth (default 16GB/s)")
    p.add_argument("--time-limit", default="60", help="time limit of each solve (default 60s)")
    p.add_argument("--gap", default="0.01", help="relative optimality gap to stop at: 0.01 or 1%% (default 1%%)")
    p.add_argument("--processes", type=int, help="solves run in parallel (default: one per CPU)")
    p.add_argument("--plot", help="write the Pareto figure (overhead against budget) here: .png, .pdf, .svg")
    p.add_argument("-o", "--output", help="write the table as CSV here")
    p.add_argument("--json", action="store_true")
    p.set_defaults(fn=cmd_sweep)

    p = sub.add_parser("capture", help="trace one training step of a PyTorch model into a graph file (needs torch)")
    p.add_argument("model", metavar="MODEL", help="MODULE:FACTORY, path/to/file.py:FACTORY, or a built-in: mlp, "
                   "cnn, transformer, gpt2, bert. FACTORY() returns a module, (model, inputs[, loss_fn]) or "
                   "dict(model=, inputs=, targets=, loss_fn=)")
    p.add_argument("--input-shape", action="append", metavar="SHAPE",
                   help="one per model input, e.g. 8,3,224,224; replaces the factory's inputs (its targets and "
                   "loss stay)")
    p.add_argument("--input-dtype", action="append", choices=["float", "long"],
                   help="float (randn, the default) or long (token ids below --vocab); once for all inputs or "
                   "once per --input-shape")
    p.add_argument("--vocab", type=int, help="with --input-dtype long: token ids are drawn from 0..N-1")
    p.add_argument("--dtype", choices=["fp32", "bf16", "fp16"], help="convert the model and float inputs")
    p.add_argument("--fake", action="store_true",
                   help="build the model under FakeTensorMode: shapes only, no weights in memory")
    p.add_argument("--profile", action="store_true",
                   help="measure each operation's time and scratch memory on this machine instead of the roofline "
                        "model")
    p.add_argument("--optimizer", choices=["sgd", "adam"], help="add the parameter update to the graph")
    p.add_argument("--cuda-preset", default="h100", help="roofline rates for the cuda cost: h100 (default) or a100")
    p.add_argument("-o", "--output", required=True, help="write the graph here")
    p.add_argument("--json", action="store_true")
    p.set_defaults(fn=cmd_capture)

    p = sub.add_parser("run", help="replay a schedule in real training steps of the captured model (needs torch)")
    p.add_argument("graph", metavar="GRAPH", help="a graph written by optsched capture")
    p.add_argument("schedule", metavar="SCHEDULE")
    _add_cluster_args(p)
    p.add_argument("--model", help="MODULE:FACTORY of the model (default: the one the graph was captured from)")
    p.add_argument("--steps", type=int, default=3, help="training steps to run (default 3)")
    p.add_argument("--device-map", help="schedule device to torch device, e.g. gpu0=cuda:0,host=cpu "
                   "(default: accelerators to cuda:0.. when present, else everything on the CPU)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(fn=cmd_run)

    p = sub.add_parser("examples", help="list the example graphs shipped with optsched")
    p.set_defaults(fn=cmd_examples)
    return ap


def main(argv: list[str] | None = None) -> int:
    rc = _main(argv)
    if argv is None and sys.modules.get("optsched.solvers.milp") is not None:
        from .solvers.milp import abandoned_running

        if abandoned_running():
            # a HiGHS run given up after a Ctrl-C (its root LP checks for none) would hold the exit until its own
            # time limit, and Python's finalisation would abort under it: everything is written, so leave now
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(rc)
    return rc


def _main(argv: list[str] | None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.fn(args)
    except InfeasibleError as e:
        if getattr(args, "json", False):    # a script reading --json learns the outcome and its figures too
            print(json.dumps({"status": e.status, "proven": e.proven, "message": e.render(),
                              "memory_lower_bound_bytes": e.least, "smallest_found_bytes": e.found}, indent=1))
        print(f"optsched: {e.render()}", file=sys.stderr)
        return 1
    except OptschedError as e:
        print(f"optsched: error: {e.render()}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("optsched: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0


if __name__ == "__main__":
    sys.exit(main())
