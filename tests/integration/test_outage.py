"""A node whose ledger goes away keeps training (J = 0), keeps what it would have written in
its backlog, and writes it when the ledger is back: nothing lost, nothing twice. S3 over HTTP
through a proxy that is cut and restored."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import urlparse

import pytest

from flows.node import steps
from flows.node.runtime import open_node
from flows.node.state import RoundState
from tests.integration.test_round_steps import make_swarm
from tests.netproxy import ToggleProxy

pytestmark = pytest.mark.s3


def test_a_node_trains_through_a_ledger_outage_and_writes_its_backlog_after(
    tmp_path: Path, s3_server
) -> None:
    target = urlparse(s3_server.endpoint_url)
    proxy = ToggleProxy(target.hostname or "127.0.0.1", target.port or 80)
    bucket = s3_server.new_bucket()
    ledger = {
        "url": f"s3://{bucket}/ledger",
        "storage_options": {**s3_server.storage_options, "endpoint_url": proxy.url},
        "retry": {"attempts": 2, "initial_wait_s": 0.05, "max_wait_s": 0.1, "jitter_s": 0.0},
    }
    swarm = make_swarm(tmp_path, ledger=ledger, rounds=3)
    a, b = open_node(swarm, "a"), open_node(swarm, "b")
    try:
        for node in (a, b):  # round 0: the ledger is up
            state = RoundState(0)
            steps.generate(node, state)
            assert steps.publish(node, state)
        proxy.down()
        state = RoundState(1)
        steps.generate(a, state)
        assert steps.publish(a, state) == []  # kept in the backlog
        assert steps.sample(a, state) == []  # J = 0 this round
        steps.train(a, state)  # trains on its own groups; the training log is backlogged
        metrics = steps.track(a, state)
        assert metrics["ledger_unreachable"] == 1.0 and metrics["external_groups_used"] == 0.0
        assert metrics["backlog_files"] == 2.0 and metrics["groups_trained"] == 2.0
        proxy.up()
        state = RoundState(2)
        steps.generate(a, state)
        assert steps.publish(a, state)  # the backlog first, then round 2
        assert len(a.backlog) == 0
        rows = a.ledger.query(
            "SELECT node_round, count(*) AS n, count(DISTINCT rollout_id) AS ids FROM rollouts "
            "WHERE node_id = 'a' GROUP BY 1 ORDER BY 1"
        ).rows()
        questions = a.spec.node.questions * 2  # completions per round
        assert rows == [(r, questions, questions) for r in range(3)]
        trainings = a.ledger.query("SELECT DISTINCT node_round FROM trainings WHERE node_id = 'a'")
        assert trainings.get_column("node_round").to_list() == [1]
    finally:
        a.close()
        b.close()
        proxy.close()
