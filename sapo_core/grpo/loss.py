"""The clipped GRPO policy loss: one pure function, loss variants as small reducers.

Shapes: B sequences, T completion positions. `mask` is 1 on completion tokens that are
trained on and 0 on padding. Log-probs are of the sampled tokens under logits / temperature.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Literal

import torch
from torch import Tensor

LossType = Literal["grpo", "bnpo", "dr_grpo", "dapo"]


def masked_mean(x: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    """Mean of x where mask is 1; the denominator is clamped away from zero."""
    if dim is None:
        return (x * mask).sum() / mask.sum().clamp(min=1.0)
    return (x * mask).sum(dim) / mask.sum(dim).clamp(min=1.0)


def _grpo(per_token: Tensor, mask: Tensor, max_len: int) -> Tensor:
    """GRPO (DeepSeekMath): mean over each sequence's tokens, then mean over sequences.

    Long sequences weigh each token less, which biases towards long wrong answers.
    """
    return masked_mean(per_token, mask, dim=1).mean()


def _bnpo(per_token: Tensor, mask: Tensor, max_len: int) -> Tensor:
    """BNPO: one mean over all tokens of the (micro-)batch, so every token weighs the same."""
    return masked_mean(per_token, mask)


def _dr_grpo(per_token: Tensor, mask: Tensor, max_len: int) -> Tensor:
    """Dr. GRPO: token sum over B x max_completion_length, a constant: no length bias."""
    return (per_token * mask).sum() / (per_token.size(0) * max_len)


def _dapo(per_token: Tensor, mask: Tensor, max_len: int) -> Tensor:
    """DAPO: token sum over the tokens of the whole generation batch.

    On one batch this equals BNPO; they differ in how micro-batches combine
    (see micro_batch_weight): DAPO divides by the global token count.
    """
    return masked_mean(per_token, mask)


_REDUCERS: dict[str, Callable[[Tensor, Tensor, int], Tensor]] = {
    "grpo": _grpo,
    "bnpo": _bnpo,
    "dr_grpo": _dr_grpo,
    "dapo": _dapo,
}


def policy_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    loss_type: LossType,
    eps_low: float,
    eps_high: float,
    beta: float = 0.0,
    ref_logprobs: Tensor | None = None,
    max_completion_length: int | None = None,
    weights: Tensor | None = None,
) -> tuple[Tensor, dict[str, float]]:
    """PPO-clipped GRPO loss with asymmetric bounds and an optional KL to a reference.

    logprobs, old_logprobs, ref_logprobs, mask: [B, T]; advantages: [B].
    old_logprobs are the behaviour policy's, so the ratio differs from 1 as soon as the
    policy moved (unlike a reference trainer that reuses current log-probs as old ones).
    weights [B, T]: each token's importance weight for rows another sampler made
    (sapo_core/grpo/offpolicy.py); they scale the clipped policy term, not the KL, as TRL's.
    Returns the scalar loss and detached metrics.
    """
    if loss_type not in _REDUCERS:
        raise ValueError(f"unknown loss_type {loss_type!r}; expected one of {sorted(_REDUCERS)}")
    mask = mask.to(logprobs.dtype)  # [B, T]
    adv = advantages.to(logprobs.dtype).unsqueeze(1)  # [B, 1]
    ratio = torch.exp(logprobs - old_logprobs)  # [B, T]
    clipped = torch.clamp(ratio, 1.0 - eps_low, 1.0 + eps_high)  # [B, T]
    per_token = -torch.min(ratio * adv, clipped * adv)  # [B, T]
    if weights is not None:
        per_token = per_token * weights.to(per_token.dtype)
    kl: Tensor | None = None
    if beta != 0.0:
        if ref_logprobs is None:
            raise ValueError("beta > 0 needs ref_logprobs")
        delta = ref_logprobs - logprobs  # [B, T]
        kl = torch.exp(delta) - delta - 1.0  # [B, T], k3 estimator, >= 0
        per_token = per_token + beta * kl
    max_len = max_completion_length or logprobs.size(1)
    loss = _REDUCERS[loss_type](per_token, mask, max_len)

    with torch.no_grad():
        low = (ratio < 1.0 - eps_low) & (adv < 0)  # [B, T]
        high = (ratio > 1.0 + eps_high) & (adv > 0)  # [B, T]
        metrics = {
            "loss": float(loss),
            "ratio_mean": float(masked_mean(ratio, mask)),
            "clip_fraction": float(masked_mean((low | high).to(mask.dtype), mask)),
            "clip_low_fraction": float(masked_mean(low.to(mask.dtype), mask)),
            "clip_high_fraction": float(masked_mean(high.to(mask.dtype), mask)),
            "tokens": float(mask.sum()),
        }
        if kl is not None:
            metrics["kl"] = float(masked_mean(kl, mask))
    return loss, metrics


def row_loss_shares(tokens: Sequence[int], loss_type: LossType) -> list[float]:
    """Each trained row's share of the weight the loss gives the round's rows (summing to 1),
    given each row's completion tokens: what a row, a group or a peer holds of the gradient.

    grpo: every row weighs the same, whatever its length (mean over its tokens, then over
    rows). dr_grpo, dapo and bnpo weigh tokens, so a row weighs its token count (bnpo weighs
    tokens within each micro-batch, then micro-batches alike: the token share over the whole
    batch is what it would weigh in one micro-batch, an approximation under several).
    """
    if not tokens:
        return []
    if loss_type == "grpo":
        return [1.0 / len(tokens)] * len(tokens)
    total = float(sum(tokens))
    return [t / total if total else 1.0 / len(tokens) for t in tokens]


def micro_batch_weight(
    loss_type: LossType,
    *,
    micro_sequences: int,
    micro_tokens: float,
    total_sequences: int,
    total_tokens: float,
    micro_batches: int,
) -> float:
    """Weight of one micro-batch's loss in the accumulated gradient.

    grpo and dr_grpo: the sequence share, so the sum equals the full-batch loss exactly
    (TRL divides by the number of micro-batches, the same when they are equal in size).
    bnpo: 1 / micro_batches, TRL's mean of per-micro-batch token means.
    dapo: the token share, TRL's normalisation by the batch's total token count.
    """
    if loss_type in ("grpo", "dr_grpo"):
        return micro_sequences / total_sequences
    if loss_type == "bnpo":
        return 1.0 / micro_batches
    return micro_tokens / max(total_tokens, 1.0)
