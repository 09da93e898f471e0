"""What an operation costs on each device kind.

Two ways, as users need them:
- `roofline`: analytic, from the FLOPs (PyTorch's FlopCounterMode formulas,
  which count matmuls, convolutions and attention) and the bytes the op reads
  and writes: seconds = launch overhead + max(FLOPs / peak rate for the dtype,
  bytes / memory bandwidth). The bytes term is what makes pointwise ops, and
  ops the FLOP formulas do not know, cost something. Device presets hold
  achievable (not datasheet) rates; `measure_cpu()` times this machine's CPU
  once per process. A user overrides a preset with `DeviceModel(...)`.
- `profile`: run each op on the present device on random tensors of the
  captured shapes, median of several runs after warm-up; also the scratch
  each op allocates and releases while it runs (`scratch_of`), which the
  captured graph adds to the op's workspace (`with_scratch`).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from functools import lru_cache

import torch

from ..graph import Graph
from .memory import cpu_allocation_levels
from .trace import is_view


@dataclass(frozen=True)
class DeviceModel:
    """Achievable rates of one device kind."""

    name: str
    kind: str                   # "cuda" or "cpu"
    flops: Mapping[str, float]  # dtype name -> FLOP/s; "default" for the rest
    bandwidth: float            # bytes/s of memory traffic
    overhead: float             # seconds per op (launch, dispatch)

    def seconds(self, flops: float, bytes_moved: float, dtype: str = "float32") -> float:
        rate = self.flops.get(dtype, self.flops["default"])
        return self.overhead + max(flops / rate, bytes_moved / self.bandwidth)


# Datasheet peaks times typical achieved fractions (about 70% for dense math, 80% for memory traffic).
# float32 matmuls on CUDA run without TF32, PyTorch's default.
PRESETS: dict[str, DeviceModel] = {
    "h100": DeviceModel("NVIDIA H100 SXM", "cuda",
                        {"float32": 0.7 * 67e12, "bfloat16": 0.7 * 989e12, "float16": 0.7 * 989e12,
                         "default": 0.7 * 67e12}, 0.8 * 3.35e12, 5e-6),
    "a100": DeviceModel("NVIDIA A100 SXM", "cuda",
                        {"float32": 0.7 * 19.5e12, "bfloat16": 0.7 * 312e12, "float16": 0.7 * 312e12,
                         "default": 0.7 * 19.5e12}, 0.8 * 2.0e12, 5e-6),
}


@lru_cache(maxsize=1)
def measure_cpu() -> DeviceModel:
    """This machine's CPU: a float32 matmul rate, a copy bandwidth and a per-op overhead, timed once."""
    a = torch.randn(512, 512)
    b = torch.randn(512, 512)
    mm = _median_time(lambda: torch.mm(a, b), 5)
    big = torch.empty(8 * 2**20)
    copy = _median_time(lambda: big.clone(), 5)
    tiny = torch.zeros(1)
    over = _median_time(lambda: tiny.add(1), 20)
    rate = 2 * 512**3 / max(mm, 1e-9)
    return DeviceModel("host CPU (measured)", "cpu", {"float32": rate, "default": rate},
                       2 * big.numel() * 4 / max(copy, 1e-9), over)


def timed_runs(fn: Callable[[], object], runs: int, warmup: int = 2,
               sync: Callable[[], None] = lambda: None) -> list[tuple[float, object]]:
    """(seconds, result) of `runs` calls of fn after `warmup` untimed ones (first calls pay for caches)."""
    for _ in range(warmup):
        fn()
    sync()
    out = []
    for _ in range(runs):
        t = time.perf_counter()
        result = fn()
        sync()
        out.append((time.perf_counter() - t, result))
    return out


def _median_time(fn: Callable[[], object], runs: int, warmup: int = 2,
                 sync: Callable[[], None] = lambda: None) -> float:
    return statistics.median(t for t, _ in timed_runs(fn, runs, warmup, sync))


def _tensor_bytes(v) -> int:
    if isinstance(v, torch.Tensor):
        return v.numel() * v.element_size()
    if isinstance(v, (tuple, list)):
        return sum(_tensor_bytes(x) for x in v)
    return 0


def work(n: torch.fx.Node) -> tuple[float, float, str]:
    """(FLOPs, bytes read and written, dtype) of one FX call."""
    from torch.utils.flop_counter import flop_registry

    val = n.meta.get("val")
    arg_vals = lambda x: x.meta.get("val") if isinstance(x, torch.fx.Node) else x
    args = torch.fx.node.map_arg(n.args, arg_vals)
    kwargs = torch.fx.node.map_arg(n.kwargs, arg_vals)
    packet = getattr(n.target, "overloadpacket", None)
    flops = 0.0
    if packet in flop_registry:
        try:
            flops = float(flop_registry[packet](*args, **kwargs, out_val=val))
        except Exception:  # noqa: BLE001 - a formula that does not fit these arguments counts as no FLOPs
            flops = 0.0
    moved = sum(_tensor_bytes(a.meta.get("val")) for a in n.all_input_nodes) + _tensor_bytes(val)
    first = val[0] if isinstance(val, (tuple, list)) else val
    dtype = str(first.dtype).removeprefix("torch.") if isinstance(first, torch.Tensor) else "float32"
    return flops, float(moved), dtype


def roofline(models: Mapping[str, DeviceModel]) -> Callable:
    """A `cost_of(fx_node)` giving {device kind: seconds} for each model; views cost nothing."""

    def cost_of(n, *, flops: float = 0.0, bytes_moved: float = 0.0, dtype: str = "float32") -> dict[str, float]:
        if n is not None:
            if is_view(n):
                return {k: 0.0 for k in models}
            flops, bytes_moved, dtype = work(n)
        return {k: m.seconds(flops, bytes_moved, dtype) for k, m in models.items()}

    return cost_of


def _materialize(v, device):
    """A real tensor with the shape, strides and dtype of a traced value."""
    if not isinstance(v, torch.Tensor):
        return v
    t = torch.empty_strided(tuple(v.shape), tuple(v.stride()), dtype=v.dtype, device=device)
    if t.is_floating_point():
        t.normal_()
    else:
        t.zero_()
    return t


def profiled(base: Callable, device: str, runs: int = 5) -> tuple[Callable, list[str], dict[str, int]]:
    """A `cost_of` that measures each op on `device` for that device's kind and keeps `base` for the others.

    Returns it, the list of ops that could not run on random inputs (they keep the roofline figure), and the
    scratch of each op that has some (FX op name -> bytes: `scratch_of`), filled as `cost_of` runs.
    """
    dev = torch.device(device)
    kind = "cuda" if dev.type == "cuda" else "cpu"
    sync = (lambda: torch.cuda.synchronize(dev)) if dev.type == "cuda" else (lambda: None)
    failed: list[str] = []
    took: dict[str, int] = {}

    def cost_of(n, **kw) -> dict[str, float]:
        cost = base(n, **kw)
        if n is None or is_view(n):
            return cost
        to_real = lambda x: _materialize(x.meta.get("val"), dev) if isinstance(x, torch.fx.Node) else x
        try:
            args = torch.fx.node.map_arg(n.args, to_real)
            kwargs = torch.fx.node.map_arg(n.kwargs, to_real)
            with torch.no_grad():
                cost[kind] = _median_time(lambda: n.target(*args, **kwargs), runs, sync=sync)
                if extra := scratch_of(lambda: n.target(*args, **kwargs), dev):
                    took[n.name] = extra
        except Exception:  # noqa: BLE001 - e.g. an index op whose random indices are out of range
            failed.append(n.name)
        return cost

    return cost_of, failed, took


def run_op(call: Callable[[], object], device: torch.device) -> tuple[object, int]:
    """`call()`'s result and its scratch: the bytes it allocates and releases again while it runs on a GPU (cuBLAS
    and reduction buffers, temporaries of composite ops; 0 elsewhere). The caching allocator counts a host-issued
    allocation at once, so no synchronization is needed."""
    if device.type != "cuda":
        return call(), 0
    torch.cuda.reset_peak_memory_stats(device)
    out = call()
    return out, int(torch.cuda.max_memory_allocated(device) - torch.cuda.memory_allocated(device))


def scratch_of(call: Callable[[], object], device: torch.device) -> int:
    """What `call()` allocates and releases again while it runs alone in the process on `device`: on a GPU the
    caching allocator's count (`run_op`), elsewhere the CPU allocator's, from the profiler's allocation events
    (convolution backward's buffers there grow with torch's threads: the default cnn's keep-everything peak without
    them is 9% under eager's at 2 threads, 15% at 16)."""
    if device.type == "cuda":
        return run_op(call, device)[1]
    out = []
    peak, held = cpu_allocation_levels(lambda: out.append(call()))
    return peak - held


def with_scratch(graph: Graph, scratch: Mapping[str, int]) -> Graph:
    """The graph with each node's measured scratch added to its workspace (held while it runs)."""
    return Graph(tuple(replace(n, workspace=n.workspace + scratch[n.id]) if scratch.get(n.id) else n
                       for n in graph.nodes), graph.name, graph.meta)
