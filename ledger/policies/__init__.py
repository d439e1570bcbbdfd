"""Sampling policies: which peers' groups a node trains on.

Each policy is a small validated config plus one SQL file over the ``groups`` view, so what a
node samples is something a user can read, paste into DuckDB and change; a swarm can also
draw with a user's own SQL file (`SqlPolicy`, ledger/policies/user_sql.py).
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, ClassVar, Literal

from pydantic import Field, TypeAdapter, model_validator

from ledger.policies.base import (
    MaxAge,
    _Policy,
    build_drawable,
    drawable_sql,
    drawable_statements,
)
from ledger.policies.user_sql import SqlPolicy


class PaperPolicy(_Policy):
    """Drop groups whose rewards all agree, then sample uniformly (the paper's choice)."""

    kind: Literal["paper"] = "paper"


class RewardFilteredPolicy(_Policy):
    """Bounds on mean claimed reward, a recency window and a cap per peer."""

    kind: Literal["reward_filtered"] = "reward_filtered"
    min_mean_reward: float = Field(0.0, ge=0.0, le=1.0, description="Lowest group mean reward.")
    max_mean_reward: float = Field(1.0, ge=0.0, le=1.0, description="Highest group mean reward.")
    require_variance: bool = Field(True, description="Drop groups whose rewards all agree.")
    max_age_s: MaxAge = None

    @model_validator(mode="after")
    def _bounds_ordered(self) -> RewardFilteredPolicy:
        if self.min_mean_reward > self.max_mean_reward:
            raise ValueError(
                f"min_mean_reward {self.min_mean_reward} > max_mean_reward {self.max_mean_reward}"
            )
        return self

    def parameters(self, now: datetime) -> dict[str, Any]:
        return {
            "min_mean_reward": self.min_mean_reward,
            "max_mean_reward": self.max_mean_reward,
            "require_variance": self.require_variance,
            "max_age_s": self.max_age_s,
            "now": now,
        }


class VarianceWeightedPolicy(_Policy):
    """Draw groups with probability proportional to their reward variance, capped per peer.

    Beyond the paper: aims at its instability at high J (see variance_weighted.sql)."""

    kind: Literal["variance_weighted"] = "variance_weighted"
    min_std: float = Field(
        0.0, ge=0.0, lt=0.5, description="Drop groups whose reward std is at most this."
    )
    max_age_s: MaxAge = None

    def parameters(self, now: datetime) -> dict[str, Any]:
        return {
            "min_std": self.min_std,
            "max_age_s": self.max_age_s,
            "now": now,
        }


class FreshPolicy(_Policy):
    """Peers' informative groups the receiver never drew before, each peer's newest first
    and peers taking turns in a seeded order (a later stamp buys no larger share); fewer
    than asked for when peers have not published that many (see fresh.sql).

    Beyond the paper: at high J the uniform draw serves the same stale groups over and
    over (the pool degrades when nodes take more than they give); this takes each group
    at most once, and no more than the peers' fresh supply."""

    kind: Literal["fresh"] = "fresh"
    remembers: ClassVar[bool] = True
    max_age_s: MaxAge = None

    def parameters(self, now: datetime) -> dict[str, Any]:
        return {"max_age_s": self.max_age_s, "now": now}


AnyPolicy = PaperPolicy | RewardFilteredPolicy | VarianceWeightedPolicy | FreshPolicy | SqlPolicy
SamplingPolicy = Annotated[AnyPolicy, Field(discriminator="kind")]
"""Any sampling policy; YAML picks one with ``kind``."""

_ADAPTER: TypeAdapter[AnyPolicy] = TypeAdapter(SamplingPolicy)


def parse_policy(value: str | dict[str, Any] | _Policy) -> AnyPolicy:
    """A policy from its name, a mapping (from YAML or the CLI), or a policy object."""
    if isinstance(value, AnyPolicy):
        return value
    if isinstance(value, str):
        value = {"kind": value}
    return _ADAPTER.validate_python(value)


__all__ = [
    "AnyPolicy",
    "FreshPolicy",
    "PaperPolicy",
    "RewardFilteredPolicy",
    "SamplingPolicy",
    "SqlPolicy",
    "VarianceWeightedPolicy",
    "build_drawable",
    "drawable_sql",
    "drawable_statements",
    "parse_policy",
]
