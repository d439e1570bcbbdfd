"""A receiver's reputation of its peers, from its own verifier (sapo_core/reputation.py)."""

from __future__ import annotations

import dataclasses

from sapo_core.config import ReputationConfig, RewardConfig, TaskConfig, TaskSpec
from sapo_core.reputation import PeerEvidence, Reputation, evidence
from sapo_core.rewards import ConfigBounds, score_groups
from sapo_core.rollouts import Group, Rollout
from sapo_core.tasks import Question, TaskSource
from tests.factories import rollout_of

EASY = TaskConfig(specs=(TaskSpec(name="chain_sum", config={"min_terms": 2, "max_terms": 2}),))


def _row(q: Question, node: str, j: int, completion: str, claimed: float) -> Rollout:
    return rollout_of(q, completion, node, j, claimed)


def _groups(node: str, honest: bool, n: int = 4) -> list[Group]:
    groups = []
    for q in TaskSource(EASY, seed=3).draw(0, n):
        right, wrong = f"<answer>{q.answer}</answer>", "<answer>-1</answer>"
        if honest:
            rows = [_row(q, node, 0, right, 1.0), _row(q, node, 1, wrong, 0.0)]
        else:  # claims full marks for wrong answers, and tampers one question's answer
            rows = [
                _row(q, node, 0, wrong, 1.0),
                _row(q, node, 1, wrong, 1.0),
                _row(dataclasses.replace(q, answer="-1"), node, 2, wrong, 1.0),
            ]
        groups.append(Group(rows[0].group_id, "external", tuple(rows)))
    return groups


def test_evidence_counts_failed_and_misclaimed_rows_per_peer() -> None:
    groups = _groups("honest", True) + _groups("liar", False)
    scored, problems = score_groups(groups, RewardConfig())
    found = evidence(groups, scored, problems)
    assert found["honest"] == PeerEvidence(rows=8, failed=0, misclaimed=0)
    assert found["liar"] == PeerEvidence(rows=12, failed=4, misclaimed=8)


def test_a_lying_peer_is_excluded_once_the_evidence_suffices_and_an_honest_one_never() -> None:
    reputation = Reputation.empty(ReputationConfig(exclude_after_rows=24))
    for round_ in range(3):
        groups = _groups("honest", True) + _groups("liar", False)
        scored, problems = score_groups(groups, RewardConfig())
        reputation.update(evidence(groups, scored, problems))
        assert reputation.excluded() == ([] if round_ == 0 else ["liar"])  # 12 rows, then 24
    assert reputation.bad_share("honest") < 0.1
    assert reputation.known() == ["honest"]  # 24 judged rows, over min_rows
    again = Reputation.from_json(reputation.to_json(), ReputationConfig(exclude_after_rows=24))
    assert again.peers == reputation.peers and again.excluded() == ["liar"]


def test_rows_refused_for_the_receivers_own_reasons_are_not_evidence_at_all() -> None:
    # An honest specialist's groups of a task this node neither trains nor is evaluated on,
    # and groups left when the round's budget ran out: nothing for or against their peer.
    other = TaskConfig(specs=(TaskSpec(name="products", config={"max_terms": 2}),))
    groups = []
    for k, q in enumerate(TaskSource(other, seed=5).draw(0, 3)):
        rows = [_row(q, "specialist", j, f"<answer>{q.answer}</answer>", 1.0) for j in range(2)]
        groups.append(Group(f"sw.specialist.r0.g{k}", "external", tuple(rows)))
    bounds = ConfigBounds.for_node(EASY, None, 1000.0)
    scored, problems = score_groups(groups, RewardConfig(), bounds)
    assert scored == [] and len(problems) == 6
    assert evidence(groups, scored, problems) == {}
    spent = RewardConfig(verify_budget_s=1e-9)
    scored, problems = score_groups(_groups("late", True), spent, clock=iter(range(100)).__next__)
    assert all("verification budget" in p for p in problems)
    assert evidence(_groups("late", True), scored, problems) == {}


def _unjudged_group(node: str, slot: int, rows: int = 256) -> Group:
    """A group of a task the receiver does not train (so its verifier cannot judge it)."""
    other = TaskConfig(specs=(TaskSpec(name="products", config={"max_terms": 2}),))
    q = TaskSource(other, seed=slot).draw(0, 1)[0]
    made = [_row(q, node, j, f"<answer>{q.answer}</answer>", 1.0) for j in range(rows)]
    return Group(made[0].group_id, "external", tuple(made))


def _tampered(node: str, slot: int, rows: int = 4) -> Group:
    """A group of a task the receiver trains whose shipped answer is not the real one."""
    q = dataclasses.replace(TaskSource(EASY, seed=slot).draw(0, 1)[0], answer="-1")
    made = [_row(q, node, j, "<answer>-1</answer>", 1.0) for j in range(rows)]
    return Group(made[0].group_id, "external", tuple(made))


def test_a_sybil_cannot_become_known_on_rows_the_receiver_cannot_judge() -> None:
    # Issue 43: a 256-row group of an untrained task made a Sybil "known" after one draw,
    # and its later tampered groups were diluted below the exclusion line.
    reputation = Reputation.empty()
    bounds = ConfigBounds.for_node(EASY, None, 1000.0)
    warm_up = [_unjudged_group("sybil", k) for k in range(4)]
    scored, problems = score_groups(warm_up, RewardConfig(), bounds)
    reputation.update(evidence(warm_up, scored, problems))
    assert reputation.known() == [] and "sybil" not in reputation.peers
    for round_ in range(2):
        bad = [_tampered("sybil", round_)]  # one group a round, its answer tampered
        scored, problems = score_groups(bad, RewardConfig(), bounds)
        reputation.update(evidence(bad, scored, problems))
    assert reputation.excluded() == ["sybil"] and reputation.known() == []


def test_a_good_past_does_not_buy_a_bad_present() -> None:
    # 1,000 honest rows, then tampered groups: recent verdicts weigh most, so the peer is
    # excluded within about two half-lives of bad rows (counting all rows alike, it would
    # take 1,000 bad rows).
    reputation = Reputation.empty()
    reputation.update({"turncoat": PeerEvidence(rows=1000)})
    assert reputation.known() == ["turncoat"]
    bad_rows = 0
    while not reputation.excluded():
        reputation.update({"turncoat": PeerEvidence(rows=4, failed=4)})
        bad_rows += 4
        assert bad_rows <= 2 * ReputationConfig().half_life_rows
    assert reputation.excluded() == ["turncoat"] and reputation.known() == []


def test_misclaims_alone_never_exclude_a_peer_nor_make_it_known() -> None:
    # A peer with another verifier setting misclaims every row: not excluded for it; but
    # the draw filters on claimed rewards, so it is not trusted with them either.
    reputation = Reputation.empty()
    for _ in range(50):
        reputation.update({"other-verifier": PeerEvidence(rows=4, misclaimed=4)})
        reputation.update({"honest": PeerEvidence(rows=4)})
    assert reputation.excluded() == [] and reputation.known() == ["honest"]


def test_a_reputation_saved_before_version_2_still_loads() -> None:
    old = {"peers": {"liar": {"rows": 20, "failed": 12, "misclaimed": 0}, "ok": {"rows": 20}}}
    reputation = Reputation.from_json(old)
    assert reputation.excluded() == ["liar"] and reputation.known() == ["ok"]
    # An old record's rows (unjudged ones among them) buy no longer a credit than new ones.
    veteran = Reputation.from_json({"peers": {"v": {"rows": 10_000}}})
    bad_rows = 0
    while not veteran.excluded():
        veteran.update({"v": PeerEvidence(rows=4, failed=4)})
        bad_rows += 4
    assert bad_rows <= 2 * ReputationConfig().half_life_rows
