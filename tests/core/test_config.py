"""Config models: bounds, unknown keys, cross-field rules, YAML, and no torch import."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from pydantic import ValidationError

from sapo_core.config import GRPOConfig, NodeConfig


def test_defaults_follow_the_paper() -> None:
    cfg = NodeConfig()
    assert (cfg.grpo.eps_low, cfg.grpo.eps_high, cfg.grpo.beta) == (0.2, 0.28, 0.0)
    assert cfg.generation.completions_per_question == 8
    assert cfg.reward.format_weight == 0.0 and cfg.reward.extraction == "strict"
    assert len(cfg.tasks.specs) == 9 and cfg.questions == 8


def test_unknown_keys_are_rejected_at_every_level() -> None:
    with pytest.raises(ValidationError, match="extra"):
        NodeConfig.model_validate({"grpo": {"learning_rte": 1e-5}})
    with pytest.raises(ValidationError, match="extra"):
        NodeConfig.model_validate({"nodes": 3})


@pytest.mark.parametrize(
    "bad",
    [
        {"grpo": {"eps_low": 1.0}},
        {"grpo": {"loss_type": "sapo"}},
        {"generation": {"temperature": 0}},
        {"generation": {"completions_per_question": 1}},
        {"local_groups": 0, "external_groups": 0},
        {"local_groups": 8, "questions_per_round": 4},
        {"tasks": {"specs": []}},
        {"tasks": {"specs": [{"name": "chain_sum"}, {"name": "chain_sum"}]}},
    ],
)
def test_bounds_and_cross_field_rules(bad: dict) -> None:  # type: ignore[type-arg]
    with pytest.raises(ValidationError):
        NodeConfig.model_validate(bad)


def test_questions_default_to_i_plus_j() -> None:
    assert NodeConfig(local_groups=4, external_groups=4).questions == 8
    assert NodeConfig(local_groups=2, external_groups=6, questions_per_round=3).questions == 3


def test_yaml_round_trip(tmp_path: Path) -> None:
    path = tmp_path / "node.yaml"
    path.write_text("node_id: n1\nlocal_groups: 4\nexternal_groups: 4\ngrpo:\n  iterations: 2\n")
    cfg = NodeConfig.from_yaml(path)
    assert cfg.node_id == "n1" and cfg.grpo == GRPOConfig(iterations=2)


def test_config_module_imports_no_torch() -> None:
    code = "import sys, sapo_core.config; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_every_shipped_node_config_loads() -> None:
    root = Path(__file__).resolve().parents[2] / "examples"
    files = sorted(root.glob("*node*.yaml"))
    assert files, "examples/ ships at least one node config"
    for path in files:
        NodeConfig.from_yaml(path)
