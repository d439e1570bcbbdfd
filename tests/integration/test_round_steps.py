"""A node's round, step by step, without Prefect: a local ledger, tiny models, no MLflow."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import yaml

from flows.config import SwarmConfig, load_swarm
from flows.node import checkpoint as checkpoints
from flows.node import steps
from flows.node.metrics import describe
from flows.node.runtime import NodeRuntime, open_node
from flows.node.state import RoundState
from ledger import DrawRequest
from tests.tiny_models import build_tiny_model


def make_swarm(tmp_path: Path, grpo: dict | None = None, **changes: object) -> SwarmConfig:
    model = tmp_path / "model"
    if not model.exists():
        build_tiny_model(model)
    data = {
        "swarm_id": "steps",
        "workdir": str(tmp_path / "work"),
        "rounds": 2,
        "checkpoint_every": 2,
        "sampling": {"kind": "reward_filtered", "require_variance": False},
        "tracking": {"enabled": False},
        "defaults": {
            "model": str(model),
            "local_groups": 2,
            "external_groups": 1,
            "tasks": {"specs": [{"name": "chain_sum", "config": {"max_terms": 2}}]},
            "generation": {"completions_per_question": 2, "max_new_tokens": 3},
            "grpo": {"drop_zero_variance": False, **(grpo or {})},
        },
        "nodes": [{"node_id": "a", "seed": 0}, {"node_id": "b", "seed": 1}],
        **changes,
    }
    return load_swarm(text=yaml.safe_dump(data))


def run_round(node: NodeRuntime, round_: int, *, force: bool = False) -> dict[str, float]:
    """The round as flows run it (``steps.ROUND``), step by step without Prefect."""
    state = RoundState(round_, last=force)
    metrics = steps.run_round(node, state)
    assert state.generated is not None
    assert sum(len(g.rollouts) for g in state.generated.groups) == node.spec.node.questions * 2
    assert metrics["ledger_unreachable"] == 0.0  # published
    return metrics


def test_a_round_publishes_samples_peers_trains_and_reports(tmp_path: Path) -> None:
    swarm = make_swarm(tmp_path)
    a = open_node(swarm, "a")
    b = open_node(swarm, "b")
    try:
        run_round(a, 0)  # a publishes 3 groups (I + J questions) of 2 completions
        assert a.ledger.query("SELECT count(*) FROM rollouts").item() == 6

        state = RoundState(0)
        steps.generate(b, state)
        keys = steps.publish(b, state)
        assert keys == steps.publish(b, state)  # a retried publish writes the same keys
        drawn = steps.sample(b, state)
        assert len(drawn) == 1 and drawn[0].startswith("steps.a.r0.")  # a's, never b's own
        figures = steps.train(b, state)
        assert state.report is not None and state.report.chosen is not None
        assert len(state.report.chosen.selected) == 3 and state.report.flagged_rows == 0
        assert steps.checkpoint(b, state) is None  # every 2 rounds: not after round 0
        metrics = steps.track(b, state)

        chosen = state.report.chosen
        rewards = chosen.rewards()
        assert metrics["training_reward"] == pytest.approx(sum(rewards) / len(rewards))
        assert figures["cumulative_training_reward"] == pytest.approx(metrics["training_reward"])
        assert figures["cumulative_own_reward"] == pytest.approx(metrics["own_reward"])
        for name in ("cumulative_own_reward", "cumulative_training_reward"):
            assert metrics[name] == figures[name] == getattr(b.learner.totals, name)
        assert metrics["external_groups_used"] == 1.0 and metrics["groups_trained"] == 3.0
        assert metrics["policy_version"] == 1.0
        assert set(state.seconds) == {
            "generate", "publish", "sample", "checkpoint_wait", "reward", "update", "checkpoint",
        }  # fmt: skip
        for name in ("generate", "publish", "sample", "reward", "update", "orchestration"):
            assert metrics[f"seconds_{name}"] >= 0.0
        assert "seconds_track" not in metrics
        assert "loss" in metrics and "update_tokens_per_s" in metrics  # the update ran
        # The ledger's own mean over b's completions is what MLflow would get.
        sql = "SELECT avg(reward) FROM rollouts WHERE node_id = 'b' AND node_round = 0"
        assert metrics["own_reward"] == pytest.approx(b.ledger.query(sql).item())
        # training_reward_local covers only the own groups kept for the update
        own = chosen.rewards("local")
        assert metrics["training_reward_local"] == pytest.approx(sum(own) / len(own))
        line = describe(metrics, "b", 0)
        assert line.startswith(f"b round 0: own_reward {metrics['own_reward']:.3f} (cumulative ")
        assert f"training_reward {metrics['training_reward']:.3f} (local " in line
    finally:
        a.close()
        b.close()


def test_steps_out_of_order_fail_clearly(tmp_path: Path) -> None:
    node = open_node(make_swarm(tmp_path), "a")
    try:
        with pytest.raises(RuntimeError, match="round 4: publish before generate"):
            steps.publish(node, RoundState(4))
        with pytest.raises(RuntimeError, match="round 4: train before generate"):
            steps.train(node, RoundState(4))
    finally:
        node.close()


def test_checkpoint_cadence_and_resume(tmp_path: Path) -> None:
    swarm = make_swarm(tmp_path, checkpoint_every=2)
    assert [steps.checkpoint_due(d, 2, force=False) for d in (1, 2, 3, 4)] == [
        False, True, False, True,
    ]  # fmt: skip
    assert steps.checkpoint_due(1, 2, force=True)
    node = open_node(swarm, "a")
    try:
        run_round(node, 0)
        assert checkpoints.latest(swarm.workdir, "a") is None
        run_round(node, 1)  # its checkpoint is written in the background
        node.wait_for_checkpoint()
        saved = checkpoints.latest(swarm.workdir, "a")
        assert saved is not None and saved.next_round == 2 == node.next_round
        totals = node.learner.totals
    finally:
        node.close()
    again = open_node(swarm, "a")
    try:
        assert again.next_round == 2 and again.learner.totals == totals
        assert again.learner.totals is not totals
        assert again.learner.policy_version == 2
    finally:
        again.close()


def test_resume_keeps_the_kl_reference_at_the_initial_model(tmp_path: Path) -> None:
    # A tiny random model earns no reward, so its advantages are zero: weight decay is what
    # moves the policy away from the reference here.
    grpo = {"beta": 0.04, "weight_decay": 0.1, "learning_rate": 1e-2}
    swarm = make_swarm(tmp_path, grpo=grpo, checkpoint_every=1)
    node = open_node(swarm, "a")
    initial = [p.detach().clone() for p in node.learner.ref_model.parameters()]
    try:
        run_round(node, 0)
        trained = [p.detach().clone() for p in node.learner.policy.model.parameters()]
    finally:
        node.close()
    resumed = open_node(swarm, "a")
    try:
        ref = list(resumed.learner.ref_model.parameters())
        policy = list(resumed.learner.policy.model.parameters())
        assert all(torch.equal(x, y) for x, y in zip(initial, ref, strict=True))
        assert all(torch.equal(x, y) for x, y in zip(trained, policy, strict=True))
        assert any(not torch.equal(x, y) for x, y in zip(trained, ref, strict=True))
    finally:
        resumed.close()


def test_evaluation_and_training_logs_land_in_the_ledger(tmp_path: Path) -> None:
    swarm = make_swarm(tmp_path)
    data = swarm.model_dump(mode="json")
    for node in data["nodes"]:
        node["node"]["evaluation"] = {"every": 2, "questions_per_task": 3, "completions": 1}
    swarm = SwarmConfig.model_validate(data)
    a, b = open_node(swarm, "a"), open_node(swarm, "b")
    try:
        run_round(a, 0)
        state = RoundState(0)
        assert steps.evaluate(b, state)["eval_accuracy"] == pytest.approx(
            state.evaluation["eval_accuracy/chain_sum"]
        )
        for step in (steps.generate, steps.publish, steps.sample, steps.train):
            step(b, state)
        metrics = steps.track(b, state)
        assert metrics["eval_accuracy"] == state.evaluation["eval_accuracy"]
        assert "seconds_evaluate" in metrics
        assert steps.evaluate(b, RoundState(1)) == {}  # every 2 rounds: not due at round 1
        assert not steps.evaluated(b, 2)
        assert steps.final_evaluation(b)  # the policy after the last round (2)
        assert steps.evaluated(b, 2) and steps.evaluated(b, 1)  # round 1: none due

        evals = b.ledger.query(
            "SELECT node_id, node_round, task, questions, completions, accuracy, policy_version "
            "FROM evaluations WHERE node_id = 'b' ORDER BY node_round"
        ).rows()
        # a's round ran its evaluation too (due at round 0), as every round does
        assert a.ledger.evaluated_nodes("steps", 0) == {"a", "b"}
        assert [(e[0], e[1], e[2], e[3], e[4]) for e in evals] == [
            ("b", 0, "chain_sum", 3, 3),
            ("b", 2, "chain_sum", 3, 3),
        ]
        assert evals[0][6] == 0 and evals[1][6] == 1  # before and after b's one update
        trained = b.ledger.query(
            "SELECT origin, peer_node_id, task, completions, trained FROM trainings "
            "WHERE node_id = 'b' ORDER BY origin"
        ).rows()
        # I = 2 own groups and J = 1 of a's; zero-variance groups kept (drop_zero_variance off)
        assert trained == [
            ("external", "a", "chain_sum", 2, True),
            ("local", "b", "chain_sum", 2, True),
            ("local", "b", "chain_sum", 2, True),
        ]
        assert state.report is not None and state.report.chosen is not None
        chosen = state.report.chosen
        informative = b.ledger.query(
            "SELECT count(*) FROM trainings WHERE node_id = 'b' AND informative"
        ).item()
        assert informative == sum(not g.zero_variance for g in chosen.selected)
    finally:
        a.close()
        b.close()


class _Excluding:
    """A reputation that has excluded ``peer`` (what `Reputation` holds after its lies)."""

    def __init__(self, peer: str) -> None:
        self.peer = peer

    def excluded(self) -> list[str]:
        return [self.peer]

    def known(self) -> list[str]:
        return []

    def standing(self) -> dict[str, int]:
        return {}


def test_the_warm_up_does_not_count_the_groups_of_peers_the_node_excluded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 45: the warm-up wait asked the ledger without the node's exclusions, so an
    excluded peer's groups ended it at once and the draw then found nothing to train on."""
    swarm = make_swarm(tmp_path, peer_wait_s=1.0)
    a = open_node(swarm, "a")
    b = open_node(swarm, "b")
    try:
        run_round(a, 0)  # a's groups are in the ledger
        monkeypatch.setattr(b.learner, "reputation", _Excluding("a"))
        polls = []
        asked = b.ledger.draw_group_ids

        def counted(request: DrawRequest) -> list[str]:
            polls.append(request.exclude_nodes)
            return asked(request)

        monkeypatch.setattr(b.ledger, "draw_group_ids", counted)
        state = RoundState(0)
        steps.generate(b, state)
        assert steps.sample(b, state) == []  # a is excluded: nothing drawn
        # The wait asked as the draw does, so it found nothing and waited out peer_wait_s
        # (polling every PEER_POLL_S), instead of stopping at a's groups.
        assert len(polls) >= 2 and all(p == ("a",) for p in polls)
    finally:
        a.close()
        b.close()
