"""Issue 43, Sybils that launder their record: each publishes one 256-row group of a task the
receiver does not train (its verifier cannot judge it), then only groups whose shipped answer
is tampered, stamped last so that `fresh` draws them first.

On main at 164bacb the unjudged rows counted as rows seen: each Sybil was "known" after one
draw, its failures were diluted below the exclusion line, and under `fresh` two Sybils took
all of J for 11 rounds while the honest peers, not yet known, were held to the unknown-peer
budget. Here the receiver's real draw (the ledger's SQL), its real verifier and its
reputation run round after round over a local folder and S3 over HTTP.
"""

from __future__ import annotations

import math

from ledger import FreshPolicy
from sapo_core.reputation import Reputation
from tests.peer_rounds import HONEST, RECEIVER, SYBILS, publish_sybil_round, receiver_round


def test_sybils_get_no_more_than_the_unknown_budget_and_are_excluded(site):
    led = site.open()
    reputation = Reputation.empty(RECEIVER.reputation)
    policy = FreshPolicy()
    unknown_cap = math.ceil(policy.max_unknown_share * RECEIVER.external_groups)
    drawn_by_round = []
    for round_ in range(8):
        publish_sybil_round(led, round_)
        known, excluded = reputation.known(), reputation.excluded()
        groups, judged = receiver_round(led, reputation, policy, round_)
        assert all(g.question.task == "chain_sum" for g in groups)
        peers = [g.rollouts[0].node_id for g in groups]
        assert not set(peers) & set(excluded)  # an excluded Sybil is drawn no more
        from_sybils = sum(p in SYBILS for p in peers)
        drawn_by_round.append(from_sybils)
        if known:  # an honest peer is known: Sybils, all together, within the budget
            assert from_sybils <= unknown_cap, (round_, known)
        assert not set(reputation.known()) & set(SYBILS)
        assert all(e.rows <= 4 for e in judged.evidence.values())  # one group's worth
    # Each Sybil is out after two tampered groups drawn (8 judged rows); the honest peers
    # are known, and had most of J: the Sybils, a third of the draws at most.
    assert reputation.excluded() == list(SYBILS)
    assert reputation.known() == list(HONEST)
    assert sum(drawn_by_round) <= 4 and sum(drawn_by_round) <= len(drawn_by_round) * 2 / 3
