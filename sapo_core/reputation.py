"""What a receiver learns about its peers from its own verifier, and which peers it stops
sampling.

Every peer row a node considers is re-derived and re-scored here anyway; this keeps count,
per publishing peer, of rows that failed verification (tampered or unverifiable questions)
and of rows whose claimed reward differs from the receiver's own score. Three rules keep the
record from being bought (ReputationConfig holds the numbers):

- Only *judged* rows count. A row of a task the receiver does not train, or one left when its
  verification budget ran out, says nothing about its peer: it is neither good nor bad, and a
  peer cannot become known by publishing what the receiver cannot check.
- A peer's rows count at most as one of the receiver's own groups per group drawn: the learner
  cuts every peer group to the receiver's group size before verifying it
  (sapo_core.peers.within_group_size), so a 256-row group is evidence of 4 rows, not 256.
- Recent verdicts weigh most: each judged row halves the weight of what came
  ``half_life_rows`` rows before it, so a good past is not a credit a peer spends later.

A peer whose bad share (failed rows plus half the misclaimed ones, recency-weighted, with a
prior of one good and one bad row) exceeds ``max_bad_share`` after ``exclude_after_rows``
judged rows is excluded from sampling; one with ``min_rows`` judged rows and not excluded is
*known*. Honest peers with the same verifier claim exactly what the receiver scores; a peer
with another extraction or format weight (a legitimate configuration) misclaims, so misclaims
alone never pass one half: only failures push a peer out. Known, though, also needs a bad
share of at most ``known_max_bad_share`` (a quarter): the draw filters on claimed rewards, so a
peer whose claims are not ours stays within the unknown-peer budget.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from sapo_core.config import ReputationConfig
from sapo_core.rebuild import UNJUDGED
from sapo_core.rewards import ScoredGroup
from sapo_core.rollouts import Group

CLAIM_TOLERANCE = 1e-6


@dataclass(frozen=True)
class PeerEvidence:
    """One peer's rows as this node's verifier judged them in one round."""

    rows: int = 0
    """Rows judged: scored, or dropped by verification for the peer's doing."""
    failed: int = 0
    """Rows dropped by verification: tampered question or answer, unverifiable, refused."""
    misclaimed: int = 0
    """Verified rows whose claimed reward differs from this node's score."""

    def __add__(self, other: PeerEvidence) -> PeerEvidence:
        return PeerEvidence(
            self.rows + other.rows, self.failed + other.failed, self.misclaimed + other.misclaimed
        )

    @property
    def bad(self) -> float:
        return self.failed + 0.5 * self.misclaimed


def evidence(
    groups: Sequence[Group], scored: Sequence[ScoredGroup], problems: Sequence[str]
) -> dict[str, PeerEvidence]:
    """Per publishing peer, what verifying ``groups`` showed: ``scored`` and ``problems``
    as ``score_groups`` returns them (a problem names its row first: ``<rollout_id>: ...``).

    Rows left unjudged (a task this node has no use for, the round's budget spent) are not
    counted at all. A row dropped only because its group kept fewer than two rows was
    judged, and good."""
    reasons = dict(p.partition(": ")[::2] for p in problems)
    kept = {
        r.rollout_id: reward
        for g in scored
        for r, reward in zip(g.rollouts, g.rewards, strict=True)
    }
    found: dict[str, PeerEvidence] = {}
    for group in groups:
        for row in group.rollouts:
            why = reasons.get(row.rollout_id)
            if why is not None and why.startswith(UNJUDGED):
                continue
            mine = kept.get(row.rollout_id)
            claimed = row.reward
            misclaimed = (
                mine is not None and claimed is not None and abs(claimed - mine) > CLAIM_TOLERANCE
            )
            seen = PeerEvidence(1, int(why is not None), int(misclaimed))
            found[row.node_id] = found.get(row.node_id, PeerEvidence()) + seen
    return found


@dataclass(frozen=True)
class PeerRecord:
    """What this node holds of one peer: every judged row counted, and the recent ones
    weighed."""

    judged: int = 0
    """Rows judged, ever: what `known` and exclusion wait for."""
    rows: float = 0.0
    """Judged rows, each weighted by its recency."""
    bad: float = 0.0
    """Failed rows plus half the misclaimed ones, weighted alike."""

    def after(self, seen: PeerEvidence, half_life_rows: float) -> PeerRecord:
        """The record once ``seen`` is judged, row by row: each new row halves the weight of
        every earlier one every ``half_life_rows`` rows, so no number of rows judged at once
        weighs more than about ``half_life_rows / ln 2`` of them (the bad ones among them
        spread evenly)."""
        if not seen.rows:
            return self
        step = 0.5 ** (1.0 / half_life_rows)  # one row's decay
        kept = step**seen.rows  # what is left of the old record's weight
        weight = (1.0 - kept) / (1.0 - step)  # the new rows' weight: sum of step**k
        return PeerRecord(
            self.judged + seen.rows,
            self.rows * kept + weight,
            self.bad * kept + weight * seen.bad / seen.rows,
        )

    @property
    def bad_share(self) -> float:
        """Recent bad rows over recent rows, one good and one bad row as the prior."""
        return (self.bad + 1.0) / (self.rows + 2.0)


@dataclass
class Reputation:
    """Per peer, its record; the peers it excludes and those it knows."""

    peers: dict[str, PeerRecord]
    config: ReputationConfig

    @classmethod
    def empty(cls, config: ReputationConfig | None = None) -> Reputation:
        return cls({}, config or ReputationConfig.model_validate({}))

    def update(self, found: Mapping[str, PeerEvidence]) -> None:
        for peer, seen in found.items():
            if seen.rows:
                record = self.peers.get(peer, PeerRecord())
                self.peers[peer] = record.after(seen, self.config.half_life_rows)

    def bad_share(self, peer: str) -> float:
        return self.peers.get(peer, PeerRecord()).bad_share

    def excluded(self) -> list[str]:
        """Peers with enough evidence against them, sorted."""
        return sorted(
            peer
            for peer, r in self.peers.items()
            if r.judged >= self.config.exclude_after_rows
            and r.bad_share > self.config.max_bad_share
        )

    def known(self) -> list[str]:
        """Peers with enough rows judged and few bad ones: sampled before new ids. A peer
        whose claims keep differing from this node's scores is not excluded for it alone,
        but never known: the draw filters on claimed rewards, so its claims could fill its
        share of J with groups that teach nothing."""
        return sorted(
            p
            for p, r in self.peers.items()
            if r.judged >= self.config.min_rows and r.bad_share <= self.config.known_max_bad_share
        )

    def standing(self) -> dict[str, int]:
        """Peers not known yet, not excluded, and judged well so far (a bad share within the
        bound for known ones), with the rows judged of each: within the unknown-peer budget
        the draw takes them first, most rows first, so a crowd of new ids cannot hold back
        a peer the node is coming to know, and each newcomer becomes known in turn."""
        known, excluded = set(self.known()), set(self.excluded())
        return {
            p: r.judged
            for p, r in sorted(self.peers.items())
            if p not in known
            and p not in excluded
            and r.judged > 0
            and r.bad_share <= self.config.known_max_bad_share
        }

    def to_json(self) -> dict[str, Any]:
        return {"version": 2, "peers": {p: asdict(r) for p, r in sorted(self.peers.items())}}

    @classmethod
    def from_json(
        cls, data: Mapping[str, Any], config: ReputationConfig | None = None
    ) -> Reputation:
        """A saved reputation; one saved before version 2 (plain counts, unjudged rows
        among them) is read as if every row was judged and recent."""
        peers: dict[str, PeerRecord] = {}
        for peer, e in data.get("peers", {}).items():
            if data.get("version", 1) >= 2:
                record = PeerRecord(int(e["judged"]), float(e["rows"]), float(e["bad"]))
            else:  # weighed as one batch of that many rows: at most ~23 rows' weight
                old = PeerEvidence(**{k: int(v) for k, v in e.items()})
                record = PeerRecord().after(old, (config or cls.empty().config).half_life_rows)
            peers[str(peer)] = record
        return cls(peers, config or ReputationConfig.model_validate({}))
