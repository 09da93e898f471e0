"""A call run in a child process (`optsched.solvers.apart`): its value, its error, stopping it, and the child
leaving when its caller is gone."""

import os
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from optsched.solvers import apart
from optsched.solvers.apart import Apart, ChildLost


def _ended(call: Apart, seconds: float = 30) -> None:
    call.thread.join(seconds)
    assert not call.thread.is_alive()


def test_the_call_runs_in_another_process_and_returns_its_value():
    call = Apart(os.getpid)
    _ended(call)
    assert call.in_child and call.result() != os.getpid()


def test_the_childs_error_is_raised_again_in_the_caller():
    call = Apart(int, "not a number")
    _ended(call)
    with pytest.raises(ValueError, match="not a number") as e:
        call.result()
    assert "raised in optsched's child process" in "\n".join(e.value.__notes__)


def test_an_answer_that_cannot_be_sent_back_is_said_so():
    call = Apart(threading.Lock)       # a lock cannot be pickled
    _ended(call)
    with pytest.raises(ChildLost, match="cannot be sent back"):
        call.result()


def test_a_child_that_dies_without_an_answer_is_said_so():
    call = Apart(os._exit, 3)
    _ended(call)
    with pytest.raises(ChildLost, match="exit code 3"):
        call.result()


def test_what_the_call_prints_does_not_spoil_its_answer(capfd):
    call = Apart(print, "said by the child")
    _ended(call)
    assert call.result() is None
    assert "said by the child" in capfd.readouterr().err


def test_a_call_that_cannot_be_pickled_runs_in_a_thread_with_its_value():
    pid = os.getpid()
    call = Apart(lambda: os.getpid())
    _ended(call)
    assert not call.in_child and call.result() == pid


def test_here_is_what_runs_in_the_thread_instead():
    call = Apart(lambda: "not this", here=lambda: "this")
    _ended(call)
    assert call.result() == "this"


def test_a_call_not_allowed_a_child_runs_here():
    call = Apart(os.getpid, child=False)
    _ended(call)
    assert not call.in_child and call.result() == os.getpid()


def test_with_children_off_the_call_runs_here(monkeypatch):
    monkeypatch.setattr(apart, "IN_CHILD", False)
    call = Apart(os.getpid)
    _ended(call)
    assert not call.in_child and call.result() == os.getpid()


def test_stop_ends_the_child_at_once_and_result_says_so():
    call = Apart(time.sleep, 60)
    t = time.perf_counter()
    call.stop()
    assert time.perf_counter() - t < 5 and not call.thread.is_alive()
    with pytest.raises(ChildLost, match="stopped"):
        call.result()


def test_the_result_is_not_there_before_the_call_ends():
    call = Apart(time.sleep, 60)
    try:
        with pytest.raises(RuntimeError, match="before the call ended"):
            call.result()
    finally:
        call.stop()


@pytest.mark.skipif(not os.path.exists("/proc/self/stat"), reason="reads a process's state from /proc")
def test_the_child_leaves_when_its_caller_dies():
    # the caller is killed outright (no cleanup): the child sees its stdin close and leaves
    script = textwrap.dedent("""
        import os, sys, time
        from optsched.solvers.apart import Apart, ChildLost
        call = Apart(time.sleep, 120)
        print(call._proc.pid, flush=True)
        time.sleep(120)
    """)
    caller = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True,
                              env={**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)})
    with caller.stdout:
        pid = int(caller.stdout.readline())
    caller.kill()
    caller.wait()
    deadline = time.perf_counter() + 10
    while time.perf_counter() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            break
        if _zombie(pid):
            break
        time.sleep(0.05)
    else:
        os.kill(pid, 9)
        pytest.fail("the child outlived its caller by 10 s")


def _zombie(pid: int) -> bool:
    """Whether pid has ended and waits only for its (gone) parent's reaper."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:       # gone between the two looks
        return True
