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

import dataclasses
import math
from datetime import timedelta
from typing import Any

from ledger import FreshPolicy
from sapo_core.config import GenerationConfig, NodeConfig, TaskConfig, TaskSpec
from sapo_core.peers import judge_peers, judged_tasks
from sapo_core.reputation import Reputation
from sapo_core.rollouts import Rollout, from_records, group_rollouts
from sapo_core.tasks import Question, TaskSource
from tests.factories import T0

TASKS = TaskConfig(specs=(TaskSpec(name="chain_sum", config={"min_terms": 2, "max_terms": 2}),))
OTHER = TaskConfig(specs=(TaskSpec(name="products", config={"max_terms": 2}),))
RECEIVER = NodeConfig(
    node_id="me",
    tasks=TASKS,
    generation=GenerationConfig(completions_per_question=4),
    local_groups=2,
    external_groups=2,
)
HONEST, SYBILS = ("h1", "h2"), ("s1", "s2")


def _rows(node: str, round_: int, q: Question, answers: list[str], claims: list[float]) -> list:
    group_id = f"sw.{node}.r{round_}.q0"
    stamp = T0 + timedelta(minutes=round_, seconds=59 if node in SYBILS else 0)
    return [
        Rollout(
            rollout_id=f"{group_id}.c{k}",
            group_id=group_id,
            node_id=node,
            model_id="m",
            node_round=round_,
            policy_version=round_,
            question=q,
            completion=f"<answer>{answer}</answer>",
            completion_tokens=4,
            reward=claim,
        ).to_record()
        | {"swarm_id": "sw", "published_at": stamp}
        for k, (answer, claim) in enumerate(zip(answers, claims, strict=True))
    ]


def _publish_round(led: Any, round_: int) -> None:
    for k, node in enumerate(HONEST):
        q = TaskSource(TASKS, seed=100 + k).draw(round_, 1)[0]
        led.publish(_rows(node, round_, q, [q.answer, "-1", q.answer, "-1"], [1, 0, 1, 0]))
    for k, node in enumerate(SYBILS):
        if round_ == 0:  # the warm-up: 256 rows the receiver cannot judge
            q = TaskSource(OTHER, seed=200 + k).draw(0, 1)[0]
            led.publish(_rows(node, 0, q, [q.answer] * 256, [1.0, 0.0] * 128))
        else:  # then only tampered answers, claimed informative
            q = TaskSource(TASKS, seed=300 + k).draw(round_, 1)[0]
            bad = dataclasses.replace(q, answer="-1")
            led.publish(_rows(node, round_, bad, ["-1", "0", "-1", "0"], [1, 0, 1, 0]))


def test_sybils_get_no_more_than_the_unknown_budget_and_are_excluded(site):
    led = site.open()
    reputation = Reputation.empty(RECEIVER.reputation)
    policy = FreshPolicy()
    unknown_cap = math.ceil(policy.max_unknown_share * RECEIVER.external_groups)
    drawn_by_round = []
    for round_ in range(8):
        _publish_round(led, round_)
        known, excluded = reputation.known(), reputation.excluded()
        frame = led.sample(
            "me",
            RECEIVER.external_groups,
            policy,
            seed=round_,
            swarm_id="sw",
            exclude_nodes=excluded,
            known_nodes=known or None,
            for_round=round_,
            tasks=judged_tasks(RECEIVER),
        )
        led.write_sample("sw", "me", round_, frame, policy="fresh", seed=round_)
        rows, dropped = from_records(frame.iter_rows(named=True))
        groups = group_rollouts(rows, "external")
        assert dropped == 0 and all(g.question.task == "chain_sum" for g in groups)
        judged = judge_peers(groups, RECEIVER, round_)
        reputation.update(judged.evidence)
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
