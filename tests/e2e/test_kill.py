"""kill -9 at every step of a round, then resume: nothing lost, nothing written twice.

A node runs 3 rounds (a checkpoint after each); the fault hook (flows.node.steps.fault_point)
makes it SIGKILL itself on entering one step of round 1. Resuming the node must leave every
round's rollouts, training log and sample log in the ledger exactly once, and finish."""

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


@pytest.mark.parametrize("step", STEPS)
def test_sigkill_at_each_step_then_resume(tmp_path: Path, tiny_model: Path, step: str) -> None:  # noqa: F811
    path = swarm_file(
        tmp_path, tiny_model, rounds=3, node_count=2, peer_wait_s=0, checkpoint_every=1
    )
    work = tmp_path / "work"
    # node-1 publishes first, so that node-0 has a peer to sample in every round.
    sapo("node", "-c", str(path), "--node-id", "node-1")
    cmd = [sys.executable, "-m", "flows.cli", "node", "-c", str(path), "--node-id", "node-0"]
    proc = subprocess.Popen(
        cmd,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
        env={**os.environ, KILL_AT_ENV: f"{step}:1"},
    )
    try:
        proc.wait(timeout=600)
    finally:
        stop_process_group(proc)  # and the node's own Prefect server
    assert proc.returncode == -9, f"the node was not killed at {step} (exit {proc.returncode})"
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
    assert rollouts == [(r, per_round, per_round) for r in range(3)]
    assert logs["trainings"] == [(r, 1) for r in range(3)]
    assert logs["samples"] == [(r, 1) for r in range(3)]
    assert report.clean, report
    checkpoints = sorted((work / "nodes" / "node-0" / "checkpoints").glob("round-*"))
    assert json.loads((checkpoints[-1] / "state.json").read_text())["next_round"] == 3
