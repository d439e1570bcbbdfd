"""A niced launcher's nodes stay niced: each node leads its own session, which Linux's
sched_autogroup makes a scheduling group of its own where nice does not reach."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

PROBE = """
import os, subprocess, sys
from pathlib import Path
from flows.swarm.launcher import share_priority
os.nice(7)
child = subprocess.Popen(["sleep", "30"], start_new_session=True)
try:
    before = Path(f"/proc/{child.pid}/autogroup").read_text().split()[-1]
    share_priority(child.pid)
    print(before, Path(f"/proc/{child.pid}/autogroup").read_text().split()[-1])
finally:
    child.kill()
"""


def test_a_niced_launcher_gives_each_nodes_session_its_niceness() -> None:
    if not Path("/proc/self/autogroup").exists():
        pytest.skip("no sched_autogroup on this kernel: nice reaches every process already")
    root = Path(__file__).resolve().parents[2]
    done = subprocess.run(
        [sys.executable, "-c", PROBE], capture_output=True, text=True, cwd=root, timeout=60
    )
    assert done.returncode == 0, done.stderr
    # A new session starts at 0; now the launcher's: ours (tests run niced too) plus 7.
    assert done.stdout.split() == ["0", str(min(os.nice(0) + 7, 19))]
