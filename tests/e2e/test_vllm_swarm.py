"""End to end: a swarm of two node processes sharing one ledger, one generating on vLLM (its
CPU build, in its own environment) and one on the transformers loop; each trains on the
other's groups."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from tests.e2e.test_swarm import node_metrics, sapo, swarm_file
from tests.factories import open_ledger
from tests.integration.test_vllm_backend import PYTHON, needs_vllm
from tests.tiny_models import build_tiny_model

pytestmark = [pytest.mark.e2e, pytest.mark.slow, needs_vllm]


def test_a_vllm_node_and_a_transformers_node_learn_from_each_other(tmp_path: Path) -> None:
    model = build_tiny_model(tmp_path / "tiny", hidden=256)  # head size 64 for vLLM's CPU
    path = swarm_file(tmp_path, model, node_count=None, peer_wait_s=180)
    data = yaml.safe_load(path.read_text())
    data.pop("node_count")
    vllm = {"backend": "vllm", "vllm": {"python": str(PYTHON), "max_model_len": 256}}
    data["nodes"] = [
        {"node_id": "on-vllm", "seed": 0, "generation": vllm},
        {"node_id": "on-transformers", "seed": 1},
    ]
    path.write_text(yaml.safe_dump(data))
    out = sapo("swarm", "-c", str(path), timeout=900)
    assert "on-vllm round 1: own_reward" in out and "on-transformers round 1:" in out

    work = tmp_path / "work"
    with open_ledger(str(work / "ledger")) as ledger:
        published = ledger.query(
            "SELECT node_id, count(*) AS n FROM rollouts GROUP BY 1 ORDER BY 1"
        ).rows()
        assert published == [("on-transformers", 24), ("on-vllm", 24)]  # 2 rounds x 4 x 3
        taken = ledger.query(
            "SELECT node_id, peer_node_id FROM trainings WHERE origin = 'external' "
            "GROUP BY ALL ORDER BY ALL"
        ).rows()
        assert taken == [("on-transformers", "on-vllm"), ("on-vllm", "on-transformers")]
    nodes = node_metrics(f"sqlite:///{work / 'mlflow.db'}", "e2e-swarm")
    for node_id in ("on-vllm", "on-transformers"):
        m = nodes[node_id]["metrics"]
        assert set(m["own_reward"]) == {0, 1}
        # the update's first ratio is the trainer's own: exactly 1 on a single iteration
        assert all(v == pytest.approx(1.0, abs=1e-5) for v in m["ratio_mean"].values())
    assert nodes["on-vllm"]["params"]["generation.backend"] == "vllm"
    assert nodes["on-transformers"]["params"]["generation.backend"] == "transformers"
