"""The round's training set: I of the node's own groups plus J groups from peers.

Which peers' groups arrive is a sampling policy the ledger evaluates; here they are only
scored (by the node's own verifier, before this step) and merged. J = 0 is plain GRPO.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TypedDict

from sapo_core.grpo.offpolicy import Drift
from sapo_core.reputation import PeerEvidence
from sapo_core.rewards import ScoredGroup
from sapo_core.rollouts import Group


class DriftColumns(TypedDict, total=False):
    """A group's drift in the training log: present when a row of it carried a claim."""

    drift_tokens: int
    drift_kl: float
    drift_weight_mean: float
    drift_weight_sq_mean: float
    drift_capped: float


class TrainingRecord(DriftColumns):
    """One line of the ledger's training log (ledger/node_logs.py ``TRAININGS``), less what
    the writer stamps (swarm, node, round, time): the columns are held equal by a test."""

    group_id: str
    origin: str
    peer_node_id: str
    task: str
    completions: int
    reward_mean: float
    informative: bool
    trained: bool
    loss_share: float


@dataclass(frozen=True)
class TrainingSet:
    """The round's I + J groups (own first) and those of them that carry a gradient."""

    selected: tuple[ScoredGroup, ...]
    trained: tuple[ScoredGroup, ...]
    peer_evidence: Mapping[str, PeerEvidence] = field(default_factory=dict)
    """What verifying the peers' groups showed about each peer (sapo_core/reputation.py)."""

    def rewards(self, source: str | None = None) -> list[float]:
        """This node's rewards over the selected groups, optionally of one source."""
        return [r for g in self.selected if source in (None, g.group.source) for r in g.rewards]

    def is_trained(self, group: ScoredGroup) -> bool:
        """Whether a selected group carried a gradient (by identity: two groups may be equal)."""
        return any(group is g for g in self.trained)

    @property
    def zero_variance_fraction(self) -> float:
        return sum(g.zero_variance for g in self.selected) / max(len(self.selected), 1)

    @property
    def external_used(self) -> int:
        return sum(g.group.source == "external" for g in self.selected)

    def records(
        self,
        loss_shares: Mapping[str, float] | None = None,
        drift: Mapping[str, Drift] | None = None,
    ) -> list[TrainingRecord]:
        """One row per selected group, for the ledger's training log: where it came from,
        whether it carried a gradient, whether it was trained on, its share of the
        update's loss weight (``loss_shares``, by group id: RoundReport's) and how far its
        generator was from this policy (``drift``, by group id)."""
        shares = loss_shares or {}
        drifts = drift or {}
        return [
            TrainingRecord(
                {
                    "group_id": g.group.group_id,
                    "origin": g.group.source,
                    "peer_node_id": g.rollouts[0].node_id,
                    "task": g.group.question.task,
                    "completions": len(g.rewards),
                    "reward_mean": g.mean_reward,
                    "informative": not g.zero_variance,
                    "trained": self.is_trained(g),
                    "loss_share": min(shares.get(g.group.group_id, 0.0), 1.0),  # float sums
                    **drift_record(drifts.get(g.group.group_id)),
                }
            )
            for g in self.selected
        ]


def drift_record(drift: Drift | None) -> DriftColumns:
    """A group's drift as the training log's columns (none when no row had a claim)."""
    if drift is None or not drift.tokens:
        return {}
    return {
        "drift_tokens": drift.tokens,
        "drift_kl": drift.kl,
        "drift_weight_mean": drift.weight_sum / drift.tokens,
        "drift_weight_sq_mean": drift.weight_sq_sum / drift.tokens,
        "drift_capped": drift.capped_fraction,
    }


def choose_local(
    groups: Sequence[Group], count: int, seed: str, *, informative_first: bool = False
) -> list[Group]:
    """I of the node's own groups, drawn without replacement (seeded, order kept).

    With ``informative_first`` the draw takes the groups whose rows' rewards (this node's
    verdicts, given when they were made) differ before those whose rewards all agree, each
    kind in the seeded order: a node that makes more questions than it trains on (I below
    `questions_per_round`) then trains on as many informative groups as its questions
    yielded, up to I. The control of issue 46: a node alone buying informative groups
    with generation instead of with peers."""
    if count >= len(groups):
        return list(groups)
    rng = random.Random(seed)
    if not informative_first:  # the draw every earlier run made, unchanged
        return [groups[i] for i in sorted(rng.sample(range(len(groups)), count))]
    order = rng.sample(range(len(groups)), len(groups))
    order.sort(key=lambda i: not _informative(groups[i]))  # stable: seeded within each kind
    return [groups[i] for i in sorted(order[:count])]


def _informative(group: Group) -> bool:
    """Whether a group's rows' rewards differ: its advantages are not all zero."""
    return len({r.reward for r in group.rollouts if r.reward is not None}) > 1


def assemble(
    local: Sequence[ScoredGroup],
    external: Sequence[ScoredGroup],
    *,
    drop_zero_variance: bool,
) -> TrainingSet:
    """Merge the round's own scored groups (I, chosen by `choose_local`) and its peers'
    (J, cut by `sapo_core.peers.judge_peers`), own first.

    With drop_zero_variance, groups whose rewards (this node's) are all equal are left
    out: their advantages are zero, so they add no gradient, only dilute the normaliser.
    Missing peers are not replaced by own groups: a node without peers trains on I.
    """
    selected = (*local, *external)
    trained = tuple(g for g in selected if not (drop_zero_variance and g.zero_variance))
    return TrainingSet(selected, trained)
