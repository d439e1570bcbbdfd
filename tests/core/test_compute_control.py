"""The compute-matched control's selection rule (issue 46): a node alone that makes more
questions than it trains on takes the informative groups first, so it trains on as many
groups with a signal as a sharing node, bought with generation instead of with peers."""

from __future__ import annotations

import random
from typing import Any

import pytest

from sapo_core.assembly import choose_local
from sapo_core.config import GenerationConfig, GRPOConfig, NodeConfig, TaskConfig
from sapo_core.learner import Learner
from sapo_core.rollouts import Group, Rollout

TASKS = TaskConfig.model_validate({"specs": [{"name": "chain_sum"}]})
# A hand-made round of 8 own groups of 4: three carry a signal (rewards differ).
REWARDS = [
    [0, 0, 0, 0],
    [1, 0, 0, 1],  # informative
    [0, 0, 0, 0],
    [1, 1, 1, 1],
    [0, 1, 0, 0],  # informative
    [0, 0, 0, 0],
    [1, 1, 0, 1],  # informative
    [0, 0, 0, 0],
]
INFORMATIVE = {1, 4, 6}


def _round(learner: Learner | None = None) -> list[Group]:
    """The round's groups (of the learner's first question: choose_local reads no question)."""
    q = learner.tasks.draw(0, 1)[0] if learner else None
    groups = []
    for k, rewards in enumerate(REWARDS):
        gid = f"me.r0.q{k}"
        rows = tuple(
            Rollout(
                rollout_id=f"{gid}.c{j}", group_id=gid, node_id="me", model_id="m",
                node_round=0, policy_version=0, question=q,  # type: ignore[arg-type]
                completion=f"<answer>{r}</answer>", completion_tokens=4, reward=float(r),
            )
            for j, r in enumerate(rewards)
        )  # fmt: skip
        groups.append(Group(gid, "local", rows))
    return groups


def _index(group: Group) -> int:
    return int(group.group_id.rsplit("q", 1)[1])


@pytest.mark.parametrize("seed", ["0/0/local", "1/0/local", "7/3/local"])
def test_informative_first_takes_every_informative_group_then_fills_by_the_seeded_draw(
    seed: str,
) -> None:
    groups = _round()
    picked = [_index(g) for g in choose_local(groups, 4, seed, informative_first=True)]
    assert len(picked) == 4 and picked == sorted(picked)  # generation order kept
    assert set(picked) >= INFORMATIVE  # all three informative groups
    [filler] = set(picked) - INFORMATIVE  # and one more: the first of the rest in the seed's order
    order = random.Random(seed).sample(range(8), 8)
    assert filler == next(i for i in order if i not in INFORMATIVE)
    # With fewer slots than informative groups, only informative ones, in the seed's order.
    two = {_index(g) for g in choose_local(groups, 2, seed, informative_first=True)}
    assert two == set([i for i in order if i in INFORMATIVE][:2])


def test_the_default_draw_is_the_one_every_earlier_run_made() -> None:
    groups = _round()
    for seed in ("0/0/local", "3/5/local"):
        picked = [_index(g) for g in choose_local(groups, 4, seed)]
        assert picked == sorted(random.Random(seed).sample(range(8), 4))


def test_a_node_alone_with_the_control_trains_on_the_informative_groups(
    tiny_model_dir: Any, tiny_policy: Any
) -> None:
    def node(selection: str) -> Learner:
        config = NodeConfig(
            node_id="me", model=str(tiny_model_dir), tasks=TASKS,
            generation=GenerationConfig(completions_per_question=4, max_new_tokens=8),
            grpo=GRPOConfig(drop_zero_variance=True),
            local_groups=4, external_groups=0, questions_per_round=8,
            local_selection=selection,  # type: ignore[arg-type]
        )  # fmt: skip
        return Learner(config, tiny_policy)

    control = node("informative_first")
    chosen, flagged = control.select(0, _round(control), [])
    assert flagged == 0
    assert len(chosen.selected) == 4
    assert {_index(g.group) for g in chosen.trained} == INFORMATIVE
    # The same node drawing at random selects 4 of the 8 and trains on the informative
    # ones among them: fewer, for this seed.
    drawn = node("drawn")
    chosen, _ = drawn.select(0, _round(drawn), [])
    picked = {_index(g.group) for g in chosen.selected}
    assert {_index(g.group) for g in chosen.trained} == picked & INFORMATIVE
    assert len(picked & INFORMATIVE) < 3
