"""Against PyTorch: optsched's schedules beside `torch._functorch.config.activation_memory_budget` at matched memory.

PyTorch's own answer to "train in less memory" is the min-cut partitioner of `torch.compile`: with
`activation_memory_budget` below 1 it picks, by a 0/1 knapsack, which forward values to save for the backward and
which to recompute there. For each built-in model this runs

- eager `loss.backward()` (the keep-everything reference: peak and step time);
- `torch.compile` (inductor; "aot_eager_decomp_partition", the same partitioner without code generation, when
  inductor cannot compile) of forward + loss at each budget in --budgets; `.backward()` on its loss runs the
  backward graph AOTAutograd compiled from the same joint graph, so the budget decides what the step holds;
- optsched: the step captured with profiled op costs, solved for the accelerator "gpu0" with each measured PyTorch
  peak as its budget (and at 50% of the eager peak, the headline), and replayed op by op (`optsched.execute`).

Memory is accounted the same way on both sides, so "matched" means the same bytes: the storages the step starts with
(parameters, buffers, inputs, targets; `capture.memory._resident`) plus the CPU allocator's peak above its level at the
start while the step runs (`capture.memory.cpu_allocation_peak`), `.grad` None at the start. That is `eager_peak`, and
for a replay `StepStats.allocator_peak["cpu"]`. The graph counts the same storages (parameters, inputs, activations,
gradients), so a budget of B bytes on "gpu0" bounds the replay's ledger `StepStats.peak["gpu0"]` by B. The ledger is not
the whole process here: on a CPU the "host" is the same RAM, so a tensor swapped to it is still counted by the allocator
(allocator peak = gpu0 ledger + host copies + scratch inside ops, which the profile measures into each op's workspace
and the ledger of storages does not count). So the CSV has `peak_bytes` (the allocator: the whole step),
`ledger_gpu0_bytes` and `device_peak_bytes`, the budgeted device's measured peak that the figure plots: the allocator's
for PyTorch and for a schedule that swaps nothing (all on one memory, as PyTorch), for one that swaps the gpu0 ledger
with the model's tensors that it does not count (`StepStats.peak_with_model_tensors`: the model holds a weight the
schedule swaps out; on a GPU machine the host copies would be in host RAM; op scratch is left out). Before, the swapping
rows plotted the gpu0 ledger alone, below what gpu0 held wherever a weight was swapped out (at 5176a4d, mlp at a 50%
target by MILP: 4.47 MB against 7.10 MB with them; transformer 5.15 MB against 6.51 MB; gpt2 12.93 MB against 14.24 MB).
`milp/recompute-only` never swaps: it is the like-for-like counterpart of the knapsack. Only the accelerator computes
(the graph's costs name `cuda` alone), since both devices are the same cores here; op costs are profiled on this CPU and
the link is this CPU's copy bandwidth.

Step time, one thread on both sides: every step of a model (eager, each compiled budget, each schedule) is built
first and then all are timed in turns, one step of each per round for --steps rounds after a warm-up round, so a
change of load falls on all of them alike. The time is the process's CPU time (`time.process_time`, user + system)
over the step: with one thread all of a step's work is in this process, and on a machine shared with other jobs
the wall time mostly measures how long the scheduler kept this process waiting (wall times are kept too,
`step_wall_s`, `overhead_wall`). Compiled code fuses ops and an op-by-op replay pays Python per op, so absolute
times favour PyTorch; the fair figure is each side's `overhead` over its own keep-everything run (torch.compile at
budget 1.0; the replayed keep-everything schedule): the median over rounds of the step's time against that
baseline's time in the same round, minus 1 (`time_vs_eager` likewise against eager). The CSV also has every step's
CPU time, and loss and gradient error against eager.

What the measurements show (experiments/results/against_pytorch_cpu.csv):
- The budget bounds what the forward keeps for the backward (`held_after_forward_bytes` falls with it on every
  model), not the step's peak: the backward graph recomputes the dropped values at its start and holds each until
  its own backward runs, so the peak stays put (mlp, cnn), moves non-monotonically, or rises (budget 0 on gpt2 and
  the transformer is above budget 1).
- torch.compile at budget 1 is already below eager (fused pointwise chains are never materialised, the min-cut
  recomputes cheap ones); optsched schedules the unfused ATen graph, whose keep-everything peak is eager's or
  more, so at the same bytes it has more to drop.
- The profile measures the scratch inside each op (convolution and matmul backward) into its workspace, so a
  schedule that swaps nothing and fits the matched budget in the graph fits it measured: every recompute-only row
  but one is under its budget (gpt2 at 50% of eager: 248 bytes over), every cnn row at least 2.8% under (up to
  9.3% over before the CPU's scratch was measured, at 5176a4d).
- A swapping schedule's gpu0 peak with the weights it swaps out still held by the model is well above its budget
  (mlp at a 50% target: 6.85 MB, 70% of eager's peak); `cluster.hold_sources` is the problem that makes room.
- The recompute-only MILP proves its schedules within 1.9% in 30 s (gpt2, 236 nodes; the others within 0.3%).

On a GPU (--cuda; experiments/results/against_pytorch_cuda.csv, an H200 with torch 2.11): models at
`machine.GPU_SIZES`, op costs measured in the keep-everything replay with CUDA events, the link that of cuda:0 to
pinned host memory; peaks from cuda:0's allocator for every side (a schedule's host copies are in host memory);
step times are wall times to the end of the GPU's work. There optsched's gradients equal eager's bitwise on mlp and
gpt2 (within 2e-7 on the transformer), while torch.compile's differ by up to 4e-3; but at a 50% target the replay's
measured peak is above the budget (gpt2 +18%, mlp +60%; the ledger keeps to it), and there the op-by-op replay takes
1.35-2.93x eager's step time where torch.compile at its nearest budget takes 0.83-1.02x. On an H100 after the
replay called the host less per op (against_pytorch_cuda_h100.csv, at 4db1bea, the command in its first line): the
transformer's MILP schedule at torch.compile's 50%-budget peak (0.80 of eager's) takes 1.27x eager's step (1.73x on
the H200 before), torch.compile 0.99x; at 50% of eager's peak, 1.45x (2.04x before). The mlp at a 50% target holds
0.70 of eager's peak at 1.60x (torch.compile: 0.87 at every budget); GPT-2 0.53 at 2.68x, torch.compile 0.55 at
0.81x.

    .venv/bin/python experiments/against_pytorch.py          # writes experiments/results/against_pytorch_cpu.csv, .png
    .venv/bin/python experiments/against_pytorch.py --quick  # mlp only, small, into the temp directory
    python experiments/against_pytorch.py --cuda --models transformer,mlp,gpt2 --budgets 1.0,0.5,0.0 \
        --fractions 0.5 --solvers heuristic,milp --time-limit 5 --steps 5 -o .../against_pytorch_cuda_h100.csv
"""

from __future__ import annotations

import argparse
import csv
import itertools
import math
import os
import statistics
import sys
import tempfile
import time
import traceback
import types

import torch
import torch._dynamo
from machine import GPU_SIZES, cpu_model, gpu_model

from optsched.capture import capture_step, measure_cpu
from optsched.capture.memory import _resident, cpu_allocation_levels
from optsched.capture.models import BUILTIN
from optsched.capture.trace import _WithLoss
from optsched.cluster import single_accelerator
from optsched.errors import InfeasibleError
from optsched.execute import Replayer, cpu_as_accelerator, measure_copy, measure_copy_issue, measure_costs
from optsched.graph import Graph
from optsched.solvers import solve

RESULTS = os.path.join(os.path.dirname(__file__), "results")
# sizes at which one eager step takes 8-40 ms on one core of the project machine and activations outweigh weights
SIZES = {"mlp": dict(batch=1024, width=256, depth=6), "cnn": dict(batch=16),
         "transformer": dict(batch=8, seq=64, d=128), "gpt2": dict(batch=4, seq=128)}
BUDGETS = (1.0, 0.8, 0.6, 0.5, 0.4, 0.3, 0.0)
SOLVERS = ("milp", "milp/recompute-only", "heuristic")
COMPILE_FALLBACK = "aot_eager_decomp_partition"


def example(name: str, quick: bool = False, device: str = "cpu") -> dict:
    """A built-in model at the experiment's size (the built-in default under --quick; `GPU_SIZES` on CUDA), seeded,
    on `device`."""
    torch.manual_seed(0)
    sizes = {} if quick else (GPU_SIZES if device == "cuda" else SIZES).get(name, {})
    ex = BUILTIN[name](**sizes)
    return {**ex, "model": ex["model"].to(device), "inputs": tuple(t.to(device) for t in ex["inputs"]),
            "targets": tuple(t.to(device) for t in ex["targets"])}


def _cuda(tensors) -> bool:
    return any(t.is_cuda for t in tensors)


def _sync(cuda: bool) -> None:
    if cuda:
        torch.cuda.synchronize()


def _allocation_levels(fn, cuda: bool) -> tuple[int, int]:
    """(peak, held when it returns) of the device allocator's bytes while `fn()` runs, above the level before it:
    the CPU allocator's (profiled), or cuda:0's (`max_memory_allocated`, after a synchronize either side)."""
    if not cuda:
        return cpu_allocation_levels(fn)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    start = torch.cuda.memory_allocated()
    fn()
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated() - start, torch.cuda.memory_allocated() - start


def _measure(run, model, tensors, steps: int, warmup: int = 1) -> tuple[int, float, list[float]]:
    """(peak bytes of one step, median step seconds, the step times); `.grad` is None before every step. The time is
    the process's CPU time on the CPU, the wall time to the end of the GPU's work on CUDA."""
    cuda = _cuda(tensors)
    for _ in range(warmup):
        model.zero_grad(set_to_none=True)
        run()
    model.zero_grad(set_to_none=True)
    peak = _resident(model, tensors) + _allocation_levels(run, cuda)[0]
    times = []
    clock = time.perf_counter if cuda else time.process_time
    for _ in range(steps):
        model.zero_grad(set_to_none=True)
        _sync(cuda)
        t = clock()
        run()
        _sync(cuda)
        times.append(clock() - t)
    model.zero_grad(set_to_none=True)
    return peak, statistics.median(times), times


def _grads(model) -> list[torch.Tensor | None]:
    return [None if p.grad is None else p.grad.detach().clone() for p in model.parameters()]


def _errors(loss: float, grads, ref: dict) -> tuple[float, float]:
    """Relative loss error and the largest gradient error relative to that gradient's largest entry."""
    worst = 0.0
    for g, r in zip(grads, ref["grads"], strict=True):
        if (g is None) != (r is None):
            return abs(loss - ref["loss"]) / max(abs(ref["loss"]), 1e-12), math.inf
        if r is not None:
            worst = max(worst, float((g - r).abs().max()) / max(float(r.abs().max()), 1e-12))
    return abs(loss - ref["loss"]) / max(abs(ref["loss"]), 1e-12), worst


def eager_step(model, inputs: tuple, targets: tuple, loss_fn, steps: int = 5) -> dict:
    """Plain `loss.backward()`: loss, gradients, peak, median step time and the step as `run` (the reference for
    both sides)."""
    wl = _WithLoss(model, loss_fn, len(inputs))
    model.zero_grad(set_to_none=True)
    loss = wl(*inputs, *targets)[0]
    loss.backward()
    ref = {"loss": float(loss.detach()), "grads": _grads(model)}
    run = lambda: wl(*inputs, *targets)[0].backward()
    peak, step_s, times = _measure(run, model, inputs + targets, steps)
    held = _held_after_forward(lambda: wl(*inputs, *targets)[0], model, _cuda(inputs))
    return {**ref, "peak": peak, "step_s": step_s, "times": times, "held": held, "run": run}


def _held_after_forward(forward, model, cuda: bool) -> int:
    """Bytes the forward leaves allocated for the backward (what activation_memory_budget limits), not the peak."""
    model.zero_grad(set_to_none=True)
    box = {}
    held = _allocation_levels(lambda: box.setdefault("loss", forward()), cuda)[1]
    box.pop("loss").backward()
    model.zero_grad(set_to_none=True)
    return held


def compiled_step(model, inputs: tuple, targets: tuple, loss_fn, budget: float, *, backend: str = "inductor",
                  steps: int = 5, ref: dict | None = None) -> dict:
    """`torch.compile` forward + loss under `activation_memory_budget=budget`, then `.backward()`; measured.

    Falls back to `COMPILE_FALLBACK` when `backend` fails to compile (the result says which ran and why). With
    `ref` (from `eager_step`) it also reports the loss and gradient errors against eager.
    """
    errors = []
    for name in dict.fromkeys((backend, COMPILE_FALLBACK)):
        try:
            out = _compiled_with(name, model, inputs, targets, loss_fn, budget, steps, ref)
        except Exception as e:  # an inductor build failure surfaces as any of several exception types
            errors.append(f"{name}: {type(e).__name__}: {(str(e).splitlines() or [''])[0][:200]}")
            print(f"  torch.compile backend {errors[-1]}", file=sys.stderr)
            continue
        return {**out, "compile_error": "; ".join(errors)}
    raise RuntimeError(f"torch.compile failed with every backend: {'; '.join(errors)}")


def _compiled_with(backend: str, model, inputs, targets, loss_fn, budget, steps, ref) -> dict:
    import torch._functorch.config as fconfig

    wl = _WithLoss(model, loss_fn, len(inputs))
    # the partitioner reads the budget when the first call compiles the joint graph
    with fconfig.patch(activation_memory_budget=budget):
        fn = torch.compile(_fresh(lambda *a: wl(*a)[0]), backend=backend, fullgraph=True)
        model.zero_grad(set_to_none=True)
        t = time.perf_counter()
        loss = fn(*inputs, *targets)
        loss.backward()
        out = {"budget": budget, "backend": backend, "compile_s": time.perf_counter() - t,
               "loss": float(loss.detach()), "grads": _grads(model)}
    if ref is not None:
        out["loss_err"], out["grad_err"] = _errors(out["loss"], out["grads"], ref)
    out["run"] = lambda: fn(*inputs, *targets).backward()
    out["peak"], out["step_s"], out["times"] = _measure(out["run"], model, inputs + targets, steps)
    out["held"] = _held_after_forward(lambda: fn(*inputs, *targets), model, _cuda(inputs))
    return out


_FRESH = itertools.count()


def _fresh(fn):
    """`fn` with a code object of its own. Dynamo keeps compiled code per code object, and its guards do not
    include the functorch config: a step compiled under one budget stays callable beside the others (no
    `torch._dynamo.reset()`), so all of them can be timed in turns."""
    code = fn.__code__.replace(co_name=f"step_{next(_FRESH)}")
    return types.FunctionType(code, fn.__globals__, code.co_name, fn.__defaults__, fn.__closure__)


def optsched_step(model, step, graph: Graph, inputs: tuple, targets: tuple, budget: int, solver: str, *,
                  link: dict | None = None, time_limit: float = 30.0, steps: int = 5,
                  ref: dict | None = None) -> dict:
    """Solve `graph` for `budget` bytes on gpu0 with `solver` (`NAME/recompute-only` forbids swapping), replay the
    schedule where the model is (the CPU, or cuda:0) and measure it as `compiled_step` does; status "infeasible"
    when no schedule fits. `link`: `single_accelerator`'s bandwidth, latency and issue (default the CPU's copy
    bandwidth)."""
    cluster = single_accelerator(int(budget), **(link or {"bandwidth": measure_cpu().bandwidth}))
    name, _, variant = solver.partition("/")
    t = time.perf_counter()
    try:
        schedule = solve(graph, cluster, name, time_limit=time_limit, swap=variant != "recompute-only")
    except InfeasibleError as e:
        return {"solver": solver, "budget_bytes": int(budget), "status": "infeasible", "message": e.message}
    solve_s = time.perf_counter() - t
    replay = Replayer(model, step, graph, cluster, schedule)
    pred = replay.predicted
    model.zero_grad(set_to_none=True)
    first = replay.run(inputs, targets)
    status = schedule.report.status if schedule.report else "ok"
    out = {"solver": solver, "budget_bytes": int(budget), "status": status, "solve_s": solve_s,
           "message": schedule.report.message if schedule.report else "",
           "gap": schedule.report.gap if schedule.report and schedule.report.gap is not None else "",
           "loss": first.loss, "device_peak": first.peak_with_model_tensors["gpu0"], "ledger": first.peak["gpu0"],
           "predicted_peak": pred.peak["gpu0"],
           "predicted_step_s": pred.makespan, "recomputed": pred.recomputed, "swap_out_bytes": pred.swap_out_bytes}
    if ref is not None:
        out["loss_err"], out["grad_err"] = _errors(first.loss, _grads(model), ref)
    out["run"] = lambda: replay.run(inputs, targets)
    out["peak"], out["step_s"], out["times"] = _measure(out["run"], model, inputs + targets, steps)
    out["cuda"] = _cuda(inputs)
    return out


def _device_line(argv: list[str], start_load: tuple[float, ...], cuda: bool = False) -> str:
    load = lambda xs: "/".join(f"{x:.2f}" for x in xs)
    where = (f"GPU {gpu_model()} (cuda:0), host CPU {cpu_model()}, {os.cpu_count()} cores; step times are wall "
             "times to the end of the GPU's work (step_cpu_s holds them too)" if cuda else
             f"CPU {cpu_model()}, {os.cpu_count()} cores, torch.set_num_threads(1)")
    return (f"# device: {where}; "
            f"torch {torch.__version__}; "
            f"load average (1/5/15 min) at start {load(start_load)}, at end {load(os.getloadavg())}; "
            f"command: .venv/bin/python experiments/against_pytorch.py"
            f"{' ' if argv else ''}{' '.join(argv)}")


COLUMNS = ["model", "side", "method", "backend", "activation_memory_budget", "target", "status", "budget_bytes",
           "peak_bytes", "device_peak_bytes", "ledger_gpu0_bytes", "predicted_peak_bytes", "peak_fraction_of_eager",
           "held_after_forward_bytes", "step_cpu_s", "overhead", "time_vs_eager", "step_wall_s", "overhead_wall",
           "predicted_step_s", "recomputed", "swap_out_bytes", "loss_err", "grad_err", "compile_s", "solve_s",
           "solver_gap", "step_cpu_times_s", "message"]


def interleaved_times(runs: dict, model, rounds: int, warmup: int = 1,
                      cuda: bool = False) -> dict[object, dict[str, list[float]]]:
    """Step times taken in turns, one step of every run per round, so a change of load falls on all runs alike;
    per run, the process CPU times ("cpu") and wall times ("wall") in round order. `.grad` is None before every
    step. On CUDA each step is timed from a synchronized GPU to the end of its work, and "cpu" is that wall time:
    the host thread's CPU time does not measure a GPU's step."""
    times = {k: {"cpu": [], "wall": []} for k in runs}
    for r in range(warmup + rounds):
        for k, run in runs.items():
            model.zero_grad(set_to_none=True)
            _sync(cuda)
            w, c = time.perf_counter(), time.process_time()
            run()
            _sync(cuda)
            c, w = time.process_time() - c, time.perf_counter() - w
            c = w if cuda else c
            if r >= warmup:
                times[k]["cpu"].append(c)
                times[k]["wall"].append(w)
    model.zero_grad(set_to_none=True)
    return times


def _ratio(times: list[float], base: list[float]) -> float:
    """Median over rounds of the time against the baseline's time in the same round."""
    return statistics.median(t / b for t, b in zip(times, base, strict=True))


def run_model(name: str, args) -> list[dict]:
    """Every row of one model: eager, torch.compile at each budget, optsched at each matched peak; then all their
    steps timed in turns."""
    ex = example(name, args.quick, args.device)
    model, inputs, targets, loss_fn = ex["model"], tuple(ex["inputs"]), tuple(ex["targets"]), ex["loss_fn"]
    cuda = args.device == "cuda"
    eager = eager_step(model, inputs, targets, loss_fn, steps=1)
    base = {"model": name}
    rows = [{**base, "side": "eager", "method": "loss.backward()", "status": "ok", "peak_bytes": eager["peak"],
             "device_peak_bytes": eager["peak"], "held_after_forward_bytes": eager["held"]}]
    runs = {0: eager["run"]}
    print(f"{name}: eager peak {eager['peak'] / 1e6:.2f} MB", file=sys.stderr)
    compiled = []
    for b in args.budgets:
        c = compiled_step(model, inputs, targets, loss_fn, b, backend=args.backend, steps=1, ref=eager)
        compiled.append(c)
        runs[len(rows)] = c["run"]
        rows.append({**base, "side": "pytorch", "method": "torch.compile+activation_memory_budget",
                     "backend": c["backend"], "activation_memory_budget": b, "status": "ok", "peak_bytes": c["peak"],
                     "device_peak_bytes": c["peak"], "held_after_forward_bytes": c["held"],
                     "loss_err": c["loss_err"], "grad_err": c["grad_err"], "compile_s": c["compile_s"],
                     "message": c["compile_error"]})
        print(f"  torch.compile[{c['backend']}] budget {b:.2f}: peak {c['peak'] / 1e6:.2f} MB (held after forward "
              f"{c['held'] / 1e6:.2f} MB), grad err {c['grad_err']:.1e}", file=sys.stderr)

    if cuda:   # the "cuda" costs as the replay spends them on cuda:0 (CUDA events); the link to pinned host memory
        step, graph = capture_step(model, inputs, loss_fn, targets=targets)
        graph = measure_costs(model, step, graph, inputs, targets, device="cuda")
        bandwidth, latency = measure_copy("cuda")
        link = {"bandwidth": bandwidth, "latency": latency, "issue": measure_copy_issue("cuda")}
    else:
        step, graph = capture_step(model, inputs, loss_fn, targets=targets, profile=True)
        graph = cpu_as_accelerator(graph)
        link = {"bandwidth": measure_cpu().bandwidth}
    keep = optsched_step(model, step, graph, inputs, targets, 2**40, "keep-everything", link=link, steps=1,
                         ref=eager)
    runs[len(rows)] = keep["run"]
    rows.append({**base, "side": "optsched", "method": "keep-everything", "target": "unbounded", **_opt_row(keep)})
    goals = {}  # budget bytes -> what it matches
    for c in compiled:
        goals.setdefault(c["peak"], f"torch.compile@{c['budget']:g}")
    for frac in args.fractions:
        goals.setdefault(int(frac * eager["peak"]), f"{frac:.0%} of eager")
    for budget, label in sorted(goals.items(), reverse=True):
        amb = next((c["budget"] for c in compiled if c["peak"] == budget), "")
        for solver in args.solvers:
            try:
                r = optsched_step(model, step, graph, inputs, targets, budget, solver, link=link,
                                  time_limit=args.time_limit, steps=1, ref=eager)
            except Exception as e:   # an executor fault: recorded in its row, the other rows still run
                traceback.print_exc()
                rows.append({**base, "side": "optsched", "method": solver, "activation_memory_budget": amb,
                             "target": label, "budget_bytes": budget, "status": "error",
                             "message": f"{type(e).__name__}: {e}"[:300]})
                continue
            if "run" in r:
                runs[len(rows)] = r["run"]
            rows.append({**base, "side": "optsched", "method": solver, "activation_memory_budget": amb,
                         "target": label, **_opt_row(r)})
            msg = (f"peak {r['peak'] / 1e6:.2f} MB (gpu0 {r['device_peak'] / 1e6:.2f}), solved in {r['solve_s']:.1f}"
                   f" s, {r['status']}" if r["status"] != "infeasible" else "infeasible")
            print(f"  optsched {solver} at {budget / 1e6:.2f} MB ({label}): {msg}", file=sys.stderr)

    print(f"  timing {len(runs)} steps in {args.steps} rounds", file=sys.stderr)
    times = interleaved_times(runs, model, args.steps, cuda=cuda)
    own = {"eager": 0, "pytorch": next(k for k, r in enumerate(rows) if r.get("activation_memory_budget") == 1.0),
           "optsched": next(k for k, r in enumerate(rows) if r["method"] == "keep-everything")}
    for k, r in enumerate(rows):
        r["peak_fraction_of_eager"] = r["device_peak_bytes"] / eager["peak"] if "device_peak_bytes" in r else ""
        if k in times:
            cpu, wall, base = times[k]["cpu"], times[k]["wall"], times[own[r["side"]]]
            r["step_cpu_times_s"] = cpu
            r["step_cpu_s"], r["step_wall_s"] = statistics.median(cpu), statistics.median(wall)
            r["overhead"] = _ratio(cpu, base["cpu"]) - 1
            r["overhead_wall"] = _ratio(wall, base["wall"]) - 1
            r["time_vs_eager"] = _ratio(cpu, times[0]["cpu"])
    torch._dynamo.reset()  # the compiled steps of this model are done with
    return rows


def _opt_row(r: dict) -> dict:
    if r["status"] == "infeasible":
        return {"budget_bytes": r["budget_bytes"], "status": "infeasible", "message": r["message"]}
    return {"budget_bytes": r["budget_bytes"] if r["budget_bytes"] < 2**40 else "", "status": r["status"],
            "peak_bytes": r["peak"],
            "device_peak_bytes": r["peak"] if r["swap_out_bytes"] == 0 or r["cuda"] else r["device_peak"],
            "ledger_gpu0_bytes": r["ledger"], "predicted_peak_bytes": r["predicted_peak"],
            "predicted_step_s": r["predicted_step_s"], "recomputed": r["recomputed"],
            "swap_out_bytes": r["swap_out_bytes"], "loss_err": r["loss_err"], "grad_err": r["grad_err"],
            "solve_s": r["solve_s"], "solver_gap": r["gap"], "message": r["message"]}


def write_csv(rows: list[dict], path: str, first_line: str) -> None:
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with open(path, "w", newline="") as f:
        f.write(first_line + "\n")
        w = csv.DictWriter(f, fieldnames=COLUMNS)
        w.writeheader()
        for r in rows:
            r = dict(r)
            if "step_cpu_times_s" in r:
                r["step_cpu_times_s"] = " ".join(f"{t:.6f}" for t in r["step_cpu_times_s"])
            w.writerow(r)


def read_csv(path: str) -> tuple[str, list[dict]]:
    """The first (comment) line and the rows of a CSV this script wrote, numbers as numbers."""
    with open(path, newline="") as f:
        first = f.readline().rstrip("\n")
        rows = []
        for r in csv.DictReader(f):
            for k, v in r.items():
                try:
                    r[k] = float(v) if k != "step_cpu_times_s" else [float(x) for x in v.split()]
                except ValueError:
                    pass
            rows.append(r)
    return first, rows


def headline(rows: list[dict]) -> str:
    """Per model, the rows nearest 50% of the eager peak: PyTorch's closest budget and each solver at 50%."""
    lines = [f"{'model':12s} {'method':40s} {'peak MB':>8s} {'of eager':>8s} {'overhead':>8s} {'vs eager':>8s}"]
    for model in dict.fromkeys(r["model"] for r in rows):
        mine = [r for r in rows if r["model"] == model]
        eager = next(r for r in mine if r["side"] == "eager")
        torch_rows = [r for r in mine if r["side"] == "pytorch"]
        best = min(torch_rows, key=lambda r: abs(r["device_peak_bytes"] / eager["peak_bytes"] - 0.5))
        picked = [best] + [r for r in mine if r["side"] == "optsched" and r.get("target") == "50% of eager"]
        for r in picked:
            what = r["method"] + (f" @{r['activation_memory_budget']:g}" if r["side"] == "pytorch" else "")
            if r["status"] in ("infeasible", "error"):
                at = format(r["budget_bytes"] / 1e6, ".2f")
                lines.append(f"{model:12s} {what:40s} {r['status'] + ' at ' + at:>8s}")
                continue
            lines.append(f"{model:12s} {what:40s} {r['device_peak_bytes'] / 1e6:8.2f} "
                         f"{r['device_peak_bytes'] / eager['peak_bytes']:8.0%} {r['overhead']:+8.1%} "
                         f"{r['time_vs_eager']:8.2f}x")
    return "\n".join(lines)


def plot(rows: list[dict], path: str, title: str) -> None:
    """Per model: step-time overhead (%) against measured peak memory (MB), one line per method, each drawn in the
    order of its budgets (largest first), since a measured peak need not fall with the budget."""
    import textwrap

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    models = list(dict.fromkeys(r["model"] for r in rows))
    ncol = min(len(models), 2)
    nrow = math.ceil(len(models) / ncol)
    fig, axes = plt.subplots(nrow, ncol, figsize=(6.2 * ncol, 4.3 * nrow + 1.2), squeeze=False)
    styles = {"torch.compile+activation_memory_budget": ("C0", "o", "-"), "milp": ("C1", "s", "-"),
              "milp/recompute-only": ("C2", "^", "--"), "heuristic": ("C3", "D", ":")}
    labels = {"torch.compile+activation_memory_budget": "torch.compile + activation_memory_budget (labels: budget)",
              "milp": "optsched milp (gpu0 with the model's tensors; its host copies excluded)",
              "milp/recompute-only": "optsched milp/recompute-only (no swapping)",
              "heuristic": "optsched heuristic (gpu0 with the model's tensors; its host copies excluded)"}
    for ax, model in zip(axes.flat, models, strict=False):
        mine = [r for r in rows if r["model"] == model and r["status"] not in ("infeasible", "error")
                and r.get("overhead") not in ("", None)]
        eager = next(r for r in mine if r["side"] == "eager")
        for method, (color, marker, ls) in styles.items():
            order = (lambda r: -r["activation_memory_budget"]) if method.startswith("torch") else \
                (lambda r: -r["budget_bytes"])
            pts = [(r["device_peak_bytes"] / 1e6, 100 * r["overhead"], r["activation_memory_budget"])
                   for r in sorted((r for r in mine if r["method"] == method), key=order)]
            if not pts:
                continue
            ax.plot([p[0] for p in pts], [p[1] for p in pts], color=color, marker=marker, ls=ls,
                    label=labels[method])
            if method.startswith("torch"):
                for x, y, b in pts:
                    ax.annotate(f"{b:g}", (x, y), textcoords="offset points", xytext=(5, 3), fontsize=7, color=color)
        ax.axvline(eager["peak_bytes"] / 1e6, color="grey", lw=0.8)
        ax.axvline(eager["peak_bytes"] / 2e6, color="grey", lw=0.8, ls="--")
        ax.set_title(f"{model} (grey: eager peak; dashed: half of it)", fontsize=9)
        ax.set_xlabel("measured peak memory of the budgeted device (MB)")
        ax.set_ylabel("overhead over own keep-everything (%)")
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(models):]:
        ax.axis("off")
    handles, names = axes.flat[0].get_legend_handles_labels()
    fig.legend(handles, names, loc="lower center", ncol=2, fontsize=8, frameon=False)
    clock = "wall time to the end of the GPU's work" if "GPU" in title else "process CPU time"
    fig.suptitle(textwrap.fill(f"Step time ({clock}) against peak memory, each side against its own "
                               "keep-everything step. " + title, 170 * ncol // 2), fontsize=7)
    fig.tight_layout(rect=(0, 0.07 if nrow > 1 else 0.12, 1, 1))
    fig.savefig(path, dpi=130)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default=None, help="comma-separated built-ins (default mlp,cnn,transformer,gpt2)")
    ap.add_argument("--budgets", default=None, help=f"activation_memory_budget values (default {BUDGETS})")
    ap.add_argument("--fractions", default="0.75,0.5",
                    help="optsched budgets as fractions of the eager peak, besides the measured PyTorch peaks")
    ap.add_argument("--solvers", default=",".join(SOLVERS))
    ap.add_argument("--backend", default="inductor")
    ap.add_argument("--steps", type=int, default=10, help="timed steps per run (median)")
    ap.add_argument("--time-limit", type=float, default=30.0, help="MILP seconds per solve")
    ap.add_argument("--quick", action="store_true", help="mlp at its default size, budgets 1.0,0.5,0.0, MILP 5 s")
    ap.add_argument("--cuda", action="store_true", help="run on cuda:0 (models at GPU_SIZES; GPU allocator peaks, "
                    "wall times to the end of the GPU's work)")
    ap.add_argument("-o", "--output", default=None, help="CSV path; the figure goes beside it as .png")
    ap.add_argument("--plot", metavar="CSV", help="only redraw the figure of a CSV this script wrote")
    args = ap.parse_args(argv)
    if args.plot:
        first, rows = read_csv(args.plot)
        plot(rows, os.path.splitext(args.plot)[0] + ".png", first.lstrip("# "))
        print(headline(rows))
        return 0
    args.models = (args.models or ("mlp" if args.quick else "mlp,cnn,transformer,gpt2")).split(",")
    args.budgets = [float(b) for b in args.budgets.split(",")] if args.budgets else \
        ([1.0, 0.5, 0.0] if args.quick else list(BUDGETS))
    if 1.0 not in args.budgets:
        args.budgets.insert(0, 1.0)  # the PyTorch side's own baseline
    args.solvers = args.solvers.split(",")
    args.fractions = [float(f) for f in args.fractions.split(",") if f]
    if args.quick:
        args.time_limit, args.steps = min(args.time_limit, 5.0), min(args.steps, 3)
    args.device = "cuda" if args.cuda else "cpu"
    output = args.output or (os.path.join(tempfile.gettempdir(), f"against_pytorch_{args.device}_quick.csv")
                             if args.quick else os.path.join(RESULTS, f"against_pytorch_{args.device}.csv"))
    if not args.cuda:
        torch.set_num_threads(1)
    start_load = os.getloadavg()
    rows = []
    for name in args.models:
        if name in ("gpt2", "bert"):
            try:
                import transformers  # noqa: F401
            except ImportError:
                print(f"{name}: skipped, transformers is not installed", file=sys.stderr)
                continue
        rows += run_model(name, args)
        device_line = _device_line(argv, start_load, args.cuda)
        write_csv(rows, output, device_line)   # the models so far
    png = os.path.splitext(output)[0] + ".png"
    plot(rows, png, device_line.lstrip("# "))
    print(headline(rows))
    print(f"wrote {output} and {png}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
