"""Capture the forward+backward graph of a PyTorch model as an optsched `Graph`.

Needs torch; nothing outside `capture` and `execute` imports it.

    graph = optsched.capture.capture(model, (x,), F.cross_entropy, targets=(y,))

`capture_factory` builds the model itself, under `FakeTensorMode` when
`fake=True`, so a billion-parameter model is captured without allocating its
weights.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from ..graph import Graph
from .cost import PRESETS, DeviceModel, measure_cpu, profiled, roofline, with_scratch
from .trace import CaptureError, Step, _as_tuple, default_loss, export_step, fold, joint_to_graph

__all__ = ["capture", "capture_step", "capture_factory", "normalize_example", "CaptureError", "DeviceModel",
           "PRESETS", "measure_cpu", "export_step", "Step", "default_loss"]


def _device_models(cuda: str | DeviceModel, cpu: DeviceModel | None) -> dict[str, DeviceModel]:
    if isinstance(cuda, str):
        if cuda not in PRESETS:
            raise CaptureError(f"unknown device preset {cuda!r}", field="cuda",
                               hint=f"use one of {', '.join(PRESETS)} or pass a DeviceModel")
        cuda = PRESETS[cuda]
    return {"cuda": cuda, "cpu": cpu or measure_cpu()}


def capture(model, example_inputs, loss_fn: Callable | None = None, *, targets=None, optimizer: str | None = None,
            cuda: str | DeviceModel = "h100", cpu: DeviceModel | None = None, profile: bool = False,
            name: str | None = None) -> Graph:
    """The joint graph of one training step of `model` on `example_inputs`.

    loss_fn(output, *targets) gives the scalar loss; without it the model's
    `.loss` or the mean of its output is used. `optimizer` ("sgd", "adam")
    adds the parameter update. Costs: the roofline of `cuda` (a preset name or
    a DeviceModel) and of `cpu` (measured on this machine by default);
    `profile=True` measures each op instead on the device the model is on.
    """
    return capture_step(model, example_inputs, loss_fn, targets=targets, optimizer=optimizer, cuda=cuda, cpu=cpu,
                        profile=profile, name=name)[1]


def capture_step(model, example_inputs, loss_fn: Callable | None = None, *, targets=None,
                 optimizer: str | None = None, cuda: str | DeviceModel = "h100", cpu: DeviceModel | None = None,
                 profile: bool = False, name: str | None = None) -> tuple[Step, Graph]:
    """`capture`, also returning the traced step the graph was read from (the executor replays it)."""
    step = export_step(model, example_inputs, targets, loss_fn)
    models = _device_models(cuda, cpu)
    cost_of = roofline(models)
    failed: list[str] = []
    scratch: dict[str, int] = {}
    if profile:
        device = next(model.parameters()).device
        if device.type == "meta" or _is_fake(model):
            raise CaptureError("cannot profile a model without real weights", field="profile",
                               hint="drop --profile, or capture without --fake")
        cost_of, failed, scratch = profiled(cost_of, str(device))
    graph = joint_to_graph(step, cost_of, name=name or type(model).__name__, optimizer=optimizer)
    info = graph.meta["capture"]
    info["cost"] = "profiled" if profile else "roofline"
    info["cuda_model"] = models["cuda"].name
    info["parameters"] = sum(p.numel() for p in model.parameters())
    if failed:
        info["profile_failed"] = failed
    if scratch:     # each op's joins the workspace of its node (a multi-output op's, its primary's)
        info["scratch_bytes"] = dict(sorted(scratch.items()))
        primary = fold(step).primary
        graph = with_scratch(graph, {primary.get(op, op): b for op, b in scratch.items()})
    return step, graph


def _is_fake(model) -> bool:
    from torch._subclasses.fake_tensor import FakeTensor

    return any(isinstance(p, FakeTensor) for p in model.parameters())


def normalize_example(obj) -> dict:
    """Accept a bare model, (model, inputs[, loss_fn]) or a dict with model/inputs/targets/loss_fn."""
    import torch

    if isinstance(obj, torch.nn.Module):
        return {"model": obj}
    if isinstance(obj, Mapping):
        if "model" not in obj:
            raise CaptureError("the factory returned a dict without 'model'",
                               hint="return a module, (model, inputs[, loss_fn]) or dict(model=..., inputs=...)")
        return dict(obj)
    if isinstance(obj, tuple) and obj and isinstance(obj[0], torch.nn.Module):
        keys = ("model", "inputs", "loss_fn")
        return dict(zip(keys, obj, strict=False))
    raise CaptureError(f"the factory returned {type(obj).__name__}",
                       hint="return a module, (model, inputs[, loss_fn]) or dict(model=..., inputs=...)")


def capture_factory(factory: Callable[[], object], *, inputs=None, targets=None, fake: bool = False, dtype=None,
                    **kw) -> Graph:
    """Build the model with `factory()` (under FakeTensorMode when `fake`) and capture it.

    `inputs`/`targets` override what the factory returns; under `fake` they are
    made fake too, so no real activation memory is touched. `dtype` (say
    torch.bfloat16) converts the model and the floating-point inputs and targets.
    """
    import contextlib

    from torch._subclasses.fake_tensor import FakeTensorMode

    mode = FakeTensorMode(allow_non_fake_inputs=True) if fake else None
    with mode if mode else contextlib.nullcontext():
        ex = normalize_example(factory())
        model = ex["model"]
        inputs = _as_tuple(inputs if inputs is not None else ex.get("inputs"))
        targets = _as_tuple(targets if targets is not None else ex.get("targets"))
        if fake:
            conv = lambda t: mode.from_tensor(t) if hasattr(t, "dim") and not _fake_tensor(t) else t
            inputs, targets = tuple(map(conv, inputs)), tuple(map(conv, targets))
        if dtype is not None:
            model = _to_dtype(model, dtype) if fake else model.to(dtype)
            cast = lambda t: t.to(dtype) if hasattr(t, "is_floating_point") and t.is_floating_point() else t
            inputs, targets = tuple(map(cast, inputs)), tuple(map(cast, targets))
    if not inputs:
        raise CaptureError("no example inputs: the factory returned none and no input shape was given",
                           hint="give --input-shape, e.g. --input-shape 8,3,224,224")
    return capture(model, inputs, ex.get("loss_fn"), targets=targets, **kw)


def _to_dtype(model, dtype):
    """`model.to(dtype)` for fake parameters, which `Module.to` cannot swap (the fake mode holds weak references)."""
    from torch import nn

    new: dict[int, object] = {}
    for mod in model.modules():
        for store in (mod._parameters, mod._buffers):
            for key, t in store.items():
                if t is not None and t.is_floating_point():
                    if id(t) not in new:  # a tensor shared by two modules stays shared
                        moved = t.detach().to(dtype)
                        new[id(t)] = nn.Parameter(moved, t.requires_grad) if isinstance(t, nn.Parameter) else moved
                    store[key] = new[id(t)]
    return model


def _fake_tensor(t) -> bool:
    from torch._subclasses.fake_tensor import FakeTensor

    return isinstance(t, FakeTensor)
