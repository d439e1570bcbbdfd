"""Process groups the stack started: whether one runs, and stopping them together."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Iterable
from pathlib import Path


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie, exited but not yet collected by its parent, does not)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return True  # no /proc (macOS): it answered the signal
    return state not in ("Z", "X")


def _stop_group(pid: int, timeout: float = 20.0) -> bool:
    """SIGTERM the process group ``pid`` leads, then SIGKILL what is left."""
    return pid in _stop_groups([pid], timeout)


def _stop_groups(pids: Iterable[int], timeout: float = 20.0) -> set[int]:
    """SIGTERM the process groups ``pids`` lead, together; SIGKILL what is left of them
    after ``timeout``. The groups that were running."""
    running = set()
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGTERM)
            running.add(pid)
    left = set(running)
    deadline = time.monotonic() + timeout
    while left and time.monotonic() < deadline:
        for pid in list(left):
            _reap(pid)
            try:
                os.killpg(pid, 0)
            except ProcessLookupError:
                left.discard(pid)
        time.sleep(0.2)
    for pid in left:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGKILL)
        _reap(pid)
    return running


def _reap(pid: int) -> None:
    """Collect ``pid`` if it is this process's child (``up`` and ``down`` in one process)."""
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)
