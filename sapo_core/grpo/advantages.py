"""Group-relative advantages, grouped by an explicit group id.

Groups are never found by reshaping with a fixed group size: a peer's group can arrive with
rows dropped (flagged by the verifier), so groups have any size, including one.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import torch
from torch import Tensor

ScaleRewards = Literal["group", "batch", "none"]


def dense_group_ids(group_ids: Sequence[str]) -> Tensor:
    """Dense integer ids [N] for string group ids, numbered in first-seen order."""
    numbering: dict[str, int] = {}
    return torch.tensor([numbering.setdefault(g, len(numbering)) for g in group_ids])


def group_advantages(
    rewards: Tensor, groups: Tensor, scale: ScaleRewards = "group", eps: float = 1e-4
) -> Tensor:
    """Rewards minus their group's mean, optionally divided by a std (+ eps), as in TRL.

    rewards: [N] float; groups: [N] integer group ids. Returns [N].
    std is the unbiased one (TRL's torch.std); a group of one has std 0 and advantage 0.
    """
    rewards = rewards.to(torch.float64)
    _, inverse, counts = torch.unique(groups, return_inverse=True, return_counts=True)
    n_groups = counts.numel()
    sums = torch.zeros(n_groups, dtype=rewards.dtype).index_add_(0, inverse, rewards)  # [G]
    means = sums / counts  # [G]
    centred = rewards - means[inverse]  # [N]
    if scale == "none":
        return centred.float()
    if scale == "group":
        squares = torch.zeros(n_groups, dtype=rewards.dtype).index_add_(0, inverse, centred**2)
        std = torch.sqrt(squares / (counts - 1).clamp(min=1))  # [G]
        return (centred / (std[inverse] + eps)).float()
    batch_std = rewards.std() if rewards.numel() > 1 else rewards.new_zeros(())
    return (centred / (batch_std + eps)).float()
