"""Shared fixtures: ledgers on local disk and on a real S3 API over HTTP (moto's server);
and the rule that no process a test started outlives the test session."""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest

from flows.env import apply_offline_defaults

apply_offline_defaults()
# moto and botocore need a region; bucket creation fails with a location constraint if it is
# passed as a client argument instead (see shared/ENVIRONMENT.md).
os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")
STACK_VARIABLES = ("MLFLOW_TRACKING_URI", "PREFECT_API_URL", "SAPO_WORKDIR")
"""Where nodes send their runs and state when a file does not say. A developer who exported
a stack's variables (docs/running.md, "Many machines") must not send the tests' runs to it, and
`mlflow.set_tracking_uri` in one test sets MLFLOW_TRACKING_URI for the node processes of
the next: every test starts without them (tests that need a server name it)."""


@pytest.fixture(autouse=True)
def _no_stack_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in STACK_VARIABLES:
        monkeypatch.delenv(name, raising=False)


@pytest.fixture(autouse=True, scope="session")
def _rebuild_workers_stopped() -> Iterator[None]:
    """Stop the rebuild workers that nodes run in this process (sapo_core.rebuild) before
    the leftover-process check; they would otherwise live until the interpreter exits."""
    yield
    rebuild = sys.modules.get("sapo_core.rebuild")
    if rebuild is not None:
        rebuild.close_shared()


logging.getLogger("werkzeug").setLevel(logging.WARNING)  # moto's request log


@dataclass
class S3Server:
    endpoint_url: str
    key: str = "testing"
    secret: str = "testing"

    @property
    def storage_options(self) -> dict[str, Any]:
        return {"key": self.key, "secret": self.secret, "endpoint_url": self.endpoint_url}

    def client(self) -> Any:
        import boto3

        return boto3.client(
            "s3",
            endpoint_url=self.endpoint_url,
            aws_access_key_id=self.key,
            aws_secret_access_key=self.secret,
        )

    def new_bucket(self) -> str:
        name = "sapo-" + uuid.uuid4().hex[:12]
        self.client().create_bucket(Bucket=name)
        return name


@pytest.fixture(scope="session")
def s3_server() -> Iterator[S3Server]:
    """moto's S3 server on loopback only, stopped when the session ends."""
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    try:
        yield S3Server(endpoint_url=f"http://{host}:{port}")
    finally:
        server.stop()


@dataclass
class LedgerSite:
    """Where a test's ledger lives; ``open()`` gives an independent reader/writer."""

    url: str
    storage_options: dict[str, Any] = field(default_factory=dict)
    kind: str = "local"

    def open(self, **kwargs: Any) -> Any:
        from tests.factories import open_ledger

        return open_ledger(self.url, self.storage_options or None, **kwargs)

    def sibling(self, name: str) -> LedgerSite:
        """Another ledger on the same store (a folder or prefix beside this one)."""
        return LedgerSite(f"{self.url}-{name}", self.storage_options, self.kind)


@pytest.fixture(params=["local", pytest.param("s3", marks=[pytest.mark.s3])])
def site(request: pytest.FixtureRequest, tmp_path: Any) -> LedgerSite:
    """The same contract, run on a local directory and on S3 over HTTP (one bucket a test)."""
    if request.param == "local":
        return LedgerSite(str(tmp_path / "ledger"))
    server: S3Server = request.getfixturevalue("s3_server")
    bucket = server.new_bucket()
    return LedgerSite(f"s3://{bucket}/ledger", server.storage_options, "s3")


@pytest.fixture
def s3_site(s3_server: S3Server) -> LedgerSite:
    return LedgerSite(f"s3://{s3_server.new_bucket()}/ledger", s3_server.storage_options, "s3")


@pytest.fixture
def local_site(tmp_path: Any) -> LedgerSite:
    return LedgerSite(str(tmp_path / "ledger"))


def rows_of(table: Any) -> list[dict[str, Any]]:
    return table.to_pylist()


MakeRound = Callable[..., Any]


@pytest.fixture
def make_round() -> MakeRound:
    from ledger.synthetic import synthetic_round

    return synthetic_round


# The hostile-input matrix on S3 belongs to the slow suite: every attack still runs on the
# local store in the fast one, and the store-level S3 behaviour (the ledger's contract,
# manifests, change-log markers, listings, outages, credentials) keeps its fast tests.
SLOW_ON_S3 = frozenset(
    {
        "test_attacks.py",
        "test_attacks_copies.py",
        "test_attacks_grinding.py",
        "test_attacks_sybils.py",
        "test_attacks_costs.py",
        "test_attacks_floods.py",
        "test_attacks_identity.py",
        "test_attacks_ranges.py",
        "test_attacks_reports.py",
        "test_bad_files.py",
        "test_concurrency_and_failures.py",
        "test_identity.py",
        "test_node_logs.py",
    }
)


@pytest.hookimpl(tryfirst=True)  # before ``-m`` deselects by marker
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "/integration/" in str(item.path):
            item.add_marker(pytest.mark.integration)
        callspec = getattr(item, "callspec", None)
        on_s3 = callspec is not None and callspec.params.get("site") == "s3"
        if on_s3 and item.path.name in SLOW_ON_S3:
            item.add_marker(pytest.mark.slow)


# -- processes: nothing a test started outlives the session ------------------------------


def stop_process_group(proc: subprocess.Popen[Any], timeout: float = 30.0) -> None:
    """Stop ``proc`` (started with ``start_new_session=True``) and everything it started:
    SIGTERM to its process group, a wait, SIGKILL on timeout.

    The group outlives its leader: a node's Prefect server stays in it after the node
    exited or was killed, and is stopped too.
    """
    _signal_group(proc.pid, signal.SIGTERM)
    if not _wait_for_group(proc, timeout):
        _signal_group(proc.pid, signal.SIGKILL)
        _wait_for_group(proc, 10.0)
    if proc.poll() is None:
        proc.kill()
    proc.wait()


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def _wait_for_group(proc: subprocess.Popen[Any], timeout: float) -> bool:
    """True once the leader has exited and nothing is left running in its group."""
    deadline = time.monotonic() + timeout
    while proc.poll() is None or _live_processes(group=proc.pid):
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.1)
    return True


def _live_processes(group: int | None = None) -> dict[int, int]:
    """pid -> parent pid of every running (non-zombie) process, or of one process group's.

    Read from /proc (Linux); elsewhere, without /proc, nothing is found.
    """
    found = {}
    for entry in os.listdir("/proc") if os.path.isdir("/proc") else []:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as handle:
                fields = handle.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        state, ppid, pgrp = fields[0], int(fields[1]), int(fields[2])
        if state != "Z" and (group is None or pgrp == group):
            found[int(entry)] = ppid
    return found


def _descendants() -> list[tuple[int, str]]:
    """(pid, command line) of every running, non-zombie descendant of this process."""
    try:
        import psutil
    except ImportError:
        return _descendants_from_proc()
    found = []
    for child in psutil.Process().children(recursive=True):
        with contextlib.suppress(psutil.Error):
            if child.status() != psutil.STATUS_ZOMBIE:
                found.append((child.pid, " ".join(child.cmdline())[:200]))
    return found


def _descendants_from_proc() -> list[tuple[int, str]]:
    children: dict[int, list[int]] = {}
    for pid, ppid in _live_processes().items():
        children.setdefault(ppid, []).append(pid)
    found, stack = [], list(children.get(os.getpid(), []))
    while stack:
        pid = stack.pop()
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as handle:
                cmdline = handle.read().replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:
            continue
        found.append((pid, cmdline[:200]))
        stack.extend(children.get(pid, []))
    return found


def _become_subreaper() -> None:
    """Linux: orphans of our children (the Prefect server of a node killed with SIGKILL)
    are re-parented to this process rather than to init, so the session check sees them."""
    if sys.platform.startswith("linux"):
        pr_set_child_subreaper = 36
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(None, use_errno=True).prctl(pr_set_child_subreaper, 1, 0, 0, 0)


def _stop_prefect_servers() -> None:
    """Prefect's temporary servers started by flows run in this process (outside the test
    harness) would stop at interpreter exit: stop them now, before the check."""
    module = sys.modules.get("prefect.server.api.server")
    if module is not None:
        # A private registry of Prefect's: read defensively, it may change between versions.
        instances = getattr(module.SubprocessASGIServer, "_instances", {})
        for server in list(instances.values()):
            server.stop()


def _reap_zombies() -> None:
    with contextlib.suppress(ChildProcessError):
        while os.waitpid(-1, os.WNOHANG)[0]:
            pass


def _stop_all(pids: list[int]) -> None:
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and _descendants():
            _reap_zombies()
            time.sleep(0.2)
        pids = [pid for pid, _ in _descendants()]
    _reap_zombies()


_first_seen: dict[int, str] = {}
"""Descendant pid -> the test after which it was first seen running."""


def pytest_configure(config: pytest.Config) -> None:
    _become_subreaper()


def pytest_runtest_logfinish(nodeid: str) -> None:
    for pid, _ in _descendants():
        _first_seen.setdefault(pid, nodeid)


def pytest_sessionfinish(session: pytest.Session) -> None:
    """Fail the run if a process that a test started is still running; stop them all."""
    _stop_prefect_servers()
    leftovers = _descendants()
    _stop_all([pid for pid, _ in leftovers])
    if not leftovers:
        return
    lines = [f"{len(leftovers)} processes started by tests outlived them (now stopped):"]
    lines += [
        f"  pid {pid}, running since {_first_seen.get(pid, 'the session teardown')}: {cmd}"
        for pid, cmd in leftovers
    ]
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    for line in lines:
        if reporter is not None:
            reporter.write_line(line, red=True, bold=True)
        else:
            print(line, file=sys.stderr)
    if session.exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
