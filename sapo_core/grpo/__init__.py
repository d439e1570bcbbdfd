"""GRPO: group-relative advantages, the clipped policy loss, and the update step.

`advantages` and `loss` are pure tensor functions; `update` holds the model-facing step.
"""

from sapo_core.grpo.advantages import dense_group_ids, group_advantages
from sapo_core.grpo.loss import masked_mean, micro_batch_weight, policy_loss

__all__ = [
    "dense_group_ids",
    "group_advantages",
    "masked_mean",
    "micro_batch_weight",
    "policy_loss",
]
