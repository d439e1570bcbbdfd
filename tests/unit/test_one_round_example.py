"""examples/one_round.py, the algorithm on one page: it runs end to end on a tiny random
model, imports the algorithm package alone, and its step really trains."""

from __future__ import annotations

import ast
import importlib.util
import math
import statistics
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from tests.tiny_models import build_tiny_model

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "one_round.py"
QUESTIONS, COMPLETIONS, TOKENS = 2, 4, 8


def load_example() -> ModuleType:
    """The example is a script, not a package module: load it from its path."""
    spec = importlib.util.spec_from_file_location("one_round_example", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("one-round-model"))


def run(
    monkeypatch: pytest.MonkeyPatch, model_dir: Path, verifier: Any = None
) -> tuple[dict[str, Any], Any, list[tuple[Any, str]]]:
    """Run the example's main; returns its figures, the policy it trained and the
    (question, completion) pairs its verifier saw."""
    example = load_example()
    seen: list[tuple[Any, str]] = []
    policies: list[Any] = []
    real_verify, real_load = example.verify_answer, example.load_policy

    def verify(question: Any, completion: str, config: Any) -> Any:
        seen.append((question, completion))
        return (verifier or real_verify)(question, completion, config)

    def load(model: str) -> Any:
        policies.append(real_load(model))
        return policies[-1]

    monkeypatch.setattr(example, "verify_answer", verify)
    monkeypatch.setattr(example, "load_policy", load)
    argv = ["--model", str(model_dir), "--questions", str(QUESTIONS)]
    argv += ["--completions", str(COMPLETIONS), "--max-new-tokens", str(TOKENS)]
    figures = example.main([*argv, "--seed", "3", "--lr", "1e-3", "--tasks", "basic_arithmetic"])
    assert len(policies) == 1
    return figures, policies[0], seen


def initial_weights(model_dir: Path) -> dict[str, Any]:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(model_dir)).state_dict()


def letters(question: Any, completion: str, config: Any) -> Any:
    """A stand-in verifier with a spread of rewards in [0, 1] (a random model never answers
    right): the share of ASCII letters in the completion."""
    from sapo_core.rewards import Verdict

    return Verdict(sum(c.isascii() and c.isalpha() for c in completion) / max(len(completion), 1))


def test_the_example_imports_the_algorithm_package_alone() -> None:
    roots = set()
    for node in ast.walk(ast.parse(EXAMPLE.read_text())):
        if isinstance(node, ast.Import):
            roots |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            roots.add(node.module.split(".")[0])
    third_party = roots - set(sys.stdlib_module_names) - {"__future__"}
    assert third_party == {"sapo_core", "torch"}, third_party  # no ledger, flows, Prefect, MLflow


def test_one_round_trains_towards_rewarded_completions(
    monkeypatch: pytest.MonkeyPatch, tiny_model_dir: Path
) -> None:
    figures, policy, seen = run(monkeypatch, tiny_model_dir, verifier=letters)

    # every completion of every question was generated and verified, once
    assert figures["completions"] == len(seen) == QUESTIONS * COMPLETIONS
    assert len({q.key for q, _ in seen}) == QUESTIONS
    assert figures["rewards"] == [letters(q, c, None).reward for q, c in seen]
    assert all(0.0 <= r <= 1.0 for r in figures["rewards"])
    assert figures["mean_reward"] == pytest.approx(sum(figures["rewards"]) / len(seen))
    assert 0 < figures["tokens"] <= QUESTIONS * COMPLETIONS * TOKENS
    assert figures["trained_tokens"] == figures["tokens"]  # every group had a spread

    # group-normalised advantages: (reward - group mean) / (group std + 1e-4), summing to 0
    assert [len(a) for a in figures["advantages"]] == [COMPLETIONS] * QUESTIONS
    for k, group in enumerate(figures["advantages"]):
        rewards = figures["rewards"][k * COMPLETIONS : (k + 1) * COMPLETIONS]
        mean, std = statistics.fmean(rewards), statistics.stdev(rewards)
        assert group == pytest.approx([(r - mean) / (std + 1e-4) for r in rewards], rel=1e-4)
        assert sum(group) == pytest.approx(0.0, abs=1e-5)
        assert max(group) > 0.5 and min(group) < -0.5
    assert figures["groups_trained"] == QUESTIONS

    # the loss was back-propagated and stepped: the weights moved and the same loss fell
    assert all(math.isfinite(figures[k]) for k in ("mean_reward", "loss", "loss_after"))
    assert figures["loss_after"] < figures["loss"] - 1e-4
    before = initial_weights(tiny_model_dir)
    after = policy.model.state_dict()
    changed = [name for name, w in after.items() if not w.equal(before[name])]
    assert len(changed) > len(after) // 2, changed
    assert all(bool(w.isfinite().all()) for w in after.values())


def test_no_step_without_a_learning_signal(
    monkeypatch: pytest.MonkeyPatch, tiny_model_dir: Path
) -> None:
    """With the real verifier a random model earns nothing: every group has zero variance,
    so there is nothing to train on and the weights stay as they were."""
    figures, policy, seen = run(monkeypatch, tiny_model_dir)

    assert len(seen) == figures["completions"] == QUESTIONS * COMPLETIONS
    assert figures["rewards"] == [0.0] * len(seen)
    assert figures["advantages"] == [[0.0] * COMPLETIONS] * QUESTIONS
    assert figures["groups_trained"] == 0
    assert figures["loss"] == figures["loss_after"] == 0.0
    before = initial_weights(tiny_model_dir)
    assert all(w.equal(before[name]) for name, w in policy.model.state_dict().items())
