"""Measure the memory one eager training step really uses, to check the captured graph against it.

CPU: PyTorch's CPU allocator reports every allocation and free to the
profiler with the running total, so the peak of live storage bytes is exact.
CUDA: `torch.cuda.max_memory_allocated`.

Both count what a keep-everything schedule of the captured graph holds:
parameters, buffers, the step's inputs, activations, gradients. `.grad` must
be None at the start (gradients are allocated by the step).
"""

from __future__ import annotations

import os
import sys
from contextlib import contextmanager

import torch

from .trace import _as_tuple, _WithLoss


def model_storages(model: torch.nn.Module, tensors) -> dict[int, tuple[str, int]]:
    """The storages of the model's parameters and buffers and of `tensors`, each once: data pointer -> (its torch
    device, its bytes)."""
    out: dict[int, tuple[str, int]] = {}
    for t in (*model.parameters(), *model.buffers(), *tensors):
        s = t.untyped_storage()
        out.setdefault(s.data_ptr(), (str(t.device), s.nbytes()))
    return out


def _resident(model: torch.nn.Module, tensors, device=None) -> int:
    """Bytes of the storages of the model's parameters and buffers and of `tensors` (on `device` alone if given)."""
    where = None if device is None else str(torch.device(device))
    return sum(n for dev, n in model_storages(model, tensors).values() if where is None or dev == where)


def cpu_allocation_peak(fn) -> int:
    """Peak of CPU-allocator bytes allocated while `fn()` runs, above what was allocated before it."""
    return cpu_allocation_levels(fn)[0]


def cpu_allocation_levels(fn) -> tuple[int, int]:
    """(peak, held when it returns) of CPU-allocator bytes while `fn()` runs, above the level before it.

    The held part of a forward pass is what it keeps for the backward (what `activation_memory_budget` limits).
    """
    from torch._C._profiler import _EventType
    from torch.profiler import ProfilerActivity, profile

    prof = profile(activities=[ProfilerActivity.CPU], profile_memory=True)
    with _quiet_stderr():
        prof.__enter__()
    try:
        fn()
    finally:
        with _quiet_stderr():
            prof.__exit__(None, None, None)
    events = []
    stack = list(prof.profiler.kineto_results.experimental_event_tree())
    while stack:
        e = stack.pop()
        if e.tag == _EventType.Allocation and e.extra_fields.device.type == "cpu":
            events.append((e.start_time_ns, e.extra_fields.alloc_size, e.extra_fields.total_allocated))
        stack.extend(e.children)
    if not events:
        return 0, 0
    events.sort()
    start = events[0][2] - events[0][1]
    return max(total for _, _, total in events) - start, events[-1][2] - start


@contextmanager
def _quiet_stderr():
    """The process's stderr (fd 2) to /dev/null meanwhile: the profiler's library writes a line there each time it
    starts and stops ("USDT: ... profiler_start"), which a capture measuring each op's scratch would print hundreds
    of times."""
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def eager_peak(model: torch.nn.Module, inputs, targets=None, loss_fn=None) -> int:
    """Peak bytes of one plain training step (forward, loss, `loss.backward()`) on the model's device."""
    inputs, targets = _as_tuple(inputs), _as_tuple(targets)
    step = _WithLoss(model, loss_fn, len(inputs))
    model.zero_grad(set_to_none=True)
    device = next(model.parameters()).device
    run = lambda: step(*inputs, *targets)[0].backward()
    try:
        if device.type == "cuda":
            torch.cuda.synchronize(device)
            torch.cuda.reset_peak_memory_stats(device)
            run()
            torch.cuda.synchronize(device)
            return int(torch.cuda.max_memory_allocated(device))
        return _resident(model, inputs + targets) + cpu_allocation_peak(run)
    finally:
        model.zero_grad(set_to_none=True)
