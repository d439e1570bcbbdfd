"""Issue 58 through the flows' round, on a local ledger and on S3 over HTTP: every row a
node publishes carries its generator's claim, a corrected receiver trains on peers'
claimed tokens, and how far each peer drifted is in the training log, the metrics and the
shipped dashboard."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import polars as pl
import pytest
import yaml

import dashboards
from flows.config import load_swarm
from flows.node import steps
from flows.node.runtime import open_node
from flows.node.state import RoundState
from sapo_core.claims import tokenizer_fingerprint
from tests.tiny_models import build_tiny_model

pytestmark = pytest.mark.integration


def _swarm(tmp_path: Path, site: Any) -> Any:
    model = tmp_path / "model"
    build_tiny_model(model)
    data = {
        "swarm_id": "drift",
        "workdir": str(tmp_path / "work"),
        "rounds": 2,
        "sampling": {"kind": "reward_filtered", "require_variance": False},
        "tracking": {"enabled": False},
        "ledger": {"url": site.url, "storage_options": site.storage_options},
        "defaults": {
            "model": str(model),
            "local_groups": 1,
            "external_groups": 1,
            "tasks": {"specs": [{"name": "chain_sum", "config": {"max_terms": 2}}]},
            "generation": {"completions_per_question": 3, "max_new_tokens": 6},
            "grpo": {"drop_zero_variance": False, "off_policy": {"correction": "token_truncate"}},
        },
        "nodes": [{"node_id": "a", "seed": 0}, {"node_id": "b", "seed": 1}],
    }
    return load_swarm(text=yaml.safe_dump(data))


def test_every_row_carries_its_claim_and_peers_drift_is_logged(tmp_path: Path, site: Any) -> None:
    swarm = _swarm(tmp_path, site)
    a, b = open_node(swarm, "a"), open_node(swarm, "b")
    try:
        metrics: dict[str, float] = {}
        for round_ in (0, 1):
            steps.run_round(a, RoundState(round_, last=round_ == 1))
            metrics = steps.run_round(b, RoundState(round_, last=round_ == 1))
        fingerprint = tokenizer_fingerprint(b.learner.policy.tokenizer)
        rows = b.ledger.query(
            "SELECT count(*) AS n, count(token_ids) AS claimed, "
            "count(*) FILTER (len(token_ids) = completion_tokens "
            "AND len(token_logprobs) = completion_tokens AND list_max(token_logprobs) <= 0 "
            f"AND tokenizer = '{fingerprint}') AS whole FROM rollouts"
        ).row(0, named=True)
        assert rows == {"n": 2 * 2 * 2 * 3, "claimed": 24, "whole": 24}
        # b trained on a's claimed tokens: every peer row's claim accepted, none re-encoded
        assert metrics["claims_accepted"] == 3.0
        assert all(metrics[k] == 0.0 for k in metrics if k.startswith("claims_") and "acc" not in k)
        assert metrics["offpolicy_kl_local"] == pytest.approx(0.0, abs=1e-4)  # exact generation
        assert metrics["offpolicy_ess_local"] == pytest.approx(1.0, abs=1e-4)
        assert "offpolicy_kl_external" in metrics and "peer_kl/a" in metrics
        trained = b.ledger.query(
            "SELECT node_round, origin, drift_tokens, drift_kl, drift_weight_mean FROM trainings "
            "WHERE node_id = 'b' ORDER BY node_round, origin"
        ).rows()
        assert [(r, o) for r, o, *_ in trained] == [
            (0, "external"), (0, "local"), (1, "external"), (1, "local"),
        ]  # fmt: skip
        assert all(tokens > 0 for _, _, tokens, _, _ in trained)
        drift = b.ledger.query(dashboards.runnable("peer_drift")).filter(
            (pl.col("node_id") == "b") & (pl.col("node_round") == 1)
        )
        by_peer = {row["peer_node_id"]: row for row in drift.to_dicts()}
        assert set(by_peer) == {"a", "b"}
        assert by_peer["b"]["kl"] == pytest.approx(0.0, abs=1e-4)
        assert by_peer["a"]["kl"] == pytest.approx(metrics["peer_kl/a"], rel=1e-6, abs=1e-9)
        assert by_peer["a"]["ess_fraction"] == pytest.approx(metrics["peer_ess/a"], rel=1e-6)
        lags = b.ledger.query(dashboards.runnable("drift_by_lag"))
        # b trained on a's groups of its own round or the one before (2 rounds, 1 group each)
        assert set(lags["lag_rounds"]) <= {0, 1} and lags["groups"].sum() >= 2
    finally:
        a.close()
        b.close()
