"""A receiver's reputation of its peers, from its own verifier (sapo_core/reputation.py)."""

from __future__ import annotations

import dataclasses

from sapo_core.config import RewardConfig, TaskConfig, TaskSpec
from sapo_core.reputation import PeerEvidence, Reputation, evidence
from sapo_core.rewards import score_groups
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
    reputation = Reputation.empty(min_rows=24)
    for round_ in range(3):
        groups = _groups("honest", True) + _groups("liar", False)
        scored, problems = score_groups(groups, RewardConfig())
        reputation.update(evidence(groups, scored, problems))
        assert reputation.excluded() == ([] if round_ == 0 else ["liar"])  # 12 rows, then 24
    assert reputation.bad_share("honest") < 0.1
    again = Reputation.from_json(reputation.to_json(), min_rows=24)
    assert again.peers == reputation.peers and again.excluded() == ["liar"]


def test_rows_refused_for_the_receivers_own_reasons_are_not_held_against_the_peer() -> None:
    # An honest specialist's groups of a task this node neither trains nor is evaluated on,
    # and groups left when the round's budget ran out: no evidence against their peer.
    from sapo_core.rewards import ConfigBounds

    other = TaskConfig(specs=(TaskSpec(name="products", config={"max_terms": 2}),))
    groups = []
    for k, q in enumerate(TaskSource(other, seed=5).draw(0, 3)):
        rows = [_row(q, "specialist", j, f"<answer>{q.answer}</answer>", 1.0) for j in range(2)]
        groups.append(Group(f"sw.specialist.r0.g{k}", "external", tuple(rows)))
    bounds = ConfigBounds.for_node(EASY, None, 1000.0)
    scored, problems = score_groups(groups, RewardConfig(), bounds)
    assert scored == [] and len(problems) == 6
    assert evidence(groups, scored, problems)["specialist"] == PeerEvidence(rows=6)
    spent = RewardConfig(verify_budget_s=1e-9)
    scored, problems = score_groups(_groups("late", True), spent, clock=iter(range(100)).__next__)
    assert all("verification budget" in p for p in problems)
    assert evidence(_groups("late", True), scored, problems)["late"].failed == 0
