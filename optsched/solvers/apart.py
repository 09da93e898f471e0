"""A function run in a child Python process, beside the caller's own work.

The candidates' work is mostly Python (simulating and repairing roundings), which holds the GIL: two threads
share one core. lp-rounding's LP roundings and the bound's plans' roundings on BERT at 40% of its keep-everything
memory (2 cores): 11.0 s and 13.3 s side by side in two threads, 7.4 s and 6.1 s in two processes.

The child is the caller's own interpreter with its import path, handed the pickled call on stdin; it answers on
stdout, in a session of its own (a Ctrl-C at the terminal is the caller's to handle), and leaves when its stdin
closes: when the caller stops it, or dies. Where the call cannot be pickled or no child starts, it runs in a
thread of this process instead.
"""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
import threading
import traceback
from collections.abc import Callable

from ..errors import OptschedError

# a Ctrl-C at the terminal reaches the caller alone
_OWN_GROUP = ({"start_new_session": True} if os.name == "posix"
              else {"creationflags": getattr(subprocess, "CREATE_NEW_PROCESS_GROUP", 0)})
IN_CHILD = True     # False: every call runs in a thread here (for tests that change code the call runs: a child
                    # process would not see the change)


class ChildLost(OptschedError):
    """The child process gave no answer: it was stopped, died, or its answer could not be sent back."""


class Apart:
    """`fn(*args)` started at once, in a child process where it can be and `child` allows, else `here()` (default:
    the same call) in a thread. `thread` is alive while it runs; `result()` then returns its value or raises its
    error; `stop()` ends a child at once (a thread runs on: `here` must watch a stop event of its own)."""

    def __init__(self, fn, *args, here: Callable[[], object] | None = None, child: bool = True):
        self._got: dict = {}
        self._proc = None
        try:
            if not (child and IN_CHILD and sys.executable):
                raise OSError("no child process to start")
            payload = pickle.dumps((fn, args), protocol=pickle.HIGHEST_PROTOCOL)
            self._proc = subprocess.Popen(
                [sys.executable, "-c", "from optsched.solvers.apart import _child; _child()"],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, **_OWN_GROUP,
                env={**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)})
        except (pickle.PicklingError, TypeError, AttributeError, OSError):
            self.thread = threading.Thread(target=self._here, args=(here or (lambda: fn(*args)),), daemon=True)
        else:
            self.thread = threading.Thread(target=self._read, args=(payload,), daemon=True)
        self.thread.start()

    @property
    def in_child(self) -> bool:
        return self._proc is not None

    def _here(self, call) -> None:
        try:
            self._got["value"] = call()
        except BaseException as e:      # raised again by result()
            self._got["error"] = e

    def _read(self, payload: bytes) -> None:
        proc = self._proc
        try:
            proc.stdin.write(len(payload).to_bytes(8, "little") + payload)
            proc.stdin.flush()
            answer = proc.stdout.read()
        except (BrokenPipeError, OSError, ValueError):     # ValueError: stop() closed the pipes
            answer = b""
        proc.wait()
        self._close()
        try:
            kind, value = pickle.loads(answer)
        except Exception:
            if proc.returncode is not None and proc.returncode < 0:
                self._got["error"] = ChildLost("the child process was stopped")
            else:
                self._got["error"] = ChildLost(f"the child process ended (exit code {proc.returncode}) "
                                               "without an answer")
            return
        self._got[kind] = value

    def result(self):
        if self.thread.is_alive():
            raise RuntimeError("Apart.result() before the call ended")
        if "error" in self._got:
            raise self._got["error"]
        return self._got["value"]

    def stop(self) -> None:
        if self._proc is not None:
            if self._proc.poll() is None:
                self._proc.kill()
            self.thread.join()

    def _close(self) -> None:
        for f in (self._proc.stdin, self._proc.stdout):
            try:
                f.close()
            except OSError:
                pass


def _child() -> None:
    """The child's side: read the call, run it, write ("value", v) or ("error", e) (with the child's traceback as a
    note), and leave at once when stdin closes before that."""
    inp, out = sys.stdin.buffer, sys.stdout.buffer
    sys.stdout = sys.stderr         # whatever the call prints stays off the answer's channel
    size = int.from_bytes(inp.read(8), "little")
    fn, args = pickle.loads(inp.read(size))

    def orphaned() -> None:
        inp.read()      # returns at EOF: the caller closed it, or is gone
        os._exit(1)

    threading.Thread(target=orphaned, daemon=True).start()
    try:
        answer = ("value", fn(*args))
    except BaseException as e:      # noqa: BLE001 - every error goes back to the caller
        e.add_note("raised in optsched's child process:\n" + "".join(traceback.format_exception(e)).rstrip())
        answer = ("error", e)
    try:
        data = pickle.dumps(answer, protocol=pickle.HIGHEST_PROTOCOL)
        pickle.loads(data)      # the caller must be able to read it back
    except Exception as e:      # noqa: BLE001 - said to the caller instead
        data = pickle.dumps(("error", ChildLost(f"the child process's answer cannot be sent back: {e!r}")))
    out.write(data)
    out.flush()
    os._exit(0)
