"""examples/one_round.py, a node's round on one page: it runs end to end on a tiny random
model, imports the algorithm package alone, and its step really trains."""

from __future__ import annotations

import ast
import importlib.util
import statistics
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import torch

from tests.tiny_models import build_tiny_model

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "one_round.py"
QUESTIONS, COMPLETIONS, TOKENS = 2, 4, 8
ARGV = ["--questions", str(QUESTIONS), "--completions", str(COMPLETIONS)]
ARGV += ["--max-new-tokens", str(TOKENS), "--seed", "3", "--lr", "1e-3"]
ARGV += ["--tasks", "basic_arithmetic"]


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


def letters(question: Any, completion: str, config: Any, truth: Any = None) -> Any:
    """A stand-in verifier with a spread of rewards in [0, 1] (a random model never answers
    right): the share of ASCII letters in the completion."""
    from sapo_core.rewards import Verdict

    return Verdict(sum(c.isascii() and c.isalpha() for c in completion) / max(len(completion), 1))


def counting(verifier: Any, seen: list[str]) -> Any:
    def verify(question: Any, completion: str, config: Any, truth: Any = None) -> Any:
        seen.append(completion)
        return verifier(question, completion, config, truth)

    return verify


def initial_model(model_dir: Path) -> Any:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(model_dir)).float()


def weighted_logprob(model: Any, segments: list[Any], pad_id: int) -> float:
    """Sum over completions of advantage x mean token log-prob: what the step increases."""
    from sapo_core.grpo.logprobs import plain_logprobs

    with torch.no_grad():
        logprobs, mask = plain_logprobs(model, segments, 1.0, pad_id)
    means = (logprobs * mask).sum(1) / mask.sum(1)
    advantages = torch.tensor([a for seg in segments for a in seg.advantages])
    return float((advantages * means).sum())


def test_the_example_imports_the_algorithm_package_alone() -> None:
    roots = set()
    for node in ast.walk(ast.parse(EXAMPLE.read_text())):
        if isinstance(node, ast.Import):
            roots |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            roots.add(node.module.split(".")[0])
    third_party = roots - set(sys.stdlib_module_names) - {"__future__"}
    assert third_party == {"sapo_core"}, third_party  # no ledger, flows, Prefect, MLflow


def test_one_round_trains_towards_rewarded_completions(
    monkeypatch: pytest.MonkeyPatch, tiny_model_dir: Path
) -> None:
    seen: list[str] = []
    monkeypatch.setattr("sapo_core.rewards.verify_answer", counting(letters, seen))
    out = load_example().main(["--model", str(tiny_model_dir), *ARGV])
    learner, report = out["learner"], out["report"]

    # every completion of every question was generated and verified, once
    assert len(seen) == QUESTIONS * COMPLETIONS
    flat = [r for group in out["rewards"] for r in group]
    assert flat == [letters(None, c, None).reward for c in seen]
    assert report.training_reward == pytest.approx(statistics.fmean(flat))

    # group-normalised advantages: (reward - group mean) / (group std + 1e-4), summing to 0
    assert [len(a) for a in out["advantages"]] == [COMPLETIONS] * QUESTIONS
    for rewards, group in zip(out["rewards"], out["advantages"], strict=True):
        mean, std = statistics.fmean(rewards), statistics.stdev(rewards)
        assert group == pytest.approx([(r - mean) / (std + 1e-4) for r in rewards], rel=1e-4)
        assert sum(group) == pytest.approx(0.0, abs=1e-5)
    assert report.groups_trained == QUESTIONS and learner.policy_version == 1

    # the step made the rewarded completions likelier and the others less likely
    segments, _ = learner.encode(out["chosen"].trained)
    pad_id = int(learner.policy.tokenizer.pad_token_id)
    before = weighted_logprob(initial_model(tiny_model_dir), segments, pad_id)
    after = weighted_logprob(learner.policy.model, segments, pad_id)
    assert after > before + 1e-3
    assert report.update["grad_norm"] > 0


def test_no_step_without_a_learning_signal(tiny_model_dir: Path) -> None:
    """With the real verifier a random model earns nothing: every group has zero variance,
    so there is nothing to train on and the weights stay as they were."""
    out = load_example().main(["--model", str(tiny_model_dir), *ARGV])
    assert out["rewards"] == [[0.0] * COMPLETIONS] * QUESTIONS
    assert out["advantages"] == [] and out["report"].groups_trained == 0
    before = initial_model(tiny_model_dir).state_dict()
    after = out["learner"].policy.model.state_dict()
    assert all(w.equal(before[name]) for name, w in after.items())


@pytest.mark.slow
def test_on_the_bundled_model_the_map_shows_every_step(capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 47: the README's map of the algorithm, run as it says on the bundled model
    (`--questions 2 --completions 4`), scored 0 and ended "nothing to learn this round":
    the update never ran. On the embedded swarm's questions it draws until a group carries
    a signal, and takes the step."""
    out = load_example().main(["--questions", "2", "--completions", "4"])
    printed = capsys.readouterr().out
    assert out["report"].update, printed  # the GRPO step ran
    assert out["chosen"].trained and all(
        any(a != 0 for a in advantages) for advantages in out["advantages"]
    )
    for step in ("[1]", "[2]", "[3]", "[4]", "[5]", "[6] loss"):
        assert step in printed, printed
