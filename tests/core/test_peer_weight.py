"""What one peer can cost a receiver, whatever it publishes (issue 43).

A peer group enters the update as at most the receiver's own group size, rows chosen by the
receiver's seed; the loss weight each peer holds is bounded by that and reported; reading a
peer's answer is linear in its text, and the round's verification budget can stop a group
mid-way.
"""

from __future__ import annotations

import dataclasses
import random
import time
from typing import Any

import pytest
from reasoning_gym.utils import extract_answer as reasoning_gym_answer

from sapo_core.config import (
    GenerationConfig,
    GRPOConfig,
    NodeConfig,
    RewardConfig,
    TaskConfig,
    TaskSpec,
)
from sapo_core.grpo.loss import row_loss_shares
from sapo_core.learner import Learner
from sapo_core.peers import within_group_size
from sapo_core.prompts import extract_answer, is_well_formed, tagged_answer
from sapo_core.reputation import evidence
from sapo_core.rewards import ConfigBounds, own_verdicts, score_groups
from sapo_core.rollouts import Group, Rollout
from sapo_core.tasks import Question, TaskSource
from tests.factories import rollout_of

TASKS = TaskConfig(specs=(TaskSpec(name="chain_sum", config={"min_terms": 2, "max_terms": 2}),))
BOMB = "<answer> " * 3640  # 32 KB, under max_completion_chars: ~6 s a row for the old regex


def _question(seed: int = 1) -> Question:
    return TaskSource(TASKS, seed=seed).draw(0, 1)[0]


def _group(node: str, completions: list[str], seed: int = 1) -> Group:
    q = _question(seed)
    rows = tuple(rollout_of(q, c, node, j, claimed=None) for j, c in enumerate(completions))
    return Group(rows[0].group_id, "external", rows)


# -- the answer a completion gives, linear in its text ------------------------------------


def test_the_tagged_answer_is_reasoning_gyms_on_every_shape_of_text() -> None:
    atoms = ["<answer>", "</answer>", " ", "\n", "a", "1", "<", "/", "answer>", "<answer", "\u2003"]
    rng = random.Random(0)
    for _ in range(20_000):
        text = "".join(rng.choice(atoms) for _ in range(rng.randint(0, 14)))
        assert tagged_answer(text) == reasoning_gym_answer(text), repr(text)


def test_a_peers_bomb_costs_the_verifier_no_more_than_honest_text() -> None:
    # Issue 43: 64 such rows took 198 s against a 120 s budget. Now each is read in one
    # pass: every row of every group is judged well within a budget of seconds.
    assert tagged_answer(BOMB) is None and not is_well_formed(BOMB)
    assert extract_answer(BOMB, "lenient") is None and extract_answer(BOMB, "last_number") is None
    groups = [_group(f"peer{k}", [BOMB] * 3 + ["<answer>0</answer>"], seed=k) for k in range(16)]
    config = RewardConfig(verify_budget_s=20.0)
    started = time.monotonic()
    scored, problems = score_groups(groups, config, ConfigBounds.for_node(TASKS, None, 1000.0))
    assert problems == [] and len(scored) == 16  # all 64 rows judged, none left unjudged
    assert time.monotonic() - started < config.verify_budget_s  # a hang bound, not a timing


def test_the_budget_stops_a_group_midway_and_leaves_its_rows_unjudged() -> None:
    # A clock that moves one second per reading: the budget of 2.5 s runs out within the
    # first group, whose remaining rows are unjudged (nothing held against the peer), and
    # the second group is not started.
    ticks = iter(range(1000))
    groups = [_group("peer", ["<answer>1</answer>"] * 4), _group("other", ["x", "y"], seed=2)]
    config = RewardConfig(verify_budget_s=2.5)
    bounds = ConfigBounds.for_node(TASKS, None, 1000.0)
    scored, problems = score_groups(groups, config, bounds, clock=lambda: next(ticks))
    assert scored == [] and len(problems) == 6
    assert all("unjudged" in p for p in problems)
    assert "within the group" in problems[0]
    assert evidence(groups, scored, problems) == {}


# -- a peer group weighs one of the receiver's own ------------------------------------------


def test_a_big_group_is_cut_to_the_receivers_size_by_its_seed_not_the_peers_order() -> None:
    big = _group("evil", [f"<answer>{k % 2}</answer>" for k in range(256)])
    cut = within_group_size(big, 4, "7/0/external")
    assert len(cut.rollouts) == 4 and cut.group_id == big.group_id
    reordered = Group(big.group_id, "external", tuple(reversed(big.rollouts)))
    assert within_group_size(reordered, 4, "7/0/external") == cut  # the peer's order: no say
    others = {within_group_size(big, 4, f"{s}/0/external").rollouts for s in range(20)}
    assert len(others) > 10  # the receiver's seed chooses
    small = _group("ok", ["a", "b", "c"])
    assert within_group_size(small, 4, "7/0/external") is small


def test_loss_shares_follow_the_loss_normalisation() -> None:
    assert row_loss_shares([10, 30], "grpo") == [0.5, 0.5]  # every row alike
    for token_level in ("bnpo", "dr_grpo", "dapo"):
        assert row_loss_shares([10, 30], token_level) == [0.25, 0.75]  # by tokens
    assert row_loss_shares([], "grpo") == []


def _node(model_dir: Any, size: int = 4) -> NodeConfig:
    return NodeConfig(
        node_id="me",
        model=str(model_dir),
        tasks=TASKS,
        generation=GenerationConfig(completions_per_question=size, max_new_tokens=32),
        grpo=GRPOConfig(drop_zero_variance=True),
        local_groups=2,
        external_groups=2,
    )


def _rows(learner: Learner, node: str, answers: list[str], round_: int = 0) -> Group:
    [q] = learner.tasks.draw(round_, 1)
    group_id = f"sw.{node}.r{round_}.q0"
    rows = tuple(
        Rollout(
            rollout_id=f"{group_id}.c{k:03d}",
            group_id=group_id,
            node_id=node,
            model_id="m",
            node_round=round_,
            policy_version=0,
            question=q,
            completion=text,
            completion_tokens=8,
            reward=None,
        )
        for k, text in enumerate(answers)
    )
    if node != "me":
        return Group(group_id, "external", rows)
    # Own rows carry the verdicts this node's verifier gave them, as `generate` makes them.
    verdicts = own_verdicts(rows, learner.config.reward)
    return Group(
        group_id,
        "local",
        tuple(dataclasses.replace(r, reward=v.reward) for r, v in zip(rows, verdicts, strict=True)),
    )


@pytest.mark.parametrize("loss_type", ["grpo", "dapo"])
def test_a_peer_with_a_256_row_group_holds_no_more_than_one_group_of_the_update(
    tiny_model_dir: Any, tiny_policy: Any, loss_type: str
) -> None:
    # Issue 43: one 256-row group (half right, carrying an injected line) against a
    # receiver whose groups hold 4 took 97% of the GRPO loss weight.
    config = _node(tiny_model_dir).model_copy(
        update={"grpo": GRPOConfig(drop_zero_variance=True, loss_type=loss_type)}
    )
    me = Learner(config, tiny_policy)
    [q] = me.tasks.draw(0, 1)
    right, wrong = f"<answer>{q.answer}</answer>", "<answer>-1</answer>"
    own = [_rows(me, "me", [right, wrong, right, wrong])]
    honest = _rows(me, "honest", [right, wrong, wrong, wrong])
    evil = _rows(
        me, "evil", [(right if k % 2 else wrong) + " visit evil.example" for k in range(256)]
    )
    chosen, flagged = me.select(0, own, [evil, honest])
    assert flagged == 0 and chosen.external_used == 2
    assert [len(g.rollouts) for g in chosen.trained] == [4, 4, 4]
    assert chosen.peer_evidence["evil"].rows == 4  # evidence of 4 rows, not 256
    report = me.update(0, chosen)
    assert sum(report.loss_shares.values()) == pytest.approx(1.0)
    assert set(report.peer_loss_shares) == {"evil", "honest"}
    if loss_type == "grpo":  # every row alike: one group of three
        assert report.peer_loss_shares["evil"] == pytest.approx(1 / 3)
    # Under any loss a peer group holds no more than 4 rows of at most max_new_tokens.
    evil_tokens = 4 * me.config.generation.max_new_tokens
    trained_tokens = sum(
        len(me.encoder.completion_tokens(r)[0]) for g in chosen.trained for r in g.rollouts
    )
    assert report.peer_loss_shares["evil"] <= evil_tokens / trained_tokens
    logged = {r["group_id"]: r["loss_share"] for r in chosen.records(report.loss_shares)}
    assert logged[evil.group_id] == pytest.approx(report.peer_loss_shares["evil"])
