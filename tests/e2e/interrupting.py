"""Ctrl-C as a terminal sends it, and what a swarm must have done when it stops
(flows/swarm/stopping.py): helpers of the end-to-end tests (tests/e2e/test_adapter_swarm.py
stops its swarm this way, then resumes it)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from tests.conftest import stop_process_group


def processes_mentioning(text: str) -> list[str]:
    """Command lines of the running processes whose command line or environment mention
    ``text`` (a node names its swarm file; its Prefect server has PREFECT_HOME)."""
    return [cmdline for _, cmdline in _mentioning(text)]


def pids_mentioning(text: str) -> list[int]:
    """The process ids of `processes_mentioning`."""
    return [pid for pid, _ in _mentioning(text)]


def _mentioning(text: str) -> list[tuple[int, str]]:
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            environ = (entry / "environ").read_bytes().decode(errors="replace")
        except OSError:
            continue
        if text in cmdline or text in environ:
            found.append((int(entry.name), cmdline))
    return found


def interrupted(args: list[str], line: str, wait_s: float = 300) -> tuple[str, float]:
    """Run `sapo ARGS` until it prints ``line``, then Ctrl-C it as a terminal would (the
    launcher's process group); its output and the seconds from Ctrl-C to its exit 130."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "flows.cli", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    lines: list[str] = []
    assert proc.stdout is not None
    reader = threading.Thread(target=lambda: lines.extend(proc.stdout or []), daemon=True)
    reader.start()
    try:
        deadline = time.monotonic() + wait_s
        while not any(line in seen for seen in list(lines)):
            assert time.monotonic() < deadline and proc.poll() is None, "".join(lines)[-3000:]
            time.sleep(0.1)
        os.killpg(proc.pid, signal.SIGINT)
        sent = time.monotonic()
        proc.wait(timeout=120)
        took = time.monotonic() - sent
    finally:
        stop_process_group(proc)
    reader.join(timeout=10)
    output = "".join(lines)
    assert proc.returncode == 130, output[-3000:]
    return output, took


def check_clean_stop(output: str, took: float, work: Path, nodes: list[str]) -> None:
    """What a swarm stopped by Ctrl-C (`interrupted`) must have done: exit within seconds,
    show none of its dying nodes' noise, say how far each node got and how to resume, and
    leave no process of its own (nodes, their Prefect servers) running."""
    assert took < 15, f"{took:.1f} s from Ctrl-C to exit"
    for noise in ("Traceback", "Crash detected", "Error logging to API"):
        assert noise not in output, output[-3000:]  # what dying nodes print is not shown
    tail = output.strip().splitlines()[-len(nodes) - 1 :]
    assert tail[0].startswith(f"{nodes[0]}: stopped; round"), tail
    for line, node in zip(tail[1:-1], nodes[1:], strict=True):
        assert line.startswith(f"{node}: stopped"), tail
    assert tail[-1] == "stopped by SIGINT: rerun the same command to resume"
    assert processes_mentioning(str(work)) == []
