"""Issue 59: a node stopped at any step of a round and resumed from its checkpoint ends as its
unstopped twin: the same reputation of its peers, reward totals, weights and draws.

Before the learner held its state, a node stopped after a round's verdicts and resumed from
an older checkpoint counted that round's peer evidence twice (the reputation lived in its
own file, outside the checkpoint). Now every piece is in `Learner.state_dict()`, saved at
one instant, so a resumed node is the node that saved it and each round counts once.

The twin and each stopped node run the round's steps (flows/node/steps.py ``ROUND``) without
Prefect, in workdirs of their own with the same peer's groups published in each ledger and
the same node key (which keys its draws)."""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml

from flows.config import SwarmConfig, load_swarm
from flows.node import steps
from flows.node.runtime import NodeRuntime, open_node
from flows.node.state import RoundState
from ledger import NodeKey
from sapo_core.rollouts import Rollout
from sapo_core.tasks import TaskSource
from tests.factories import open_ledger
from tests.tiny_models import build_tiny_model

ROUNDS = 3
STOPPED_IN = 1  # with a checkpoint every 2 rounds: a stop here resumes from round 0
SWARM = "twin"
STEPS = [s.name for s in steps.ROUND if s.name != "evaluate"]  # none due in this swarm


class Stop(Exception):
    """The process ends here (its memory lost; what it wrote stays)."""


@dataclass
class Ended:
    """What a node ends with, to compare."""

    reputation: dict[str, Any]
    totals: dict[str, float]
    policy_version: int
    weights: dict[str, torch.Tensor]
    draws: list[list[str]]
    judged: int


def swarm_in(root: Path, model: Path) -> SwarmConfig:
    data = {
        "swarm_id": SWARM,
        "workdir": str(root),
        "rounds": ROUNDS,
        "checkpoint_every": 2,
        "peer_wait_s": 0.0,
        "tracking": {"enabled": False},
        "defaults": {
            "model": str(model),
            "local_groups": 1,
            "external_groups": 2,
            "tasks": {"specs": [{"name": "chain_sum", "config": {"max_terms": 2}}]},
            "generation": {"completions_per_question": 2, "max_new_tokens": 3},
            "grpo": {"learning_rate": 1e-3, "drop_zero_variance": False},
        },
        "nodes": [{"node_id": "n", "seed": 0}],
    }
    swarm = load_swarm(text=yaml.safe_dump(data))
    peer = NodeKey.generate(SWARM, "p")
    ledger = open_ledger(str(swarm.ledger.url), signer=peer)
    ledger.register_key(peer)
    ledger.publish(peer_rows(swarm))
    return swarm


def peer_rows(swarm: SwarmConfig) -> list[dict[str, Any]]:
    """A peer's groups of the node's task, each with one right and one wrong answer (so its
    draw keeps them), for every round: rows this node's verifier judges."""
    tasks = swarm.node("n").node.tasks
    rows = []
    for r in range(ROUNDS):
        for k, question in enumerate(TaskSource(tasks, seed=100).draw(r, 3)):
            gid = f"{SWARM}.p.r{r}.q{k}"
            for j, (answer, reward) in enumerate([(question.answer, 1.0), ("-1", 0.0)]):
                rollout = Rollout(
                    rollout_id=f"{gid}.c{j}",
                    group_id=gid,
                    node_id="p",
                    model_id="peer-model",
                    node_round=r,
                    policy_version=r,
                    question=question,
                    completion=f"<answer>{answer}</answer>",
                    completion_tokens=3,
                    reward=reward,
                )
                rows.append(rollout.to_record() | {"swarm_id": SWARM})
    return rows


def stopping_at(step_name: str) -> steps.StepCall:
    def call(step: steps.Step, node: NodeRuntime, state: RoundState) -> Any:
        if step.name == step_name and state.round == STOPPED_IN:
            raise Stop(step_name)
        return step.run(node, state)

    return call


def run(swarm: SwarmConfig, call: steps.StepCall = steps.call_directly) -> None:
    """Run the node's rounds from its checkpoint to the end (or to a stop)."""
    node = open_node(swarm, "n")
    try:
        for round_ in range(node.next_round, ROUNDS):
            steps.run_round(node, RoundState(round_, last=round_ == ROUNDS - 1), call=call)
    finally:
        node.close()


def ended(swarm: SwarmConfig) -> Ended:
    node = open_node(swarm, "n")
    try:
        assert node.next_round == ROUNDS
        learner = node.learner
        draws = []
        for r in range(ROUNDS):
            frame = node.ledger.logged_draw(SWARM, "n", r)
            assert frame is not None
            draws.append(sorted(frame["group_id"].unique().to_list()))
        return Ended(
            learner.reputation.to_json(),
            learner.totals.as_metrics(),
            learner.policy_version,
            {k: v.clone() for k, v in learner.policy.model.state_dict().items()},
            draws,
            sum(r.judged for r in learner.reputation.peers.values()),
        )
    finally:
        node.close()


@pytest.fixture(scope="module")
def twin(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Ended]:
    root = tmp_path_factory.mktemp("twin")
    model = build_tiny_model(root / "model")
    swarm = swarm_in(root / "unstopped", model)
    run(swarm)
    return model, swarm.workdir / "keys", ended(swarm)


@pytest.mark.parametrize("step", STEPS)
def test_a_node_stopped_at_a_step_and_resumed_ends_as_its_unstopped_twin(
    step: str, twin: tuple[Path, Path, Ended], tmp_path: Path
) -> None:
    model, keys, expected = twin
    # Each round judges 2 of the peer's groups of 2 rows: 4 rows a round, counted once.
    assert expected.judged == 4 * ROUNDS and expected.policy_version == ROUNDS
    swarm = swarm_in(tmp_path / "stopped", model)
    shutil.copytree(keys, swarm.workdir / "keys")  # the same key: the same draws
    with pytest.raises(Stop):
        run(swarm, stopping_at(step))
    run(swarm)  # resumed from its newest checkpoint, to the end
    got = ended(swarm)
    assert got.judged == expected.judged
    assert got.reputation == expected.reputation
    assert got.totals == expected.totals
    assert got.policy_version == expected.policy_version
    assert got.draws == expected.draws
    for name, weight in expected.weights.items():
        assert torch.equal(got.weights[name], weight), name
