"""The update planned for its device (issue 44): passes sized from a memory budget and the
model's shape, checkpointing only when the budget needs it, and the same loss and gradient
whatever the plan.

A GPU plan is computed here for an injected budget and run on the CPU: what the plan decides
(how many passes, whether layers recompute) is counted by hooks on a tiny model with a
152k vocabulary, the size whose logits are the largest tensor of a Qwen update.
"""

from __future__ import annotations

import random
from typing import Any

import pytest
import torch

from sapo_core.config import GRPOConfig
from sapo_core.grpo.logprobs import plain_logprobs
from sapo_core.grpo.loss import policy_loss
from sapo_core.grpo.plan import (
    CPU_MAX_PACKED_TOKENS,
    CPU_PASS_OVERHEAD_TOKENS,
    CPU_TOKENS_PER_PASS,
    GPU_MIN_TOKENS_PER_PASS,
    activation_bytes_per_token,
    plan_for,
    plan_update,
)
from sapo_core.grpo.segments import Segment
from sapo_core.grpo.update import grpo_update
from sapo_core.policy.compat import is_checkpointing

VOCAB = 152_064  # Qwen2.5's


@pytest.fixture(scope="module")
def wide_model() -> Any:
    """A 2-layer decoder with Qwen's vocabulary and a 16-wide hidden state."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=VOCAB, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=2048,
        tie_word_embeddings=True, attn_implementation="sdpa",
    )  # fmt: skip
    return LlamaForCausalLM(config).float()


def _segments(groups: int, rows: int, prompt: int, completion: int, seed: int = 0) -> list:
    rng = random.Random(seed)
    out = []
    for _ in range(groups):
        completions = [
            [rng.randrange(VOCAB) for _ in range(completion - rng.randrange(0, 8))]
            for _ in range(rows)
        ]
        advantages = [rng.uniform(-1, 1) for _ in range(rows)]
        prompt_ids = [rng.randrange(VOCAB) for _ in range(prompt)]
        out.append(Segment(prompt_ids, completions, advantages, [None] * rows))
    return out


class _Capture(torch.optim.Optimizer):
    """An optimizer that steps nowhere and keeps the gradient it was given."""

    def __init__(self, params: Any) -> None:
        super().__init__(list(params), {})
        self.grads: list[torch.Tensor] = []

    def step(self, closure: Any = None) -> None:
        self.grads = [p.grad.clone() for g in self.param_groups for p in g["params"]]


def _passes(model: Any) -> dict[str, int]:
    """Counts of decoder passes and of the first layer's MLP runs: twice a pass when it is
    recomputed in the backward (checkpointing). The MLP's forward is wrapped, not hooked:
    torch's checkpoint recomputes without running module hooks."""
    counts = {"decoder": 0, "layer": 0}

    def passed(*_: Any) -> None:
        counts["decoder"] += 1

    model.model.register_forward_hook(passed)
    mlp = model.model.layers[0].mlp
    run = type(mlp).forward

    def counted(*args: Any, **kwargs: Any) -> Any:
        counts["layer"] += 1
        return run(mlp, *args, **kwargs)

    mlp.forward = counted
    return counts


def _update(model: Any, segments: list, plan: Any) -> tuple[Any, list[torch.Tensor]]:
    optimizer = _Capture(model.parameters())
    result = grpo_update(
        model, optimizer, segments, GRPOConfig(), temperature=1.0, pad_id=0,
        max_completion_length=1024, plan=plan,
    )  # fmt: skip
    return result, optimizer.grads


def _budget(model: Any, tokens: int, *, checkpointing: bool) -> int:
    """Free device memory under which a pass holds about ``tokens`` tokens."""
    per_token = activation_bytes_per_token(
        model.config, checkpointing=checkpointing, activation_bytes=4, shared_prompt=True
    )
    return int(tokens * (per_token + 4096) / 0.6) + 1


def test_the_cpu_plan_is_what_measured_best_on_two_cores_and_overrides_win() -> None:
    plan = plan_update(GRPOConfig(), None, device="cpu")
    assert (plan.tokens_per_pass, plan.checkpointing, plan.release_memory) == (
        CPU_TOKENS_PER_PASS, True, True,
    )  # fmt: skip
    given = GRPOConfig(micro_batch_tokens=256, gradient_checkpointing=False)
    assert plan_update(given, None, device="cpu").tokens_per_pass == 256
    assert not plan_update(given, None, device="cpu").checkpointing
    assert (
        plan_update(GRPOConfig(micro_batch_tokens=None), None, device="cpu").tokens_per_pass is None
    )


def test_the_plain_plan_turns_every_speed_measure_off_and_keeps_passes_bounded(
    wide_model,
) -> None:
    """Issue 59: the plain forward is what a setting forces; the plan holds every speed
    measure (the shared-prompt path, packing caps and padding, checkpointing, memory
    release), each chosen for the device."""
    auto = plan_update(GRPOConfig(), None, device="cpu")
    assert (auto.shared_prompt, auto.max_packed_tokens, auto.overhead_tokens) == (
        True, CPU_MAX_PACKED_TOKENS, CPU_PASS_OVERHEAD_TOKENS,
    )  # fmt: skip
    plain = plan_update(GRPOConfig(plan="plain"), None, device="cpu")
    assert (plain.shared_prompt, plain.max_packed_tokens, plain.overhead_tokens) == (False, None, 0)
    assert (plain.checkpointing, plain.release_memory) == (False, False)
    assert plain.tokens_per_pass == CPU_TOKENS_PER_PASS  # a memory bound, not a speed measure
    forced = plan_update(GRPOConfig(plan="plain", gradient_checkpointing=True), None, device="cpu")
    assert forced.checkpointing and not forced.shared_prompt
    # On a GPU the plain plan sizes its passes for the plain path's logits: far fewer tokens.
    free = _budget(wide_model, 12_000, checkpointing=False)
    cfg = wide_model.config
    gpu = plan_update(GRPOConfig(), cfg, device="cuda", free_bytes=free)
    gpu_plain = plan_update(GRPOConfig(plan="plain"), cfg, device="cuda", free_bytes=free)
    assert gpu_plain.tokens_per_pass < gpu.tokens_per_pass / 10 and not gpu_plain.shared_prompt
    assert not gpu_plain.checkpointing and gpu_plain.max_packed_tokens is None
    # plan_for asks the model's family, and the setting wins over it.
    assert plan_for(wide_model, GRPOConfig()).shared_prompt
    assert not plan_for(wide_model, GRPOConfig(plan="plain")).shared_prompt


def test_the_plain_paths_logits_dominate_its_budget_on_a_152k_vocabulary(wide_model) -> None:
    plain = activation_bytes_per_token(
        wide_model.config, checkpointing=False, activation_bytes=4, shared_prompt=False
    )
    shared = activation_bytes_per_token(
        wide_model.config, checkpointing=False, activation_bytes=4, shared_prompt=True
    )
    assert plain > 100 * shared and plain >= VOCAB * 4


@pytest.mark.slow  # ~41k tokens through a 152k-vocabulary head: about a minute on 2 cores
def test_with_room_64_sequences_of_640_tokens_take_at_most_4_passes_unchecked(wide_model) -> None:
    segments = _segments(groups=8, rows=8, prompt=128, completion=512)  # 64 x ~640 tokens
    budget = _budget(wide_model, 12_000, checkpointing=False)
    plan = plan_update(GRPOConfig(), wide_model.config, device="cuda", free_bytes=budget)
    assert not plan.checkpointing and plan.tokens_per_pass >= GPU_MIN_TOKENS_PER_PASS
    counts = _passes(wide_model)
    result, _ = _update(wide_model, segments, plan)
    assert counts["decoder"] <= 4 and counts["layer"] == counts["decoder"]  # no recompute
    assert result.metrics["update_passes"] == counts["decoder"]
    assert result.metrics["update_checkpointing"] == 0.0
    assert not is_checkpointing(wide_model)


def test_under_a_small_budget_the_plan_splits_and_checkpoints(wide_model) -> None:
    segments = _segments(groups=3, rows=4, prompt=64, completion=300)
    budget = _budget(wide_model, 900, checkpointing=True)
    plan = plan_update(GRPOConfig(), wide_model.config, device="cuda", free_bytes=budget)
    assert plan.checkpointing and plan.tokens_per_pass < GPU_MIN_TOKENS_PER_PASS
    counts = _passes(wide_model)
    result, _ = _update(wide_model, segments, plan)
    assert counts["decoder"] >= 3 and counts["layer"] == 2 * counts["decoder"]  # recomputed
    assert result.metrics["update_checkpointing"] == 1.0


def test_loss_and_gradient_are_the_plain_paths_whatever_the_plan(wide_model) -> None:
    segments = _segments(groups=3, rows=3, prompt=20, completion=40, seed=1)
    plans = {
        "cpu": plan_update(GRPOConfig(), wide_model.config, device="cpu"),
        "gpu, roomy": plan_update(
            GRPOConfig(), wide_model.config, device="cuda",
            free_bytes=_budget(wide_model, 50_000, checkpointing=False),
        ),
        "gpu, tight": plan_update(
            GRPOConfig(), wide_model.config, device="cuda",
            free_bytes=_budget(wide_model, 90, checkpointing=True),
        ),
        "plain": plan_update(GRPOConfig(plan="plain"), wide_model.config, device="cpu"),
    }  # fmt: skip
    # The reference: each (prompt, completion) alone through the plain forward, its loss
    # `policy_loss` at ratio 1, averaged over rows (grpo).
    wide_model.zero_grad(set_to_none=True)
    rows = [
        (s, ids, a) for s in segments for ids, a in zip(s.completion_ids, s.advantages, strict=True)
    ]
    total = 0.0
    for seg, ids, advantage in rows:
        lp, mask = plain_logprobs(
            wide_model, [Segment(seg.prompt_ids, [ids], [advantage], [None])], 1.0, 0
        )
        loss, _ = policy_loss(
            lp, lp.detach(), torch.tensor([advantage]), mask, loss_type="grpo",
            eps_low=0.2, eps_high=0.28,
        )  # fmt: skip
        (loss / len(rows)).backward()
        total += float(loss) / len(rows)
    reference = [p.grad.clone() for p in wide_model.parameters()]
    wide_model.zero_grad(set_to_none=True)
    for name, plan in plans.items():
        result, grads = _update(wide_model, segments, plan)
        assert result.metrics["loss"] == pytest.approx(total, abs=1e-5), name
        for got, want in zip(grads, reference, strict=True):
            assert (got - want).abs().max() <= 1e-4 * want.abs().max() + 1e-7, name
    assert {plans[n].checkpointing for n in plans} == {True, False}
    assert {plans[n].shared_prompt for n in plans} == {True, False}


def test_a_set_cap_decides_checkpointing_and_the_updates_own_allocations_are_reserved(
    wide_model,
) -> None:
    free = _budget(wide_model, 12_000, checkpointing=False)
    cfg = wide_model.config
    # A cap the memory holds without checkpointing runs without; one it does not, with.
    small = plan_update(GRPOConfig(micro_batch_tokens=1000), cfg, device="cuda", free_bytes=free)
    large = plan_update(GRPOConfig(micro_batch_tokens=10**6), cfg, device="cuda", free_bytes=free)
    assert (small.tokens_per_pass, small.checkpointing) == (1000, False)
    assert (large.tokens_per_pass, large.checkpointing) == (10**6, True)
    # Gradients and Adam's moments come out of the same memory: reserving them shrinks the
    # passes (and here forces checkpointing).
    roomy = plan_update(GRPOConfig(), cfg, device="cuda", free_bytes=free)
    reserved = plan_update(
        GRPOConfig(), cfg, device="cuda", free_bytes=free, reserved_bytes=free // 2
    )
    assert reserved.budget_bytes < roomy.budget_bytes and reserved.checkpointing
    # Eager attention keeps its scores: each token costs more.
    sdpa, eager = (
        activation_bytes_per_token(
            cfg, checkpointing=False, activation_bytes=2, shared_prompt=True, eager=e
        )
        for e in (False, True)
    )
    assert eager > sdpa
