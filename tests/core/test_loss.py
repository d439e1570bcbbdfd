"""policy_loss: hand-computed cases, TRL's normalisations, gradient signs, the ratio."""

from __future__ import annotations

from collections import defaultdict
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from sapo_core.grpo.loss import micro_batch_weight, policy_loss

LOSS_TYPES = ["grpo", "bnpo", "dr_grpo", "dapo"]


def _case() -> dict[str, torch.Tensor]:
    # two sequences, three positions; the second has one padding position
    return {
        "logprobs": torch.tensor([[-1.0, -0.5, -2.0], [-0.3, -1.2, 0.0]]),
        "old": torch.tensor([[-1.1, -0.5, -1.5], [-0.3, -0.9, 0.0]]),
        "adv": torch.tensor([1.0, -2.0]),
        "mask": torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]]),
    }


def _per_token_by_hand(eps_low: float, eps_high: float) -> list[list[float]]:
    import math

    c = _case()
    out = []
    for b in range(2):
        row = []
        for t in range(3):
            ratio = math.exp(float(c["logprobs"][b, t] - c["old"][b, t]))
            a = float(c["adv"][b])
            clipped = min(max(ratio, 1 - eps_low), 1 + eps_high)
            row.append(-min(ratio * a, clipped * a))
        out.append(row)
    return out


@pytest.mark.parametrize("loss_type", LOSS_TYPES)
def test_every_loss_type_by_hand(loss_type: str) -> None:
    c = _case()
    pt = _per_token_by_hand(0.2, 0.28)
    seq0, seq1 = sum(pt[0]) / 3, sum(pt[1][:2]) / 2
    tokens = sum(pt[0]) + sum(pt[1][:2])
    expected = {
        "grpo": (seq0 + seq1) / 2,
        "bnpo": tokens / 5,
        "dapo": tokens / 5,
        "dr_grpo": tokens / (2 * 4),  # max_completion_length 4
    }[loss_type]
    loss, metrics = policy_loss(
        c["logprobs"], c["old"], c["adv"], c["mask"],
        loss_type=loss_type, eps_low=0.2, eps_high=0.28, max_completion_length=4,
    )  # fmt: skip
    assert loss.item() == pytest.approx(expected, abs=1e-6)
    assert metrics["loss"] == pytest.approx(expected, abs=1e-6)


def test_clip_metrics_by_hand() -> None:
    c = _case()
    # ratios: seq0 [e^0.1, 1, e^-0.5]; seq1 [1, e^-0.3]. adv0 > 0: clipped when ratio > 1.28;
    # adv1 < 0: clipped when ratio < 0.8 -> e^-0.3 = 0.74 is clipped. One of five tokens.
    _, metrics = policy_loss(
        c["logprobs"], c["old"], c["adv"], c["mask"], loss_type="grpo", eps_low=0.2, eps_high=0.28
    )
    assert metrics["clip_fraction"] == pytest.approx(1 / 5)
    assert metrics["clip_low_fraction"] == pytest.approx(1 / 5)
    assert metrics["clip_high_fraction"] == 0.0
    ratios = [1.1051709, 1.0, 0.6065307, 1.0, 0.7408182]
    assert metrics["ratio_mean"] == pytest.approx(sum(ratios) / 5, rel=1e-6)


def test_ratio_is_not_one_when_policies_differ() -> None:
    c = _case()
    _, metrics = policy_loss(
        c["logprobs"], c["old"], c["adv"], c["mask"], loss_type="grpo", eps_low=0.2, eps_high=0.28
    )
    assert metrics["ratio_mean"] != pytest.approx(1.0, abs=1e-3)


def test_kl_term_by_hand() -> None:
    lp = torch.tensor([[-1.0, -2.0]])
    ref = torch.tensor([[-1.5, -2.0]])
    mask = torch.ones(1, 2)
    kw: dict[str, Any] = {"loss_type": "bnpo", "eps_low": 0.2, "eps_high": 0.2}
    loss0, _ = policy_loss(lp, lp, torch.zeros(1), mask, **kw)
    loss, metrics = policy_loss(
        lp, lp, torch.zeros(1), mask,
        loss_type="bnpo", eps_low=0.2, eps_high=0.2, beta=0.5, ref_logprobs=ref,
    )  # fmt: skip
    import math

    kl0 = math.exp(-0.5) + 0.5 - 1  # k3 estimator at the first token; 0 at the second
    assert metrics["kl"] == pytest.approx(kl0 / 2, rel=1e-6)
    assert loss.item() - loss0.item() == pytest.approx(0.5 * kl0 / 2, rel=1e-6)


def test_beta_without_reference_is_an_error() -> None:
    c = _case()
    with pytest.raises(ValueError, match="ref_logprobs"):
        policy_loss(
            c["logprobs"], c["old"], c["adv"], c["mask"],
            loss_type="grpo", eps_low=0.2, eps_high=0.2, beta=0.1,
        )  # fmt: skip


@pytest.mark.parametrize("loss_type", LOSS_TYPES)
def test_gradient_raises_good_and_lowers_bad_tokens(loss_type: str) -> None:
    logprobs = torch.full((2, 3), -1.0, requires_grad=True)
    old = torch.full((2, 3), -1.0)
    loss, _ = policy_loss(
        logprobs, old, torch.tensor([1.0, -1.0]), torch.ones(2, 3),
        loss_type=loss_type, eps_low=0.2, eps_high=0.28,
    )  # fmt: skip
    loss.backward()
    assert logprobs.grad is not None
    assert (logprobs.grad[0] < 0).all()  # descending the loss raises a positive-advantage token
    assert (logprobs.grad[1] > 0).all()


def test_clipped_tokens_carry_no_gradient() -> None:
    logprobs = torch.tensor([[0.0, -1.0]], requires_grad=True)
    old = torch.tensor([[-1.0, -1.0]])  # ratio e at token 0: beyond 1 + eps_high
    loss, _ = policy_loss(
        logprobs, old, torch.tensor([1.0]), torch.ones(1, 2),
        loss_type="grpo", eps_low=0.2, eps_high=0.28,
    )  # fmt: skip
    loss.backward()
    assert logprobs.grad is not None
    assert logprobs.grad[0, 0] == 0.0 and logprobs.grad[0, 1] != 0.0


# -- against TRL's own implementation -------------------------------------------------------


class _Accelerator:
    num_processes = 1

    def gather(self, x: torch.Tensor) -> torch.Tensor:
        return x

    gather_for_metrics = gather

    def reduce(self, x: torch.Tensor, reduction: str = "sum") -> torch.Tensor:
        return x


def _trl_loss(loss_type: str, data: dict[str, torch.Tensor], beta: float, max_len: int) -> float:
    """TRL's GRPOTrainer._compute_loss on our tensors, single process, one micro-batch."""
    from trl import GRPOTrainer

    logprobs = data["logprobs"]
    trainer: Any = SimpleNamespace(
        loss_type=loss_type,
        epsilon_low=0.2,
        epsilon_high=0.28,
        beta=beta,
        importance_sampling_level="token",
        top_entropy_quantile=1.0,
        off_policy_mask_threshold=None,
        use_vllm=False,
        aux_loss_enabled=False,
        _entropy_bonus_enabled=False,
        current_gradient_accumulation_steps=1,
        max_completion_length=max_len,
        accelerator=_Accelerator(),
        args=SimpleNamespace(
            use_bias_correction_kl=False, delta=None, steps_per_generation=1,
            gradient_accumulation_steps=1,
        ),
        model=SimpleNamespace(training=True),
        _metrics={"train": defaultdict(list), "eval": defaultdict(list)},
        _get_per_token_logps_and_entropies=lambda *a, **k: (
            logprobs, torch.zeros_like(logprobs), None
        ),
    )  # fmt: skip
    b, t = logprobs.shape
    inputs = {
        "prompt_ids": torch.zeros(b, 1, dtype=torch.long),
        "prompt_mask": torch.ones(b, 1, dtype=torch.long),
        "completion_ids": torch.zeros(b, t, dtype=torch.long),
        "completion_mask": data["mask"].long(),
        "advantages": data["adv"],
        "old_per_token_logps": data["old"],
        "ref_per_token_logps": data["ref"],
        "num_items_in_batch": data["mask"].sum(),
    }
    return float(GRPOTrainer._compute_loss(trainer, None, inputs))


@pytest.mark.parametrize("beta", [0.0, 0.04])
@pytest.mark.parametrize("loss_type", LOSS_TYPES)
def test_matches_trl(loss_type: str, beta: float) -> None:
    gen = torch.Generator().manual_seed(3)
    b, t = 6, 9
    lengths = torch.tensor([9, 4, 1, 7, 9, 2])
    data = {
        "logprobs": -torch.rand(b, t, generator=gen, dtype=torch.float64) * 3,
        "old": -torch.rand(b, t, generator=gen, dtype=torch.float64) * 3,
        "ref": -torch.rand(b, t, generator=gen, dtype=torch.float64) * 3,
        "adv": torch.randn(b, generator=gen, dtype=torch.float64),
        "mask": (torch.arange(t)[None, :] < lengths[:, None]).double(),
    }
    ours, _ = policy_loss(
        data["logprobs"], data["old"], data["adv"], data["mask"],
        loss_type=loss_type, eps_low=0.2, eps_high=0.28, beta=beta,
        ref_logprobs=data["ref"], max_completion_length=12,
    )  # fmt: skip
    assert ours.item() == pytest.approx(_trl_loss(loss_type, data, beta, 12), abs=1e-6)


@pytest.mark.parametrize("loss_type", ["grpo", "dr_grpo", "dapo"])
def test_micro_batches_add_up_to_the_full_batch(loss_type: str) -> None:
    gen = torch.Generator().manual_seed(0)
    lp = -torch.rand(5, 4, generator=gen, dtype=torch.float64)
    old = -torch.rand(5, 4, generator=gen, dtype=torch.float64)
    adv = torch.randn(5, generator=gen, dtype=torch.float64)
    mask = (torch.arange(4)[None, :] < torch.tensor([4, 1, 3, 2, 4])[:, None]).double()
    kw: dict[str, Any] = {"eps_low": 0.2, "eps_high": 0.28, "max_completion_length": 4}
    full, _ = policy_loss(lp, old, adv, mask, loss_type=loss_type, **kw)  # type: ignore[arg-type]
    total = 0.0
    for lo, hi in [(0, 2), (2, 5)]:
        part, _ = policy_loss(
            lp[lo:hi], old[lo:hi], adv[lo:hi], mask[lo:hi], loss_type=loss_type, **kw
        )  # type: ignore[arg-type]
        total += (
            part.item()
            * micro_batch_weight(
                loss_type,  # type: ignore[arg-type]
                micro_sequences=hi - lo,
                micro_tokens=float(mask[lo:hi].sum()),
                total_sequences=5,
                total_tokens=float(mask.sum()),
                micro_batches=2,
            )
        )
    assert total == pytest.approx(full.item(), abs=1e-9)
