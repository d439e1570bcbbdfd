"""The Prefect server a command starts for itself (flows/services/prefect_server.py): a
detached one is out of reach of the terminal's Ctrl-C (a session of its own), yet never
outlives the command, even one killed by SIGKILL; so a node started by hand stops cleanly
(`sapo experiment`'s stop: tests/e2e/test_experiment.py)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from flows.services.prefect_server import can_detach
from tests.conftest import stop_process_group
from tests.e2e.interrupting import interrupted, pids_mentioning, processes_mentioning
from tests.tiny_models import build_tiny_model

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

COMMAND = """
import sys
from pathlib import Path
from flows.services.prefect_server import local_prefect_server
with local_prefect_server(Path(sys.argv[1]), detached=True) as api:
    print(api, flush=True)
    sys.stdin.read()  # until the test kills it
"""


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
        (server,) = [p for p in pids_mentioning(str(home)) if p != command.pid]  # PREFECT_HOME
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


@pytest.mark.skipif(not can_detach(), reason="Prefect's ephemeral server stops with the node")
def test_a_node_started_by_hand_stops_as_a_swarm_does(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`sapo node` with no Prefect server (as docs/running.md runs one on another machine):
    Ctrl-C used to stop Prefect's ephemeral server under the flow too, and the node ended on
    "error: ConnectError" (exit 2). Now: where it resumes, exit 130, nothing left running."""
    home = tmp_path / "prefect-home"
    monkeypatch.setenv("PREFECT_HOME", str(home))  # the user's ~/.prefect otherwise
    model = build_tiny_model(tmp_path / "model")
    swarm = {
        "swarm_id": "solo",
        "workdir": str(tmp_path / "work"),
        "rounds": 50,
        "checkpoint_every": 1,
        "defaults": {
            "model": str(model),
            "local_groups": 2,
            "external_groups": 0,
            "tasks": {"specs": [{"name": "chain_sum", "config": {"max_terms": 2}}]},
            "generation": {"completions_per_question": 2, "max_new_tokens": 3},
            "grpo": {"drop_zero_variance": False},
        },
        "nodes": [{"node_id": "a", "seed": 0}],
    }
    path = tmp_path / "swarm.yaml"
    path.write_text(yaml.safe_dump(swarm))
    out, took = interrupted(["node", "-c", str(path), "--node-id", "a"], "a round 1: own_reward")
    assert took < 15, f"{took:.1f} s from Ctrl-C to exit"
    for noise in ("Traceback", "Error logging to API", "ConnectError", "Crash detected"):
        assert noise not in out, out[-3000:]
    tail = out.strip().splitlines()[-2:]
    assert tail[0].startswith("a: stopped; round"), tail  # round 1's checkpoint may lag
    assert tail[1] == "stopped by SIGINT: rerun the same command to resume"
    assert (home / "prefect.db").exists()  # its server kept Prefect's database where it was
    assert processes_mentioning(str(tmp_path)) == []
