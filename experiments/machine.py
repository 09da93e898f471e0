"""The CPU's model name, for the machine line every result file starts with."""

from __future__ import annotations

import platform


def cpu_model() -> str:
    """/proc/cpuinfo's model name where Linux gives one, else what `platform` knows."""
    try:
        with open("/proc/cpuinfo") as f:
            return next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor() or platform.machine()
