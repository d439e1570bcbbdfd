"""The GRPO update step: pack rows into micro-batches, fill in behaviour log-probs,
accumulate gradients, step.

Rows arrive as segments: one prompt (this node's template around the question) and the
completions trained against it; `segments` lays them out as passes, `logprobs` computes what
the loss needs. Which speed measures apply (the shared-prompt path, packing caps,
checkpointing, memory release) is the plan's (`plan.py`), chosen for the device.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from sapo_core.config import GRPOConfig
from sapo_core.grpo.logprobs import completion_logprobs
from sapo_core.grpo.loss import micro_batch_weight, policy_loss
from sapo_core.grpo.offpolicy import Drift, importance_weights, row_drift
from sapo_core.grpo.plan import UpdatePlan, plan_for
from sapo_core.grpo.segments import Segment, padded, split_segments
from sapo_core.memory import release_free_memory
from sapo_core.moved import moved_names
from sapo_core.policy.compat import set_checkpointing

# make_optimizer lived here until issue 59; the old import says where it went.
__getattr__ = moved_names(__name__, {"make_optimizer": "moved to sapo_core.grpo.optimizer"})


@dataclass
class UpdateResult:
    """What one update did, for tracking."""

    metrics: dict[str, float]
    """By their MLflow names, given here once (flows logs them as they are): the loss's
    (`loss`, `ratio_mean`, `clip_fraction`, `clip_low_fraction`, `clip_high_fraction`, `kl`
    where beta > 0), `grad_norm`, `update_tokens_per_s` and the plan's (`UpdatePlan.metrics`)."""
    seconds: float
    tokens: int
    drift: dict[str, Drift] = field(default_factory=dict)
    """Per segment label (a group id), how far its rows' generators are from the policy
    before the step: rows whose generator's log-probs are known only."""


def _with_own(batch: list[Segment], current: Tensor) -> Tensor:
    """Behaviour log-probs [b, T]: each row's recorded ones, or this policy's `current` ones
    (detached) for rows that carry none (peers' rows, reduced-precision generation)."""
    old = current.detach().clone()
    rows = [lp for seg in batch for lp in seg.behaviour_logprobs]
    for i, row in enumerate(rows):
        if row is not None:
            old[i, : len(row)] = torch.tensor(row)
            old[i, len(row) :] = 0.0
    return old


@dataclass
class _Fixed:
    """What a micro-batch's loss holds fixed through the step's iterations."""

    old: Tensor  # [b, T]
    weights: Tensor | None  # [b, T], importance weights; None: every token weighs 1


def _sampler(batch: list[Segment], width: int, device: Any) -> tuple[Tensor, Tensor] | None:
    """The generators' log-probs [b, T] and which rows carry them [b], or None if none do."""
    rows = [
        seg.sampler_logprobs[i] if seg.sampler_logprobs else None
        for seg in batch
        for i in range(len(seg))
    ]
    if all(r is None for r in rows):
        return None
    values = padded([r or [] for r in rows], width, 0.0, torch.float32).to(device)
    return values, torch.tensor([r is not None for r in rows], device=device)


def _fix(
    batch: list[Segment],
    current: Tensor,
    mask: Tensor,
    config: GRPOConfig,
    drift: dict[str, Drift],
) -> _Fixed:
    """The micro-batch's old log-probs and importance weights, from its first forward
    (`current`); its rows' drift is added to ``drift`` by segment label."""
    old = _with_own(batch, current)
    sampled = _sampler(batch, current.size(1), current.device)
    if sampled is None:
        return _Fixed(old, None)
    sampler, known = sampled
    current = current.detach()
    off = config.off_policy
    weights, cut = importance_weights(
        current, sampler, known, mask, mode=off.correction, cap=off.cap, mask_below=off.mask_below
    )
    labels = [seg.label for seg in batch for _ in range(len(seg))]
    for label, row in zip(labels, row_drift(current, sampler, known, mask, cut), strict=True):
        if row is not None:
            drift[label] = drift.get(label, Drift()) + row
    if not off.enabled:
        return _Fixed(old, None)
    # The proximal policy is this node's before the step: the ratio to it starts at 1 and
    # the generator enters through the weights alone.
    old = torch.where(known.unsqueeze(1), current, old)
    return _Fixed(old, weights)


def grpo_update(
    model: Any,
    optimizer: torch.optim.Optimizer,
    segments: Sequence[Segment],
    config: GRPOConfig,
    *,
    temperature: float,
    pad_id: int,
    max_completion_length: int,
    plan: UpdatePlan | None = None,
) -> UpdateResult:
    """`config.iterations` optimizer steps on one batch; gradients accumulate over micro-batches.

    Behaviour log-probs are fixed at the first step (generation's for own rows, the current
    policy's for rows without them), so from the second iteration on the ratio and the clip
    act as PPO intends. The current policy's are the first iteration's own forward, detached:
    the weights change only after its last micro-batch, so they are what a separate pass
    before the update would compute, without its cost.

    How the segments become passes is ``plan``'s (by default the one chosen for the model's
    device now: sapo_core/grpo/plan.py); the loss and its gradient are the same whatever it
    is. The plan and the passes it made are in the result's metrics.
    """
    started = time.perf_counter()
    if not segments:
        return UpdateResult({}, 0.0, 0)
    model.train()
    plan = plan or plan_for(model, config, optimizer)
    set_checkpointing(model, plan.checkpointing)
    batches = split_segments(
        segments,
        plan.micro_batch_size,
        plan.tokens_per_pass,
        plan.max_packed_tokens,
        plan.overhead_tokens,
    )
    fixed: list[_Fixed | None] = [None] * len(batches)
    drift: dict[str, Drift] = {}
    total_seqs = sum(len(s) for s in segments)
    total_tokens = float(sum(len(ids) for s in segments for ids in s.completion_ids))
    sums: dict[str, float] = {}
    for _ in range(config.iterations):
        optimizer.zero_grad(set_to_none=True)
        for index, batch in enumerate(batches):
            logprobs, mask = completion_logprobs(
                model, batch, temperature, pad_id, plan.shared_prompt
            )
            terms = fixed[index]
            if terms is None:
                terms = fixed[index] = _fix(batch, logprobs, mask, config, drift)
            advantages = torch.tensor(
                [a for seg in batch for a in seg.advantages], device=logprobs.device
            )  # [b]
            ref = None
            if config.beta:
                ref_rows = [r for seg in batch for r in (seg.ref_logprobs or [])]
                ref = padded(ref_rows, logprobs.size(1), 0.0, torch.float32).to(logprobs.device)
            loss, metrics = policy_loss(
                logprobs,
                terms.old,
                advantages,
                mask,
                loss_type=config.loss_type,
                eps_low=config.eps_low,
                eps_high=config.eps_high,
                beta=config.beta,
                ref_logprobs=ref,
                max_completion_length=max_completion_length,
                weights=terms.weights,
            )
            weight = micro_batch_weight(
                config.loss_type,
                micro_sequences=logprobs.size(0),
                micro_tokens=float(mask.sum()),
                total_sequences=total_seqs,
                total_tokens=total_tokens,
                micro_batches=len(batches),
            )
            (loss * weight).backward()
            if plan.release_memory:
                release_free_memory()  # this micro-batch's activations, before the next's
            # The loss logged is the objective optimised (the micro-batches' losses as the
            # gradient weighs them), per iteration; the other figures are token means.
            sums["loss"] = sums.get("loss", 0.0) + loss.item() * weight / config.iterations
            share = float(mask.sum()) / (total_tokens * config.iterations)
            for key, value in metrics.items():
                if key not in ("tokens", "loss"):
                    sums[key] = sums.get(key, 0.0) + value * share
        if config.max_grad_norm is not None:
            norm = torch.nn.utils.clip_grad_norm_(model.parameters(), config.max_grad_norm)
            sums["grad_norm"] = sums.get("grad_norm", 0.0) + float(norm) / config.iterations
        optimizer.step()
    optimizer.zero_grad(set_to_none=True)  # gradients are not kept through generation
    if plan.release_memory:
        release_free_memory()  # ... nor their pages, which generation's peak would sit on
    seconds = time.perf_counter() - started
    sums["update_tokens_per_s"] = total_tokens * config.iterations / max(seconds, 1e-9)
    sums.update(plan.metrics(len(batches)))
    return UpdateResult(sums, seconds, int(total_tokens), drift)


def reference_logprobs(
    ref_model: Any,
    segments: Sequence[Segment],
    temperature: float,
    pad_id: int,
    plan: UpdatePlan,
) -> None:
    """Fill each segment's ref_logprobs from a frozen reference model (for beta > 0), in
    passes no larger than ``plan``'s (the update's, whose passes also hold gradients)."""
    for seg in segments:
        rows: list[list[float]] = []
        pieces = split_segments(
            [seg], plan.micro_batch_size, plan.tokens_per_pass, plan.max_packed_tokens
        )
        for piece in pieces:
            with torch.no_grad():
                # the plain plan keeps the reference plain too; else its family decides
                fast = None if plan.shared_prompt else False
                logprobs, _ = completion_logprobs(ref_model, piece, temperature, pad_id, fast)
            rows.extend(
                logprobs[i, : len(ids)].tolist() for i, ids in enumerate(piece[0].completion_ids)
            )
        seg.ref_logprobs = rows
