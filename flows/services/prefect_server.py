"""A Prefect server on loopback for as long as a command needs one: `sapo deploy --serve`
(schedules need a server) and `sapo experiment` (its flow's states must outlive a Ctrl-C).

Prefect's own ephemeral server is a child in the command's process group, so the Ctrl-C that
stops a sweep stops the server too. The sweep then could not report that it stopped: its
last calls failed with a connection error and a traceback, instead of "stopped by SIGINT".
A detached server runs in a session of its own, which a terminal's Ctrl-C does not reach.
On Linux the kernel also stops it when the command dies, even by SIGKILL (PR_SET_PDEATHSIG).
Elsewhere a server is never detached: it stays in the command's group, and a stop of the
group stops it.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

SERVER_START_S = 180.0
SERVED_API = "api_url"
"""The file, in the local server's folder, that names its API while it runs."""

# Sets the parent-death signal, checks that the parent is still the one that started it (it
# may have died before the prctl call), then becomes the server: the signal survives exec.
_DIE_WITH_PARENT = """\
import ctypes, os, signal, sys
ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGTERM))  # PR_SET_PDEATHSIG
if os.getppid() != int(sys.argv[1]):
    sys.exit(1)
os.execv(sys.executable, [sys.executable, *sys.argv[2:]])
"""


def can_detach() -> bool:
    """Whether a server can leave the command's process group and still die with it."""
    return sys.platform.startswith("linux")


def drain_prefect_clients() -> None:
    """Send what this process's Prefect client still holds (its logs, its events) while its
    server is up: Prefect sends both from background workers, at exit by default, and a
    server stopped first turns them into "Error logging to API"."""
    if "prefect" not in sys.modules:
        return
    from prefect.events.worker import EventsWorker
    from prefect.logging.handlers import APILogWorker

    APILogWorker.drain_all(timeout=10)
    EventsWorker.drain_all(timeout=10)


@contextmanager
def local_prefect_server(home: Path, *, detached: bool = False) -> Iterator[str]:
    """A Prefect server on 127.0.0.1 (a free port, its database under ``home``), for as
    long as the block runs; yields its API URL. It stays in this process's group, so a
    Ctrl-C or a stop of the group stops it with the deployments it serves; ``detached``
    (where `can_detach`): in a session of its own, ended with this process."""
    from flows.services.stack import free_port, wait_for_http

    home.mkdir(parents=True, exist_ok=True)
    port = free_port()
    api = f"http://127.0.0.1:{port}/api"
    env = {**os.environ, "PREFECT_HOME": str(home), "PREFECT_API_URL": api}
    cmd = ["-P", "-m", "prefect", "server", "start", "--host", "127.0.0.1", "--port", str(port)]
    detached = detached and can_detach()
    if detached:
        cmd = ["-c", _DIE_WITH_PARENT, str(os.getpid()), *cmd]
    with open(home / "server.log", "ab") as log:
        server = subprocess.Popen(
            [sys.executable, *cmd],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=detached,
        )
    try:
        if not wait_for_http(f"{api}/health", lambda: server.poll() is None, SERVER_START_S):
            raise RuntimeError(
                f"the local Prefect server did not start (see {home / 'server.log'})"
            )
        (home / SERVED_API).write_text(api)
        yield api
    finally:
        (home / SERVED_API).unlink(missing_ok=True)
        if server.poll() is None:
            drain_prefect_clients()
        server.send_signal(signal.SIGTERM)
        try:
            server.wait(timeout=15)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()


STOP_CRASHES = (
    "Crash detected! Execution was aborted by an interrupt signal.",
    "Crash detected! Execution was aborted by a termination signal.",
)
"""What Prefect logs at ERROR for each run a Ctrl-C or SIGTERM cuts short (prefect 3.x)."""


class _NoStopCrashes(logging.Filter):
    """Drops Prefect's crash report of a run that a stop signal ended: the command says what
    the stop left and how to resume, and a stop is no crash. The run's state (Crashed, or
    Cancelled where sapo catches the stop) still says it."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith(STOP_CRASHES)


@contextmanager
def flows_outlive_ctrl_c(home: Path) -> Iterator[None]:
    """Where a command runs its flows in the foreground: on PREFECT_API_URL's server, else on
    a detached local one (database under ``home``, as Prefect's ephemeral mode keeps it), so
    the flow can still record how a stop ended it. Where no server can be detached, Prefect's
    ephemeral one, as before. Prefect's "Crash detected!" for a stopped run is not shown."""
    quiet = _NoStopCrashes()
    runs = [logging.getLogger(name) for name in ("prefect.flow_runs", "prefect.task_runs")]
    for logger in runs:
        logger.addFilter(quiet)
    try:
        if os.environ.get("PREFECT_API_URL") or not can_detach():
            yield
            return
        from prefect.settings import PREFECT_API_URL, temporary_settings

        with (
            local_prefect_server(home, detached=True) as api,
            temporary_settings({PREFECT_API_URL: api}),
        ):
            yield
    finally:
        for logger in runs:
            logger.removeFilter(quiet)


__all__ = [
    "SERVED_API",
    "SERVER_START_S",
    "can_detach",
    "drain_prefect_clients",
    "flows_outlive_ctrl_c",
    "local_prefect_server",
]
