"""The executor: schedules from every solver replay a real training step whose loss and gradients equal plain
`loss.backward()`, step after step with an optimizer; memory measured on CPU agrees with the simulator; CPU copies
run on worker threads; op costs measured in the replay predict it; bad input is refused before anything runs."""

from __future__ import annotations

import copy
import gc
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import replace

import pytest

torch = pytest.importorskip("torch")

from optsched.capture import capture_step  # noqa: E402
from optsched.capture.models import BUILTIN  # noqa: E402
from optsched.capture.trace import _WithLoss  # noqa: E402
from optsched.cluster import Cluster, Device, hold_sources, single_accelerator  # noqa: E402
from optsched.errors import OptschedError  # noqa: E402
from optsched.execute import (  # noqa: E402
    ExecuteError,
    Replayer,
    compile,
    execute,
    keep_freed_cpu_memory,
    measure_copy,
    measure_copy_issue,
    measure_costs,
)
from optsched.execute import replay as replay_module  # noqa: E402
from optsched.formats.importers import example_graph_path, import_graph  # noqa: E402
from optsched.schedule import Compute, Copy, Free, Schedule, Sync  # noqa: E402
from optsched.simulate import simulate  # noqa: E402
from optsched.solvers import solve  # noqa: E402

# (solver, budget as a fraction of the keep-everything peak)
CASES = [("keep-everything", 1.0), ("chen-sqrt", 1.0), ("chen-greedy", 1.0), ("offload-all", 1.0),
         ("dtr", 0.7), ("heuristic", 0.65)]
MODELS = ["mlp", "cnn", "transformer"]


@pytest.fixture(scope="module", params=MODELS + ["gpt2"])
def captured(request):
    if request.param == "gpt2":
        pytest.importorskip("transformers")
    torch.manual_seed(0)
    ex = BUILTIN[request.param]()
    step, graph = capture_step(ex["model"], ex["inputs"], ex["loss_fn"], targets=ex["targets"])
    big = single_accelerator(2**40)
    keep = simulate(graph, big, solve(graph, big, "keep-everything")).peak["gpu0"]
    return request.param, ex, step, graph, keep


def _eager_grads(model, ex):
    ref = copy.deepcopy(model)
    ref.zero_grad(set_to_none=True)
    loss = _WithLoss(ref, ex["loss_fn"], len(ex["inputs"]))(*ex["inputs"], *ex["targets"])[0]
    loss.backward()
    return loss.detach(), [p.grad for p in ref.parameters()]


def _replay_like_eager(model, ex, step, graph, cluster, schedule, what: str = ""):
    """The replay's stats, once its loss and gradients are asserted to be eager's, bit for bit."""
    model.zero_grad(set_to_none=True)
    want_loss, want = _eager_grads(model, ex)
    stats = Replayer(model, step, graph, cluster, schedule).run(ex["inputs"], ex["targets"])
    assert stats.loss == want_loss.item()
    for p, g in zip(model.parameters(), want, strict=True):
        assert torch.equal(p.grad, g), f"{what}: gradient differs"
    return stats


def _train(step_fn, model, ex, steps=3):
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    losses = []
    for _ in range(steps):
        opt.zero_grad(set_to_none=True)
        losses.append(step_fn())
        opt.step()
    return losses


def _train_eager(ref, ex, steps=3):
    """The same SGD steps as `_train` through plain `loss.backward()` on `ref`."""
    wrapped = _WithLoss(ref, ex["loss_fn"], len(ex["inputs"]))

    def eager():
        loss = wrapped(*ex["inputs"], *ex["targets"])[0]
        loss.backward()
        return loss.item()

    return _train(eager, ref, ex, steps)


@pytest.mark.parametrize("solver,frac", CASES)
def test_gradients_equal_eager(captured, solver, frac):
    name, ex, step, graph, keep = captured
    model = ex["model"]
    cluster = single_accelerator(int(keep * frac))
    schedule = solve(graph, cluster, solver)
    stats = _replay_like_eager(model, ex, step, graph, cluster, schedule, f"{name}/{solver}")
    # the ledger of storages held never exceeds the budget nor the prediction, and matches it on the accelerator
    # (the host may hold less: the simulator releases a buffer when its copy ends in time, the CPU replay earlier)
    for d, peak in stats.peak.items():
        assert peak <= cluster.device(d).memory
        assert peak <= 1.05 * stats.predicted.peak[d]
    assert abs(stats.peak["gpu0"] - stats.predicted.peak["gpu0"]) <= 0.05 * stats.predicted.peak["gpu0"]
    model.zero_grad(set_to_none=True)


def test_schedules_exercise_recompute_and_swap(captured):
    """The cases above are not all keep-everything in disguise."""
    _, _, _, graph, keep = captured
    recomputed = swapped = 0
    for solver, frac in CASES:
        cluster = single_accelerator(int(keep * frac))
        sim = simulate(graph, cluster, solve(graph, cluster, solver))
        recomputed += sim.recomputed
        swapped += sim.swap_out_bytes
    assert recomputed > 0 and swapped > 0


def test_statistics_made_by_a_later_run_of_their_op_replay_like_eager(torch_threads):
    """lp-rounding's schedule of the transformer at 70% computes some layer norms' statistics right after a
    recomputation of their op (`polish.remade_outputs`), as the simulator counts them: the replay hands them over
    from that run, its gradients are eager's and its ledger the prediction (as `test_gradients_equal_eager`)."""
    from optsched.solvers.polish import remade_outputs

    torch.manual_seed(0)
    ex = BUILTIN["transformer"]()
    step, graph = capture_step(ex["model"], ex["inputs"], ex["loss_fn"], targets=ex["targets"])
    big = single_accelerator(2**40)
    cluster = single_accelerator(int(simulate(graph, big, solve(graph, big, "keep-everything")).peak["gpu0"] * 0.7))
    schedule = solve(graph, cluster, "lp-rounding", time_limit=20)
    early = [True] * len(graph.nodes)
    assert remade_outputs(graph, list(schedule.instructions), first=early) is not None    # some are made late
    stats = _replay_like_eager(ex["model"], ex, step, graph, cluster, schedule, "lp-rounding")
    assert stats.peak["gpu0"] <= cluster.device("gpu0").memory
    assert abs(stats.peak["gpu0"] - stats.predicted.peak["gpu0"]) <= 0.05 * stats.predicted.peak["gpu0"]


def _cnn_schedule(solver: str, names_maker: bool = True):
    """The default cnn (seed 3), its step and graph (without `output_of` unless `names_maker`, as graph files from
    before it), a cluster too large to bind, `solver`'s instructions there, and a Replayer of them (for its maps of
    multi-output ops)."""
    torch.manual_seed(3)
    ex = BUILTIN["cnn"]()
    step, graph = capture_step(ex["model"], ex["inputs"], ex["loss_fn"], targets=ex["targets"])
    if not names_maker:
        graph = replace(graph, nodes=tuple(replace(n, output_of="") for n in graph.nodes))
    big = single_accelerator(2**40)
    ins = list(solve(graph, big, solver).instructions)
    return ex, step, graph, big, ins, Replayer(ex["model"], step, graph, big, Schedule(tuple(ins)))


def _calls(monkeypatch) -> list[str]:
    """The FX nodes the replays call from now on, in order."""
    calls: list[str] = []
    call = Replayer._call
    monkeypatch.setattr(Replayer, "_call", lambda self, d, n, env=None: calls.append(n.name) or call(self, d, n, env))
    return calls


def test_secondary_outputs_computed_apart_do_not_rerun_the_op(monkeypatch):
    """The cnn's keep-everything schedule (frees last) with every secondary output of a multi-output op (batch-norm
    statistics, weight gradients) computed just before its first reader instead of right after its primary: each op
    still runs once per computation of its primary, the stash is in the ledger, as in the simulator's count (from
    the primary's run: `Node.output_of`), and the gradients equal eager ones."""
    ex, step, graph, cluster, ins, replay = _cnn_schedule("keep-everything")
    secondary = {v for v, op in replay.op_of.items() if replay.primary_of_op[op.name] != v}
    primary = {v: replay.primary_of_op[replay.op_of[v].name] for v in secondary}
    moved = [x for x in ins if isinstance(x, Compute) and x.node in secondary]
    frees = [x for x in ins if isinstance(x, Free)]   # at the end: a moved secondary reads what its op reads
    ins = [x for x in ins if x not in moved and x not in frees]
    for x in moved:
        readers = [k for k, y in enumerate(ins) if isinstance(y, Compute) and x.node in graph.node(y.node).inputs]
        ins.insert(readers[0] if readers else len(ins), x)
    ins += frees
    schedule = Schedule(tuple(ins))
    position = {x.node: k for k, x in enumerate(ins) if isinstance(x, Compute)}
    assert sum(position[v] > position[primary[v]] + 1 for v in secondary) >= 10   # really apart
    calls = _calls(monkeypatch)
    with Replayer(ex["model"], step, graph, cluster, schedule) as replay:
        _check_step(replay, ex)
        assert replay.peak["gpu0"] == replay.predicted.peak["gpu0"]
    ops = {replay.op_of[v].name for v in secondary}
    assert sorted(n for n in calls if n in ops) == sorted(ops)


@pytest.mark.parametrize("names_maker", [False, True])
def test_an_output_made_apart_from_its_op_is_held_from_its_run_or_the_op_runs_again(monkeypatch, names_maker):
    """The cnn's heuristic schedule with max-pool's indices computed just before the pool's backward reads them,
    not with the pool's output. In a graph that names the indices' maker (`output_of`, as captures now do), the
    simulator counts them from the pool's run, so the replay holds them from then: the pool runs once. In a graph
    without it (a file from before), the graph makes them then at no cost, so held from the pool's run they would
    take memory over the predicted peak all through it: the pool runs again for them instead. Either way the
    replay's peak is the predicted one, within a budget with no byte to spare, and the gradients are eager's."""
    ex, step, graph, big, ins, probe = _cnn_schedule("heuristic", names_maker)
    pool = next(op for op in probe.op_of.values() if "max_pool2d_with_indices" in str(op.target))
    indices = next(v for v, op in probe.op_of.items() if op is pool and probe.primary_of_op[op.name] != v)
    k0 = next(k for k, x in enumerate(ins) if isinstance(x, Compute) and x.node == indices)
    late = ins.pop(k0)
    at = next(k for k, y in enumerate(ins) if isinstance(y, Compute) and indices in graph.node(y.node).inputs)
    reads = set(graph.node(indices).inputs)      # the pool's output and input, now freed after the indices
    kept = [y for y in ins[k0:at] if isinstance(y, Free) and y.node in reads]
    ins = ins[:k0] + [y for y in ins[k0:at] if y not in kept] + [late, *kept] + ins[at:]
    schedule = Schedule(tuple(ins))
    cluster = single_accelerator(simulate(graph, big, schedule).peak["gpu0"])
    calls = _calls(monkeypatch)
    with Replayer(ex["model"], step, graph, cluster, schedule) as replay:
        _check_step(replay, ex)
        assert replay.peak["gpu0"] == replay.predicted.peak["gpu0"] == cluster.device("gpu0").memory
    assert calls.count(pool.name) == 1 + (not names_maker)


def test_training_steps_match_eager():
    """Several SGD steps through the replayed schedule give bitwise the parameters of plain training."""
    torch.manual_seed(1)
    ex = BUILTIN["transformer"]()
    model = ex["model"]
    ref = copy.deepcopy(model)
    step, graph = capture_step(model, ex["inputs"], ex["loss_fn"], targets=ex["targets"])
    big = single_accelerator(2**40)
    keep = simulate(graph, big, solve(graph, big, "keep-everything")).peak["gpu0"]
    cluster = single_accelerator(int(keep * 0.7))
    replay = Replayer(model, step, graph, cluster, solve(graph, cluster, "dtr"))
    ours = _train(lambda: replay.run(ex["inputs"], ex["targets"]).loss, model, ex)
    theirs = _train_eager(ref, ex)
    assert ours == theirs
    assert ours[-1] < ours[0]
    for p, q in zip(model.parameters(), ref.parameters(), strict=True):
        assert torch.equal(p, q)


def test_two_devices_and_milp_with_swap():
    """A 2-accelerator placement (both mapped to the CPU) and a MILP schedule replay exactly."""
    torch.manual_seed(2)
    ex = BUILTIN["mlp"](depth=3, width=128)
    model = ex["model"]
    step, graph = capture_step(model, ex["inputs"], ex["loss_fn"], targets=ex["targets"])
    big = single_accelerator(2**40)
    keep = simulate(graph, big, solve(graph, big, "keep-everything")).peak["gpu0"]
    two = single_accelerator(int(keep * 0.6), gpus=2)
    placed = solve(graph, two, "heuristic", swap=False)   # no host to spill to: it must use the second device
    used = {x.device for x in placed.instructions if isinstance(x, Compute)}
    assert {"gpu0", "gpu1"} <= used
    milp_cluster = single_accelerator(int(keep * 0.75))
    milp = solve(graph, milp_cluster, "milp", time_limit=5)
    assert any(isinstance(x, Copy) for x in milp.instructions) or simulate(graph, milp_cluster, milp).recomputed
    for cluster, schedule in ((two, placed), (milp_cluster, milp)):
        _replay_like_eager(model, ex, step, graph, cluster, schedule)


@pytest.mark.parametrize("name,device", [("mlp", "cpu"), ("transformer", "cpu"),
                                         pytest.param("mlp", "cuda", marks=pytest.mark.cuda)])
def test_the_hosts_computations_run_on_a_thread_of_their_own(name, device, monkeypatch):
    """host_thread (the default where a device maps to a GPU; on the CPU too here): the ops the schedule puts on
    the host run on one thread of their own, the same across steps, while the main thread goes on with the
    accelerator's; an op with several outputs stays on the main thread. The gradients are eager's (bitwise on the
    CPU) and the ledger's peaks as without it, the host's the simulator's (it counts what the thread has still to
    make at the graph's bytes)."""
    ex, step, graph, cluster, schedule = _host_computes_case(name, device)
    model = ex["model"]
    on = {}
    run_op = Replayer._run_op

    def spy(self, d, v, n, env=None):
        on.setdefault((v, d), set()).add(threading.current_thread().name.rsplit("_", 1)[0])
        return run_op(self, d, v, n, env)

    monkeypatch.setattr(Replayer, "_run_op", spy)
    peaks = []
    for threaded in (False, True):
        on.clear()
        with Replayer(model, step, graph, cluster, schedule, host_thread=threaded) as replay:
            for _ in range(2):
                _check_step(replay, ex, exact=device == "cpu")
            peaks.append(replay.run(ex["inputs"], ex["targets"]).peak)
        alone = {(v, d) for v, d in on if d == "host" and v not in replay.op_of}
        assert alone and all(on[x] == {"optsched-compute host" if threaded else "MainThread"} for x in alone)
        assert all(on[x] == {"MainThread"} for x in on if x not in alone)
    assert peaks[0] == peaks[1] and peaks[1]["host"] == simulate(graph, cluster, schedule).peak["host"]


def _host_computes_case(name, device):
    """A built-in on `device` and metf's schedule at 20% of its keep-everything peak, which computes on the host."""
    torch.manual_seed(2)
    ex = _on(BUILTIN[name](), device)
    step, graph = capture_step(ex["model"], ex["inputs"], ex["loss_fn"], targets=ex["targets"])
    big = single_accelerator(2**40)
    cluster = single_accelerator(int(simulate(graph, big, solve(graph, big, "keep-everything")).peak["gpu0"] * 0.2))
    return ex, step, graph, cluster, solve(graph, cluster, "metf")


def test_a_value_the_host_makes_for_a_gpu_is_made_into_a_pinned_buffer_on_the_thread_that_makes_it(monkeypatch):
    """With gpu0 on the CPU nothing is staged; where gpu0 is a GPU (stood in for: the staged set a CUDA map gives,
    the pinned buffers plain ones), each host compute whose value a copy takes to gpu0 copies it into a buffer from
    the pinned pool, on the host's thread where it runs there, once per compute; the gradients stay eager's."""
    ex, step, graph, cluster, schedule = _host_computes_case("mlp", "cpu")
    taken = []

    def pinned_like(self, src, stream):
        taken.append((threading.current_thread().name.rsplit("_", 1)[0], stream))
        return torch.empty_like(src)

    monkeypatch.setattr(Replayer, "_pinned_like", pinned_like)
    with Replayer(ex["model"], step, graph, cluster, schedule, host_thread=True) as replay:
        assert replay.staged == set()
        replay.staged = {(x.node, x.src) for x in schedule.instructions if isinstance(x, Copy) and x.src == "host"
                         and x.dst == "gpu0" and x.node not in replay.source}
        made = [x for x in schedule.instructions if isinstance(x, Compute) and (x.node, x.device) in replay.staged]
        assert made and any((x.node, x.device) in replay.threaded for x in made)
        _check_step(replay, ex)
    assert sorted(taken) == sorted(("optsched-compute host" if (x.node, x.device) in replay.threaded
                                    else "MainThread", None) for x in made)


def test_a_freed_pinned_buffer_that_queued_work_still_reads_stays_in_the_pool(monkeypatch):
    """A buffer from the pool is never one that a thread's work still has to read: on a GPU the host's thread, behind
    the main thread, took a freed buffer whose reader was a host compute queued behind its own, and waited for it
    forever. Such a buffer stays in the pool and a new one is made; once its reader is done, it is taken again."""
    ex, step, graph, cluster, schedule = _host_computes_case("mlp", "cpu")
    empty_strided = torch.empty_strided
    monkeypatch.setattr(torch, "empty_strided", lambda *a, pin_memory=False, **k: empty_strided(*a, **k))
    with Replayer(ex["model"], step, graph, cluster, schedule, host_thread=True) as replay:
        src, buf, queued = torch.ones(4, 3), torch.zeros(4, 3), Future()
        replay._pool(buf, [None, queued])
        with ThreadPoolExecutor(1) as host:
            try:
                got = host.submit(replay._pinned_like, src, None).result(timeout=10)
            finally:
                queued.set_result(None)
        assert got is not buf and got.shape == src.shape and got.stride() == src.stride()
        assert replay._pinned_like(src, None) is buf


@pytest.mark.cuda
def test_cuda_copies_of_host_made_values_read_pinned_buffers_that_the_next_steps_reuse(monkeypatch):
    """On a GPU every copy to it of a value the host computed reads a pinned buffer, and the buffers come back to
    the pool once made and copied: over three later steps fewer are allocated than one step stages (without the
    pool, each staged value takes a new one). Gradients as eager's."""
    ex, step, graph, cluster, schedule = _host_computes_case("mlp", "cuda")
    read, allocated = [], []
    copy, empty_strided = Replayer._copy, torch.empty_strided

    def spy(self, v, a, b):
        if (v, a) in self.staged:
            t = self.env[a][v][-1][0]
            read.append((t.result() if isinstance(t, Future) else t).is_pinned())
        return copy(self, v, a, b)

    def counted(*args, **kwargs):
        allocated.append(kwargs.get("pin_memory", False))
        return empty_strided(*args, **kwargs)

    monkeypatch.setattr(Replayer, "_copy", spy)
    monkeypatch.setattr(torch, "empty_strided", counted)
    with Replayer(ex["model"], step, graph, cluster, schedule) as replay:
        staged = sum(isinstance(x, Compute) and (x.node, x.device) in replay.staged for x in schedule.instructions)
        assert staged
        for k in range(5):
            if k == 2:
                allocated.clear()
            read.clear()
            _check_step(replay, ex, exact=False)
            assert read and all(read)
        assert sum(allocated) < staged


def test_cpu_allocator_peak_matches_prediction():
    """The CPU allocator's own peak (all CPU-mapped devices together) is within 10% of the simulated total."""
    torch.manual_seed(3)
    ex = BUILTIN["transformer"]()
    step, graph = capture_step(ex["model"], ex["inputs"], ex["loss_fn"], targets=ex["targets"])
    cluster = single_accelerator(2**40)
    schedule = solve(graph, cluster, "keep-everything")
    stats = Replayer(ex["model"], step, graph, cluster, schedule).run(ex["inputs"], ex["targets"], allocator=True)
    predicted = sum(stats.predicted.peak.values())
    assert abs(stats.allocator_peak["cpu"] - predicted) <= 0.10 * predicted


def test_compile_trains_like_eager():
    torch.manual_seed(4)
    ex = BUILTIN["cnn"]()
    model = ex["model"]
    ref = copy.deepcopy(model)
    step = compile(model, ex["inputs"], ex["loss_fn"], targets=ex["targets"], mem="2MB", solver="dtr")
    assert max(step.predicted.peak.values()) <= 2_000_000
    ours = _train(lambda: step(*ex["inputs"], *ex["targets"]).item(), model, ex)
    assert ours == _train_eager(ref, ex)
    for p, q in zip(model.parameters(), ref.parameters(), strict=True):
        assert torch.equal(p, q)
    for b, c in zip(model.buffers(), ref.buffers(), strict=True):   # batch-norm running statistics
        assert torch.equal(b, c)


def test_compile_takes_a_budget_as_a_share_of_the_keep_everything_peak():
    from optsched.solvers.baselines import keep_everything_peak

    torch.manual_seed(4)
    ex = BUILTIN["mlp"]()
    model = ex["model"]
    step = compile(model, ex["inputs"], ex["loss_fn"], targets=ex["targets"], mem="60%", solver="dtr")
    budget = step.cluster.devices[0].memory
    assert budget == round(0.6 * keep_everything_peak(step.graph))
    assert max(step.predicted.peak.values()) <= budget
    model.zero_grad(set_to_none=True)
    want_loss, want = _eager_grads(model, ex)
    model.zero_grad(set_to_none=True)
    assert step(*ex["inputs"], *ex["targets"]).item() == want_loss.item()
    for p, g in zip(model.parameters(), want, strict=True):
        assert torch.equal(p.grad, g)
    with pytest.raises(OptschedError, match="cannot read mem"):
        compile(model, ex["inputs"], ex["loss_fn"], targets=ex["targets"], mem="60 %%")


# -- copies on worker threads, measured costs --------------------------------------------------------------------


@pytest.fixture(scope="module")
def offload_case():
    """offload-all: swap-outs, and prefetches whose source is itself a copy made on another link's worker."""
    torch.manual_seed(7)
    ex = BUILTIN["mlp"]()
    step, graph = capture_step(ex["model"], ex["inputs"], ex["loss_fn"], targets=ex["targets"])
    cluster = single_accelerator(2**40)
    return ex, step, graph, cluster, solve(graph, cluster, "offload-all")


def _check_step(replay, ex, exact=True):
    """One replayed step against eager `loss.backward()`: bitwise, or (a GPU's kernels) to float32 rounding."""
    model = ex["model"]
    model.zero_grad(set_to_none=True)
    want_loss, want = _eager_grads(model, ex)
    loss = replay.run(ex["inputs"], ex["targets"]).loss
    assert loss == want_loss.item() if exact else abs(loss - want_loss.item()) <= 1e-5 * abs(want_loss.item())
    for p, g in zip(model.parameters(), want, strict=True):
        if exact:
            assert torch.equal(p.grad, g)
        else:
            torch.testing.assert_close(p.grad, g, rtol=1e-5, atol=1e-6)
    model.zero_grad(set_to_none=True)


def _on(ex, device):
    """A built-in example with its model, inputs and targets on the torch device."""
    return {**ex, "model": ex["model"].to(device), "inputs": tuple(t.to(device) for t in ex["inputs"]),
            "targets": tuple(t.to(device) for t in ex["targets"])}


def test_cpu_copies_run_on_link_workers(offload_case, monkeypatch):
    """Every CPU copy runs on its link's one worker thread, the same across steps; prefetches wait there on the
    swap-out's Future; gradients stay bitwise equal; closing (or dropping) the Replayer ends the workers."""
    ex, step, graph, cluster, schedule = offload_case
    seen = []
    copy_into = replay_module._copy_into

    def spy(dst, src, ev):
        seen.append((threading.current_thread(), ev))
        copy_into(dst, src, ev)

    monkeypatch.setattr(replay_module, "_copy_into", spy)
    with Replayer(ex["model"], step, graph, cluster, schedule) as replay:
        for _ in range(2):
            _check_step(replay, ex)
    copies = [x for x in schedule.instructions if isinstance(x, Copy)]
    assert len(seen) == 2 * len(copies)
    workers = {t for t, _ in seen}
    assert sorted(t.name.rsplit("_", 1)[0] for t in workers) == ["optsched-copy gpu0->host",
                                                                  "optsched-copy host->gpu0"]
    assert any(isinstance(ev, Future) for _, ev in seen)
    assert not any(t.is_alive() for t in workers)
    seen.clear()
    dropped = Replayer(ex["model"], step, graph, cluster, schedule)
    _check_step(dropped, ex)
    del dropped
    gc.collect()
    for t, _ in seen:
        t.join(timeout=10)
        assert not t.is_alive()


def test_copy_worker_error_raised_in_caller(offload_case, monkeypatch):
    """A copy that fails on its worker fails the step in the calling thread, with nothing left running; the next
    step runs clean."""
    ex, step, graph, cluster, schedule = offload_case

    def broken(dst, src, ev):
        raise RuntimeError("copy failed")

    with Replayer(ex["model"], step, graph, cluster, schedule) as replay:
        monkeypatch.setattr(replay_module, "_copy_into", broken)
        with pytest.raises(RuntimeError, match="copy failed"):
            replay.run(ex["inputs"], ex["targets"])
        assert replay.pending and all(f.done() for f in replay.pending)
        monkeypatch.undo()
        _check_step(replay, ex)


def test_measure_costs_replaces_one_kind():
    """Every node gets a positive cost for the CPU, measured in the replay; the structure and the other kind are
    unchanged, run after run; the model's gradients and batch-norm statistics are left as they were."""
    torch.manual_seed(8)
    ex = BUILTIN["cnn"]()
    model = ex["model"]
    step, graph = capture_step(model, ex["inputs"], ex["loss_fn"], targets=ex["targets"])
    before = copy.deepcopy(model.state_dict())
    first, second = (measure_costs(model, step, graph, ex["inputs"], ex["targets"], runs=2) for _ in range(2))
    for measured in (first, second):
        replayed = measured.meta["capture"]["replay"]
        assert 0 <= replayed["outside_s"] < replayed["step_s"]
        for n, m in zip(graph.nodes, measured.nodes, strict=True):
            assert m.cost["cpu"] > 0
            assert replace(m, cost=n.cost) == n and m.cost["cuda"] == n.cost["cuda"]
    assert all(p.grad is None for p in model.parameters())
    for k, v in model.state_dict().items():
        assert torch.equal(v, before[k]), k
    bandwidth, latency = measure_copy()
    assert bandwidth > 0 and latency >= 0
    assert 0 <= measure_copy_issue(gap=2e-5, copies=5, runs=2) < 0.1


def test_keep_freed_cpu_memory():
    """After the call and a warm-up, memory freed by a tensor is reused by the next one instead of faulting in fresh
    pages (by default glibc unmaps a 16 MiB block and every refill faults in all its 4,096 pages)."""
    resource = pytest.importorskip("resource")
    if not keep_freed_cpu_memory():
        pytest.skip("the C allocator is not glibc")

    def fill():
        t = torch.ones(2**22)
        del t

    for _ in range(5):
        fill()
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(5):
        fill()
    assert resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before < 1024


def test_measured_costs_predict_the_replay(mlp_case, torch_threads):
    """Wiring, not a benchmark: with the CPU as the only device, the keep-everything prediction from measured costs
    is within 3x of the fastest of several replayed steps (the fastest: the least disturbed by other processes)."""
    ex, step, graph = mlp_case
    measured = measure_costs(ex["model"], step, graph, ex["inputs"], ex["targets"], runs=3)
    cpu = Cluster((Device("cpu0", "cpu", 2**40),), ())
    schedule = solve(measured, cpu, "keep-everything")
    with Replayer(ex["model"], step, measured, cpu, schedule) as replay:
        walls = []
        for _ in range(10):
            ex["model"].zero_grad(set_to_none=True)
            stats = replay.run(ex["inputs"], ex["targets"], timed=True)
            walls.append(stats.wall_time)
    ex["model"].zero_grad(set_to_none=True)
    predicted = replay.predicted.makespan
    assert predicted == pytest.approx(sum(n.cost["cpu"] for n in measured.nodes))
    assert sorted(stats.op_times) == [k for k, x in enumerate(schedule.instructions) if isinstance(x, Compute)]
    assert predicted / 3 <= min(walls) <= 3 * predicted


# -- refusals -----------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def mlp_case():
    torch.manual_seed(5)
    ex = BUILTIN["mlp"]()
    step, graph = capture_step(ex["model"], ex["inputs"], ex["loss_fn"], targets=ex["targets"])
    return ex, step, graph


@pytest.mark.parametrize("solver,frac", [("keep-everything", 1.0), ("chen-sqrt", 1.0), ("heuristic", 0.7)])
def test_the_peak_with_the_model_tensors_is_what_the_allocator_sees(mlp_case, solver, frac):
    """The model and the caller hold the parameters and inputs all step, whatever the schedule frees or swaps out:
    the ledger with them counted throughout is the CPU allocator's peak where nothing is copied (one thread does
    everything), and at most that with copies, short of it by no more than the bytes copied (a copy worker still
    reading a freed value)."""
    ex, step, graph = mlp_case
    model = ex["model"]
    big = single_accelerator(2**40)
    keep = simulate(graph, big, solve(graph, big, "keep-everything")).peak["gpu0"]
    cluster = single_accelerator(int(keep * frac))
    schedule = solve(graph, cluster, solver)
    model.zero_grad(set_to_none=True)
    stats = Replayer(model, step, graph, cluster, schedule).run(ex["inputs"], ex["targets"], allocator=True)
    model.zero_grad(set_to_none=True)
    with_model, allocator = stats.peak_with_model_tensors_by_torch_device["cpu"], stats.allocator_peak["cpu"]
    copies = [x for x in schedule.instructions if isinstance(x, Copy)]
    if not copies:
        assert with_model == allocator
        return
    swapped = {x.node for x in copies if graph.node(x.node).kind in ("param", "input")}
    assert swapped, "the case swaps a parameter or an input out"
    assert with_model <= allocator <= with_model + sum(graph.node(x.node).bytes for x in copies)
    assert sum(stats.peak.values()) < allocator       # the ledger alone misses the swapped-out parameters


def test_a_held_model_stays_within_the_budget_where_a_moved_one_does_not(mlp_case):
    """At 70% of keep-everything the heuristic swaps weights out, which the model still holds: counted, gpu0 goes
    over its budget. Solved with the model held (`compile(hold=True)`), its step keeps them and stays within."""
    ex, step, graph = mlp_case
    model = ex["model"]
    big = single_accelerator(2**40)
    budget = int(0.7 * simulate(graph, big, solve(graph, big, "keep-everything")).peak["gpu0"])
    cluster = single_accelerator(budget)
    moved = Replayer(model, step, graph, cluster, solve(graph, cluster, "heuristic")).run(ex["inputs"], ex["targets"])
    assert moved.peak["gpu0"] <= budget < moved.peak_with_model_tensors["gpu0"]
    model.zero_grad(set_to_none=True)
    want_loss, want = _eager_grads(model, ex)
    held = compile(model, ex["inputs"], ex["loss_fn"], targets=ex["targets"], mem=budget, solver="heuristic",
                   hold=True)
    assert held.cluster.device("gpu0").memory < budget
    assert held(*ex["inputs"], *ex["targets"]).item() == want_loss.item()
    assert held.last.peak_with_model_tensors["gpu0"] <= budget
    for p, g in zip(model.parameters(), want, strict=True):
        assert torch.equal(p.grad, g)
    model.zero_grad(set_to_none=True)


def test_refuses_schedule_over_budget(mlp_case):
    ex, step, graph = mlp_case
    big = single_accelerator(2**40)
    keep = solve(graph, big, "keep-everything")
    with pytest.raises(ExecuteError, match="not valid.*over its budget"):
        Replayer(ex["model"], step, graph, single_accelerator(100_000), keep)


def test_refuses_an_op_with_no_kernel_where_the_schedule_runs_it(mlp_case, monkeypatch):
    """A graph captured on one kind of device and replayed on another that has no kernel for one of its ops (here
    the CPU's mm, stood in for as missing): refused before anything runs, naming the node, the op and the device."""
    ex, step, graph = mlp_case
    cluster = single_accelerator(2**40)
    schedule = solve(graph, cluster, "keep-everything")
    has = torch._C._dispatch_has_computed_kernel_for_dispatch_key
    monkeypatch.setattr(torch._C, "_dispatch_has_computed_kernel_for_dispatch_key",
                        lambda name, key: name != "aten::mm" and has(name, key))
    first = next(x.node for x in schedule.instructions
                 if isinstance(x, Compute) and graph.node(x.node).op == "mm.default")
    model = ex["model"]
    model.zero_grad(set_to_none=True)
    with pytest.raises(ExecuteError, match=rf"node '{first}': it runs mm.default on gpu0 \(cpu\), which has no kernel"):
        execute(model, ex["inputs"], graph, schedule, cluster, targets=ex["targets"], loss_fn=ex["loss_fn"])
    assert all(p.grad is None for p in model.parameters())


def test_refuses_graph_of_another_model(mlp_case):
    ex, _, graph = mlp_case
    other = BUILTIN["mlp"](depth=3)
    cluster = single_accelerator(2**40)
    with pytest.raises(ExecuteError, match="does not match the model"):
        execute(other["model"], other["inputs"], graph, solve(graph, cluster), cluster,
                targets=other["targets"], loss_fn=other["loss_fn"])
    imported = import_graph(example_graph_path("tiny"))
    with pytest.raises(ExecuteError, match="not captured from a PyTorch model"):
        execute(other["model"], other["inputs"], imported, solve(imported, cluster), cluster,
                targets=other["targets"], loss_fn=other["loss_fn"])
    assert all(p.grad is None for p in other["model"].parameters())


class _Scaled(torch.nn.Module):
    """A forward that makes a tensor from Python values: the trace lifts it onto the module (a get_attr node)."""

    def __init__(self):
        super().__init__()
        self.a, self.b = torch.nn.Linear(8, 8), torch.nn.Linear(8, 4)

    def forward(self, x):
        return self.b(torch.relu(self.a(x)) * torch.tensor([float(k) for k in range(8)]))


@pytest.mark.parametrize("solver", ["keep-everything", "chen-sqrt"])
def test_replays_a_tensor_the_forward_made(solver):
    torch.manual_seed(3)
    model, x = _Scaled(), torch.randn(5, 8)
    loss_fn = lambda y: (y**2).mean()
    step, graph = capture_step(model, (x,), loss_fn)
    assert any(n.op == "get_attr" for n in step.gm.graph.nodes)
    ex = {"inputs": (x,), "targets": (), "loss_fn": loss_fn}
    want_loss, want = _eager_grads(model, ex)
    cluster = single_accelerator(2**30)
    stats = execute(model, (x,), graph, solve(graph, cluster, solver), cluster, loss_fn=loss_fn)
    assert stats.loss == want_loss.item()
    for p, g in zip(model.parameters(), want, strict=True):
        assert torch.equal(p.grad, g)


def test_compile_holds_the_model_on_one_accelerator_only():
    ex = BUILTIN["mlp"]()
    two = single_accelerator(10**9, gpus=2)
    with pytest.raises(OptschedError, match="one accelerator, not 2"):
        compile(ex["model"], ex["inputs"], ex["loss_fn"], targets=ex["targets"], cluster=two, solver="heuristic",
                hold=True)
    step = compile(ex["model"], ex["inputs"], ex["loss_fn"], targets=ex["targets"], cluster=two, solver="heuristic")
    assert step.cluster == two      # a CPU model is not held unless asked


def test_a_held_parameter_swapped_out_and_back_is_the_model_own():
    """In the held problem a parameter weighs nothing, so moving it is free there; the replay then places the
    model's own tensor again rather than copying it back, which would allocate it twice on gpu0."""
    torch.manual_seed(3)
    model, x = _Scaled(), torch.randn(5, 8)
    loss_fn = lambda y: (y**2).mean()
    step, graph = capture_step(model, (x,), loss_fn)
    cluster = single_accelerator(2**30)
    hg, hc = hold_sources(graph, cluster, "gpu0")
    plain = list(solve(hg, hc, "keep-everything").instructions)
    reads = {n.id: [k for k, ins in enumerate(plain)
                    if isinstance(ins, Compute) and n.id in graph.node(ins.node).inputs]
             for n in graph.nodes if n.kind == "param"}
    w, first = next((w, ks[0]) for w, ks in reads.items() if len(ks) > 1)   # read again after its first reader
    moved = (plain[:first + 1] + [Copy(w, "gpu0", "host"), Free(w, "gpu0"), Copy(w, "host", "gpu0")]
             + plain[first + 1:])
    schedule = Schedule(tuple(moved))
    assert simulate(hg, hc, schedule).valid
    ex = {"inputs": (x,), "targets": (), "loss_fn": loss_fn}
    want_loss, want = _eager_grads(model, ex)
    stats = Replayer(model, step, hg, hc, schedule).run((x,), allocator=True)
    assert stats.loss == want_loss.item()
    for p, g in zip(model.parameters(), want, strict=True):
        assert torch.equal(p.grad, g)
    model.zero_grad(set_to_none=True)
    kept = Replayer(model, step, hg, hc, Schedule(tuple(plain))).run((x,), allocator=True)
    model.zero_grad(set_to_none=True)
    assert stats.allocator_peak["cpu"] <= kept.allocator_peak["cpu"] + graph.node(w).bytes   # its copy on the host


def test_refuses_wrong_input_shape(mlp_case):
    ex, step, graph = mlp_case
    cluster = single_accelerator(2**40)
    replay = Replayer(ex["model"], step, graph, cluster, solve(graph, cluster))
    with pytest.raises(ExecuteError, match=r"argument 0 is \(16, 256\)"):
        replay.run((torch.randn(16, 256),), ex["targets"])


def test_refuses_graph_with_optimizer(mlp_case):
    ex, step, _ = mlp_case
    from optsched.capture import capture

    graph = capture(ex["model"], ex["inputs"], ex["loss_fn"], targets=ex["targets"], optimizer="sgd")
    cluster = single_accelerator(2**40)
    with pytest.raises(ExecuteError, match="optimizer"):
        Replayer(ex["model"], step, graph, cluster, solve(graph, cluster))


def _stand_in_a_gpu(monkeypatch, scratch):
    """compile sees every schedule device on a GPU, and `scratch` measures the ops' scratch there."""
    import optsched.execute as X

    monkeypatch.setattr(X, "device_map", lambda cluster, devices=None: {d.name: torch.device("cuda")
                                                                        for d in cluster.devices})
    monkeypatch.setattr(X, "measure_scratch", scratch)


def test_compile_for_a_gpu_plans_for_the_scratch_its_ops_take(monkeypatch):
    """Where the step runs on a GPU, compile measures each op's scratch in one replay of a quick schedule and
    solves with it in the ops' workspace: here (the GPU and its measurement stood in for) a backward op that takes
    half the budget as scratch, which the schedule solved without it has no room for."""
    import optsched.execute as X

    torch.manual_seed(3)
    ex = BUILTIN["mlp"]()
    model = ex["model"]
    step, graph = capture_step(model, ex["inputs"], ex["loss_fn"], targets=ex["targets"])
    big = single_accelerator(2**40)
    budget = simulate(graph, big, solve(graph, big, "keep-everything")).peak["gpu0"]
    cluster = single_accelerator(budget)
    plain = solve(graph, cluster, "heuristic")
    extra = budget // 2
    op = next(n.id for n in graph.nodes if n.kind == "backward" and n.op == "mm.default"
              and not simulate(X.with_scratch(graph, {n.id: extra}), cluster, plain).valid)
    measured = []

    def scratch(replayer, inputs, targets=()):
        measured.append(replayer.schedule)
        return {op: extra}

    on_cpu = {"gpu0": "cpu"}    # a CUDA box too replays on the CPU here
    assert X.measure_scratch(Replayer(model, step, graph, big, solve(graph, big, "keep-everything"), on_cpu),
                             ex["inputs"], ex["targets"]) == {}   # no GPU in the replay: nothing to measure
    _stand_in_a_gpu(monkeypatch, scratch)
    ours = compile(model, ex["inputs"], ex["loss_fn"], targets=ex["targets"], mem=budget, solver="heuristic",
                   devices=on_cpu)
    assert len(measured) == 1 and ours.graph.node(op).workspace == graph.node(op).workspace + extra
    assert simulate(ours.graph, ours.cluster, ours.schedule).valid      # planned for
    model.zero_grad(set_to_none=True)
    want_loss, want = _eager_grads(model, ex)
    assert ours(*ex["inputs"], *ex["targets"]).item() == want_loss.item()
    for p, g in zip(model.parameters(), want, strict=True):
        assert torch.equal(p.grad, g)


def test_compile_measures_the_scratch_under_a_smaller_budget_where_the_gpu_runs_out(monkeypatch):
    """The quick schedule that measures the scratch does not know it either: where its replay runs out of GPU
    memory, compile measures again with the accelerator's budget cut to 3/4, then 1/2, and says so plainly where
    even that runs out; the schedule it returns is solved for the whole budget."""

    torch.manual_seed(3)
    ex = BUILTIN["mlp"]()
    model = ex["model"]
    budget = 1_400_000
    tried = []

    def scratch(replayer, inputs, targets=()):
        tried.append(replayer.cluster.device("gpu0").memory)
        if len(tried) < 2 or fail_all:
            raise torch.OutOfMemoryError("CUDA out of memory (stood in for)")
        return {}

    _stand_in_a_gpu(monkeypatch, scratch)
    fail_all = False
    ours = compile(model, ex["inputs"], ex["loss_fn"], targets=ex["targets"], mem=budget, solver="heuristic")
    assert tried == [budget, int(budget * 0.75)] and ours.cluster.device("gpu0").memory == budget
    tried.clear()
    fail_all = True
    with pytest.raises(ExecuteError, match="could not measure the ops' scratch"):
        compile(model, ex["inputs"], ex["loss_fn"], targets=ex["targets"], mem=budget, solver="heuristic")
    assert tried == [budget, int(budget * 0.75), int(budget * 0.5)]


def test_a_sync_marks_only_the_busy_streams_and_the_others_wait_before_their_next_work(monkeypatch):
    """CUDA streams after a sync: the stream that got work records a mark, each other waits for the newest mark
    of every busy stream before its next work, once, and a stream idle since the last sync records none."""
    class Stream:
        device_index = 0

        def __init__(self, name):
            self.name, self.waited = name, []

        def wait_event(self, ev):
            self.waited.append(ev)

    marks = []

    def recorded(stream):
        marks.append(f"{stream.name}{len(marks) + 1}")
        return marks[-1]

    monkeypatch.setattr(Replayer, "_recorded", staticmethod(recorded))
    current = []
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: "the caller's")
    monkeypatch.setattr(torch.cuda, "set_stream", current.append)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: "the caller's device")
    monkeypatch.setattr(torch.cuda, "set_device", current.append)
    r = Replayer.__new__(Replayer)
    a, b, c = Stream("a"), Stream("b"), Stream("c")
    r.streams, r.pending, r.busy, r.owed, r.dev = {"gpu0": a, "gpu0->host": b, "host->gpu0": c}, [], set(), {}, {}
    r.on, r.callers = {}, {}
    r._work_on(a)
    r._sync()                 # a1
    r._work_on(a)
    r._sync()                 # a2 replaces a1 for b and c
    r._work_on(b)
    assert b.waited == ["a2"]
    r._sync()                 # b3; a was idle: no mark
    assert marks == ["a1", "a2", "b3"]
    r._work_on(c)
    r._work_on(a)
    r._work_on(a)
    assert sorted(c.waited) == ["a2", "b3"] and a.waited == ["b3"] and b.waited == ["a2"]
    r._sync(ahead=frozenset())           # no stream gets work after it: nothing to mark
    r._work_on(a)
    r._sync(ahead=frozenset({a}))        # only a gets work later, and waits for no one
    assert marks == ["a1", "a2", "b3"] and r.busy == set() and r.owed == {}
    r._work_on(b)
    r._sync(ahead=frozenset({a, b}))     # c gets no more work: b's mark is owed to a alone
    assert marks[-1] == "b4" and r.owed == {a: {b: "b4"}}
    r._sync(host=True)        # the end of the step: nothing is owed to the next
    assert r.owed == {} and r.busy == set()
    r._put_back()             # a stream is made current only where another was
    assert current == [a, b, c, a, b, "the caller's", "the caller's device"] and r.on == r.callers == {}


def test_a_compute_records_an_event_only_where_a_copy_reads_its_value(offload_case, monkeypatch):
    """The accelerator's stream, stood in for on the CPU: a compute records an event only where a copy reads what
    it made, every such copy waits for that event, the stream itself waits on none (its work runs in order); it is
    made current once a step, and the caller's stream is current again after the step, even one that fails; the
    gradients stay bitwise eager's."""
    ex, step, graph, cluster, schedule = offload_case

    class Stream:
        device, device_index = torch.device("cpu"), 0

        def __init__(self):
            self.waited = []

        def wait_event(self, ev):
            self.waited.append(ev)

        def wait_stream(self, other):
            pass

    class Event:
        def __init__(self, stream):
            self.stream = stream

        def synchronize(self):
            pass

    recorded, copied, current = [], [], []
    copy_into = replay_module._copy_into

    def record(stream):
        recorded.append(Event(stream))
        return recorded[-1]

    def spy(dst, src, ev):
        copied.append(ev)
        copy_into(dst, src, ev)

    monkeypatch.setattr(Replayer, "_recorded", staticmethod(record))
    monkeypatch.setattr(replay_module, "_copy_into", spy)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: "the caller's")
    monkeypatch.setattr(torch.cuda, "set_stream", current.append)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: "the caller's device")
    monkeypatch.setattr(torch.cuda, "set_device", current.append)
    with Replayer(ex["model"], step, graph, cluster, schedule, {"gpu0": "cpu"}) as replay:   # CPU on a CUDA box too
        stream = replay.streams["gpu0"] = Stream()
        _check_step(replay, ex)
        assert current == [stream, "the caller's", "the caller's device"]
        read = {(x.node, x.src) for x in schedule.instructions if isinstance(x, Copy)}
        made = [x for x in schedule.instructions if isinstance(x, Compute) and (x.node, x.device) in read]
        assert 0 < len(made) < sum(isinstance(x, Compute) for x in schedule.instructions)
        assert len(recorded) == len(made) and all(ev.stream is stream for ev in recorded)
        from_gpu = [x for x in schedule.instructions if isinstance(x, Copy) and x.src == "gpu0"]
        assert sum(isinstance(ev, Event) for ev in copied) == len(from_gpu) > 0 and stream.waited == []
        calls = []

        def fails(self, d, v, n, env=None):
            calls.append(v)
            if len(calls) == 3:
                raise RuntimeError("CUDA out of memory (stood in)")
            return replay_module.Replayer._call(self, d, n, env)

        monkeypatch.setattr(Replayer, "_run_op", fails)
        with pytest.raises(RuntimeError, match="stood in"):
            replay.run(ex["inputs"], ex["targets"])
        assert current == [stream, "the caller's", "the caller's device"] * 2


@pytest.mark.cuda
@pytest.mark.parametrize("solver,frac", [("keep-everything", 1.0), ("offload-all", 1.0), ("dtr", 0.7),
                                         ("milp", 0.5)])
def test_cuda_gradients_match_eager(solver, frac):
    torch.manual_seed(6)
    ex = _on(BUILTIN["transformer"](), "cuda")
    model = ex["model"]
    step, graph = capture_step(model, ex["inputs"], ex["loss_fn"], targets=ex["targets"])
    big = single_accelerator(2**40)
    keep = simulate(graph, big, solve(graph, big, "keep-everything")).peak["gpu0"]
    cluster = single_accelerator(int(keep * frac))
    model.zero_grad(set_to_none=True)
    want_loss, want = _eager_grads(model, ex)
    schedule = solve(graph, cluster, solver, **({"time_limit": 10} if solver == "milp" else {}))
    if solver == "milp":   # copies to and from pinned host memory, with syncs between them
        assert {Copy, Sync} <= {type(x) for x in schedule.instructions}
    stats = Replayer(model, step, graph, cluster, schedule).run(ex["inputs"], ex["targets"])
    assert abs(stats.loss - want_loss.item()) <= 1e-5 * abs(want_loss.item())
    for p, g in zip(model.parameters(), want, strict=True):
        torch.testing.assert_close(p.grad, g, rtol=1e-5, atol=1e-6)
    assert "cuda:0" in stats.allocator_peak


@pytest.mark.cuda
def test_cuda_measure_costs():
    """On CUDA the ops are timed with events on the compute stream: every node gets a positive "cuda" cost."""
    torch.manual_seed(9)
    ex = _on(BUILTIN["transformer"](), "cuda")
    model, inputs, targets = ex["model"], ex["inputs"], ex["targets"]
    step, graph = capture_step(model, inputs, ex["loss_fn"], targets=targets)
    measured = measure_costs(model, step, graph, inputs, targets, device="cuda", runs=2)
    for n, m in zip(graph.nodes, measured.nodes, strict=True):
        assert m.cost["cuda"] > 0 and m.cost.get("cpu") == n.cost.get("cpu") and m.workspace >= n.workspace
    # fp32 attention runs the memory-efficient kernel on the GPU, which the CPU has none of
    assert {n.op for n in graph.nodes if "cpu" not in n.cost} >= {"_scaled_dot_product_efficient_attention.default"}
    bandwidth, latency = measure_copy("cuda")
    assert bandwidth > 0 and latency >= 0


@pytest.mark.cuda
def test_cuda_compile_trains_like_eager():
    """The drop-in integration on cuda:0 at 70% of the keep-everything peak: SGD steps through the replayed schedule
    (recomputation and swaps to pinned host memory) follow plain training's losses and parameters. (At half, what
    is left beside the model, 445 kB on an H100, is less than the attention backward needs with its scratch, 562 kB,
    and that op has no CPU kernel to run it on the host: compile says no schedule fits.)"""
    from optsched.solvers.baselines import keep_everything_peak
    from optsched.units import parse_size

    torch.manual_seed(7)
    ex = _on(BUILTIN["transformer"](), "cuda")
    model = ex["model"]
    ref = copy.deepcopy(model)
    asked = parse_size("70%", "mem", keep_everything_peak(capture_step(model, ex["inputs"], ex["loss_fn"],
                                                                       targets=ex["targets"])[1]))
    step = compile(model, ex["inputs"], ex["loss_fn"], targets=ex["targets"], mem="70%", solver="heuristic")
    budget = step.cluster.device("gpu0").memory   # what is left beside the model it holds on its one GPU
    assert budget < asked and step.predicted.peak["gpu0"] <= budget
    ours = _train(lambda: step(*ex["inputs"], *ex["targets"]).item(), model, ex)
    theirs = _train_eager(ref, ex)
    assert ours == pytest.approx(theirs, rel=1e-5) and ours[-1] < ours[0]
    for p, q in zip(model.parameters(), ref.parameters(), strict=True):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)
    assert step.last.peak["gpu0"] <= budget and "cuda:0" in step.last.allocator_peak
    assert step.last.peak_with_model_tensors["gpu0"] <= asked


def test_cli_capture_solve_run(tmp_path, capsys):
    """optsched capture, then solve, then run: the measured peak stays within the budget and the prediction."""
    import json

    from optsched.cli import main

    g, s = str(tmp_path / "g.json"), str(tmp_path / "s.json")
    assert main(["capture", "mlp", "-o", g]) == 0
    assert main(["solve", g, "--mem", "1.4MB", "--solver", "dtr", "-o", s]) == 0
    capsys.readouterr()
    assert main(["run", g, s, "--mem", "1.4MB", "--steps", "2", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    gpu = out["devices"]["gpu0"]
    assert gpu["measured_peak_bytes"] <= gpu["budget_bytes"] == 1_400_000
    assert abs(gpu["measured_peak_bytes"] - gpu["predicted_peak_bytes"]) <= 0.05 * gpu["predicted_peak_bytes"]
    assert len(out["losses"]) == 2 and out["losses"][0] == out["losses"][1]   # no optimizer: same loss
    capsys.readouterr()
    assert main(["run", g, s, "--mem", "1MB"]) == 2      # the schedule does not fit: refused, nothing runs
    assert "not valid" in capsys.readouterr().err


def test_cli_run_notes_the_model_tensors_and_hold_model_makes_room(tmp_path, capsys):
    """A schedule that swaps weights out: `optsched run` says gpu0 holds more than its budget once the model's
    tensors are counted; solved with --hold-model, it does not."""
    import json

    from optsched.cli import main

    g, s, h = str(tmp_path / "g.json"), str(tmp_path / "s.json"), str(tmp_path / "h.json")
    assert main(["capture", "mlp", "-o", g]) == 0
    assert main(["solve", g, "--mem", "1.3MB", "--solver", "heuristic", "-o", s]) == 0
    assert main(["solve", g, "--mem", "1.3MB", "--solver", "heuristic", "--hold-model", "-o", h]) == 0
    assert "--hold-model: the parameters and inputs" in capsys.readouterr().out
    assert main(["run", g, s, "--mem", "1.3MB", "--steps", "1"]) == 0
    assert "over its budget of 1.30 MB" in capsys.readouterr().out
    assert main(["run", g, h, "--mem", "1.3MB", "--steps", "1", "--json"]) == 0
    gpu = json.loads(capsys.readouterr().out)["devices"]["gpu0"]
    assert gpu["peak_with_model_tensors_bytes"] <= gpu["budget_bytes"] == 1_300_000
