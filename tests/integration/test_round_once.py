"""The round exists once (issues 45, 59): a node's round as the flow runs it
(flows/node/steps.py, through the ledger) and examples/one_round.py's round give the same
update on a tiny model and seed, because both are `Learner.train_round`."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import yaml

from flows.config import load_swarm
from flows.node import steps
from flows.node.runtime import open_node
from flows.node.state import RoundState
from tests.tiny_models import build_tiny_model
from tests.unit.test_one_round_example import ARGV, letters, load_example


def test_the_flows_round_and_the_examples_give_the_same_update(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = build_tiny_model(tmp_path / "model")
    monkeypatch.setattr("sapo_core.rewards.verify_answer", letters)  # a spread of rewards
    example = load_example()
    out = example.main(["--model", str(model), *ARGV])

    settings = example.node_settings(example.parse_args(["--model", str(model), *ARGV]))
    seed = settings.pop("seed")
    swarm = load_swarm(
        text=yaml.safe_dump(
            {
                "swarm_id": "once",
                "workdir": str(tmp_path / "work"),
                "rounds": 1,
                "tracking": {"enabled": False},
                "defaults": settings,
                "nodes": [{"node_id": "n", "seed": seed}],
            }
        )
    )
    node = open_node(swarm, "n")
    try:
        state = RoundState(0, last=True)
        steps.run_round(node, state)
        assert state.report is not None and state.report.chosen is not None
        flow, mine = state.report, out["report"]
        assert flow.groups_trained == mine.groups_trained > 0
        assert [g.rewards for g in state.report.chosen.trained] == [
            g.rewards for g in out["chosen"].trained
        ]
        for key in ("loss", "grad_norm", "clip_fraction"):
            assert flow.update[key] == pytest.approx(mine.update[key], rel=1e-6, abs=1e-9)
        theirs = out["learner"].policy.model.state_dict()
        for name, weight in node.learner.policy.model.state_dict().items():
            assert torch.allclose(weight, theirs[name], rtol=0, atol=1e-7), name
    finally:
        node.close()
