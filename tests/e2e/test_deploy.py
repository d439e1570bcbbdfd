"""A scheduled deployment against a real `prefect server` on 127.0.0.1 runs a round."""

from __future__ import annotations

import os
import signal
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


def _serve(path: Path, env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    """`sapo deploy --serve` of ``path`` every 5 s, one round a run, its output in ``log``."""
    with log.open("w") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "flows.cli", "deploy", "-c", str(path), "--serve",
             "--interval", "5", "--rounds-per-run", "1"],
            env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip


def test_scheduled_deployment_runs_its_rounds_and_then_stops(
    tmp_path: Path,
    tiny_model: Path,  # noqa: F811
) -> None:
    """A node deployed for its rounds (one, to keep the suite short), one a run, every 5 s
    (shorter than a round: runs that come due while one runs are cancelled, not queued
    behind it), runs them; the run that finishes it pauses the schedule, Prefect deletes
    the runs it had scheduled ahead, `--serve` returns by itself, and `sapo deployments`
    says the node finished (issue 61: schedules ran forever, each interval starting a
    process to say "finished")."""
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
        path = swarm_file(tmp_path, tiny_model, node_count=1, peer_wait_s=0, rounds=1)
        log = tmp_path / "serve.log"
        served = _serve(path, env, log)
        finished = tmp_path / "work" / "nodes" / "node-0" / "finished.json"
        _wait(finished.is_file, 480, "the node's scheduled round")
        served.wait(timeout=120)  # it returns by itself
        output = log.read_text()
        assert served.returncode == 0, output[-3000:]
        assert "every node of swarm e2e-swarm has finished its 1 rounds" in output
        runs = httpx.post(f"{api}/flow_runs/filter", json={}, timeout=10).json()
        nodes = [r for r in runs if r.get("deployment_id")]
        states = sorted({r["state_name"] for r in nodes})
        assert [r for r in nodes if r["state_name"] == "Completed"], states
        # Nothing waits for a slot, nothing is scheduled ahead: the schedule is paused.
        assert set(states) <= {"Completed", "Cancelled"}, states
        deps = httpx.post(f"{api}/deployments/filter", json={}, timeout=10).json()
        assert [d["name"] for d in deps] == ["e2e-swarm-node-0"]
        assert deps[0]["parameters"]["more_rounds"] == 1
        assert deps[0]["paused"] is True
        assert deps[0]["concurrency_options"]["collision_strategy"] == "CANCEL_NEW"
        with Ledger.open(str(tmp_path / "work" / "ledger")) as ledger:
            assert ledger.query("SELECT max(node_round) AS r FROM rollouts")["r"][0] == 0
        shown = subprocess.run(
            [sys.executable, "-m", "flows.cli", "deployments", "-c", str(path)],
            env=env, capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert shown.returncode == 0, shown.stderr[-2000:]
        row = next(line for line in shown.stdout.splitlines() if "e2e-swarm-node-0" in line)
        assert "1/1" in row and "paused" in row and "finished" in row and "Completed" in row, (
            shown.stdout,
            [(r["name"], r["state_name"], r["start_time"]) for r in nodes],
        )
        time.sleep(10)  # two more intervals: no run is created
        again = httpx.post(f"{api}/flow_runs/filter", json={}, timeout=10).json()
        assert len([r for r in again if r.get("deployment_id")]) == len(nodes)
    finally:
        # each with what it started: the server's uvicorn, the flow runs `serve` spawned
        for proc in (served, server):
            if proc is not None:
                stop_process_group(proc)


def test_serving_with_no_prefect_server_starts_one_and_ctrl_c_stops_a_round_in_flight(
    tmp_path: Path,
    tiny_model: Path,  # noqa: F811
) -> None:
    """`--serve` with no Prefect server starts one; SIGINT (Ctrl-C) with a node's run in
    flight stops it, the run and the server promptly, and leaves nothing running (issue 61:
    SIGINT did nothing in 30 s)."""
    from tests.e2e.interrupting import processes_mentioning

    env = {k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"}
    env["PREFECT_HOME"] = str(tmp_path / "user-prefect-home")  # as a fresh user's
    path = swarm_file(tmp_path, tiny_model, node_count=1, peer_wait_s=0)
    log = tmp_path / "serve.log"
    served = _serve(path, env, log)
    work = tmp_path / "work"
    api_file = work / "prefect" / "server" / "api_url"
    try:

        def running() -> bool:
            assert served.poll() is None, "sapo deploy --serve exited"
            if not api_file.is_file():
                return False
            filtered = {"flow_runs": {"state": {"type": {"any_": ["RUNNING"]}}}}
            api = api_file.read_text().strip()
            runs = httpx.post(f"{api}/flow_runs/filter", json=filtered, timeout=10).json()
            return any(r.get("deployment_id") for r in runs)

        _wait(running, 420, "a scheduled run in flight")
        os.kill(served.pid, signal.SIGINT)  # to sapo alone, as `kill -INT` does
        served.wait(timeout=60)  # before, it still served 30 s later
    finally:
        stop_process_group(served)
    output = log.read_text()
    assert "started a Prefect server for these schedules at http://127.0.0.1:" in output
    assert "prefect deployment run 'sapo-node/e2e-swarm-node-0'" in output
    assert not api_file.exists()
    assert processes_mentioning(str(work)) == []  # the run and the server went with it
