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

import itertools
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


def test_a_crowd_of_new_ids_neither_displaces_a_peer_being_judged_nor_is_known_sooner(site):
    """Issue 57: six Sybils publish one verifiable group a round each beside two honest
    peers, one known and one half judged, to a receiver drawing J = 4 (one slot for
    peers it does not know). The half-judged peer takes that slot until it is known (it
    has standing: rows judged well), and the Sybils, between them, get no more evidence a
    round than the slot holds: they become known one after another, never faster than
    16 rows each through one slot of 4 rows a round."""
    from sapo_core.reputation import PeerEvidence
    from tests.grinding import honest_round, sybil_group

    receiver = RECEIVER.model_copy(update={"external_groups": 4})
    sybils = [f"s{k}" for k in range(6)]
    led = site.open()
    reputation = Reputation.empty(receiver.reputation)
    reputation.update({"h1": PeerEvidence(rows=16), "h2": PeerEvidence(rows=8)})
    assert reputation.known() == ["h1"] and reputation.standing() == {"h2": 8}
    known_at: dict[str, int] = {}
    sybil_rows = 0
    for round_ in range(12):
        honest_round(led, round_, 4, HONEST[:1])  # the known peer has candidates to spare
        honest_round(led, round_, 2, HONEST[1:], seeds=101)
        for k, node in enumerate(sybils):
            sybil_group(led, node, round_, k)
        before = set(reputation.known())
        groups, judged = receiver_round(led, reputation, FreshPolicy(), round_, receiver)
        peers = [g.rollouts[0].node_id for g in groups]
        unknown = [p for p in peers if p not in before]
        assert len(unknown) <= 1, (round_, peers)  # the budget, while h1 has groups
        if "h2" not in before:
            assert unknown == ["h2"], (round_, peers)  # standing first
        sybil_rows += sum(judged.evidence[p].rows for p in set(peers) & set(sybils))
        for p in reputation.known():
            known_at.setdefault(p, round_)
    assert known_at["h2"] == 1  # 8 + 4 + 4 rows: known after round 1
    known_sybils = sorted(set(known_at) & set(sybils), key=known_at.get)
    assert len(known_sybils) <= sybil_rows // 16
    # One after another: each took the slot until known, four rounds apart.
    rounds = [known_at[s] for s in known_sybils]
    assert all(b - a >= 4 for a, b in itertools.pairwise(rounds)), rounds
