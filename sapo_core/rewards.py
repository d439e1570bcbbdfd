"""The node's own verifier: every row, local or a peer's, is scored here and only here.

Ground truth is re-derived from the row's task fields; a row whose shipped question or
answer differs from the re-derived one is flagged and never trained on. Publishers' claimed
rewards are ignored.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

from sapo_core.config import RewardConfig
from sapo_core.prompts import extract_answer, is_well_formed
from sapo_core.rollouts import Group, Rollout
from sapo_core.tasks import Question, TaskError, dataset, entry

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Verdict:
    """A row's reward under this node's verifier, or why it cannot be trained on."""

    reward: float | None
    problem: str | None = None


@dataclass(frozen=True)
class ScoredGroup:
    """A group's usable rows with this node's rewards (same order)."""

    group: Group
    rollouts: tuple[Rollout, ...]
    rewards: tuple[float, ...]

    @property
    def zero_variance(self) -> bool:
        return len(set(self.rewards)) <= 1

    @property
    def mean_reward(self) -> float:
        return sum(self.rewards) / len(self.rewards)


def verify(rollout: Rollout, config: RewardConfig) -> Verdict:
    """Score one row with this node's verifier against ground truth it re-derived itself."""
    return verify_answer(rollout.question, rollout.completion, config)


def verify_answer(q: Question, completion: str, config: RewardConfig) -> Verdict:
    """Score a completion of question ``q``; the question is re-derived from its four task
    fields and must match what it claims (text and answer)."""
    try:
        truth = entry(q.task, q.task_config, q.task_seed, q.task_index)
        data = dataset(q.task, q.task_config, q.task_seed)
    except TaskError as exc:
        return Verdict(None, f"unverifiable: {exc}")
    if str(truth["question"]) != q.question:
        return Verdict(None, "question differs from the regenerated one")
    gold = truth.get("answer")
    if (None if gold is None else str(gold)) != q.answer:
        return Verdict(None, "answer differs from the regenerated ground truth")
    answer = extract_answer(completion, config.extraction)
    try:
        correct = float(data.score_answer(answer, truth))
    except Exception as exc:  # a verifier crashing on odd text scores it wrong, not the node
        log.debug("verifier of %s raised on %r: %s", q.task, answer, exc)
        correct = 0.0
    correct = min(max(correct, 0.0), 1.0)
    if config.format_weight == 0.0:
        return Verdict(correct)
    formatted = config.format_weight * float(is_well_formed(completion))
    return Verdict((correct + formatted) / (1.0 + config.format_weight))


def score_group(group: Group, config: RewardConfig) -> tuple[ScoredGroup | None, list[str]]:
    """Verify every row; drop flagged rows, and the group if fewer than two remain."""
    kept: list[Rollout] = []
    rewards: list[float] = []
    problems: list[str] = []
    for rollout in group.rollouts:
        verdict = verify(rollout, config)
        if verdict.reward is None:
            problems.append(f"{rollout.rollout_id}: {verdict.problem}")
        else:
            kept.append(rollout)
            rewards.append(verdict.reward)
    if len(kept) < 2:
        return None, problems
    return ScoredGroup(group, tuple(kept), tuple(rewards)), problems


def score_groups(
    groups: Sequence[Group], config: RewardConfig
) -> tuple[list[ScoredGroup], list[str]]:
    """Score many groups; returns the usable ones and every flagged row's reason."""
    scored: list[ScoredGroup] = []
    problems: list[str] = []
    for group in groups:
        result, found = score_group(group, config)
        problems.extend(found)
        if result is not None:
            scored.append(result)
    if problems:
        log.warning("flagged %d rows; first: %s", len(problems), problems[0])
    return scored, problems
