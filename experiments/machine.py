"""The machine's names for the line every result file starts with, and model sizes for a GPU."""

from __future__ import annotations

import platform


def cpu_model() -> str:
    """/proc/cpuinfo's model name where Linux gives one, else what `platform` knows."""
    try:
        with open("/proc/cpuinfo") as f:
            return next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor() or platform.machine()


def gpu_model(index: int = 0) -> str:
    """CUDA's name for the GPU that runs the experiment."""
    import torch

    return torch.cuda.get_device_name(index)


# built-in model sizes at which a data-centre GPU (an H100) spends a step in the ops rather than in launching them
GPU_SIZES = {"mlp": {"batch": 4096, "width": 2048, "depth": 8}, "cnn": {"batch": 128, "size": 64, "width": 64},
             "transformer": {"batch": 16, "seq": 512, "d": 512, "heads": 8},
             "gpt2": {"batch": 8, "seq": 512, "d": 768, "heads": 12},
             "bert": {"batch": 8, "seq": 512, "d": 768, "heads": 12}}
