"""Checkpoints: atomic, only the newest kept, interrupted saves cleaned, resume exact."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from flows import checkpoint
from sapo_core.config import GenerationConfig, GRPOConfig, NodeConfig, TaskConfig, TaskSpec
from sapo_core.learner import Learner
from sapo_core.policy.loading import Policy, load_policy


def learner(model_dir: Path) -> Learner:
    config = NodeConfig(
        node_id="n",
        model=str(model_dir),
        local_groups=1,
        tasks=TaskConfig(specs=[TaskSpec(name="chain_sum")]),
        generation=GenerationConfig(completions_per_question=2, max_new_tokens=3),
        grpo=GRPOConfig(drop_zero_variance=False),  # a random model earns 0: step anyway
    )
    return Learner(config)


def test_newest_only_stale_temporaries_removed_model_files_listed(
    tmp_path: Path, tiny_model_dir: Any
) -> None:
    me = learner(tiny_model_dir)
    first = checkpoint.save(tmp_path, "n", me, 1, 0.5)
    stale = first.path.parent / ".tmp-killed"
    stale.mkdir()
    (stale / "model.safetensors").write_bytes(b"half a file")
    me.policy_version = 3
    second = checkpoint.save(tmp_path, "n", me, 2, 1.5)
    kept = sorted(p.name for p in second.path.parent.iterdir())
    assert kept == ["round-000002"]  # the old one and the interrupted one are gone
    assert checkpoint.latest(tmp_path, "n") == second
    assert (second.next_round, second.policy_version, second.cumulative_reward) == (2, 3, 1.5)
    names = {p.name for p in checkpoint.model_files(second.path)}
    assert "model.safetensors" in names and "config.json" in names
    assert not names & {"optimizer.pt", "rng.pt", "state.json"}
    # A directory without state.json (a save cut short before its last write) is ignored.
    (second.path.parent / "round-000009").mkdir()
    assert checkpoint.latest(tmp_path, "n") == second


def test_restore_gives_back_weights_optimizer_and_counters(
    tmp_path: Path, tiny_model_dir: Any
) -> None:
    me = learner(tiny_model_dir)
    made = me.generate(0)
    me.train(0, made.groups)
    saved = checkpoint.save(tmp_path, "n", me, 1)
    loaded = load_policy(str(saved.path))
    again = Learner(me.config, policy=Policy(loaded.model, loaded.tokenizer, model_id="x"))
    checkpoint.restore_into(again, saved)
    for a, b in zip(me.policy.model.parameters(), again.policy.model.parameters(), strict=True):
        assert torch.equal(a, b)
    assert again.policy_version == me.policy_version
    assert me.policy_version == 1
    ours, theirs = me.optimizer.state_dict()["state"], again.optimizer.state_dict()["state"]
    assert ours.keys() == theirs.keys() and len(ours) > 0
    for key in ours:
        assert torch.equal(ours[key]["exp_avg"], theirs[key]["exp_avg"])
