"""No process a test starts outlives the session: process groups are stopped whole, and a
leftover fails the run (and is stopped) at session end."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from tests.conftest import stop_process_group

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="uses /proc")


def running(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def gone(pid: int, within: float = 5.0) -> bool:
    deadline = time.monotonic() + within
    while running(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    return not running(pid)


def test_stopping_a_process_group_stops_what_its_leader_started(tmp_path: Path) -> None:
    pid_file = tmp_path / "grandchild"
    # the leader ignores SIGTERM: the group gets SIGKILL after the timeout
    script = f"trap '' TERM; sleep 120 & echo $! > {pid_file}; wait"
    proc = subprocess.Popen(["sh", "-c", script], start_new_session=True)
    while not pid_file.exists() or not pid_file.read_text().strip():
        time.sleep(0.05)
    grandchild = int(pid_file.read_text())
    began = time.monotonic()
    stop_process_group(proc, timeout=1.0)
    assert proc.returncode is not None and time.monotonic() - began < 10
    assert gone(grandchild)


def test_a_process_left_running_fails_the_session_and_is_stopped(tmp_path: Path) -> None:
    (tmp_path / "conftest.py").write_text(
        "from tests.conftest import pytest_configure, pytest_runtest_logfinish, "
        "pytest_sessionfinish  # noqa: F401\n"
    )
    pid_file = tmp_path / "orphan"
    (tmp_path / "test_leak.py").write_text(
        textwrap.dedent(
            f"""
            import subprocess

            def test_leaks_an_orphan():
                # the shell exits at once; its `sleep` is orphaned, as a killed node's
                # Prefect server is
                subprocess.run(["sh", "-c", "sleep 120 & echo $! > {pid_file}"], check=True)
            """
        )
    )
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", str(tmp_path)],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    orphan = int(pid_file.read_text())
    assert done.returncode == 1, done.stdout + done.stderr
    assert "1 processes started by tests outlived them (now stopped)" in done.stdout
    assert f"pid {orphan}, running since test_leak.py::test_leaks_an_orphan" in done.stdout
    assert gone(orphan)
