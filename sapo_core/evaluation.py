"""Held-out evaluation: the same fixed questions for every node, scored by the node's verifier.

Training reward mixes skill with luck of the draw (each round's questions differ, and with
sharing a node trains on peers' questions too). A fixed set, rebuilt from its own question
stream (`stream_seed(seed, "heldout")`, apart from every node's training stream), measures
every node's policy on identical questions at every evaluation.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TypedDict

from sapo_core.config import EvaluationConfig, RewardConfig, TaskConfig
from sapo_core.rewards import verify_answer
from sapo_core.tasks import Question, canonical_config, regenerate, stream_seed


@dataclass(frozen=True)
class TaskScore:
    """One task's result in one evaluation."""

    task: str
    questions: int
    completions: int
    correct: float  # sum of rewards

    @property
    def accuracy(self) -> float:
        return self.correct / self.completions if self.completions else 0.0


class EvaluationRecord(TypedDict):
    """One line of the ledger's evaluation log (ledger/node_logs.py ``EVALUATIONS``), less
    what the writer stamps (swarm, node, round, time): the columns are held equal by a test."""

    task: str
    questions: int
    completions: int
    correct: float
    accuracy: float
    policy_version: int
    eval_seed: int


def evaluation_records(
    scores: Sequence[TaskScore], policy_version: int, eval_seed: int
) -> list[EvaluationRecord]:
    """An evaluation's scores as the evaluation log's lines, one per task."""
    return [
        EvaluationRecord(
            task=s.task,
            questions=s.questions,
            completions=s.completions,
            correct=s.correct,
            accuracy=s.accuracy,
            policy_version=policy_version,
            eval_seed=eval_seed,
        )
        for s in scores
    ]


def heldout_questions(config: EvaluationConfig, node_tasks: TaskConfig) -> list[Question]:
    """Question i of each evaluated task is index i of the evaluation's own stream."""
    specs = (config.tasks or node_tasks).specs
    seed = stream_seed(config.seed, "heldout")
    return [
        regenerate(spec.name, canonical_config(spec.config), seed, i)
        for spec in specs
        for i in range(config.questions_per_task)
    ]


def score_by_task(
    questions: Sequence[Question],
    completions: Sequence[Sequence[str]],
    reward: RewardConfig,
) -> list[TaskScore]:
    """Score each question's completions with the node's verifier; sum them per task."""
    totals: dict[str, list[float]] = {}
    counts: dict[str, int] = {}
    for question, texts in zip(questions, completions, strict=True):
        counts[question.task] = counts.get(question.task, 0) + 1
        scores = totals.setdefault(question.task, [])
        scores.extend(verify_answer(question, text, reward).reward or 0.0 for text in texts)
    return [
        TaskScore(task, counts[task], len(scores), sum(scores)) for task, scores in totals.items()
    ]


def overall_accuracy(scores: Sequence[TaskScore]) -> float:
    """Mean over tasks (each task weighs the same, whatever its question count)."""
    return sum(s.accuracy for s in scores) / len(scores) if scores else 0.0
