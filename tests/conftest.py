"""Tests marked `cuda` run on a GPU and are skipped without one. Every other test runs as on a machine without
CUDA wherever it runs, its fixtures too: a CPU test on a GPU box would otherwise replay onto cuda:0 (the default
device map) and capture with the GPU's kernels, and its exact comparisons would test another path than the one CI
runs."""
from __future__ import annotations

import importlib.util
import signal
import sys

import pytest


def pytest_configure(config):
    config.addinivalue_line("markers", "cuda: needs a CUDA device (skipped without one); the only tests that see it")


def pytest_collection_modifyitems(config, items):
    marked = [item for item in items if item.get_closest_marker("cuda")]
    if not marked or importlib.util.find_spec("torch") is not None and __import__("torch").cuda.is_available():
        return
    for item in marked:
        item.add_marker(pytest.mark.skip(reason="needs a CUDA device"))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """Around the test's setup, call and teardown (so also around the module fixtures it sets up)."""
    torch = sys.modules.get("torch")
    if torch is None or item.get_closest_marker("cuda"):
        yield
        return
    real = torch.cuda.is_available
    torch.cuda.is_available = lambda: False
    try:
        yield
    finally:
        torch.cuda.is_available = real


@pytest.fixture
def torch_threads(request):
    """torch's threads while the test runs: one, as the executor runs on the CPU (several fight for the cores when the
    machine is busy), or the count a test gives it (`indirect` parametrization)."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(getattr(request, "param", 1))
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def ctrl_c():
    """Python's own handler for SIGINT while the test runs, so Ctrl-C (a SIGINT, `_thread.interrupt_main`) raises
    KeyboardInterrupt: a process a shell starts in the background without job control inherits SIGINT ignored, and
    Python then installs no handler, so the tests of what Ctrl-C does would see nothing happen."""
    old = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, old)
