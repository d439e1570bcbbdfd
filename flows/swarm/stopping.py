"""Stopping a local swarm: Ctrl-C (SIGINT), SIGTERM or a closed terminal (SIGHUP).

Each node process runs in its own process group, with the Prefect server it starts, so a
terminal's Ctrl-C reaches the launcher alone. The launcher then stops every node group at
once (SIGTERM, then SIGKILL after a grace period): the node abandons its step, and its
Prefect server goes with it, after it and not before (a node whose server died first kept
retrying its state reports for minutes). Abandoning a step is safe: a node killed at any
step resumes with nothing lost or written twice (tests/e2e/test_kill.py).
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, suppress
from pathlib import Path
from types import FrameType

from flows.node import checkpoint

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
GRACE_S = 5.0
"""How long a node group has after SIGTERM before it is killed."""
EXIT_STATUS = 130
"""What a shell reports for a program stopped by Ctrl-C."""


class SwarmStopped(Exception):
    """The launcher was asked to stop; its nodes were stopped. ``lines``: one per node."""

    def __init__(self, signal_name: str, lines: list[str]) -> None:
        super().__init__(f"stopped by {signal_name}")
        self.signal_name = signal_name
        self.lines = lines


def _signal_group(proc: subprocess.Popen[str], sig: signal.Signals) -> None:
    with suppress(ProcessLookupError):  # the group is gone already
        os.killpg(proc.pid, sig)


class NodeStopper:
    """Stops the node process groups when the launcher gets a stop signal."""

    def __init__(self, procs: Sequence[subprocess.Popen[str]] = ()) -> None:
        self.procs = list(procs)
        self.received: signal.Signals | None = None
        self.stopping = threading.Event()
        """Set at the first stop signal: what nodes print while they die (Prefect's
        "Crash detected!" for a flow run it sees aborted) is not shown."""

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.received is None:
            self.received = signal.Signals(signum)
            self.stopping.set()
            for proc in self.procs:
                _signal_group(proc, signal.SIGTERM)
            threading.Thread(target=self._kill_later, daemon=True).start()

    def _kill_later(self) -> None:
        deadline = time.monotonic() + GRACE_S
        for proc in self.procs:
            with suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            _signal_group(proc, signal.SIGKILL)

    def reap(self) -> None:
        """After the nodes exited: nothing of their groups survives (a Prefect server)."""
        for proc in self.procs:
            _signal_group(proc, signal.SIGKILL)

    @contextmanager
    def installed(self) -> Iterator[NodeStopper]:
        """Handle the stop signals while the nodes run (only the main thread can)."""
        if threading.current_thread() is not threading.main_thread():
            yield self
            return
        previous = {sig: signal.signal(sig, self._handle) for sig in STOP_SIGNALS}
        try:
            yield self
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)


def stopped_lines(workdir: Path, node_ids: Sequence[str]) -> list[str]:
    """Per node, what a stop left: the rounds its newest checkpoint holds."""
    lines = []
    for node_id in node_ids:
        saved = checkpoint.latest(workdir, node_id)
        if saved is None or saved.next_round == 0:
            lines.append(f"{node_id}: stopped before its first checkpoint")
        else:
            held = "round 0 is" if saved.next_round == 1 else f"rounds 0-{saved.next_round - 1} are"
            lines.append(
                f"{node_id}: stopped; {held} checkpointed, it resumes at round {saved.next_round}"
            )
    return lines
