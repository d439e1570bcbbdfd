"""The Prefect server a command starts for itself (flows/services/prefect_server.py): a
detached one is out of reach of the terminal's Ctrl-C (a session of its own), yet never
outlives the command, even one killed by SIGKILL."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from flows.services.prefect_server import can_detach
from tests.conftest import stop_process_group
from tests.e2e.interrupting import processes_mentioning

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

COMMAND = """
import sys
from pathlib import Path
from flows.services.prefect_server import local_prefect_server
with local_prefect_server(Path(sys.argv[1]), detached=True) as api:
    print(api, flush=True)
    sys.stdin.read()  # until the test kills it
"""


def _server_pids(home: Path) -> list[int]:
    """The processes whose environment names ``home`` (the server has it as PREFECT_HOME)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            try:
                if str(home) in (entry / "environ").read_bytes().decode(errors="replace"):
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


@pytest.mark.skipif(not can_detach(), reason="a detached server needs Linux's PR_SET_PDEATHSIG")
def test_a_detached_server_leaves_the_group_and_dies_with_its_command(tmp_path: Path) -> None:
    home = tmp_path / "prefect"
    command = subprocess.Popen(
        [sys.executable, "-c", COMMAND, str(home)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,  # as a terminal starts a command: its own group
        cwd=Path(__file__).resolve().parents[2],
    )
    try:
        assert command.stdout is not None
        api = command.stdout.readline().strip()
        assert api.startswith("http://127.0.0.1:"), api
        (server,) = [p for p in _server_pids(home) if p != command.pid]
        # Another session: the Ctrl-C a terminal sends the command's group misses it.
        assert os.getsid(server) != os.getsid(command.pid)
        command.send_signal(signal.SIGKILL)  # no `finally` runs: the kernel must stop it
        command.wait(timeout=10)
        deadline = time.monotonic() + 30
        while processes_mentioning(str(home)) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert processes_mentioning(str(home)) == []
    finally:
        stop_process_group(command)
