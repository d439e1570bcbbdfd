"""GRPO: group-relative advantages, the clipped policy loss, and the update step.

`advantages` and `loss` are pure tensor functions; `update` holds the model-facing step.
"""

from sapo_core.grpo.advantages import group_advantages, group_index
from sapo_core.grpo.loss import masked_mean, micro_batch_weight, policy_loss

__all__ = ["group_advantages", "group_index", "masked_mean", "micro_batch_weight", "policy_loss"]
