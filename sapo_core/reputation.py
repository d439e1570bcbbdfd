"""What a receiver learns about its peers from its own verifier, and which peers it stops
sampling.

Every peer row a node considers is re-derived and re-scored here anyway; this keeps count,
per publishing peer, of rows that failed verification (tampered or unverifiable questions)
and of rows whose claimed reward differs from the receiver's own score. A peer whose share of
such rows, with a prior of one good and one bad row, exceeds ``max_bad_share`` after at least
``min_rows`` rows is excluded from sampling. Honest peers with the same verifier claim exactly
what the receiver scores; a peer with another extraction or format weight (a legitimate
configuration) differs, so the default threshold is lenient and only claims *and* failures
together push a peer out.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from sapo_core.rebuild import UNJUDGED
from sapo_core.rewards import ScoredGroup
from sapo_core.rollouts import Group

CLAIM_TOLERANCE = 1e-6


@dataclass(frozen=True)
class PeerEvidence:
    """One peer's rows as this node's verifier saw them."""

    rows: int = 0
    failed: int = 0
    """Rows dropped by verification: tampered question or answer, unverifiable, refused."""
    misclaimed: int = 0
    """Verified rows whose claimed reward differs from this node's score."""

    def __add__(self, other: PeerEvidence) -> PeerEvidence:
        return PeerEvidence(
            self.rows + other.rows, self.failed + other.failed, self.misclaimed + other.misclaimed
        )


def evidence(
    groups: Sequence[Group], scored: Sequence[ScoredGroup], problems: Sequence[str]
) -> dict[str, PeerEvidence]:
    """Per publishing peer, what verifying ``groups`` showed: ``scored`` and ``problems``
    as ``score_groups`` returns them (a problem names its row first: ``<rollout_id>: ...``).
    A row dropped only because its group kept fewer than two rows counts as seen, not bad."""
    # Rows left unverified when the round's budget ran out, or of a task this node has no
    # use for, say nothing about their peer.
    failed_ids = {
        row for row, _, why in (p.partition(": ") for p in problems) if not why.startswith(UNJUDGED)
    }
    kept = {
        r.rollout_id: reward
        for g in scored
        for r, reward in zip(g.rollouts, g.rewards, strict=True)
    }
    found: dict[str, PeerEvidence] = {}
    for group in groups:
        for row in group.rollouts:
            mine = kept.get(row.rollout_id)
            claimed = row.reward
            misclaimed = (
                mine is not None and claimed is not None and abs(claimed - mine) > CLAIM_TOLERANCE
            )
            seen = PeerEvidence(1, int(row.rollout_id in failed_ids), int(misclaimed))
            found[row.node_id] = found.get(row.node_id, PeerEvidence()) + seen
    return found


@dataclass
class Reputation:
    """Accumulated evidence per peer, and the peers it excludes."""

    peers: dict[str, PeerEvidence]
    min_rows: int = 16
    max_bad_share: float = 0.5

    @classmethod
    def empty(cls, min_rows: int = 16, max_bad_share: float = 0.5) -> Reputation:
        return cls({}, min_rows, max_bad_share)

    def update(self, found: Mapping[str, PeerEvidence]) -> None:
        for peer, seen in found.items():
            self.peers[peer] = self.peers.get(peer, PeerEvidence()) + seen

    def bad_share(self, peer: str) -> float:
        """Failed rows, plus half the misclaimed ones, over rows seen (one good and one bad
        row as the prior). Misclaims alone stay at or under one half: an honest peer with
        another verifier setting misclaims every row and is not excluded for it."""
        e = self.peers.get(peer, PeerEvidence())
        return (e.failed + 0.5 * e.misclaimed + 1) / (e.rows + 2)

    def excluded(self) -> list[str]:
        """Peers with enough evidence against them, sorted."""
        return sorted(
            peer
            for peer, e in self.peers.items()
            if e.rows >= self.min_rows and self.bad_share(peer) > self.max_bad_share
        )

    def known(self) -> list[str]:
        """Peers with enough rows verified and not excluded: sampled before new ids."""
        excluded = set(self.excluded())
        return sorted(
            p for p, e in self.peers.items() if e.rows >= self.min_rows and p not in excluded
        )

    def to_json(self) -> dict[str, Any]:
        return {"peers": {p: asdict(e) for p, e in sorted(self.peers.items())}}

    @classmethod
    def from_json(
        cls, data: Mapping[str, Any], min_rows: int = 16, max_bad_share: float = 0.5
    ) -> Reputation:
        peers = {
            str(p): PeerEvidence(**{k: int(v) for k, v in e.items()})
            for p, e in data.get("peers", {}).items()
        }
        return cls(peers, min_rows, max_bad_share)
