"""Replay a schedule on real tensors: the instruction list of the schedule contract, op by op.

The traced joint graph (`capture.trace.Step`) gives each node's ATen call.
`Replayer` walks the schedule once per training step:
- `compute v @ d`: run v's op on d's torch device with its inputs resident
  there (views are re-derived from their storage owner when read, never
  stored); a parameter or data input is placed on d (no copy when it already
  lives there); a multi-output op keeps, from its primary output's run, the
  other outputs the schedule computes on d before that primary runs again, in
  a stash the ledger counts (rerunning the op for each would cost a whole
  batch-norm or convolution backward: 10-16 a step in the cnn's heuristic and
  MILP schedules, which place the small secondaries apart), where the budget
  has room for it (`_plan_stash`; always, in a graph whose outputs name their
  maker, `Node.output_of`, as the simulator then counts them so), and reruns
  the op for an output it could not keep or whose stash went with its freed
  primary. Where the step also
  runs on a GPU, the host's computations run on a thread of their own
  (`host_thread`): on the main thread, which issues the GPUs' work, a host
  op would hold that work back for as long as it runs, where the simulator
  has the host compute beside the GPUs (with the model held, the
  heuristic's schedule of the GPU-sized mlp at 50% computes 13 backward ops
  on the host);
- `copy v a->b`: a real copy (a clone when both map to one torch device, so
  memory behaves as on two devices); host-bound copies from CUDA go into
  pinned buffers reused across steps, on one CUDA stream per link, and a
  value the host computes for a GPU is copied into one as it is made (a copy
  from pageable memory blocks the thread that issues it); when both
  ends map to the CPU the copy runs on the link's worker thread, the CPU's
  copy stream (torch releases the GIL while it copies, so with one torch
  thread one core computes while another copies; handing a copy over costs
  the computing thread some 30-120 us, `measure_copy_issue`, a `Link.issue`);
- `free v @ d`: drop the tensor; on CUDA `record_stream` keeps the caching
  allocator from reusing it before every stream that read it is done, and a
  pinned host buffer goes back to its pool with an event of each stream that
  read it, for the next copy into it to wait on;
- `sync`: wait for every stream: the CPU's copy workers on the host, CUDA
  streams on the GPU, so the host keeps queueing work ahead of the GPU (a
  host-side synchronize per MILP stage: 41.8 ms a step instead of 19.7 for
  the GPU-sized transformer at 100% on an H200). Only a stream that got work
  since the last sync records a mark, only where another stream gets work
  later, and the others wait for it when they next get work: a replay keeps
  ahead of the GPU only on large ops, elsewhere every call on the host is
  step time, and a mark on every stream and a wait for each pair at each of
  the MILP's hundreds of stages cost that transformer 19.7 ms on the H200
  against 13.1 for the heuristic's schedule of the same work.
On CUDA each device computes on its own stream, and each copy runs on its
link's: a tensor that a copy reads, or that a copy made, carries the event of
the stream that made it, which readers on another stream wait on (the stream
semantics of the simulator); a compute's other readers are computes on its own
stream, in order without one. The replay makes a stream current only when it
moves to another, not around each op: every call per op on the host is step
time wherever the host, not the GPU, bounds the step. A tensor made by a CPU
copy carries the worker's Future instead; readers wait on it, and a worker's
error is raised in the caller.
Instructions are issued in the order the simulator starts them
(`execution_order`), so allocations and releases follow its memory timeline.

At the end the loss is returned, parameter gradients are accumulated into
`.grad` (as `loss.backward()` would), buffer updates are copied into the
buffers, and every tensor of the step is released.

Memory is measured two ways: a ledger of the storages each device holds
(per device, at every instruction, outputs included while they are made) and
the allocator's peak over the step above its level at the start, plus the
parameters, buffers and inputs on that device: on CUDA from
`torch.cuda.max_memory_allocated`, on CPU from the allocator's own peak
(`capture.memory.cpu_allocation_peak`) over all CPU-mapped devices together.
"""

from __future__ import annotations

import functools
import operator
import statistics
import threading
import time
import weakref
from collections.abc import Mapping
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field

import numpy as np
import torch

from ..capture.cost import _median_time, run_op
from ..capture.memory import _resident, cpu_allocation_peak, model_storages
from ..capture.trace import Step, _op_name, fold, has_kernel, is_random
from ..cluster import Cluster
from ..errors import OptschedError
from ..graph import Graph
from ..schedule import Compute, Copy, Free, Schedule, Sync
from ..simulate import SimResult, describe, simulate


class ExecuteError(OptschedError):
    """A schedule, graph or input that does not fit the model being run."""


@dataclass
class StepStats:
    """What one replayed step measured, beside what the simulator predicted."""

    loss: float
    wall_time: float
    peak: dict[str, int]                 # ledger: bytes of storages held per schedule device
    allocator_peak: dict[str, int]       # torch device -> the step's allocator peak (cuda always, cpu on request)
    predicted: SimResult = field(repr=False)
    op_times: dict[int, float] = field(default_factory=dict, repr=False)   # compute instruction -> seconds (timed)
    # the model and the caller hold the parameters and buffers and the step's inputs all step, whatever the schedule
    # frees or swaps out: per schedule device, the peak of its ledger plus those of them on its torch device that
    # no ledger counts at that moment (held by the accelerator there, if any: compare with the budget)
    peak_with_model_tensors: dict[str, int] = field(default_factory=dict)
    # per torch device, the same over all the schedule devices there (compare with `allocator_peak`)
    peak_with_model_tensors_by_torch_device: dict[str, int] = field(default_factory=dict)
    # graph node -> bytes its op allocated and released again while it ran on a GPU (scratch: cuBLAS and reduction
    # buffers, temporaries of composite ops), beyond its outputs (`run(scratch=True)`)
    op_scratch: dict[str, int] = field(default_factory=dict, repr=False)


def device_map(cluster: Cluster, devices: Mapping[str, str] | None = None) -> dict[str, torch.device]:
    """Schedule device -> torch device: accelerators to cuda:0.. while there are GPUs, else the CPU."""
    out: dict[str, torch.device] = {}
    given = dict(devices or {})
    unknown = set(given) - {d.name for d in cluster.devices}
    if unknown:
        raise ExecuteError(f"device map names {sorted(unknown)}, which the cluster does not have",
                           field="devices", hint="map the cluster's devices: " + ", ".join(cluster.device_index))
    gpu = 0
    for d in cluster.devices:
        if d.name in given:
            out[d.name] = torch.device(given[d.name])
        elif d.kind == "cuda" and torch.cuda.is_available() and gpu < torch.cuda.device_count():
            out[d.name] = torch.device("cuda", gpu)
            gpu += 1
        else:
            out[d.name] = torch.device("cpu")
    return out


def check_match(step: Step, graph: Graph) -> None:
    """Refuse a graph that was not captured from this model: every node must be the same FX call."""
    info = graph.meta.get("capture") if isinstance(graph.meta, Mapping) else None
    if not info:
        raise ExecuteError(f"graph {graph.name!r} was not captured from a PyTorch model",
                           hint="capture it with optsched capture (imported graphs cannot be executed)")
    if info.get("optimizer"):
        raise ExecuteError("the graph includes the optimizer update", field="optimizer",
                           hint="capture without --optimizer: the torch optimizer applies the update after the step")
    fx = {n.name: n for n in step.gm.graph.nodes}
    f = fold(step)
    for node in graph.nodes:
        name = info["fx"].get(node.id)
        n = fx.get(name) if name else None
        if n is None or f.owner.get(name) != name:
            raise ExecuteError("the graph does not match the model: no such traced operation",
                               node=node.id, hint="capture the graph again from this model and these input shapes")
        if node.kind not in ("param", "input"):
            target = n.args[0] if n.target is operator.getitem else n
            if _op_name(target) != node.op:
                raise ExecuteError(f"the graph does not match the model: the model runs {_op_name(target)} "
                                   f"where the graph has {node.op}", node=node.id,
                                   hint="capture the graph again from this model and these input shapes")


def _host_wait(ev) -> None:
    """Block this thread until ev's producer is done: a copy worker's Future (raising its error) or a CUDA event."""
    if isinstance(ev, Future):
        ev.result()
    elif ev is not None:
        ev.synchronize()


def _copy_into(dst: torch.Tensor, src: torch.Tensor, ev) -> None:
    """A CPU copy stream's work: wait until the source exists (it may itself be a copy in flight), then copy."""
    _host_wait(ev)
    dst.copy_(src)


def _shutdown(pools: dict, wait: bool = False) -> None:
    for pool in pools.values():
        pool.shutdown(wait=wait)
    pools.clear()


def measure_copy(device: str = "cpu", sizes: tuple[int, int] = (2**12, 2**22), runs: int = 15) -> tuple[float, float]:
    """(bandwidth in bytes/s, latency in s) of a copy as the replay issues it from `device`: on the CPU a fresh
    tensor filled by a copy worker thread and waited for, on CUDA a copy into pinned host memory.

    Timed at two sizes: the difference gives the bandwidth, the small one what is left, the latency (thread
    hand-off, allocation, launch), which dominates the copies of small models.
    """
    dev = torch.device(device)

    def seconds(nbytes: int) -> float:
        src = torch.ones(nbytes // 4, device=dev)
        if dev.type == "cuda":
            dst = torch.empty(src.shape, pin_memory=True)
            return _median_time(lambda: dst.copy_(src, non_blocking=True), runs,
                                sync=lambda: torch.cuda.synchronize(dev))
        with ThreadPoolExecutor(1, thread_name_prefix="optsched-copy measure") as pool:
            return _median_time(lambda: pool.submit(_copy_into, torch.empty_like(src), src, None).result(), runs)

    small, big = sizes
    t_small, t_big = seconds(small), seconds(big)
    bandwidth = (big - small) / max(t_big - t_small, 1e-12)
    return bandwidth, max(t_small - small / bandwidth, 0.0)


def measure_copy_issue(device: str = "cpu", gap: float = 2e-4, copies: int = 40, runs: int = 9) -> float:
    """Seconds of the compute thread each copy costs (`Link.issue`): 0 on CUDA, whose host thread runs ahead of
    the GPU; on the CPU what handing a copy to a link's worker costs the main thread that computes.

    More than the call: the main thread wakes the worker (on a virtual machine, an interrupt to an idle core) and
    the worker takes the GIL from it to start and to finish the copy. Timed as the replay issues a copy (a fresh
    tensor, the worker's `_copy_into`) every `gap` seconds of small operations on the main thread, against the
    same operations without the copies. The cost grows with the gap, as the idle core sleeps deeper: on the 2-core
    machine here 50 us at 10 us apart, 90 at 0.2 ms, 100-120 at 0.7 ms, about the same from 4 KB to 1 MB. The
    default gap is that of the bench's swapping schedules (copies 0.1-0.8 ms apart). Measured without it, a
    transformer step with 41 copies ran 2.5 ms slower with them on the workers than made in turn on the main thread.
    """
    if torch.device(device).type == "cuda":
        return 0.0
    src, a, b = torch.ones(2**14), torch.ones(2**10), torch.ones(2**10)
    per_op = _median_time(lambda: torch.add(a, b), 200)
    ops = max(1, round(gap / max(per_op, 1e-9)))

    def work(pool):
        futures = []
        for _ in range(copies):
            if pool is not None:
                futures.append(pool.submit(_copy_into, torch.empty_like(src), src, None))
            for _ in range(ops):
                torch.add(a, b)
        for f in futures:
            f.result()

    with ThreadPoolExecutor(1, thread_name_prefix="optsched-copy measure") as pool:
        # paired runs, so a change of machine speed meanwhile touches both alike
        pairs = [(_median_time(lambda: work(pool), 1, 0), _median_time(lambda: work(None), 1, 0))
                 for _ in range(runs + 1)][1:]
    return max(0.0, statistics.median(w - wo for w, wo in pairs) / copies)


def execution_order(graph: Graph, schedule: Schedule, sim: SimResult) -> list[int]:
    """Instruction indices in the order the simulator starts them (frees at their release).

    Issuing work in this order makes every allocation and release happen in the simulator's order, so the
    memory held follows its timeline: on CPU, where everything runs in turn, exactly; on CUDA the allocator sees
    the same sequence. At one instant releases go first, except a release the simulator orders after the
    instruction that causes it (a zero-length read or an allocation at that instant); then list order.
    """
    ins = schedule.instructions
    touched: dict[tuple[str, str], float] = {}   # (node, device) -> latest start of a reader or producer
    keys = []
    for i, x in enumerate(ins):
        t = float(sim.start[i])
        if isinstance(x, Compute):
            for src in graph.node(x.node).inputs:
                touched[(src, x.device)] = max(touched.get((src, x.device), t), t)
            touched[(x.node, x.device)] = t
            keys.append((t, 1, i))
        elif isinstance(x, Copy):
            touched[(x.node, x.src)] = max(touched.get((x.node, x.src), t), t)
            touched[(x.node, x.dst)] = t
            keys.append((t, 1, i))
        elif isinstance(x, Free):
            early = touched.pop((x.node, x.device), t) < t
            keys.append((t, 0 if early else 1, i))
        else:
            keys.append((t, 1, i))
    return [i for _, _, i in sorted(keys)]


class Replayer:
    """One schedule bound to one model: `run(inputs, targets)` performs a training step.

    CPU copies run on one worker thread per link, started on first use and kept across steps; `close()` (or
    leaving a `with` block, or collecting the Replayer) stops them. So do the host's computations where the step
    also runs on a GPU (`host_thread`, below).

    `host_thread`: the host's computations run on a thread of their own, so that the main thread goes on issuing
    the GPUs' work meanwhile, as the simulator has the host compute beside them; by default where some device maps
    to a GPU (on the CPU alone the accelerator stands in on the main thread, and the host computes none in the
    benches). Ops with several outputs, random ops and timed steps stay on the main thread.
    """

    def __init__(self, model: torch.nn.Module, step: Step, graph: Graph, cluster: Cluster, schedule: Schedule,
                 devices: Mapping[str, str] | None = None, host_thread: bool | None = None):
        check_match(step, graph)
        sim = simulate(graph, cluster, schedule)
        if not sim.valid:
            raise ExecuteError(f"the schedule is not valid for this graph and cluster: {describe(sim.violation)}",
                               hint="solve again for this budget, or check --mem/--cluster")
        self.model, self.step, self.graph, self.cluster, self.schedule = model, step, graph, cluster, schedule
        self.predicted = sim
        self.dev = device_map(cluster, devices)
        self.fx = {n.name: n for n in step.gm.graph.nodes}
        self.graph_ids = {n.id for n in graph.nodes}
        f = fold(step)
        self.owner = f.owner
        self.op_of: dict[str, torch.fx.Node] = {}   # output node id -> multi-output FX op
        self.index_of: dict[str, int] = {}
        self.primary_of_op = f.primary
        for op, outs in f.outputs.items():
            for o in outs:
                self.op_of[o] = self.fx[op]
                self.index_of[o] = self.fx[o].args[1]
        self.order = execution_order(graph, schedule, sim)
        self.take_next = self._plan_stash(schedule, sim)
        # (module, name) of every parameter and buffer: Module.get_parameter walks the path on each call, tens of
        # microseconds a step per tensor; the tensor itself is read each step (Module.to replaces buffers)
        self.slot = {fqn: (model.get_submodule(fqn.rpartition(".")[0]), fqn.rpartition(".")[2])
                     for fqn in (*step.params.values(), *step.buffers.values())}
        self.source = {}
        for ph, fqn in step.params.items():
            self.source[ph] = ("param", fqn)
        for ph, fqn in step.buffers.items():
            self.source[ph] = ("buffer", fqn)
        for k, ph in enumerate(step.inputs):
            self.source[ph] = ("input", k)
        self._check_kernels(schedule)
        self.output_node = next(n for n in step.gm.graph.nodes if n.op == "output")
        self.shapes = [tuple(self.fx[ph].meta["val"].shape) for ph in step.inputs]
        self.dtypes = [self.fx[ph].meta["val"].dtype for ph in step.inputs]
        self.cuda = any(d.type == "cuda" for d in self.dev.values())
        self.streams: dict[str, torch.cuda.Stream] = {}
        if self.cuda:
            for name, d in self.dev.items():
                if d.type == "cuda":
                    self.streams[name] = torch.cuda.Stream(d)
            for link in cluster.links:
                a, b = self.dev[link.src], self.dev[link.dst]
                side = a if a.type == "cuda" else b
                if side.type == "cuda":
                    self.streams[f"{link.src}->{link.dst}"] = torch.cuda.Stream(side)
        # the CUDA streams that get work after each sync, in issue order: only they need its marks (a MILP schedule
        # without copies, one stream at work, needs none: a mark and its bookkeeping cost some 14 us of host time,
        # 2.5 ms a step for the GPU-sized transformer's 184 stages on an H100)
        self.ahead: dict[int, frozenset] = {}
        later: set = set()
        for k in reversed(self.order):
            x = schedule.instructions[k]
            if isinstance(x, Sync):
                self.ahead[k] = frozenset(later)
            elif isinstance(x, (Compute, Copy)):
                s = self.streams.get(x.device if isinstance(x, Compute) else f"{x.src}->{x.dst}")
                if s is not None:
                    later.add(s)
        # the values a copy reads, by (node, device): only a compute of one of them records a CUDA event, which the
        # copy's stream waits for; a compute's other readers are computes on its own stream, which runs in order
        self.copied = {(x.node, x.src) for x in schedule.instructions if isinstance(x, Copy)}
        # the values the host computes that a copy takes to a GPU: made into a pinned buffer (`_staged`), since a
        # copy from pageable memory blocks the thread that issues it (on an H100, 38 ms a step of the held mlp at
        # 50% by MILP, whose schedule computes 14 backward ops on the host)
        self.staged = {(x.node, x.src) for x in schedule.instructions if isinstance(x, Copy) and
                       x.node not in self.source and self.dev[x.src].type == "cpu" and self.dev[x.dst].type == "cuda"}
        self.pinned: dict[tuple, list[torch.Tensor]] = {}
        self.pinned_lock = threading.Lock()   # the host's thread takes buffers too (`_staged`)
        self.where = {d: str(x) for d, x in self.dev.items()}     # schedule device -> its torch device's name
        self.same: dict[str, list[str]] = {}       # torch device -> the schedule devices on it
        for d, w in self.where.items():
            self.same.setdefault(w, []).append(d)
        self.inputs_of = {n.id: n.inputs for n in graph.nodes}
        self.source_bytes = {v: graph.node(v).bytes for v in self.source}
        # the schedule device that holds the model's tensors on each torch device: its accelerator, if any
        kind = {x.name: x.kind for x in cluster.devices}
        self.keeper = {w: next((d for d in ds if kind[d] == "cuda"), ds[0]) for w, ds in self.same.items()}
        self.pools: dict[str, ThreadPoolExecutor] = {}   # CPU copy streams by link, the host's compute thread
        self.pending: list[Future] = []                  # CPU copies and host computes issued since the last sync
        # (node, device) of the computes that run on the host's thread (`host_thread`), found once
        on_thread = {x.name for x in cluster.devices if (self.cuda if host_thread is None else host_thread)
                     and x.kind == "cpu" and self.dev[x.name].type == "cpu"}
        self.threaded = {(x.node, x.device) for x in schedule.instructions
                         if isinstance(x, Compute) and x.device in on_thread and x.node not in self.source
                         and x.node not in self.op_of and not is_random(self.fx[x.node])}
        self.timing = False
        self.scratch = False                             # `run(scratch=True)`: measure each op's scratch on GPUs
        self.op_scratch: dict[str, int] = {}
        self.busy: set = set()                           # CUDA streams given work since the last sync
        self.owed: dict = {}                             # CUDA stream -> {other stream: its mark at the last sync}
        self.on: dict = {}                               # CUDA device index -> the stream the step made current
        self.callers: dict = {}                          # CUDA device index -> the caller's current stream there
        self.home = None                                 # the caller's current CUDA device, while the step runs
        weakref.finalize(self, _shutdown, self.pools)

    def close(self) -> None:
        """Stop the copy workers and the host's compute thread; a later `run` starts them again."""
        _shutdown(self.pools, wait=True)

    def __enter__(self) -> Replayer:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _check_kernels(self, schedule: Schedule) -> None:
        """Refuse, before anything runs, a compute whose op has no kernel where it is placed (a graph captured on
        the CPU, replayed on a GPU, or the other way round: `capture.trace.has_kernel`)."""
        seen = set()
        for x in schedule.instructions:
            if not isinstance(x, Compute) or x.node in self.source:
                continue
            op = self.op_of.get(x.node) or self.fx[x.node]
            where = self.dev[x.device]
            if (op.target, where.type) in seen:
                continue
            seen.add((op.target, where.type))
            if not has_kernel(op, where.type):
                raise ExecuteError(f"it runs {_op_name(op)} on {x.device} ({where}), which has no kernel for it",
                                   node=x.node,
                                   hint=f"capture the model on {where.type}, or map {x.device} to another device "
                                        "(--device-map)")

    def _plan_stash(self, schedule: Schedule, sim: SimResult) -> dict[int, list[str]]:
        """For each compute of a multi-output primary: the other outputs the schedule computes on its device
        before the primary's next compute there, which are handed over from this run. The graph has such an output
        made apart from its primary at no cost, which no op does: held from the primary's run, it takes memory the
        simulator does not count until its own compute; made by running the op again, it takes time, and the op's
        other outputs while it runs. So an output is held where the budget has room for it beside the predicted
        memory until then, and elsewhere where holding it goes less over the budget than running the op again would
        (a MILP schedule of the bench-sized cnn at 70% computes max-pool's 2 MB of indices late: held from the
        pool's run, the replay went 15% over the predicted peak and 13% over the budget; now the pool runs again
        for them, and the replay's peak is the predicted one). A graph whose such outputs name their primary
        (`Node.output_of`, as every capture now does) has the simulator count them from the primary's run, so
        they are always held."""
        plan: dict[int, list[str]] = {}
        last: dict[tuple[str, str], int] = {}   # (op, device) -> the primary's latest compute so far
        wanted, seen = [], set()                # (primary's compute, output, its compute); their first two
        for k, x in enumerate(schedule.instructions):
            if not isinstance(x, Compute) or x.node not in self.op_of:
                continue
            op = self.op_of[x.node].name
            if self.primary_of_op[op] == x.node:
                plan[k] = []
                last[(op, x.device)] = k
            elif (op, x.device) in last and (last[(op, x.device)], x.node) not in seen:
                seen.add((last[(op, x.device)], x.node))
                wanted.append((last[(op, x.device)], x.node, k))
        held = {d: np.zeros(len(sim.timeline[d][1]), dtype=np.int64) for d in sim.timeline}
        for k, o, k2 in wanted:
            if self.graph.node(o).output_of:    # the simulator counts it from the primary's run: held, as counted
                plan[k].append(o)
                continue
            d, primary = schedule.instructions[k].device, self.graph.node(schedule.instructions[k].node)
            times, level = sim.timeline[d]
            # held from the end of the primary's run (the simulator counts the op's other outputs as its
            # workspace until then) to the output's own compute; the op again, at that compute
            lo, at = np.searchsorted(times, [sim.end[k], sim.start[k2]], "left").tolist()
            hi = int(np.searchsorted(times, sim.start[k2], "right"))
            size = self.graph.node(o).bytes
            again = primary.bytes + primary.workspace - size
            over_held = int((level[lo:at] + held[d][lo:at]).max(initial=-size)) + size - sim.budget[d]
            over_again = int((level[at:hi] + held[d][at:hi]).max(initial=0)) + again - sim.budget[d]
            if over_held <= max(over_again, 0):
                held[d][lo:at] += size
                plan[k].append(o)
            else:
                held[d][at:hi] += again
        return plan

    # -- values -----------------------------------------------------------------------------------------------------

    def _value(self, d: str, n: torch.fx.Node, env=None):
        """The tensor of FX node n on schedule device d (in `env`, d's values, or those an op on the host's thread
        was given): resident, or a view re-derived from its owner."""
        env = self.env[d] if env is None else env
        if n.name in env:
            t = env[n.name][-1][0]
            return t.result() if isinstance(t, Future) else t
        if n.name in self.graph_ids:
            raise ExecuteError(f"{n.name} is read on {d} where it is not resident (an executor bug: the simulator "
                               "accepted this schedule)")
        if n.target is operator.getitem:
            return self._value(d, n.args[0], env)[n.args[1]]
        return self._call(d, n, env)

    def _call(self, d: str, n: torch.fx.Node, env=None):
        if n.op == "get_attr":   # a tensor the forward made from Python values, lifted onto the traced module
            t = self.step.gm
            for part in n.target.split("."):
                t = getattr(t, part)
            return t.to(self.dev[d], non_blocking=True) if isinstance(t, torch.Tensor) else t
        resolve = functools.partial(self._value, d, env=env)
        args = torch.fx.node.map_arg(n.args, resolve)
        kwargs = torch.fx.node.map_arg(n.kwargs, resolve) if n.kwargs else n.kwargs
        if "device" in kwargs:   # factory ops were traced with the capture's device
            kwargs = {**kwargs, "device": self.dev[d]}
        if n.op == "call_method":
            return getattr(args[0], n.target)(*args[1:], **kwargs)
        return n.target(*args, **kwargs)

    # -- bookkeeping ------------------------------------------------------------------------------------------------

    def _put(self, d: str, v: str, t: torch.Tensor, ev, stream=None) -> None:
        """A new copy of v on d, made when ev (None, a CUDA event or a copy worker's Future) is done, by a compute
        on the CUDA `stream`, if any (later work there needs no wait for it). Issued in simulator order, a prefetch
        may land before the list frees the previous copy, so a device holds a list of generations: reads take the
        newest (all hold the same values), a free releases the oldest."""
        self.env[d].setdefault(v, []).append((t, ev, stream))
        counted, storage = self._counted(v, t)
        self.level[d] += counted
        self.peak[d] = max(self.peak[d], self.level[d])
        if self.outside.get(storage) == counted:   # the model's own tensor, now in the ledger
            self.held[storage] = self.held.get(storage, 0) + 1
            if self.held[storage] == 1:
                self.outside_bytes[self.where[d]] -= self.outside[storage]
        self._track(d)

    def _counted(self, v: str, t: torch.Tensor) -> tuple[int, int]:
        """The bytes of v's tensor t in the ledger: its storage's, but no more than the graph gives a parameter or
        an input (none where the model holds them all step: `cluster.hold_sources`); and the storage's address. A
        value the host's thread has still to make (a Future) counts the graph's bytes, as the simulator does."""
        if isinstance(t, Future):
            return self.graph.node(v).bytes, None
        storage = t.untyped_storage()
        nbytes = storage.nbytes()
        return min(nbytes, self.source_bytes[v]) if v in self.source_bytes else nbytes, storage.data_ptr()

    def _track(self, d: str, extra: int = 0) -> None:
        """The peaks with the model's tensors of d (`extra` bytes more on it), of the schedule device that holds
        them on d's torch device, and of that torch device."""
        where = self.where[d]
        out = self.outside_bytes[where]
        same = self.same[where]
        now = (self.level[d] if len(same) == 1 else sum(self.level[x] for x in same)) + out + extra
        self.torch_peak[where] = max(self.torch_peak[where], now)
        keeper = self.keeper[where]
        self.model_peak[d] = max(self.model_peak[d], self.level[d] + extra + (out if d == keeper else 0))
        self.model_peak[keeper] = max(self.model_peak[keeper], self.level[keeper] + out)

    def _drop(self, d: str, v: str) -> None:
        gens = self.env[d][v]
        t, ev, _ = gens.pop(0)
        if not gens:
            del self.env[d][v]
            self._drop_stash(d, v)
        counted, storage = self._counted(v, t)
        self.level[d] -= counted
        if storage in self.held and self.outside[storage] == counted:   # the model's own: it stays, unledgered
            self.held[storage] -= 1
            if not self.held[storage]:
                del self.held[storage]
                self.outside_bytes[self.where[d]] += self.outside[storage]
                self._track(d)
        readers = self.readers.get((d, v), ())
        made = not isinstance(t, Future)
        if made and t.is_cuda:
            for s in readers:
                if not isinstance(s, Future):
                    t.record_stream(s)
        if not gens:
            self.readers.pop((d, v), None)
        pinned = made and self.cuda and t.device.type == "cpu" and t.is_pinned()
        if pinned or not made and (v, d) in self.staged:
            # refilled only once the copy that filled it and every copy reading it are done: a CPU copy's Future,
            # or an event recorded now on each CUDA stream that reads it (its reads were issued before this free)
            waits = [ev, *(s if isinstance(s, Future) else self._recorded(s) for s in readers)]
            if pinned:
                self._pool(t, waits)
            else:   # a buffer the host's thread stages: back in the pool once it is made
                t.add_done_callback(lambda f: f.exception() is None and self._pool(f.result(), waits))

    def _pool(self, t: torch.Tensor, waits: list) -> None:
        with self.pinned_lock:
            self.pinned.setdefault((tuple(t.shape), t.stride(), t.dtype), []).append((t, waits))

    @staticmethod
    def _recorded(stream):
        if stream is None:
            return None
        ev = torch.cuda.Event()
        ev.record(stream)
        return ev

    def _drop_stash(self, d: str, primary: str) -> None:
        for t in self.stash[d].pop(primary, {}).values():
            self.level[d] -= t.untyped_storage().nbytes()

    def _wait_inputs(self, d: str, node_id: str, stream) -> None:
        for src in self.inputs_of[node_id]:
            ev, made_on = self.env[d][src][-1][1:] if src in self.env[d] else (None, None)
            if ev is None or (made_on is not None and made_on is stream):
                continue
            if stream is None or isinstance(ev, Future):
                _host_wait(ev)
            else:
                stream.wait_event(ev)
                self.readers.setdefault((d, src), set()).add(stream)

    # -- instructions -----------------------------------------------------------------------------------------------

    def _work_on(self, stream) -> None:
        """Before new work on a CUDA stream: the waits the syncs since its last work left it, and the stream made
        current on its device where it is not yet (`_put_back` restores the caller's at the end of the step): a
        stream context around each op cost host time, which bounds the replay on a GPU."""
        for ev in self.owed.pop(stream, {}).values():
            stream.wait_event(ev)
        self.busy.add(stream)
        where = stream.device_index
        if self.on.get(where) is not stream:
            if not self.callers:
                self.home = torch.cuda.current_device()
            self.callers.setdefault(where, torch.cuda.current_stream(where))
            torch.cuda.set_stream(stream)       # which makes its device current too
            self.on[where] = stream

    def _put_back(self) -> None:
        """The streams that were current on each device before the step current again, and the device too."""
        if self.callers:
            for stream in self.callers.values():
                torch.cuda.set_stream(stream)
            torch.cuda.set_device(self.home)
        self.callers, self.on = {}, {}

    def _compute(self, k: int, d: str, v: str) -> None:
        if (v, d) in self.threaded and not self.timing:
            self._compute_on_thread(d, v)
            return
        dev = self.dev[d]
        stream = self.streams.get(d)
        if stream is not None:
            self._work_on(stream)
        self._wait_inputs(d, v, stream)
        if v in self.source:
            t = self._source(v).to(dev, non_blocking=True)
        elif v in self.op_of:
            op = self.op_of[v]
            stashed = self.stash[d].get(self.primary_of_op[op.name], {})
            if v in stashed:
                t = stashed.pop(v)
                self.level[d] -= t.untyped_storage().nbytes()  # moves from the stash into the ledger
            else:
                outs = self._run_op(d, v, op)
                t = outs[self.index_of[v]]
                if v == self.primary_of_op[op.name]:
                    self._drop_stash(d, v)
                    # keep the outputs the schedule computes from this run where the budget has room
                    # (`_plan_stash`): held from now, not from their own compute, but the op is not run again
                    rest = {o: outs[self.index_of[o]] for o in self.take_next.get(k, ())}
                    self.stash[d][v] = rest
                    self.level[d] += sum(x.untyped_storage().nbytes() for x in rest.values())
                    self.peak[d] = max(self.peak[d], self.level[d] + t.untyped_storage().nbytes())
                    self._track(d, t.untyped_storage().nbytes())
                else:   # the op again for this output: its other outputs are held while it runs
                    made = sum(x.untyped_storage().nbytes() for x in outs if isinstance(x, torch.Tensor))
                    self.peak[d] = max(self.peak[d], self.level[d] + made)
                    self._track(d, made)
        else:
            t = self._run_op(d, v, self.fx[v])
        if (v, d) in self.staged:
            t = self._staged(t)
        self._put(d, v, t, self._recorded(stream) if (v, d) in self.copied else None, stream)

    def _compute_on_thread(self, d: str, v: str) -> None:
        """v's op on d's own thread (`host_thread`), given its inputs as they are now: a free issued after it
        releases them once the op has run, and a pinned buffer among them is refilled only after that."""
        env = self.env[d]
        given = {u: env[u][-1:] for u in self.inputs_of[v] if u in env}
        pool = self.pools.get(d)
        if pool is None:
            pool = self.pools[d] = ThreadPoolExecutor(1, thread_name_prefix=f"optsched-compute {d}")
        done = pool.submit(self._run_given, d, v, given)
        self.pending.append(done)
        for u in given:
            self.readers.setdefault((d, u), set()).add(done)
        self._put(d, v, done, done)

    def _run_given(self, d: str, v: str, given: dict):
        for entries in given.values():
            _host_wait(entries[-1][1])
        t = self._run_op(d, v, self.fx[v], given)
        return self._staged(t) if (v, d) in self.staged else t

    def _staged(self, t: torch.Tensor) -> torch.Tensor:
        """t copied into a pinned host buffer, which the copy to the GPU then reads without blocking."""
        buf = self._pinned_like(t, None)
        buf.copy_(t)
        return buf

    def _run_op(self, d: str, v: str, n: torch.fx.Node, env=None):
        """n's call for graph node v; in a scratch run on a GPU, also what it allocated and released meanwhile
        (`capture.cost.run_op`)."""
        if not self.scratch:
            return self._call(d, n, env)
        out, extra = run_op(lambda: self._call(d, n, env), self.dev[d])
        if extra:
            self.op_scratch[v] = max(self.op_scratch.get(v, 0), extra)
        return out

    def _source(self, v: str) -> torch.Tensor:
        """The model's parameter or buffer, or the step's input, that source node v stands for."""
        what, key = self.source[v]
        if what == "param":
            return getattr(*self.slot[key]).detach()
        if what == "buffer":
            return getattr(*self.slot[key])
        return self.args[key]

    def _copy(self, v: str, a: str, b: str) -> None:
        if v in self.source and self.graph.node(v).bytes == 0:
            own = self._source(v)
            if own.device == self.dev[b]:   # a held parameter or input (`cluster.hold_sources`): the model keeps
                self._put(b, v, own, None)  # it on b, nothing moves
                return
        src, ev, _ = self.env[a][v][-1]
        if isinstance(src, Future):   # made on the host's thread: the copy starts once it is
            src = src.result()
        da, db = self.dev[a], self.dev[b]
        link = f"{a}->{b}"
        if da.type == db.type == "cpu":
            t = torch.empty_like(src)   # allocated when the copy starts, as the simulator counts it
            pool = self.pools.get(link)
            if pool is None:
                pool = self.pools[link] = ThreadPoolExecutor(1, thread_name_prefix=f"optsched-copy {link}")
            done = pool.submit(_copy_into, t, src, ev)
            self.pending.append(done)
            if self.cuda and src.is_pinned():   # a pinned host buffer, reused for later copies from CUDA
                self.readers.setdefault((a, v), set()).add(done)
            self._put(b, v, t, done)
            return
        stream = self.streams.get(link)
        if stream is not None:
            self._work_on(stream)
        if stream is not None and ev is not None and not isinstance(ev, Future):
            stream.wait_event(ev)
            self.readers.setdefault((a, v), set()).add(stream)
        else:
            _host_wait(ev)
            if stream is not None and (a, v) in self.staged:   # its buffer is refilled only after this copy
                self.readers.setdefault((a, v), set()).add(stream)
        if da == db:
            t = src.clone()
        elif db.type == "cpu" and da.type == "cuda":
            t = self._pinned_like(src, stream)
            t.copy_(src, non_blocking=True)
        else:
            t = src.to(db, non_blocking=True)
        self._put(b, v, t, self._recorded(stream))

    def _pinned_like(self, src: torch.Tensor, stream) -> torch.Tensor:
        """A pinned host buffer for a copy from CUDA on `stream`, or (stream None) for a host-made value
        (`_staged`): a freed one of src's layout (the stream waits for the copies that filled and read it; every
        wait without a stream is waited for here), else a new one. A freed buffer that a thread's work (the host's
        computes, a CPU copy) still has to read stays in the pool: the host's thread would wait for work queued
        behind its own, and the main thread would stop issuing the GPU's work until the host caught up."""
        with self.pinned_lock:
            pool = self.pinned.get((tuple(src.shape), src.stride(), src.dtype), [])
            free = next((i for i in reversed(range(len(pool)))
                         if all(w.done() for w in pool[i][1] if isinstance(w, Future))), None)
            t, waits = pool.pop(free) if free is not None else (None, ())
        if t is not None:
            for ev in waits:
                if stream is not None and isinstance(ev, torch.cuda.Event):
                    stream.wait_event(ev)
                else:
                    _host_wait(ev)
            return t
        return torch.empty_strided(src.shape, src.stride(), dtype=src.dtype, pin_memory=True)

    def _sync(self, host: bool = False, ahead=None) -> None:
        """Wait for every copy and stream; nearly free when nothing is in flight (the MILP syncs after each stage).

        CPU copies are waited for here. CUDA streams wait for one another on the GPU, so the host keeps queueing
        work ahead of the GPU: each stream that got work since the last sync records a mark, which every other
        stream waits for before its next work (`_work_on`; a later mark of the same stream replaces it, since it
        comes after it); `ahead`, the streams that get work after this sync, limits the marks to those a stream will
        wait for. host=True (the end of the step) also waits here until the GPU is done."""
        if self.pending:
            wait(self.pending)   # every CPU copy ends, failed or not, before an error is raised
            pending, self.pending = self.pending, []
            for done in pending:
                done.result()
        if host:
            for d in {x for x in self.dev.values() if x.type == "cuda"}:
                torch.cuda.synchronize(d)
            self.owed = {}
        elif len(self.streams) > 1:
            for s in self.busy:
                others = [o for o in (self.streams.values() if ahead is None else ahead) if o is not s]
                if others:
                    ev = self._recorded(s)
                    for o in others:
                        self.owed.setdefault(o, {})[s] = ev
        self.busy = set()

    # -- the step ---------------------------------------------------------------------------------------------------

    def _check_inputs(self, args: tuple) -> None:
        if len(args) != len(self.shapes):
            raise ExecuteError(f"the step takes {self.step.num_inputs} input(s) and "
                               f"{len(self.shapes) - self.step.num_inputs} target(s), got {len(args)} tensors")
        for k, (t, shape, dtype) in enumerate(zip(args, self.shapes, self.dtypes, strict=True)):
            if not isinstance(t, torch.Tensor) or tuple(t.shape) != shape or t.dtype != dtype:
                got = f"{tuple(t.shape)} {t.dtype}" if isinstance(t, torch.Tensor) else type(t).__name__
                raise ExecuteError(f"argument {k} is {got}; the schedule was made for {shape} {dtype}",
                                   field=f"input {k}", hint="capture and solve again for this input shape")

    def _mark(self, d: str):
        """A point in time on d's compute stream; the CPU's main thread is one stream for every CPU device."""
        stream = self.streams.get(d)
        if stream is None:
            return "cpu", time.perf_counter()
        ev = torch.cuda.Event(enable_timing=True)
        ev.record(stream)
        return d, ev

    def _run(self, inputs: tuple, targets: tuple, timed: bool) -> torch.Tensor:
        names = list(self.dev)
        self.args = inputs + targets
        self.env = {d: {} for d in names}
        self.stash = {d: {} for d in names}
        self.level = dict.fromkeys(names, 0)
        self.peak = dict.fromkeys(names, 0)
        # the storages of the model's parameters and buffers and of the step's inputs on the torch devices of the
        # schedule (data pointer -> bytes): outside the ledger until a compute places one there, and again after
        # the ledger frees it; their pointers stay unique all step, since they stay allocated
        self.outside, self.held = {}, {}
        self.outside_bytes = dict.fromkeys(self.same, 0)
        for ptr, (where, nbytes) in model_storages(self.model, inputs + targets).items():
            if where in self.same:
                self.outside[ptr] = nbytes
                self.outside_bytes[where] += nbytes
        self.torch_peak = dict(self.outside_bytes)
        self.model_peak = {d: self.outside_bytes[self.where[d]] if self.keeper[self.where[d]] == d else 0
                           for d in names}
        self.readers = {}
        self.pending = []
        self.busy, self.owed = set(), {}
        self.timing = timed      # a timed step computes on the main thread, whose clock times each op
        # timed: each compute gets the time its stream advanced since the previous one there, so the dispatch and
        # bookkeeping before the op are charged to it (waits for inputs too: time schedules without copies)
        for stream in self.streams.values():   # what the caller queued before the step (the optimizer's update of
            stream.wait_stream(torch.cuda.current_stream(stream.device))   # the parameters) comes first
        marks = dict(self._mark(d) for d in names) if timed else {}
        self.spans = []
        instructions = self.schedule.instructions
        try:
            for k in self.order:
                ins = instructions[k]
                if isinstance(ins, Compute):
                    self._compute(k, ins.device, ins.node)
                    if timed:
                        key, mark = self._mark(ins.device)
                        self.spans.append((k, marks[key], mark))
                        marks[key] = mark
                elif isinstance(ins, Copy):
                    self._copy(ins.node, ins.src, ins.dst)
                elif isinstance(ins, Free):
                    self._drop(ins.device, ins.node)
                elif isinstance(ins, Sync):
                    self._sync(ahead=self.ahead[k])
            self._put_back()    # the gradients are the caller's: made on its streams
            self._sync(host=True)
            loss = self._finish()
        except BaseException:
            self.env = self.stash = {}   # an abandoned step holds no tensor (an out-of-memory error can be retried)
            raise
        finally:
            self._put_back()
            wait(self.pending)   # no copy outlives the step, even one abandoned by an error
        for d in names:
            for v in list(self.env[d]):
                while v in self.env[d]:
                    self._drop(d, v)
        return loss

    def _where(self, node_id: str) -> str:
        return next(d for d in self.env if node_id in self.env[d])

    def _finish(self) -> torch.Tensor:
        """Loss out, gradients into `.grad`, buffer updates into the buffers."""
        f_owner = self.owner
        outs = {n.name: n for n in self.output_node.all_input_nodes}
        with torch.no_grad():
            for name, fqn in self.step.grads.items():
                p = getattr(*self.slot[fqn])
                g = self._value(self._where(f_owner[name]), outs[name]).to(p.device)
                if p.grad is None:
                    p.grad = g if g.untyped_storage().nbytes() == g.numel() * g.element_size() else g.clone()
                else:
                    p.grad += g
            for name, fqn in self.step.buffer_updates.items():
                getattr(*self.slot[fqn]).copy_(self._value(self._where(f_owner[name]), outs[name]))
        loss_owner = f_owner[self.step.loss]
        return self._value(self._where(loss_owner), self.fx[self.step.loss]).detach()

    def run(self, inputs, targets=(), *, allocator: bool = False, timed: bool = False,
            scratch: bool = False) -> StepStats:
        """One training step; returns the loss and what was measured beside the prediction.

        allocator=True also records the CPU allocator's peak through the profiler, which slows the step;
        timed=True fills `op_times` (perf_counter on the CPU, CUDA events on a stream: no extra synchronization);
        scratch=True fills `op_scratch` for the ops on GPUs, resetting the allocator's peak at each (so no GPU
        allocator peak is given for that step).
        """
        inputs = tuple(inputs) if isinstance(inputs, (tuple, list)) else (inputs,)
        targets = tuple(targets) if isinstance(targets, (tuple, list)) else (targets,) if targets is not None else ()
        self._check_inputs(inputs + targets)
        box: dict[str, torch.Tensor] = {}
        measured: dict[str, int] = {}
        cuda_devs = sorted({str(x) for x in self.dev.values() if x.type == "cuda"})
        start = {}
        for c in cuda_devs:
            torch.cuda.synchronize(c)
            torch.cuda.reset_peak_memory_stats(c)
            start[c] = torch.cuda.memory_allocated(c)
        self.scratch, self.op_scratch = scratch, {}
        t0 = time.perf_counter()
        try:
            if allocator and any(x.type == "cpu" for x in self.dev.values()):
                measured["cpu"] = _resident(self.model, inputs + targets, "cpu") + \
                    cpu_allocation_peak(lambda: box.setdefault("loss", self._run(inputs, targets, timed)))
            else:
                box["loss"] = self._run(inputs, targets, timed)
        finally:
            self.scratch = False
        self._sync(host=True)
        wall = time.perf_counter() - t0
        for c in cuda_devs if not scratch else ():   # as on the CPU: what the step allocated above the level at its
            # start, plus the parameters, buffers and inputs there (whatever else the process holds on the GPU is
            # not the step's)
            measured[c] = int(torch.cuda.max_memory_allocated(c)) - start[c] + \
                _resident(self.model, inputs + targets, c)
        op_times = {k: b - a if isinstance(a, float) else a.elapsed_time(b) / 1e3 for k, a, b in self.spans}
        return StepStats(float(box["loss"]), wall, dict(self.peak), measured, self.predicted, op_times,
                         dict(self.model_peak), dict(self.torch_peak), self.op_scratch)
