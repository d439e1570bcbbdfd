"""End to end: a LoRA node and a full fine-tuning node in one swarm (issue 31), stopped by
Ctrl-C and resumed (in one decision: tests/e2e/one_decision.py).

They share the ledger as any two nodes do (text is text); Ctrl-C stops the swarm within
seconds, leaving no process (tests/e2e/interrupting.py), and the same command resumes it
from the checkpoints (the adapter's and its Adam state alone on the LoRA node); the
manifest, MLflow and the report say which node trained an adapter; `sapo compare
--register` registers the adapter, which loads on its base into a pipeline."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from flows.reports.report import report_ledger
from tests.e2e.interrupting import check_clean_stop, interrupted
from tests.e2e.one_decision import check_one_decision, counting_env
from tests.e2e.test_swarm import node_metrics, sapo, tiny_model  # noqa: F401 - fixture
from tests.factories import open_ledger

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

LORA = {"kind": "lora", "rank": 4, "alpha": 8}


def test_a_lora_node_and_a_full_node_share_stop_on_ctrl_c_resume_and_register(
    tmp_path: Path,
    tiny_model: Path,  # noqa: F811
) -> None:
    import mlflow

    from sapo_core.policy import adapter

    work = tmp_path / "work"
    swarm = {
        "swarm_id": "adapters",
        "workdir": str(work),
        "rounds": 200,
        "peer_wait_s": 120,
        # tiny random models earn no reward: groups without variance are accepted
        "sampling": {"kind": "reward_filtered", "require_variance": False},
        "defaults": {
            "model": str(tiny_model),
            "local_groups": 1,
            "external_groups": 1,
            "tasks": {"specs": [{"name": "chain_sum", "config": {"max_terms": 2}}]},
            "generation": {"completions_per_question": 2, "max_new_tokens": 5},
            "grpo": {"drop_zero_variance": False},
        },
        # a-lora sorts first: with equal rewards it is the node `compare` registers
        "nodes": [
            {"node_id": "a-lora", "seed": 0, "grpo": {"adapter": LORA}},
            {"node_id": "b-full", "seed": 1},
        ],
    }
    path = tmp_path / "swarm.yaml"
    path.write_text(yaml.safe_dump(swarm))
    stopped, took = interrupted(["swarm", "-c", str(path)], "a-lora round 1: own_reward", 600)
    check_clean_stop(stopped, took, work, ["a-lora", "b-full"])
    assert list((work / "nodes" / "a-lora" / "checkpoints").glob("round-*"))

    # Resumed in one decision (issue 59), counted in the launcher and the node processes.
    counting = tmp_path / "counting"
    out = sapo("swarm", "-c", str(path), "--rounds", "3", timeout=900, env=counting_env(counting))
    assert "a-lora round 2: own_reward" in out, out[-3000:]  # resumed, not restarted
    assert "a-lora round 0: own_reward" not in out
    check_one_decision(counting, nodes=2)

    with open_ledger(str(work / "ledger")) as ledger:
        manifests = ledger.query("SELECT node_id, adapter FROM manifests ORDER BY node_id").rows()
        trained = ledger.query(
            """SELECT node_id, list(DISTINCT peer_node_id) FROM trainings
            WHERE origin = 'external' AND trained GROUP BY node_id ORDER BY node_id"""
        ).rows()
    assert manifests == [("a-lora", "lora-r4"), ("b-full", None)]
    assert trained == [("a-lora", ["b-full"]), ("b-full", ["a-lora"])]

    uri = f"sqlite:///{work / 'mlflow.db'}"
    metrics = node_metrics(uri, "adapters")
    assert metrics["a-lora"]["tags"]["sapo.adapter"] == "lora-r4"
    assert metrics["b-full"]["tags"]["sapo.adapter"] == "none"
    assert sorted(metrics["a-lora"]["metrics"]["own_reward"]) == [0, 1, 2]

    registered = sapo("compare", "--mlflow", uri, "--register", "adapters-best")
    assert "registered a-lora of adapters" in registered, registered
    mlflow.set_tracking_uri(uri)
    pipeline = mlflow.transformers.load_model("models:/adapters-best/1")
    assert adapter.is_adapted(pipeline.model)
    assert adapter.base_directory(pipeline.model) == str(tiny_model)
    logged = [p for p in (work / "mlartifacts").rglob("*.safetensors") if "model-round" in str(p)]
    # the full node's weights, and the LoRA node's adapter alone (its base is not copied)
    assert {p.name for p in logged} == {"model.safetensors", "adapter_model.safetensors"}, logged

    report = report_ledger(str(work / "ledger"), tmp_path / "report")
    shown = {r["node_id"]: r["adapter"] for r in report.nodes}
    assert shown == {"a-lora": "lora-r4", "b-full": None}
    assert f"{tiny_model} + lora-r4" in Path(report.html).read_text()
