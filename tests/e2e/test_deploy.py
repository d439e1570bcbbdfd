"""A scheduled deployment against a real `prefect server` on 127.0.0.1 runs a round."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from ledger import Ledger
from tests.conftest import stop_process_group
from tests.e2e.test_swarm import swarm_file, tiny_model  # noqa: F401  (fixture)

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait(predicate, timeout: float, what: str) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(1)
    raise AssertionError(f"timed out waiting for {what}")


def test_scheduled_deployment_runs_a_round(tmp_path: Path, tiny_model: Path) -> None:  # noqa: F811
    port = _free_port()
    api = f"http://127.0.0.1:{port}/api"
    env = {
        **os.environ,
        "PREFECT_HOME": str(tmp_path / "prefect-server"),
        "PREFECT_API_URL": api,
        "PREFECT_LOGGING_LEVEL": "WARNING",
    }
    Path(env["PREFECT_HOME"]).mkdir()
    server = subprocess.Popen(
        [sys.executable, "-m", "prefect", "server", "start", "--host", "127.0.0.1",
         "--port", str(port)],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
    )  # fmt: skip
    served = None
    try:

        def healthy() -> bool:
            try:
                return httpx.get(f"{api}/health", timeout=2).status_code == 200
            except httpx.HTTPError:
                return False

        _wait(healthy, 120, "the Prefect server")
        path = swarm_file(tmp_path, tiny_model, node_count=1, peer_wait_s=0)
        served = subprocess.Popen(
            [sys.executable, "-m", "flows.cli", "deploy", "-c", str(path), "--serve",
             "--interval", "5", "--rounds-per-run", "1"],
            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            start_new_session=True,
        )  # fmt: skip
        state = tmp_path / "work" / "nodes" / "node-0" / "checkpoints"

        def ran_a_round() -> bool:
            done = [json.loads(p.read_text()) for p in state.glob("round-*/state.json")]
            return any(d["next_round"] >= 1 for d in done)

        _wait(ran_a_round, 300, "a scheduled round")
        runs = httpx.post(f"{api}/flow_runs/filter", json={}, timeout=10).json()
        by_deployment = [r for r in runs if r.get("deployment_id")]
        assert by_deployment, "the round ran as a deployment's scheduled flow run"
        deps = httpx.post(f"{api}/deployments/filter", json={}, timeout=10).json()
        assert [d["name"] for d in deps] == ["e2e-swarm-node-0"]
        assert deps[0]["parameters"]["more_rounds"] == 1
        with Ledger.open(str(tmp_path / "work" / "ledger")) as ledger:
            assert ledger.query("SELECT count(*) AS n FROM rollouts")["n"][0] >= 12
    finally:
        # each with what it started: the server's uvicorn, the flow runs `serve` spawned
        for proc in (served, server):
            if proc is not None:
                stop_process_group(proc)


def test_serving_with_no_prefect_server_starts_one_and_runs_a_round(
    tmp_path: Path,
    tiny_model: Path,  # noqa: F811
) -> None:
    from tests.e2e.interrupting import processes_mentioning

    env = {k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"}
    env["PREFECT_HOME"] = str(tmp_path / "user-prefect-home")  # as a fresh user's
    path = swarm_file(tmp_path, tiny_model, node_count=1, peer_wait_s=0)
    served = subprocess.Popen(
        [sys.executable, "-m", "flows.cli", "deploy", "-c", str(path), "--serve",
         "--interval", "5", "--rounds-per-run", "1"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True,
    )  # fmt: skip
    work = tmp_path / "work"
    state = work / "nodes" / "node-0" / "checkpoints"
    try:

        def ran_a_round() -> bool:
            assert served.poll() is None, "sapo deploy --serve exited"
            done = [json.loads(p.read_text()) for p in state.glob("round-*/state.json")]
            return any(d["next_round"] >= 1 for d in done)

        _wait(ran_a_round, 420, "a scheduled round")
    finally:
        stop_process_group(served)
    output = served.stdout.read() if served.stdout else ""
    assert "started a Prefect server for these schedules at http://127.0.0.1:" in output
    assert "prefect deployment run 'sapo-node/e2e-swarm-node-0'" in output
    assert processes_mentioning(str(work)) == []  # the server went with it
