"""The shared-prompt fast path against the plain forward, and which models may take it."""

from __future__ import annotations

import types
from typing import Any

import pytest
import torch
from transformers import Gemma2Config, Gemma2ForCausalLM, LlamaConfig, LlamaForCausalLM

from sapo_core.grpo.logprobs import completion_logprobs, plain_logprobs
from sapo_core.grpo.plan import UpdatePlan
from sapo_core.grpo.segments import Segment
from sapo_core.grpo.shared_prompt import (
    SHARED_PROMPT_MODEL_TYPES,
    shared_prompt_logprobs,
    supports_shared_prompt,
)
from sapo_core.grpo.update import reference_logprobs

PAD = 2  # any id works as padding: it is masked
# One tiny model of every family on the shared-prompt allow-list (SHARED_PROMPT_MODEL_TYPES).
# gemma3: a scaled embedding and sliding-window layers (a window of 4 positions here).
FAMILIES = ["llama", "qwen2", "qwen3", "mistral", "smollm3", "gemma3"]  # llama: SmolLM2's


def _segments(tokenizer: Any) -> list[Segment]:
    """Prompts of three lengths; one to three completions each, of lengths 1 to 5."""
    texts = ("What is 2+2?", "Name a colour", "Count the letters in the word strawberry, please")
    prompts = [tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]
    assert len({len(p) for p in prompts}) == 3
    return [
        Segment(prompts[0], [[11, 12, 13], [14], [15, 16]], [1.0, -0.5, -0.5], [None] * 3),
        Segment(prompts[1], [[21, 22, 23, 24, 25], [26, 27]], [0.7, -0.7], [None] * 2),
        Segment(prompts[2], [[31, 32]], [0.0], [None]),
    ]


@pytest.mark.parametrize("family", FAMILIES)
def test_plain_and_shared_prompt_paths_agree(family: str, tiny_family_policy: Any) -> None:
    policy = tiny_family_policy(family)
    model = policy.model.eval()
    segments = _segments(policy.tokenizer)
    assert supports_shared_prompt(model)
    with torch.no_grad():
        fast, fast_mask = shared_prompt_logprobs(model, segments, 0.7, PAD)
        plain, plain_mask = plain_logprobs(model, segments, 0.7, PAD)
        dispatched, _ = completion_logprobs(model, segments, 0.7, PAD)
    lengths = [len(ids) for seg in segments for ids in seg.completion_ids]
    assert fast.shape == plain.shape == (6, 5)
    assert plain_mask.sum(-1).tolist() == fast_mask.sum(-1).tolist() == lengths
    assert torch.equal(plain_mask, fast_mask)
    assert torch.allclose(fast, plain, atol=1e-5, rtol=0)
    assert (plain[plain_mask == 0] == 0).all() and (plain[plain_mask == 1] < 0).all()
    assert torch.equal(dispatched, fast)  # both families are allow-listed


@pytest.mark.parametrize("family", FAMILIES)
def test_plain_and_shared_prompt_gradients_agree(family: str, tiny_family_policy: Any) -> None:
    policy = tiny_family_policy(family)
    model = policy.model.eval()
    segments = _segments(policy.tokenizer)
    weights = torch.randn(6, 5, generator=torch.Generator().manual_seed(0))  # [B, T]

    def gradients(path: Any) -> dict[str, torch.Tensor]:
        model.zero_grad(set_to_none=True)
        logprobs, mask = path(model, segments, 0.7, PAD)
        (logprobs * weights * mask).sum().backward()
        return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}

    fast, plain = gradients(shared_prompt_logprobs), gradients(plain_logprobs)
    model.zero_grad(set_to_none=True)
    # Every parameter, the vocabulary matrices included: the fast path adds their gradients
    # itself (embedding rows, chunked head), the plain path through ordinary autograd.
    assert fast.keys() == plain.keys() == {n for n, _ in model.named_parameters()}
    for name, grad in fast.items():
        assert grad.abs().max() > 0, name
        assert (grad - plain[name]).abs().max() <= 1e-4 * grad.abs().max(), name


def _tiny_config(config_class: Any, **extra: Any) -> Any:
    return config_class(
        vocab_size=64,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=8,
        **extra,
    )


def test_only_allow_listed_families_without_logit_post_processing_share_prompts(
    tiny_policy: Any, tiny_family_policy: Any
) -> None:
    assert supports_shared_prompt(tiny_policy.model)
    assert supports_shared_prompt(tiny_family_policy("qwen2").model)
    gemma = Gemma2ForCausalLM(_tiny_config(Gemma2Config))
    assert gemma.config.final_logit_softcapping == 30.0  # Gemma2's default soft-cap
    assert not supports_shared_prompt(gemma)
    gemma.config.final_logit_softcapping = None
    assert not supports_shared_prompt(gemma)  # not allow-listed even without the cap
    llama = LlamaForCausalLM(_tiny_config(LlamaConfig))
    assert supports_shared_prompt(llama)
    for name, value in (("final_logit_softcapping", 30.0), ("logit_scale", 0.5)):
        scaled = LlamaForCausalLM(_tiny_config(LlamaConfig, **{name: value}))
        assert not supports_shared_prompt(scaled), name
    assert supports_shared_prompt(LlamaForCausalLM(_tiny_config(LlamaConfig, logits_scaling=1.0)))
    # the fast path calls these itself: a model without them cannot take it
    assert not supports_shared_prompt(types.SimpleNamespace(config=llama.config))


def test_a_soft_capped_family_takes_the_plain_path_everywhere() -> None:
    torch.manual_seed(0)
    # Random logits reach about 0.2; a cap of 0.05 bends them all, so the fast path, which
    # skips the cap, is visibly wrong here.
    gemma = Gemma2ForCausalLM(_tiny_config(Gemma2Config, final_logit_softcapping=0.05)).eval()
    segments = [
        Segment([5, 6, 7], [[11, 12, 13], [14]], [1.0, -1.0], [None] * 2),
        Segment([8, 9], [[21, 22]], [0.0], [None]),
    ]
    with torch.no_grad():
        plain, _ = plain_logprobs(gemma, segments, 0.7, PAD)
        dispatched, _ = completion_logprobs(gemma, segments, 0.7, PAD)
        skipped, _ = shared_prompt_logprobs(gemma, segments, 0.7, PAD)
    assert torch.equal(dispatched, plain)
    assert (skipped - plain).abs().max() > 1e-2
    one_a_pass = UpdatePlan(
        "cpu", 1, None, 768, True, 0, checkpointing=False, release_memory=False
    )  # the shared-prompt path planned: the reference model's family still says plain
    reference_logprobs(gemma, segments, 0.7, PAD, one_a_pass)
    rows = [row for seg in segments for row in seg.ref_logprobs or []]
    assert [len(r) for r in rows] == [3, 1, 2]
    for i, row in enumerate(rows):
        assert row == pytest.approx(plain[i, : len(row)].tolist(), abs=1e-6)


def test_every_allow_listed_family_is_tested(tiny_family_policy: Any) -> None:
    tested = {tiny_family_policy(f).model.config.model_type for f in FAMILIES}
    assert tested == set(SHARED_PROMPT_MODEL_TYPES)
