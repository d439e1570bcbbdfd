"""Rows another sampler made: their importance weights, and how far that sampler is.

A peer's completion was sampled by the peer's policy, an own one by this node's generator
(exactly the trainer's numbers on the transformers backend, close to them under vLLM or
reduced precision). Each row may carry the generator's log-prob of every token it sampled
(the ledger's ``token_logprobs``). The update then takes this node's log-probs before the
step as the PPO "old" ones (the proximal policy) and weighs each token's policy loss by

    ratio = pi_self(token) / pi_generator(token) = exp(current - sampler)

truncated at a cap or masked outside a band, per token or for the whole sequence: the
decoupled form of asynchronous GRPO (TRL's vLLM correction, NeMo RL, Gensyn's F-TIS). The
ratio is computed once, before the step, and held fixed through its iterations.

Shapes: B rows, T completion positions; ``mask`` is 1 on trained tokens.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

LOG_RATIO_LIMIT = 20.0
"""Log-ratios are clamped to +-20 before they are exponentiated: a peer claiming -100 on
every token would otherwise make exp() infinite (and its square, in the effective sample
size, overflow). e^20 ~ 5e8, far above any cap, so no weight the loss uses is changed."""


@dataclass(frozen=True)
class Drift:
    """How far a generator is from this node's policy, summed over the tokens of some rows
    (a group, a peer's groups in a round); the sums add, so groups aggregate exactly."""

    tokens: int = 0
    log_ratio_sum: float = 0.0  # sum of (generator - self) log-probs: KL(generator || self)
    weight_sum: float = 0.0  # sum of the untruncated token ratios
    weight_sq_sum: float = 0.0
    capped: int = 0  # tokens the correction truncated or masked (under none: would have)

    def __add__(self, other: Drift) -> Drift:
        return Drift(
            self.tokens + other.tokens,
            self.log_ratio_sum + other.log_ratio_sum,
            self.weight_sum + other.weight_sum,
            self.weight_sq_sum + other.weight_sq_sum,
            self.capped + other.capped,
        )

    @property
    def kl(self) -> float:
        """Mean (generator - self) log-prob of the sampled tokens: an estimate of
        KL(generator || self) per token (>= 0 in expectation; 0 on one's own exact rows)."""
        return self.log_ratio_sum / self.tokens if self.tokens else 0.0

    @property
    def ess_fraction(self) -> float:
        """Effective sample size of the token ratios as a fraction of the tokens,
        (sum w)^2 / (n sum w^2): 1 when every ratio is equal, near 0 when a few dominate."""
        if not self.tokens or self.weight_sq_sum <= 0.0:
            return 1.0 if not self.tokens else 0.0
        return min(self.weight_sum**2 / (self.tokens * self.weight_sq_sum), 1.0)

    @property
    def capped_fraction(self) -> float:
        return self.capped / self.tokens if self.tokens else 0.0


def _cut(ratio: Tensor, mode: str, cap: float, mask_below: float) -> tuple[Tensor, Tensor]:
    """(the weights, where they differ from the ratio) under ``mode``'s kind of cut."""
    if mode.endswith("_mask"):
        out = (ratio > cap) | (ratio < mask_below)
        return ratio.masked_fill(out, 0.0), out
    return ratio.clamp(max=cap), ratio > cap


def importance_weights(
    current: Tensor,
    sampler: Tensor,
    known: Tensor,
    mask: Tensor,
    *,
    mode: str,
    cap: float,
    mask_below: float = 0.0,
) -> tuple[Tensor, Tensor]:
    """Each token's loss weight [B, T] and whether the correction cut it [B, T].

    current: this node's log-probs before the step (detached); sampler: the generator's;
    known: [B] bool, rows whose generator's log-probs are known (the others weigh 1).
    mode: token_truncate, token_mask, sequence_truncate or sequence_mask; ``none`` weighs
    every token 1 and reports as cut the tokens whose ratio exceeds ``cap``.
    A sequence's ratio is the product of its tokens' (the exact weight of the whole
    completion), clamped in log space like a token's.
    """
    mask = mask.to(torch.float32)
    log_ratio = ((current.float() - sampler.float()) * mask).clamp(
        -LOG_RATIO_LIMIT, LOG_RATIO_LIMIT
    )  # [B, T]
    rows = known.to(torch.bool).unsqueeze(1) & (mask > 0)  # [B, T]
    if mode == "none":
        return torch.ones_like(mask), (log_ratio.exp() > cap) & rows
    if mode.startswith("sequence"):
        seq = log_ratio.sum(dim=1, keepdim=True).clamp(-LOG_RATIO_LIMIT, LOG_RATIO_LIMIT)
        weights, cut = _cut(seq.exp().expand_as(log_ratio), mode, cap, mask_below)
    elif mode.startswith("token"):
        weights, cut = _cut(log_ratio.exp(), mode, cap, mask_below)
    else:
        raise ValueError(f"unknown off-policy correction {mode!r}")
    weights = torch.where(rows, weights, torch.ones_like(weights))
    return weights, cut & rows


def row_drift(
    current: Tensor, sampler: Tensor, known: Tensor, mask: Tensor, cut: Tensor
) -> list[Drift | None]:
    """Per row, its tokens' drift (None where the generator's log-probs are unknown)."""
    mask = mask.to(torch.float64)
    log_ratio = ((sampler.double() - current.double()) * mask).clamp(
        -LOG_RATIO_LIMIT, LOG_RATIO_LIMIT
    )  # [B, T], generator - self
    weights = (-log_ratio).exp() * mask  # [B, T], the token ratios self / generator
    sums = torch.stack(
        [
            mask.sum(1),
            log_ratio.sum(1),
            weights.sum(1),
            (weights * weights).sum(1),
            (cut.double() * mask).sum(1),
        ],
        dim=1,
    ).tolist()  # [B, 5]
    return [
        Drift(int(n), lr, w, w2, int(c)) if is_known else None
        for (n, lr, w, w2, c), is_known in zip(sums, known.tolist(), strict=True)
    ]
