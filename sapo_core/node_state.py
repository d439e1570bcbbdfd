"""What a node carries from round to round besides its weights: the pieces of
`Learner.state_dict()` (sapo_core/learner.py) that are not the optimizer's.

- ``policy_version``: optimizer steps taken, stamped on every row the node publishes;
- `RewardTotals`: the running sums of the round's rewards (docs/running.md, "Rewards, by
  name");
- the node's `Reputation` of its peers (sapo_core/reputation.py), updated once per round by
  the round's own verdicts;
- the RNG streams (torch's and Python's).

Held together so that a checkpoint saves them at one instant: a node resumed from a
checkpoint is the node that wrote it, and a round retried after a stop counts its verdicts
and rewards once.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any


@dataclass
class RewardTotals:
    """A node's running sums over its rounds: each is the sum of that round's figure of
    the same name."""

    cumulative_own_reward: float = 0.0
    cumulative_training_reward: float = 0.0

    def add(self, *, own_reward: float, training_reward: float) -> None:
        self.cumulative_own_reward += own_reward
        self.cumulative_training_reward += training_reward

    def as_metrics(self) -> dict[str, float]:
        return {
            "cumulative_own_reward": self.cumulative_own_reward,
            "cumulative_training_reward": self.cumulative_training_reward,
        }

    @classmethod
    def from_state(cls, data: dict[str, Any]) -> RewardTotals:
        """From a saved state (zeros where these names are missing: older checkpoints)."""
        return cls(
            float(data.get("cumulative_own_reward", 0.0)),
            float(data.get("cumulative_training_reward", 0.0)),
        )


def rng_state() -> dict[str, Any]:
    """The process's RNG streams the learner draws from (a copy)."""
    import torch  # here: checkpoints' readers (the CLI's lifecycle) load no torch

    return {"torch": torch.get_rng_state(), "python": random.getstate()}


def set_rng_state(state: dict[str, Any]) -> None:
    import torch

    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
