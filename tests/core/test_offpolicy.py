"""The off-policy correction (sapo_core/grpo/offpolicy.py): weights and drift against
hand-computed numbers, the loss they make, and the bound a lying generator cannot pass."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import pytest
import torch

from sapo_core.grpo.loss import policy_loss
from sapo_core.grpo.offpolicy import LOG_RATIO_LIMIT, Drift, importance_weights, row_drift

CURRENT = torch.tensor([[-1.0, -0.5, -2.0], [-0.3, -1.2, 0.0]])
SAMPLER = torch.tensor([[-1.5, -0.4, -0.2], [-0.3, -2.0, -9.0]])
MASK = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
KNOWN = torch.tensor([True, True])


def _ratios() -> list[list[float]]:
    return [[math.exp(float(CURRENT[b, t] - SAMPLER[b, t])) for t in range(3)] for b in range(2)]


@pytest.mark.parametrize("mode", ["token_truncate", "token_mask"])
def test_token_weights_by_hand(mode: str) -> None:
    cap, below = 1.5, 0.5
    weights, cut = importance_weights(
        CURRENT, SAMPLER, KNOWN, MASK, mode=mode, cap=cap, mask_below=below
    )
    for b, row in enumerate(_ratios()):
        for t, r in enumerate(row):
            if not MASK[b, t]:
                assert weights[b, t] == 1.0 and not cut[b, t]  # padding: untouched, uncounted
                continue
            if mode == "token_truncate":
                want, was_cut = min(r, cap), r > cap
            else:
                want, was_cut = (0.0, True) if (r > cap or r < below) else (r, False)
            assert weights[b, t].item() == pytest.approx(want, rel=1e-6), (b, t)
            assert bool(cut[b, t]) == was_cut


@pytest.mark.parametrize("mode", ["sequence_truncate", "sequence_mask"])
def test_sequence_weights_are_the_product_of_the_tokens_ratios(mode: str) -> None:
    weights, cut = importance_weights(CURRENT, SAMPLER, KNOWN, MASK, mode=mode, cap=2.0)
    for b, row in enumerate(_ratios()):
        product = math.prod(r for t, r in enumerate(row) if MASK[b, t])
        want = min(product, 2.0) if mode == "sequence_truncate" else product * (product <= 2.0)
        for t in range(3):
            if MASK[b, t]:
                assert weights[b, t].item() == pytest.approx(want, rel=1e-5)
                assert bool(cut[b, t]) == (product > 2.0)


def test_rows_without_a_claim_weigh_one_and_none_weighs_everything_one() -> None:
    known = torch.tensor([False, True])
    weights, cut = importance_weights(CURRENT, SAMPLER, known, MASK, mode="token_truncate", cap=2.0)
    assert weights[0].tolist() == [1.0, 1.0, 1.0] and not cut[0].any()
    weights, cut = importance_weights(CURRENT, SAMPLER, KNOWN, MASK, mode="none", cap=2.0)
    assert torch.equal(weights, torch.ones_like(weights))
    # none reports what a cap would have cut: of the ratios only exp(-1.2 + 2.0) > 2
    assert cut.tolist() == [[False, False, False], [False, True, False]]
    assert importance_weights(CURRENT, SAMPLER, KNOWN, MASK, mode="none", cap=1.5)[1][0, 0]


def test_the_weights_scale_the_policy_term_token_by_token() -> None:
    logprobs = CURRENT.clone().requires_grad_(True)
    adv = torch.tensor([1.0, -2.0])
    weights, _ = importance_weights(CURRENT, SAMPLER, KNOWN, MASK, mode="token_truncate", cap=2.0)
    loss, _ = policy_loss(
        logprobs, CURRENT, adv, MASK, loss_type="bnpo", eps_low=0.2, eps_high=0.28,
        weights=weights,
    )  # fmt: skip
    # at the proximal policy the ratio is 1: each token's loss is -advantage x its weight
    by_hand = sum(
        -float(adv[b]) * min(r, 2.0)
        for b, row in enumerate(_ratios())
        for t, r in enumerate(row)
        if MASK[b, t]
    ) / float(MASK.sum())
    assert loss.item() == pytest.approx(by_hand, rel=1e-6)


def _gradient(claimed: torch.Tensor, mode: str, cap: float = 2.0) -> torch.Tensor:
    """The loss's gradient for one row of 4 tokens, advantage 1, claimed log-probs."""
    current = torch.tensor([[-0.7, -1.1, -0.2, -2.5]])
    logprobs = current.clone().requires_grad_(True)
    mask = torch.ones_like(current)
    known = torch.tensor([True])
    weights, _ = importance_weights(current, claimed, known, mask, mode=mode, cap=cap)
    loss, _ = policy_loss(
        logprobs, current, torch.tensor([1.0]), mask, loss_type="grpo", eps_low=0.2,
        eps_high=0.28, weights=weights,
    )  # fmt: skip
    loss.backward()
    assert logprobs.grad is not None
    return logprobs.grad


@pytest.mark.parametrize("cap", [1.0, 2.0, 5.0])
def test_however_a_peer_lies_its_tokens_weigh_at_most_the_cap(cap: float) -> None:
    on_policy = _gradient(torch.tensor([[-0.7, -1.1, -0.2, -2.5]]), "token_truncate", cap)
    for lie in ([-100.0] * 4, [-1e4] * 4, [0.0] * 4, [-0.01, -50.0, -3.0, -1e-6]):
        lying = _gradient(torch.tensor([lie]), "token_truncate", cap)
        assert torch.all(lying.abs() <= cap * on_policy.abs() * (1 + 1e-6)), lie
    # -100 on every token: every ratio is enormous, every weight exactly the cap
    worst = _gradient(torch.tensor([[-100.0] * 4]), "token_truncate", cap)
    assert torch.allclose(worst, cap * on_policy)
    # a mask drops such tokens instead: the lie carries no gradient at all
    masked = _gradient(torch.tensor([[-100.0] * 4]), "token_mask", cap)
    assert torch.count_nonzero(masked) == 0
    # and a sequence weight is capped alike
    seq = _gradient(torch.tensor([[-100.0] * 4]), "sequence_truncate", cap)
    assert torch.allclose(seq, cap * on_policy)


def test_drift_by_hand() -> None:
    _, cut = importance_weights(CURRENT, SAMPLER, KNOWN, MASK, mode="token_truncate", cap=2.0)
    first, second = row_drift(CURRENT, SAMPLER, KNOWN, MASK, cut)
    assert first is not None and second is not None
    lr = [float(SAMPLER[0, t] - CURRENT[0, t]) for t in range(3)]
    w = [math.exp(-x) for x in lr]
    assert first.tokens == 3 and first.kl == pytest.approx(sum(lr) / 3, rel=1e-6)
    assert first.ess_fraction == pytest.approx(sum(w) ** 2 / (3 * sum(x * x for x in w)))
    assert first.capped == sum(x > 2.0 for x in w)
    both = first + second
    assert both.tokens == 5 and both.weight_sum == pytest.approx(
        first.weight_sum + second.weight_sum
    )
    # one's own exact rows: no drift, every ratio 1
    _, none_cut = importance_weights(CURRENT, CURRENT, KNOWN, MASK, mode="none", cap=2.0)
    same = row_drift(CURRENT, CURRENT, KNOWN, MASK, none_cut)[0]
    assert same is not None and same.kl == 0.0 and same.ess_fraction == pytest.approx(1.0)
    assert row_drift(CURRENT, SAMPLER, torch.tensor([False, True]), MASK, cut)[0] is None
    assert Drift().ess_fraction == 1.0 and Drift().kl == 0.0


def test_a_claim_of_minus_infinity_in_effect_is_clamped_not_infinite() -> None:
    claimed = torch.full((1, 3), -1e4)
    current = torch.zeros(1, 3)
    mask, known = torch.ones(1, 3), torch.tensor([True])
    _, cut = importance_weights(current, claimed, known, mask, mode="none", cap=2.0)
    (drift,) = row_drift(current, claimed, known, mask, cut)
    assert drift is not None and math.isfinite(drift.weight_sq_sum)
    assert drift.kl == pytest.approx(-LOG_RATIO_LIMIT)
    assert drift.weight_sum == pytest.approx(3 * math.exp(LOG_RATIO_LIMIT), rel=1e-6)


# -- the update ----------------------------------------------------------------------------


def _update(
    tiny_model_dir: Any, correction: str, sampler: Callable[[list[float]], list[float] | None]
) -> tuple[list[torch.Tensor], Any]:
    """One step on the update tests' segments, each row's generator log-probs made from its
    exact current ones by ``sampler``; the parameters after, and the result."""
    from sapo_core.config import GRPOConfig, OffPolicyConfig
    from sapo_core.grpo.logprobs import completion_logprobs
    from sapo_core.grpo.update import grpo_update
    from sapo_core.policy.loading import load_policy
    from tests.core.test_update import PAD, _segments

    policy = load_policy(str(tiny_model_dir))
    segments = _segments(policy)
    for k, seg in enumerate(segments):
        with torch.no_grad():
            current, _ = completion_logprobs(policy.model, [seg], 1.0, PAD)
        exact = [current[i, : len(ids)].tolist() for i, ids in enumerate(seg.completion_ids)]
        seg.behaviour_logprobs = list(exact)  # own rows: generation's, exact
        seg.sampler_logprobs = [sampler(row) for row in exact]
        seg.label = f"g{k}"
    optimizer = torch.optim.AdamW(policy.model.parameters(), lr=1e-2, weight_decay=0.0)
    config = GRPOConfig(micro_batch_size=2, off_policy=OffPolicyConfig(correction=correction))
    result = grpo_update(
        policy.model, optimizer, segments, config,
        temperature=1.0, pad_id=PAD, max_completion_length=8,
    )  # fmt: skip
    return [p.detach().clone() for p in policy.model.parameters()], result


@pytest.mark.parametrize("correction", ["token_truncate", "sequence_mask"])
def test_on_ones_own_exact_rows_a_correction_changes_nothing(
    tiny_model_dir: Any, correction: str
) -> None:
    plain, none = _update(tiny_model_dir, "none", lambda row: row)
    corrected, result = _update(tiny_model_dir, correction, lambda row: row)
    assert all(torch.allclose(a, b, atol=1e-6) for a, b in zip(plain, corrected, strict=True))
    assert set(result.drift) == {"g0", "g1"}
    for drift in result.drift.values():
        assert abs(drift.kl) < 1e-5 and drift.ess_fraction == pytest.approx(1.0, abs=1e-5)
        assert drift.capped == 0
    assert none.drift["g0"].tokens == 6 and none.drift["g1"].tokens == 6


def test_a_far_generator_moves_the_weights_less_under_a_mask(tiny_model_dir: Any) -> None:
    start, _ = _update(tiny_model_dir, "none", lambda row: None)  # no claim: today's update
    far = lambda row: [x - 5.0 for x in row]  # noqa: E731 - ratio e^5 on every token
    masked, result = _update(tiny_model_dir, "token_mask", far)
    # every token masked: no gradient, so Adam leaves the weights where they started
    from sapo_core.policy.loading import load_policy

    initial = list(load_policy(str(tiny_model_dir)).model.parameters())
    assert all(torch.equal(a, b.detach()) for a, b in zip(masked, initial, strict=True))
    assert not all(torch.equal(a, b.detach()) for a, b in zip(start, initial, strict=True))
    assert all(d.capped == d.tokens and d.kl == pytest.approx(-5.0) for d in result.drift.values())
