"""Held-out evaluation: fixed questions no node trains on, scored by the node's verifier."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from sapo_core.config import EvaluationConfig, NodeConfig, RewardConfig, TaskConfig
from sapo_core.evaluation import TaskScore, heldout_questions, overall_accuracy, score_by_task
from sapo_core.tasks import TaskSource, stream_seed

TASKS = TaskConfig.model_validate(
    {
        "specs": [
            {"name": "chain_sum", "config": {"min_terms": 2, "max_terms": 2, "max_digits": 1}},
            {"name": "basic_arithmetic", "config": {"min_terms": 2, "max_terms": 2}},
        ]
    }
)


def test_heldout_set_is_fixed_per_task_and_apart_from_training_streams() -> None:
    config = EvaluationConfig(every=2, questions_per_task=5)
    first = heldout_questions(config, TASKS)
    assert [q.task for q in first] == ["chain_sum"] * 5 + ["basic_arithmetic"] * 5
    assert [q.task_index for q in first[:5]] == [0, 1, 2, 3, 4]
    assert {q.task_seed for q in first} == {stream_seed(config.seed, "heldout")}
    assert heldout_questions(config, TASKS) == first  # rebuilt from the seed, identical
    # reasoning-gym builds item i from Random(seed + i): streams are hashed apart, so neither
    # a node whose seed equals the evaluation's nor neighbouring nodes share questions.
    for seed in (0, 1, config.seed, config.seed - 3):
        drawn = [q for r in range(10) for q in TaskSource(TASKS, seed=seed).draw(r, 4)]
        # (texts may still repeat: "0 + 5 =" exists once per tiny setting; the report counts)
        spans = [(q.task_seed, q.task_seed + q.task_index) for q in drawn]
        assert all(abs(lo - stream_seed(config.seed, "heldout")) > 10**4 for lo, _ in spans)
    # Specialists are evaluated on all tasks: the evaluation's task list wins.
    only = TaskConfig.model_validate({"specs": [{"name": "chain_sum"}]})
    wide = EvaluationConfig(every=1, questions_per_task=2, tasks=TASKS)
    assert [q.task for q in heldout_questions(wide, only)] == ["chain_sum"] * 2 + [
        "basic_arithmetic"
    ] * 2


def test_scores_sum_per_task_with_the_strict_verifier() -> None:
    questions = heldout_questions(EvaluationConfig(every=1, questions_per_task=2), TASKS)
    completions = []
    for i, q in enumerate(questions):
        right = f"so <answer>{q.answer}</answer>"
        # chain_sum: both right on q0, one of two on q1; basic_arithmetic: untagged, then wrong
        completions.append(
            [
                [right, right],
                [right, f"{q.answer}"],
                [f"{q.answer}", "x"],
                ["<answer>-999999</answer>"],
            ][i]
        )
    scores = score_by_task(questions, completions, RewardConfig(extraction="strict"))
    assert scores == [
        TaskScore("chain_sum", questions=2, completions=4, correct=3.0),
        TaskScore("basic_arithmetic", questions=2, completions=3, correct=0.0),
    ]
    assert scores[0].accuracy == 0.75
    assert overall_accuracy(scores) == pytest.approx(0.375)  # tasks weigh the same
    lenient = score_by_task(questions, completions, RewardConfig(extraction="last_number"))
    assert lenient[1].correct == 1.0  # the bare number counts under last_number only


def test_evaluation_schedule() -> None:
    config = EvaluationConfig(every=4)
    assert [r for r in range(11) if config.due(r, 10)] == [0, 4, 8, 10]
    assert not EvaluationConfig().due(0, 10)  # every = 0: off
    with pytest.raises(ValidationError):
        EvaluationConfig(every=-1)


def test_neighbouring_node_seeds_draw_different_questions() -> None:
    one = TaskConfig.model_validate({"specs": [{"name": "chain_sum", "config": {"max_terms": 3}}]})
    a = [q.question for r in range(5) for q in TaskSource(one, seed=0).draw(r, 4)]
    b = [q.question for r in range(5) for q in TaskSource(one, seed=1).draw(r, 4)]
    assert len(set(a) & set(b)) <= 1  # not b == a shifted by one (reasoning-gym's seed + i)


def test_learner_evaluates_the_same_questions_reproducibly(tiny_policy) -> None:  # type: ignore[no-untyped-def]
    from sapo_core.learner import Learner

    config = NodeConfig(
        tasks=TASKS,
        generation={"completions_per_question": 2, "max_new_tokens": 4},
        evaluation=EvaluationConfig(every=1, questions_per_task=3, completions=1),
    )
    learner = Learner(config, tiny_policy)
    first = learner.evaluate()
    assert [(s.task, s.questions, s.completions) for s in first] == [
        ("chain_sum", 3, 3),
        ("basic_arithmetic", 3, 3),
    ]
    assert learner.evaluate() == first  # fixed sampling seed: replayable
