"""Generation and the update step on a tiny random model with the bundled tokenizer."""

from __future__ import annotations

import dataclasses
import types
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
from sapo_core.grpo.segments import Segment, split_segments
from sapo_core.grpo.update import grpo_update
from sapo_core.learner import Learner
from sapo_core.policy.hf_backend import (
    TransformersBackend,
    sample_one,
    stop_token_ids,
    top_p_filter,
)
from sapo_core.policy.loading import placement
from sapo_core.rollouts import Group

PAD = 2  # any id works as padding: it is masked


def _segments(policy: Any) -> list[Segment]:
    tok = policy.tokenizer
    enc = [tok(t, add_special_tokens=False)["input_ids"] for t in ("What is 2+2?", "Name a colour")]
    return [
        Segment(enc[0], [[11, 12, 13], [14], [15, 16]], [1.0, -0.5, -0.5], [None] * 3),
        Segment(enc[1], [[21, 22, 23, 24], [25, 26]], [0.7, -0.7], [None] * 2),
    ]


def test_top_p_keeps_the_smallest_head() -> None:
    probs = torch.tensor([[0.5, 0.3, 0.15, 0.05]])
    assert top_p_filter(probs, 0.7)[0].tolist() == pytest.approx([0.5, 0.3, 0.0, 0.0])
    assert top_p_filter(probs, 0.1)[0].tolist() == pytest.approx([0.5, 0.0, 0.0, 0.0])


def test_sample_one_draws_each_token_at_its_probability_and_never_a_zero() -> None:
    probs = torch.tensor([[0.5, 0.0, 0.3, 0.2, 0.0], [0.0, 0.0, 0.0, 0.0, 2.0]])  # unnormalised
    draws = sample_one(probs.repeat(20_000, 1), torch.Generator().manual_seed(0))
    first, second = draws[0::2], draws[1::2]
    assert set(second.tolist()) == {4}
    counts = torch.bincount(first, minlength=5).double() / first.numel()
    assert counts[1] == counts[4] == 0
    # 20k draws: the standard error of a frequency near 0.5 is 0.0035
    assert counts[[0, 2, 3]].tolist() == pytest.approx([0.5, 0.3, 0.2], abs=0.015)


def _widths(batches: list[list[Segment]]) -> list[list[int]]:
    return [[len(ids) for s in batch for ids in s.completion_ids] for batch in batches]


def test_split_segments_packs_each_group_once_and_splits_only_what_exceeds_a_limit() -> None:
    a = Segment([1] * 10, [[1] * n for n in (20, 100, 10, 16)], [0.1, 0.2, 0.3, 0.4], [None] * 4)
    b = Segment([2] * 10, [[2] * 18, [2] * 18], [0.9, -0.9], [[-0.5] * 18, None])
    # a packs to 156 tokens, b to 46: padding b to 156 would cost more than a micro-batch
    batches = split_segments([a, b], 8)
    assert _widths(batches) == [[20, 100, 10, 16], [18, 18]]
    assert batches[0] == [a] and batches[1] == [b]  # whole segments, rows in their order
    # 120 tokens at most: a is shared out, longest first, between two copies of its prompt
    # (100 + 10 with the prompt is 120); its other piece and b are as long, so they share
    capped = split_segments([a, b], 8, micro_batch_tokens=120)
    assert _widths(capped) == [[100, 10], [20, 16, 18, 18]]
    later = capped[1]
    assert [(s.prompt_ids[0], s.advantages) for s in later] == [(1, [0.1, 0.4]), (2, [0.9, -0.9])]
    assert later[1].behaviour_logprobs == [[-0.5] * 18, None]
    # a completion longer than the cap trains alone with its prompt
    assert _widths(split_segments([a, b], 8, micro_batch_tokens=60)) == [
        [100],
        [20, 10, 16],
        [18, 18],
    ]
    # at most 2 completions per micro-batch
    assert _widths(split_segments([a, b], 2)) == [[20, 100], [18, 18], [10, 16]]


def test_shared_prompt_equals_separate_pairs(tiny_policy: Any) -> None:
    model = tiny_policy.model.eval()
    segments = _segments(tiny_policy)
    with torch.no_grad():
        together, mask = completion_logprobs(model, segments, 0.7, PAD)
        row = 0
        for seg in segments:
            for ids in seg.completion_ids:
                single = Segment(seg.prompt_ids, [ids], [0.0], [None])
                alone, _ = completion_logprobs(model, [single], 0.7, PAD)
                assert torch.allclose(together[row, : len(ids)], alone[0], atol=1e-5)
                assert mask[row].sum() == len(ids)
                row += 1


def test_shared_prompt_gradient_equals_separate_pairs(tiny_policy: Any) -> None:
    model = tiny_policy.model
    segments = _segments(tiny_policy)

    def grads(parts: list[list[Segment]]) -> list[torch.Tensor]:
        model.zero_grad()
        for part in parts:
            lp, mask = completion_logprobs(model, part, 1.0, PAD)
            (lp * mask).sum().backward()
        return [p.grad.clone() for p in model.parameters() if p.grad is not None]

    shared = grads([segments])
    pairs = [
        [Segment(s.prompt_ids, [ids], [0.0], [None])] for s in segments for ids in s.completion_ids
    ]
    separate = grads(pairs)
    model.zero_grad()
    assert len(shared) == len(separate) > 0
    for a, b in zip(shared, separate, strict=True):
        assert (a - b).abs().max() <= 1e-4 * a.abs().max()


def test_behaviour_logprobs_match_the_training_forward(tiny_policy: Any) -> None:
    backend = TransformersBackend(tiny_policy)
    cfg = GenerationConfig(completions_per_question=3, max_new_tokens=6, temperature=0.9)
    prompts = ["<|im_start|>user\nhi<|im_end|>\n", "<|im_start|>user\na longer prompt<|im_end|>\n"]
    groups = backend.generate(prompts, cfg, seed=0)
    assert [len(g) for g in groups] == [3, 3]
    tok = tiny_policy.tokenizer
    segments = [
        Segment(tok(p, add_special_tokens=False)["input_ids"], [list(c.token_ids) for c in g],
                [0.0] * 3, [None] * 3)
        for p, g in zip(prompts, groups, strict=True)
    ]  # fmt: skip
    with torch.no_grad():
        recomputed, _ = completion_logprobs(tiny_policy.model.eval(), segments, 0.9, PAD)
    row = 0
    for g in groups:
        for c in g:
            assert 1 <= len(c.token_ids) <= 6 and len(c.logprobs) == len(c.token_ids)
            assert c.finished == (len(c.token_ids) < 6 or c.token_ids[-1] in backend.stop_set)
            got = torch.tensor(c.logprobs)
            assert torch.allclose(got, recomputed[row, : len(got)], atol=1e-4)
            row += 1


def test_generation_reports_progress_up_to_every_completion(tiny_policy: Any) -> None:
    backend = TransformersBackend(tiny_policy)
    # batch_size 4 with 2 completions: two sampling calls of 2 prompts, then one of 1.
    cfg = GenerationConfig(completions_per_question=2, max_new_tokens=5, batch_size=4)
    seen: list[tuple[int, int]] = []
    groups = backend.generate(
        ["a", "b", "c", "d", "e"], cfg, seed=1, on_progress=lambda d, t: seen.append((d, t))
    )
    assert len(groups) == 5
    assert {t for _, t in seen} == {10}
    done = [d for d, _ in seen]
    assert done == sorted(done) and done[-1] == 10
    assert {4, 8} <= set(done)  # each call reports its last row before the next starts
    quiet = backend.generate(["a", "b", "c", "d", "e"], cfg, seed=1)
    assert quiet == groups  # reporting changes nothing


def test_a_generation_that_fails_leaves_the_model_in_its_mode(tiny_policy: Any) -> None:
    backend = TransformersBackend(tiny_policy)
    model = tiny_policy.sampler()
    model.train()

    def interrupted(done: int, total: int) -> None:
        raise KeyboardInterrupt  # Ctrl-C mid-generation

    with pytest.raises(KeyboardInterrupt):
        backend.generate(
            ["What is 2+2?"], GenerationConfig(completions_per_question=2, max_new_tokens=8),
            seed=0, on_progress=interrupted,
        )  # fmt: skip
    assert model.training  # dropout stays on for the update that follows
    model.eval()


def test_generation_is_reproducible_by_seed(tiny_policy: Any) -> None:
    backend = TransformersBackend(tiny_policy)
    cfg = GenerationConfig(completions_per_question=2, max_new_tokens=5)
    a = backend.generate(["hello"], cfg, seed=4)
    assert a == backend.generate(["hello"], cfg, seed=4)


def _eos(ids: Any) -> types.SimpleNamespace:
    """A stand-in model whose generation config names these eos ids."""
    return types.SimpleNamespace(generation_config=types.SimpleNamespace(eos_token_id=ids))


def test_stop_ids_are_the_tokenizer_and_generation_config_eos(tiny_policy: Any) -> None:
    tok = tiny_policy.tokenizer
    assert tiny_policy.model.generation_config.eos_token_id == tok.eos_token_id == 2
    backend = TransformersBackend(tiny_policy)
    assert backend.stop_set == {2} and backend.stop_ids.tolist() == [2]
    assert tok.convert_ids_to_tokens(2) == "<|im_end|>"  # the bundled chat template's end
    assert stop_token_ids(tok, _eos([7, 0])) == [0, 2, 7]  # a list, as Qwen2.5 and Llama 3 have
    assert stop_token_ids(tok, _eos(7)) == [2, 7]
    assert stop_token_ids(tok, _eos(None)) == [2]


def test_generation_stops_at_the_generation_config_eos(tiny_model_dir: Any) -> None:
    policy = _fresh_policy(tiny_model_dir)
    # every id but the tokenizer's eos ends a completion: each must stop after one token
    others = [i for i in range(len(policy.tokenizer)) if i != 2]
    policy.model.generation_config.eos_token_id = others
    backend = TransformersBackend(policy)
    cfg = GenerationConfig(completions_per_question=4, max_new_tokens=5)
    [group] = backend.generate(["hello"], cfg, seed=0)
    assert [(len(c.token_ids), c.finished) for c in group] == [(1, True)] * 4


def _fresh_policy(tiny_model_dir: Any) -> Any:
    from sapo_core.policy.loading import load_policy

    return load_policy(str(tiny_model_dir))


def test_one_step_changes_parameters(tiny_model_dir: Any) -> None:
    policy = _fresh_policy(tiny_model_dir)
    before = [p.detach().clone() for p in policy.model.parameters()]
    optimizer = torch.optim.AdamW(policy.model.parameters(), lr=1e-3)
    result = grpo_update(
        policy.model, optimizer, _segments(policy), GRPOConfig(micro_batch_size=2),
        temperature=1.0, pad_id=PAD, max_completion_length=8,
    )  # fmt: skip
    after = list(policy.model.parameters())
    changed = [not torch.equal(a, b) for a, b in zip(before, after, strict=True)]
    assert all(changed)
    assert result.tokens == 12 and result.metrics["ratio_mean"] == pytest.approx(1.0, abs=1e-5)


@pytest.mark.parametrize(
    ("loss_type", "expected"),
    [
        # At the first step the ratio is 1, so each token's loss is -advantage; the
        # sequences' advantages are 1, -.5, -.5, .7, -.7 over 3, 1, 2, 4, 2 tokens.
        ("grpo", 0.0),  # mean over sequences of their token means: -mean(advantages)
        ("dr_grpo", -2.9 / (5 * 8)),  # token sum over B x max_completion_length
        ("dapo", -2.9 / 12),  # token sum over the batch's tokens
    ],
)
def test_the_logged_loss_is_the_objective_optimised(
    tiny_model_dir: Any, loss_type: str, expected: float
) -> None:
    policy = _fresh_policy(tiny_model_dir)
    optimizer = torch.optim.AdamW(policy.model.parameters(), lr=1e-3)
    cfg = GRPOConfig(micro_batch_size=2, loss_type=loss_type)  # several micro-batches
    result = grpo_update(
        policy.model, optimizer, _segments(policy), cfg,
        temperature=1.0, pad_id=PAD, max_completion_length=8,
    )  # fmt: skip
    assert result.metrics["loss"] == pytest.approx(expected, abs=1e-5)


def test_second_iteration_moves_the_ratio_and_clips(tiny_model_dir: Any) -> None:
    policy = _fresh_policy(tiny_model_dir)
    optimizer = torch.optim.AdamW(policy.model.parameters(), lr=5e-2)
    cfg = GRPOConfig(iterations=3, micro_batch_size=8, eps_low=0.01, eps_high=0.01)
    result = grpo_update(
        policy.model, optimizer, _segments(policy), cfg,
        temperature=1.0, pad_id=PAD, max_completion_length=8,
    )  # fmt: skip
    assert result.metrics["clip_fraction"] > 0.0
    assert result.metrics["ratio_mean"] != pytest.approx(1.0, abs=1e-4)


def _node(tiny_model_dir: Any, node_id: str, **kw: Any) -> NodeConfig:
    return NodeConfig(
        node_id=node_id,
        model=str(tiny_model_dir),
        tasks=TaskConfig(specs=(TaskSpec(name="chain_sum", config={"max_terms": 2}),)),
        generation=GenerationConfig(completions_per_question=3, max_new_tokens=4),
        grpo=GRPOConfig(drop_zero_variance=False, micro_batch_size=4),
        **kw,
    )


def test_learner_round_with_peers(tiny_model_dir: Any) -> None:
    me = Learner(_node(tiny_model_dir, "me", local_groups=2, external_groups=2))
    peer = Learner(_node(tiny_model_dir, "peer", local_groups=3, seed=1))
    own = me.generate(0)
    theirs = peer.generate(0).groups
    assert len(own.groups) == 4 and all(len(g.rollouts) == 3 for g in own.groups)
    row = own.groups[0].rollouts[0]
    assert row.rollout_id == "me.r0.q0.c0" and row.reward is not None
    assert row.token_ids is not None and len(row.token_ids) == row.completion_tokens
    # a lying peer: one group's ground truth replaced
    liar = theirs[0]
    lie = dataclasses.replace(liar.question, answer="999")
    tampered = Group(
        liar.group_id, "external",
        tuple(dataclasses.replace(r, question=lie) for r in liar.rollouts),
    )  # fmt: skip
    report = me.train_round(0, own, [tampered, theirs[1]])
    assert report.flagged_rows == 3
    # The verdicts went into the learner's reputation of the peer, once: 6 rows judged,
    # the tampered group's 3 failed.
    [(peer, record)] = me.reputation.peers.items()
    assert peer == liar.rollouts[0].node_id and record.judged == 6 and record.bad > 0
    assert me.totals.cumulative_own_reward == own.own_reward
    assert report.external_groups_used == 1 and report.groups_trained == 3
    assert me.policy_version == 1 and report.update["update_tokens_per_s"] > 0


def test_silo_node_trains_on_its_own_groups(tiny_model_dir: Any) -> None:
    me = Learner(_node(tiny_model_dir, "solo", local_groups=2, external_groups=0))
    report = me.train_round(0, me.generate(0))
    assert report.external_groups_used == 0 and report.groups_trained == 2
    assert report.training_reward_external is None


def test_placement_defaults_to_fp32_on_the_cpu_here() -> None:
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA; the defaults differ")
    assert placement(ComputeConfig()) == ("cpu", None)
    assert placement(ComputeConfig(precision="bf16")) == ("cpu", torch.bfloat16)
    with pytest.raises(RuntimeError, match="no CUDA device"):
        placement(ComputeConfig(device="cuda"))


def test_under_reduced_precision_the_update_recomputes_behaviour_logprobs(
    tiny_model_dir: Any,
) -> None:
    bf16 = ComputeConfig(device="cpu", precision="bf16")
    me = Learner(_node(tiny_model_dir, "half", local_groups=2, compute=bf16))
    assert me.policy.autocast is torch.bfloat16 and not me.policy.exact_behaviour
    assert all(p.dtype == torch.float32 for p in me.policy.model.parameters())  # master weights
    own = me.generate(0)
    chosen, _ = me.select(0, own.groups, [])
    segments, _ = me.encode(chosen.trained)
    # generation's bf16 log-probs are kept for the ledger but not trusted by the update ...
    assert own.groups[0].rollouts[0].logprobs is not None
    assert all(b is None for seg in segments for b in seg.behaviour_logprobs)
    # ... which recomputes them with its own forward, so the first step's ratio is 1
    report = me.update(0, chosen)
    assert report.update["ratio_mean"] == pytest.approx(1.0, abs=1e-6)
