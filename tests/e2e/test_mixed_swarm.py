"""End to end: a swarm of three architectures and three tokenizers sharing one ledger.

Llama with SmolLM2's tokenizer (a chat template), Qwen2 with a BPE trained here (another chat
template of its own markers) and Gemma 3 with Gemma's tokenizer (262k tokens, a BOS, no chat
template: the plain prompt format), tiny and random, built offline. Every node trains on the
other two's groups, re-encoded with its own tokenizer; the ledger, MLflow and the report say
which model and format each node ran."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from flows.reports.report import report_ledger
from tests.e2e.test_swarm import node_metrics, sapo
from tests.factories import open_ledger
from tests.tiny_models import build_tiny_model

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

NODES = {  # node -> (architecture, tokenizer, the prompt format it resolves to)
    "llama-smollm2": ("llama", "smollm2", "chat"),
    "qwen2-trained": ("qwen2", "trained", "chat"),
    "gemma3-gemma": ("gemma3", "gemma3", "plain"),
}


def test_three_families_train_on_each_others_text(tmp_path: Path, prefect_api: str) -> None:
    models = {
        node: build_tiny_model(tmp_path / node, family=family, tokenizer=tokenizer, seed=k)
        for k, (node, (family, tokenizer, _)) in enumerate(NODES.items())
    }
    work = tmp_path / "work"
    swarm = {
        "swarm_id": "mixed",
        "workdir": str(work),
        "rounds": 2,
        # J = 2 with at most one group from any peer: a node's J fills only with a group of
        # each other family, and it waits (up to peer_wait_s) until both have published;
        # the Gemma node is the slowest to load. Tiny random models earn no reward: groups
        # without variance are accepted, the test is about sharing, not learning.
        "peer_wait_s": 300,
        "sampling": {"kind": "reward_filtered", "require_variance": False, "max_per_peer": 1},
        "defaults": {
            "local_groups": 1,
            "external_groups": 2,
            "tasks": {"specs": [{"name": "chain_sum", "config": {"max_terms": 2}}]},
            "generation": {"completions_per_question": 2, "max_new_tokens": 6},
            "grpo": {"drop_zero_variance": False},
        },
        "nodes": [
            {"node_id": node, "seed": k, "model": str(models[node])} for k, node in enumerate(NODES)
        ],
    }
    path = tmp_path / "swarm.yaml"
    swarm["prefect"] = {"api_url": prefect_api}  # one server for the three nodes
    path.write_text(yaml.safe_dump(swarm))
    sapo("swarm", "-c", str(path), timeout=900)

    with open_ledger(str(work / "ledger")) as ledger:
        manifests = ledger.query(
            "SELECT node_id, model_id, prompt_format FROM manifests ORDER BY node_id"
        ).rows()
        trained = ledger.query(
            """SELECT node_id, node_round, list(DISTINCT peer_node_id ORDER BY peer_node_id)
            FROM trainings WHERE origin = 'external' AND trained
            GROUP BY node_id, node_round ORDER BY node_id, node_round"""
        ).rows()
        published = ledger.query(
            "SELECT node_id, count(DISTINCT group_id) FROM rollouts GROUP BY node_id"
        ).rows()
    assert manifests == sorted(
        (node, str(models[node]), fmt) for node, (_, _, fmt) in NODES.items()
    )
    assert sorted(published) == [(node, 3 * 2) for node in sorted(NODES)]  # I + J a round
    # In every round every node trained on one group of each other family.
    assert trained == [
        (node, round_, sorted(set(NODES) - {node})) for node in sorted(NODES) for round_ in (0, 1)
    ]

    metrics = node_metrics(f"sqlite:///{work / 'mlflow.db'}", "mixed")
    for node, (_, _, fmt) in NODES.items():
        tags = metrics[node]["tags"]
        assert (tags["sapo.model"], tags["sapo.prompt_format"]) == (str(models[node]), fmt)
        history: dict[str, Any] = metrics[node]["metrics"]
        assert history["external_groups_used"] == {0: 2.0, 1: 2.0}
        # Peers' text that does not fit is skipped and counted, per round, never cut.
        assert set(history["rows_skipped_too_long"]) == {0, 1}
        assert min(history["groups_trained"].values()) >= 1
    # Random text from 49k- and 262k-token vocabularies is many more tokens of a 600-token
    # BPE than the receiver's limit of 6: that receiver skips most of its peers' rows.
    skipped = metrics["qwen2-trained"]["metrics"]["rows_skipped_too_long"]
    assert sum(skipped.values()) > 0

    report = report_ledger(str(work / "ledger"), tmp_path / "report")
    shown = {r["node_id"]: (r["model_id"], r["prompt_format"]) for r in report.nodes}
    assert shown == {node: (str(models[node]), fmt) for node, (_, _, fmt) in NODES.items()}
    page = Path(report.html).read_text()
    assert all(f"{models[node]} ({fmt})" in page for node, (_, _, fmt) in NODES.items())
