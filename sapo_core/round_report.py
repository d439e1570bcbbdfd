"""What one round of training did: the report flows log, and how the update's weight and
drift divide among the groups and publishers trained on."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from sapo_core.assembly import TrainingSet
from sapo_core.grpo.loss import LossType, row_loss_shares
from sapo_core.grpo.offpolicy import Drift
from sapo_core.grpo.segments import Segment
from sapo_core.rewards import ScoredGroup


@dataclass
class RoundReport:
    """What one round of training did; the names flows log as metrics."""

    round: int
    training_reward: float
    training_reward_local: float | None
    training_reward_external: float | None
    zero_variance_fraction: float
    external_groups_used: int
    groups_trained: int
    flagged_rows: int
    update_s: float
    update: dict[str, float] = field(default_factory=dict)
    rows_skipped: dict[str, int] = field(default_factory=dict)  # reason -> completions
    loss_shares: dict[str, float] = field(default_factory=dict)
    """Per trained group id, its share of the update's loss weight (sums to 1)."""
    peer_loss_shares: dict[str, float] = field(default_factory=dict)
    """Per peer whose groups were trained on, its share of the loss weight: at most its
    groups' rows (a peer group holds no more than the node's own group size) over all rows
    trained, under the default loss (sapo_core.grpo.loss.row_loss_shares)."""
    claims: dict[str, int] = field(default_factory=dict)
    """Rows trained that this process did not sample (peers', and the node's own read back
    from the ledger on a retried round), by what became of their generator's claim
    (sapo_core.claims: accepted, or why not)."""
    drift: dict[str, Drift] = field(default_factory=dict)
    """Per trained group id, how far its generator was from this policy before the step
    (rows with a claim used; sapo_core/grpo/offpolicy.py)."""
    peer_drift: dict[str, Drift] = field(default_factory=dict)
    """The same per publisher (this node's own id for its own groups)."""
    chosen: TrainingSet | None = field(default=None, repr=False)
    """The training set the round assembled (`Learner.train_round` sets it)."""
    select_s: float = 0.0
    """Seconds judging and assembling the groups before the update."""
    peers_excluded: int = 0
    """Peers the node's reputation excludes from its draws after this round."""


def loss_shares(
    pairs: Sequence[tuple[ScoredGroup, Segment]], loss_type: LossType
) -> dict[str, float]:
    """Per group id, its rows' share of the update's loss weight."""
    tokens = [len(ids) for _, seg in pairs for ids in seg.completion_ids]
    rows = iter(row_loss_shares(tokens, loss_type))
    return {g.group.group_id: sum(next(rows) for _ in seg.completion_ids) for g, seg in pairs}


def peer_shares(
    pairs: Sequence[tuple[ScoredGroup, Segment]], shares: dict[str, float]
) -> dict[str, float]:
    """Per peer, the loss weight its groups hold (own groups are not a peer's)."""
    found: dict[str, float] = {}
    for g, _ in pairs:
        if g.group.source == "external":
            peer = g.rollouts[0].node_id
            found[peer] = found.get(peer, 0.0) + shares[g.group.group_id]
    return found


def by_publisher(
    pairs: Sequence[tuple[ScoredGroup, Segment]], drift: dict[str, Drift]
) -> dict[str, Drift]:
    """Groups' drift summed per publisher."""
    found: dict[str, Drift] = {}
    for g, _ in pairs:
        row = drift.get(g.group.group_id)
        if row is not None:
            peer = g.rollouts[0].node_id
            found[peer] = found.get(peer, Drift()) + row
    return found
