"""Run a schedule in a real training step, and a drop-in training step for a user's loop.

    step = optsched.execute.compile(model, (x,), F.cross_entropy, targets=(y,), mem="4GB")
    for x, y in data:
        loss = step(x, y)        # fills .grad like loss.backward()
        opt.step(); opt.zero_grad()

The schedule is solved once (or loaded) and replayed every step; `step.last`
holds the measured peak and wall time of the latest step beside the
simulator's prediction. `measure_costs` times each operation inside the
replay, so a prediction made with those costs includes the executor's own
overhead; `measure_copy` does the same for a link, and `measure_copy_issue` for what a copy costs the thread
that computes.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Mapping
from contextlib import contextmanager
from dataclasses import replace

from ..capture.cost import with_scratch
from ..cluster import Cluster, check_cluster, single_accelerator
from ..errors import OptschedError
from ..graph import Graph
from ..schedule import Schedule
from .replay import ExecuteError, Replayer, StepStats, check_match, device_map, measure_copy, measure_copy_issue

__all__ = ["compile", "execute", "measure_costs", "measure_scratch", "with_scratch", "measure_copy",
           "measure_copy_issue", "cpu_as_accelerator", "keep_freed_cpu_memory", "TrainStep", "Replayer", "StepStats",
           "ExecuteError", "device_map", "check_match"]


def _cluster(mem, cluster: Cluster | None, whole: int | None = None) -> Cluster:
    """One accelerator with `mem` bytes ("16GB", or "50%" of `whole`, the keep-everything peak), or `cluster`."""
    from ..units import parse_size

    if (mem is None) == (cluster is None):
        raise OptschedError("give exactly one of mem= and cluster=", hint='e.g. mem="16GB" or mem="50%"')
    if cluster is not None:
        return check_cluster(cluster)
    return check_cluster(single_accelerator(parse_size(mem, "mem", whole) if isinstance(mem, str) else int(mem)))


class TrainStep:
    """A model bound to a schedule: calling it runs one training step and returns the loss."""

    def __init__(self, replayer: Replayer, graph: Graph, cluster: Cluster, schedule: Schedule):
        self.replayer, self.graph, self.cluster, self.schedule = replayer, graph, cluster, schedule
        self.last: StepStats | None = None

    def __call__(self, *args, allocator: bool = False):
        import torch

        n = self.replayer.step.num_inputs
        self.last = self.replayer.run(args[:n], args[n:], allocator=allocator)
        return torch.tensor(self.last.loss)

    @property
    def predicted(self):
        return self.replayer.predicted


def compile(model, example_inputs, loss_fn: Callable | None = None, *, targets=None, mem=None,
            cluster: Cluster | None = None, solver: str = "milp", options=None, schedule: Schedule | str | None = None,
            devices: Mapping[str, str] | None = None, cuda="h100", hold: bool | None = None) -> TrainStep:
    """Capture the model's step, solve it for the budget (or load `schedule`), and return a `TrainStep`.

    `hold` (when solving): the model's parameters and the inputs stay on the accelerator all step, so the
    schedule makes room for them throughout (`cluster.hold_sources`) rather than moving them. Needs a cluster with
    one accelerator; None: when it has one and the model is on a GPU, which holds them whatever a schedule frees.
    Where the step runs on a GPU, each op's scratch there is measured first and planned for (`_scratched`)."""
    from ..capture import capture_step
    from ..cluster import hold_sources
    from ..solvers import solve
    from ..units import is_share

    share = is_share(mem)
    if not share:
        cluster = _cluster(mem, cluster)    # a mistake is refused before the capture
    auto = hold is None
    step, graph = capture_step(model, example_inputs, loss_fn, targets=targets, cuda=cuda)
    if share:
        from ..solvers.baselines import keep_everything_peak

        cluster = _cluster(mem, cluster, keep_everything_peak(graph))
    if isinstance(schedule, str):
        from ..formats import load_schedule

        schedule = load_schedule(schedule)
    if schedule is None:
        one = len(cluster.accelerators) == 1
        if auto:
            hold = one and any(p.is_cuda for p in model.parameters())
        if hold:
            if not one:
                raise OptschedError(f"hold needs a cluster with one accelerator, not {len(cluster.accelerators)}",
                                    hint="pass hold=False to let the schedule move the parameters")
            graph, cluster = hold_sources(graph, cluster, cluster.accelerators[0].name)
        graph = _scratched(model, step, graph, cluster, solver, options, devices, example_inputs, targets)
        schedule = solve(graph, cluster, solver, options)
    return TrainStep(Replayer(model, step, graph, cluster, schedule, devices), graph, cluster, schedule)


def _scratched(model, step, graph: Graph, cluster: Cluster, solver: str, options, devices, inputs, targets) -> Graph:
    """Where the step runs on a GPU: the graph with each op's scratch there, measured in one replay of a quick
    schedule for the budget (the heuristic's, else the chosen solver's), so that the schedule solved next keeps
    the GPU allocator, not only the values, within the budget. Elsewhere the graph as it is.

    That schedule does not know the scratch either: where its replay runs out of GPU memory (a budget near all the
    GPU has), the accelerators' budgets are cut to 3/4, then 1/2, to leave the scratch room."""
    import torch

    from ..errors import InfeasibleError
    from ..solvers import solve

    if not any(d.type == "cuda" for d in device_map(cluster, devices).values()):
        return graph
    for share in (1.0, 0.75, 0.5):
        room = replace(cluster, devices=tuple(replace(d, memory=int(d.memory * share)) if d.kind == "cuda" else d
                                              for d in cluster.devices))
        try:
            try:
                quick = solve(graph, room, "heuristic")
            except InfeasibleError:
                quick = solve(graph, room, solver, options)
        except InfeasibleError:
            if share == 1.0:
                return graph   # nothing fits the budget: the solve that follows says so, and why
            break
        try:
            with Replayer(model, step, graph, room, quick, devices) as replay:
                return with_scratch(graph, measure_scratch(replay, inputs, targets))
        except torch.OutOfMemoryError:
            torch.cuda.empty_cache()
    raise ExecuteError("could not measure the ops' scratch on the GPU: a replay for the budget ran out of memory, "
                       "and no schedule fits a smaller one", field="mem",
                       hint="give a budget further below the GPU's memory, or pass schedule= to skip the solve")


def execute(model, inputs, graph: Graph, schedule: Schedule, cluster: Cluster, *, targets=None,
            loss_fn: Callable | None = None, devices: Mapping[str, str] | None = None,
            allocator: bool = False) -> StepStats:
    """One training step of `model` as `schedule` says; the graph must have been captured from this model."""
    from ..capture import export_step

    step = export_step(model, inputs, targets, loss_fn)
    return Replayer(model, step, graph, cluster, schedule, devices).run(inputs, targets or (), allocator=allocator)


def measure_costs(model, step, graph: Graph, inputs, targets=(), *, device: str = "cpu", runs: int = 5,
                  warmup: int = 1) -> Graph:
    """The graph with `device`'s kind ("cpu" or "cuda") costed as the executor spends it.

    Replays the keep-everything schedule on `device` `warmup + runs` times and gives each node the median of its
    timed runs (`Replayer.run(timed=True)`: the op with the dispatch and bookkeeping before it). The median, not
    the least: each op's least picks its luckiest run, so their sum undercuts every real step; on the 2-core CPU
    the sum of the least read 3-17% below the median of later keep-everything steps at the bench sizes, the sum of
    the medians -9 to +1%. Other processes only ever add time, so time on a quiet machine (a busy one preempts the
    longer ops in most runs). `meta["capture"]["replay"]` keeps the median wall time of those steps and of the part
    of them outside the instructions (handing gradients to `.grad`, the last frees), which no schedule can change
    and the simulator does not count. On CUDA one more replay measures each op's scratch (what it allocates and
    releases while it runs: `Replayer.run(scratch=True)`), which joins the node's workspace, so that the simulator's
    peak is the GPU allocator's. The model's gradients, buffers and random state are left as they were.
    """
    import torch

    from ..capture.cost import timed_runs
    from ..solvers import solve

    dev = torch.device(device)
    kind = "cuda" if dev.type == "cuda" else "cpu"
    cluster = single_accelerator(sum(n.bytes + n.workspace for n in graph.nodes))
    schedule = solve(graph, cluster, "keep-everything")

    def one():
        for p in model.parameters():
            p.grad = None
        return replay.run(inputs, targets, timed=True)

    with Replayer(model, step, graph, cluster, schedule, {"gpu0": device}) as replay:
        with _kept(model, [dev]):
            samples = timed_runs(one, runs, warmup)
        scratch = measure_scratch(replay, inputs, targets)
    times: dict[str, list[float]] = {}
    for _, stats in samples:
        for k, seconds in stats.op_times.items():
            times.setdefault(schedule.instructions[k].node, []).append(seconds)
    nodes = tuple(replace(n, cost={**n.cost, kind: statistics.median(times[n.id])}) for n in graph.nodes)
    info = {**graph.meta["capture"], "cost": f"measured in replay ({kind})",
            "replay": {"device": str(dev), "runs": runs,
                       "step_s": statistics.median(stats.wall_time for _, stats in samples),
                       "outside_s": statistics.median(stats.wall_time - sum(stats.op_times.values())
                                                      for _, stats in samples)}}
    return with_scratch(Graph(nodes, graph.name, {**graph.meta, "capture": info}), scratch)


@contextmanager
def _kept(model, devices):
    """The model's gradients, buffers and random state (of the CPU and of the CUDA `devices`) as they were before,
    whatever the replays inside did."""
    import torch

    params = list(model.parameters())
    grads = [p.grad for p in params]
    buffers = {name: b.clone() for name, b in model.named_buffers()}
    with torch.random.fork_rng(devices=sorted({d for d in map(torch.device, devices) if d.type == "cuda"}, key=str)):
        try:
            yield
        finally:
            for p, g in zip(params, grads, strict=True):
                p.grad = g
            with torch.no_grad():
                for name, b in model.named_buffers():
                    b.copy_(buffers[name])


def measure_scratch(replayer: Replayer, inputs, targets=()) -> dict[str, int]:
    """Node -> bytes its op allocates and releases again while it runs on a GPU (cuBLAS and reduction buffers,
    temporaries of composite ops), from one replay of `replayer`'s schedule (`Replayer.run(scratch=True)`); the
    model's gradients, buffers and random state are left as they were. Empty where no device maps to a GPU."""
    if not any(d.type == "cuda" for d in replayer.dev.values()):
        return {}
    with _kept(replayer.model, replayer.dev.values()):
        for p in replayer.model.parameters():
            p.grad = None
        return replayer.run(inputs, targets, scratch=True).op_scratch


def cpu_as_accelerator(graph: Graph) -> Graph:
    """For a replay on the CPU alone: the accelerator ("cuda" kind) gets the CPU's costs (as `measure_costs`
    measured them) and the host only holds swapped tensors, since its computations would share the one compute
    thread, which the simulator would count as running in parallel."""
    return Graph(tuple(replace(n, cost={"cuda": n.cost["cpu"]}) for n in graph.nodes), graph.name, graph.meta)


def keep_freed_cpu_memory() -> bool:
    """Make the C allocator keep the memory it frees, as a GPU's caching allocator does; False where it cannot.

    For a replay on the CPU standing in for an accelerator. PyTorch's CPU tensors come from glibc's malloc, which
    gives freed memory back to the kernel (trimming the top of the heap, unmapping the blocks it mmapped), so the
    next allocation faults in fresh zeroed pages. How many depends on the order of allocations and frees: on the
    gpt2 bench step (2-core CPU, one torch thread) 2,000-5,500 minor faults and 10-25 ms of an 83 ms step, so two
    schedules of the same ops and no copies measured 84 and 109 ms against 79 predicted. With trimming off and
    every block on the heap (mallopt M_TRIM_THRESHOLD, M_MMAP_THRESHOLD) a warmed-up step faults fewer than 20
    times and both schedules ran in 82-88 ms. Process-wide, hence a call of its own: make it before
    `measure_costs`, so the costs and the replays see the same allocator. A block above the largest mmap
    threshold glibc accepts (at least 32 MiB) is still mapped afresh.
    """
    import ctypes

    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError, TypeError):   # not glibc (macOS, Windows)
        return False
    m_trim_threshold, m_mmap_threshold = -1, -3
    if not mallopt(m_trim_threshold, 2**31 - 1):
        return False
    return bool(mallopt(m_mmap_threshold, 2**30) or mallopt(m_mmap_threshold, 2**25))
