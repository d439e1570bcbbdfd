"""kill -9 at every step of a round, then resume: nothing lost, nothing written twice.

One node is killed at each step in turn, a step a round, and resumed each time: the fault
hook (flows.node.steps.fault_point) makes it SIGKILL itself on entering step k of round k + 1
(a checkpoint after every round). Each launch resumes the round the last one died in, then
dies in the next; the last launch finishes. Every round's rollouts, training log and sample
log must then be in the ledger exactly once. One ledger for all the kills, and one Prefect
server (as a deployed node's worker has): a node start is most of what a kill costs, the
kills are seven, and Prefect's ephemeral server, started afresh by each launch otherwise,
took 10-20 s of each on 2 cores."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from flows.node.steps import KILL_AT_ENV, ROUND
from ledger import Ledger
from tests.conftest import stop_process_group
from tests.e2e.test_swarm import sapo, swarm_file, tiny_model  # noqa: F401 - fixture

pytestmark = pytest.mark.slow
STEPS = [s.name for s in ROUND if s.name != "evaluate"]  # no evaluation due in this swarm
KILLED_IN = {k + 1: step for k, step in enumerate(STEPS)}  # round -> the step it dies in
ROUNDS = len(STEPS) + 2  # round 0 and the last round run without a kill


def killed_at(path: Path, step: str, round_: int) -> None:
    """Run node-0 until it kills itself on entering ``step`` of ``round_``."""
    cmd = [sys.executable, "-m", "flows.cli", "node", "-c", str(path), "--node-id", "node-0"]
    proc = subprocess.Popen(
        cmd,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
        env={**os.environ, KILL_AT_ENV: f"{step}:{round_}"},
    )
    try:
        proc.wait(timeout=600)
    finally:
        stop_process_group(proc)  # and the node's own Prefect server
    assert proc.returncode == -9, f"not killed at {step} of round {round_} (exit {proc.returncode})"


@pytest.mark.timeout(1800)  # nine node launches, each bounded by its own 600 s
def test_sigkill_at_each_step_then_resume(
    tmp_path: Path,
    tiny_model: Path,  # noqa: F811
    prefect_api: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    path = swarm_file(
        tmp_path, tiny_model, rounds=ROUNDS, node_count=2, peer_wait_s=0, checkpoint_every=1
    )
    work = tmp_path / "work"
    monkeypatch.setenv("PREFECT_API_URL", prefect_api)  # every launch's runs go to one server
    # node-1 publishes first, so that node-0 has a peer to sample in every round.
    sapo("node", "-c", str(path), "--node-id", "node-1")
    for round_, step in KILLED_IN.items():
        killed_at(path, step, round_)
    sapo("node", "-c", str(path), "--node-id", "node-0")
    with Ledger.open(str(work / "ledger")) as ledger:
        rollouts = ledger.query(
            "SELECT node_round, count(*) AS n, count(DISTINCT rollout_id) AS ids FROM rollouts "
            "WHERE node_id = 'node-0' GROUP BY ALL ORDER BY ALL"
        ).rows()
        logs = {
            name: ledger.query(
                f"SELECT node_round, count(DISTINCT source_file) FROM {name} "
                "WHERE node_id = 'node-0' GROUP BY ALL ORDER BY ALL"
            ).rows()
            for name in ("trainings", "samples")
        }
        report = ledger.validate()
    per_round = 4 * 3  # I + J questions x 3 completions
    # A round that differs names its kill: KILLED_IN maps rounds to the steps killed in them.
    assert rollouts == [(r, per_round, per_round) for r in range(ROUNDS)], KILLED_IN
    assert logs["trainings"] == [(r, 1) for r in range(ROUNDS)], KILLED_IN
    assert logs["samples"] == [(r, 1) for r in range(ROUNDS)], KILLED_IN
    assert report.clean, report
    checkpoints = sorted((work / "nodes" / "node-0" / "checkpoints").glob("round-*"))
    assert json.loads((checkpoints[-1] / "state.json").read_text())["next_round"] == ROUNDS
