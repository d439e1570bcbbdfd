"""Generation from a bf16 copy of the weights, and behaviour log-probs the update takes from
its own forward (one forward per micro-batch, no separate pass)."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from sapo_core.config import (
    ComputeConfig,
    GenerationConfig,
    GRPOConfig,
    NodeConfig,
    TaskConfig,
    TaskSpec,
)
from sapo_core.grpo.logprobs import completion_logprobs
from sapo_core.grpo.segments import Segment
from sapo_core.grpo.update import grpo_update
from sapo_core.learner import Learner
from sapo_core.policy.loading import load_policy, native_bf16, reduced_copy, sampling_dtype

PAD = 2

FP32_EVERYWHERE = ComputeConfig(device="cpu", precision="fp32", generation_precision="fp32")
BF16_SAMPLING = ComputeConfig(device="cpu", precision="fp32", generation_precision="bf16")


def test_reduced_copy_casts_parameters_keeps_ties_buffers_and_the_original(
    tiny_model_dir: Any,
) -> None:
    policy = load_policy(str(tiny_model_dir))
    assert policy.sampling_dtype is None and policy.exact_behaviour  # the library default
    model = policy.model
    copy = reduced_copy(model, torch.bfloat16)
    assert all(p.dtype == torch.float32 and p.requires_grad for p in model.parameters())
    for (name, original), (_, cast) in zip(
        model.named_parameters(), copy.named_parameters(), strict=True
    ):
        assert cast.dtype == torch.bfloat16 and not cast.requires_grad, name
        assert torch.equal(cast, original.detach().to(torch.bfloat16)), name
        assert cast.data_ptr() != original.data_ptr(), name
    assert copy.get_output_embeddings().weight is copy.get_input_embeddings().weight  # tied
    for (name, original), (_, kept) in zip(
        model.named_buffers(), copy.named_buffers(), strict=True
    ):
        assert kept.dtype == original.dtype and torch.equal(kept, original), name
    assert not copy.training


def test_sampling_dtype_follows_the_config() -> None:
    assert sampling_dtype(FP32_EVERYWHERE, "cpu", None) is None
    assert sampling_dtype(BF16_SAMPLING, "cpu", None) is torch.bfloat16
    follows = ComputeConfig(device="cpu", precision="bf16")  # generation_precision auto
    assert sampling_dtype(follows, "cpu", torch.bfloat16) is torch.bfloat16
    native = torch.bfloat16 if native_bf16("cpu") else None
    assert sampling_dtype(ComputeConfig(device="cpu"), "cpu", None) is native


def _node(tiny_model_dir: Any, compute: ComputeConfig) -> NodeConfig:
    return NodeConfig(
        node_id="half",
        model=str(tiny_model_dir),
        tasks=TaskConfig(specs=(TaskSpec(name="chain_sum", config={"max_terms": 2}),)),
        generation=GenerationConfig(completions_per_question=3, max_new_tokens=6),
        grpo=GRPOConfig(drop_zero_variance=False, micro_batch_size=4),
        local_groups=2,
        compute=compute,
    )


def test_bf16_sampling_keeps_fp32_training_and_the_first_ratio_is_one(
    tiny_model_dir: Any,
) -> None:
    me = Learner(_node(tiny_model_dir, BF16_SAMPLING))
    assert me.policy.autocast is None and me.policy.sampling_dtype is torch.bfloat16
    assert not me.policy.exact_behaviour
    before = [p.detach().clone() for p in me.policy.model.parameters()]
    own = me.generate(0)
    # generation ran on a copy: the policy's fp32 weights are untouched
    assert all(
        p.dtype == torch.float32 and torch.equal(p, b)
        for p, b in zip(me.policy.model.parameters(), before, strict=True)
    )
    chosen, _ = me.select(0, own.groups, [])
    segments, _ = me.encode(chosen.trained)
    rows = [r for g in own.groups for r in g.rollouts]
    assert all(r.logprobs is not None for r in rows)  # the sampler's, kept for the ledger
    assert all(b is None for seg in segments for b in seg.behaviour_logprobs)  # not trusted
    # the sampler's log-probs are close to the fp32 policy's, not equal to them
    with torch.no_grad():
        exact, _ = completion_logprobs(me.policy.model, segments, 1.0, PAD)
    sampled = [row for g in chosen.trained for row in _rows(g)]
    gap = [
        abs(exact[i, t].item() - row[t]) for i, row in enumerate(sampled) for t in range(len(row))
    ]
    assert 0 < max(gap) < 0.5
    report = me.update(0, chosen)
    assert report.update["ratio_mean"] == pytest.approx(1.0, abs=1e-6)


def _rows(group: Any) -> list[list[float]]:
    return [list(r.logprobs) for r in group.rollouts if r.token_ids]


def _segments(policy: Any) -> list[Segment]:
    tok = policy.tokenizer
    enc = [tok(t, add_special_tokens=False)["input_ids"] for t in ("What is 2+2?", "Name a colour")]
    return [
        Segment(enc[0], [[11, 12, 13], [14], [15, 16]], [1.0, -0.5, -0.5], [None] * 3),
        Segment(enc[1], [[21, 22, 23, 24], [25, 26]], [0.7, -0.7], [[-1.0] * 4, None]),
    ]


@pytest.mark.parametrize("iterations", [1, 2])
def test_update_runs_one_forward_per_micro_batch_and_iteration(
    tiny_model_dir: Any, iterations: int
) -> None:
    policy = load_policy(str(tiny_model_dir))
    calls = []
    hook = policy.model.get_decoder().register_forward_hook(lambda *_: calls.append(1))
    optimizer = torch.optim.AdamW(policy.model.parameters(), lr=1e-3)
    cfg = GRPOConfig(micro_batch_size=3, iterations=iterations)  # 2 micro-batches
    result = grpo_update(
        policy.model, optimizer, _segments(policy), cfg,
        temperature=1.0, pad_id=PAD, max_completion_length=8,
    )  # fmt: skip
    hook.remove()
    assert len(calls) == 2 * iterations  # no pass before the update for rows without log-probs
    if iterations == 1:
        # rows without log-probs have ratio 1; the recorded -1.0 row does not
        assert result.metrics["ratio_mean"] != pytest.approx(1.0, abs=1e-4)
