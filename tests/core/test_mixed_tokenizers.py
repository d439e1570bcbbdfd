"""Nodes of different families: a peer's text re-encodes under the receiver's tokenizer and
prompt format, a base model prompts in plain text, and what cannot be encoded within the
receiver's limits is skipped and counted, never a crash."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from sapo_core.config import (
    Example,
    GenerationConfig,
    GRPOConfig,
    NodeConfig,
    PromptConfig,
    TaskConfig,
    TaskSpec,
)
from sapo_core.encoding import EMPTY, TOO_LONG
from sapo_core.learner import Learner
from sapo_core.policy import bundled
from sapo_core.policy.backend import stop_text_end
from sapo_core.policy.hf_backend import TransformersBackend
from sapo_core.prompts import (
    PLAIN_STOP,
    bos_ids,
    plain_text,
    prompt_ids,
    render_prompt,
    resolve_format,
    text_ids,
)
from sapo_core.rollouts import Group, Rollout
from tests.tiny_models import build_tiny_model, trained_tokenizer

TASKS = TaskConfig(specs=(TaskSpec(name="chain_sum", config={"max_terms": 2}),))
EXAMPLE = Example(question="What is 12 + 30?", completion="12 + 30 = 42.\n<answer>42</answer>")
PEER_TEXT = "3 + 4 = 7, so <answer>7</answer>"


@pytest.fixture(scope="module")
def trained_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("trained"), family="qwen2", tokenizer="trained")


def _learner(model_dir: Path, prompt: PromptConfig, max_new_tokens: int = 64) -> Learner:
    config = NodeConfig(
        node_id="receiver",
        model=str(model_dir),
        tasks=TASKS,
        prompt=prompt,
        generation=GenerationConfig(completions_per_question=4, max_new_tokens=max_new_tokens),
        grpo=GRPOConfig(drop_zero_variance=False),
        local_groups=1,
        external_groups=1,
    )
    return Learner(config)


def _peer_group(learner: Learner, completions: list[str], peer_model: str) -> Group:
    [question] = learner.tasks.draw(0, 1)
    rows = tuple(
        Rollout(
            rollout_id=f"peer.r0.q0.c{k}",
            group_id="peer.r0.q0",
            node_id="peer",
            model_id=peer_model,
            node_round=0,
            policy_version=0,
            question=question,
            completion=text,
            completion_tokens=len(text),
            # A peer's own ids mean nothing under another vocabulary: never used here.
            token_ids=tuple(range(5)),
            logprobs=(-1.0,) * 5,
        )
        for k, text in enumerate(completions)
    )
    return Group("peer.r0.q0", "external", rows)


def test_the_plain_format_is_text_a_base_model_continues() -> None:
    config = PromptConfig(system_prompt="Answer in tags.", examples=(EXAMPLE,), prefill="")
    assert plain_text("What is 2 + 2?", config) == (
        "Answer in tags.\n\n"
        "Question: What is 12 + 30?\nAnswer: 12 + 30 = 42.\n<answer>42</answer>\n\n"
        "Question: What is 2 + 2?\nAnswer:"
    )
    tokenizer = trained_tokenizer()
    ids = prompt_ids(tokenizer, "What is 2 + 2?<|end|>", config, "plain")
    assert bos_ids(tokenizer) == []  # this tokenizer adds no BOS of its own
    assert ids == text_ids(tokenizer, plain_text("What is 2 + 2?<|end|>", config))
    assert tokenizer.convert_tokens_to_ids("<|end|>") not in ids  # the question is text
    assert render_prompt(tokenizer, "Q", config, "plain") == plain_text("Q", config)


def test_the_format_is_the_configs_else_the_models_else_the_tokenizers() -> None:
    chat, base = trained_tokenizer(), trained_tokenizer()
    base.chat_template = None
    auto = PromptConfig()
    assert resolve_format(auto, chat) == "chat"
    assert resolve_format(auto, base) == "plain"
    assert resolve_format(auto, chat, "plain") == "plain"  # a bundled base model's entry
    assert resolve_format(PromptConfig(format="chat"), base, "plain") == "chat"
    assert bundled.BUNDLED["gemma3-270m"].prompt_format == "plain"
    assert bundled.DEFAULT.prompt_format == "chat"


def test_a_peers_text_is_encoded_with_the_receivers_tokenizer_and_format(
    trained_model_dir: Path, tiny_policy: Any
) -> None:
    for fmt in ("chat", "plain"):
        me = _learner(trained_model_dir, PromptConfig(examples=(EXAMPLE,), format=fmt))
        assert me.prompt_format == fmt
        # The peer runs another family (the bundled SmolLM2 tokenizer, 49k tokens).
        group = _peer_group(me, [PEER_TEXT, "no answer"], "bundled:smollm2-135m-instruct")
        chosen, flagged = me.select(0, [], [group])
        assert flagged == 0
        [segment], skipped = me.encode(chosen.trained)
        question = group.rollouts[0].question.question
        mine = me.policy.tokenizer
        assert segment.prompt_ids == prompt_ids(mine, question, me.config.prompt, fmt)
        assert segment.completion_ids[0] == text_ids(mine, PEER_TEXT)
        assert mine.decode(segment.completion_ids[0]) == PEER_TEXT
        assert segment.behaviour_logprobs == [None, None]  # recomputed, never the peer's
        assert max(max(c) for c in segment.completion_ids) < len(mine)
        assert text_ids(mine, PEER_TEXT) != text_ids(tiny_policy.tokenizer, PEER_TEXT)
        assert not skipped


def test_text_too_long_in_the_receivers_tokens_is_skipped_and_counted(
    trained_model_dir: Path,
) -> None:
    me = _learner(trained_model_dir, PromptConfig(), max_new_tokens=12)
    [question] = me.tasks.draw(0, 1)  # the question _peer_group's rows carry
    fits = f"<answer>{question.answer}</answer>"  # the one right answer: reward 1
    assert len(text_ids(me.policy.tokenizer, fits)) <= 12
    long = "Let me think step by step about it. " * 3 + "<answer>7</answer>"
    # The kept rows sit after skipped ones: their advantages must stay theirs.
    group = _peer_group(me, [long, fits, "", "no"], "other")
    chosen, _ = me.select(0, [], [group])
    [scored] = chosen.trained
    [segment], skipped = me.encode(chosen.trained)
    assert segment.completion_ids == [text_ids(me.policy.tokenizer, t) for t in (fits, "no")]
    assert skipped == {TOO_LONG: 1, EMPTY: 1}
    rewards = torch.tensor(scored.rewards)
    expected = ((rewards - rewards.mean()) / (rewards.std() + 1e-4)).tolist()
    assert scored.rewards[1] == 1.0 and expected[1] > 0 > expected[3]
    assert segment.advantages == pytest.approx([expected[1], expected[3]], abs=1e-3)
    report = me.update(0, chosen)
    assert report.rows_skipped == {TOO_LONG: 1, EMPTY: 1} and report.groups_trained == 1


def test_a_completion_ends_at_its_first_stop_text(trained_model_dir: Path) -> None:
    tokenizer = trained_tokenizer()
    ids = text_ids(tokenizer, "7 <answer>7</answer> Question: What is")
    end = stop_text_end(tokenizer, ids, PLAIN_STOP)
    assert end is not None and tokenizer.decode(ids[:end]).endswith("</answer>")
    assert PLAIN_STOP[0] not in tokenizer.decode(ids[: end - 1])
    assert stop_text_end(tokenizer, ids, ()) is None
    assert stop_text_end(tokenizer, text_ids(tokenizer, "no tag"), PLAIN_STOP) is None
    # The sampling loop's check, one step at a time, agrees.
    me = _learner(trained_model_dir, PromptConfig(format="plain"))
    backend = me.backend
    assert isinstance(backend, TransformersBackend) and backend.stop_texts == PLAIN_STOP
    tokens = torch.tensor([ids])
    hits = [bool(backend._ends_in_stop_text(tokens, torch.tensor([0]), s)) for s in range(len(ids))]
    assert hits.index(True) == end - 1


def test_the_prompt_forward_keeps_the_last_position_by_index(tiny_policy: Any) -> None:
    from sapo_core.policy.hf_backend import last_position

    ids = torch.tensor([[5, 6, 7, 8], [0, 0, 9, 10]])
    kept = last_position(ids)
    assert kept.tolist() == [3]
    model = tiny_policy.model.eval()
    with torch.no_grad():
        by_index = model(input_ids=ids, logits_to_keep=kept).logits
        by_count = model(input_ids=ids, logits_to_keep=1).logits
    assert by_index.shape == by_count.shape == (2, 1, len(tiny_policy.tokenizer))
    assert torch.allclose(by_index, by_count, atol=1e-6)
