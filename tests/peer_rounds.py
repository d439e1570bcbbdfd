"""Peers' rounds against one receiver (issue 43), for tests and ``benchmarks/receiver_attacks.py``:
real reasoning-gym questions published as ledger rows, the Sybils' laundering round, and one
round of the receiver's real draw, verifier and reputation (what flows/node/steps.py's
``sample`` and ``reward`` do, without a model)."""

from __future__ import annotations

import dataclasses
from collections import Counter
from datetime import datetime, timedelta
from typing import Any

from ledger.draws import round_draw_key
from sapo_core.config import GenerationConfig, NodeConfig, TaskConfig, TaskSpec
from sapo_core.peers import JudgedPeers, judge_peers, judged_tasks
from sapo_core.reputation import Reputation
from sapo_core.rollouts import Group, Rollout, from_records, group_rollouts
from sapo_core.tasks import Question, TaskSource
from tests.factories import T0, copied, round_rows

TASKS = TaskConfig(specs=(TaskSpec(name="chain_sum", config={"min_terms": 2, "max_terms": 2}),))
OTHER = TaskConfig(specs=(TaskSpec(name="products", config={"max_terms": 2}),))
"""A task the receiver neither trains nor is evaluated on: it cannot judge its groups."""
RECEIVER = NodeConfig(
    node_id="me",
    tasks=TASKS,
    generation=GenerationConfig(completions_per_question=4),
    local_groups=2,
    external_groups=2,
)
"""The demo's settings: G = 4, I = 2, J = 2."""
HONEST, SYBILS = ("h1", "h2"), ("s1", "s2")


def rollout_records(
    node: str,
    round_: int,
    q: Question,
    completions: list[str],
    claims: list[float],
    *,
    published_at: datetime | None = None,
    model_id: str = "m",
) -> list[dict[str, Any]]:
    """One group of ``node``'s answers to ``q``, as the ledger rows a node publishes."""
    group_id = f"sw.{node}.r{round_}.q{q.task_index}"
    stamp = published_at or T0 + timedelta(minutes=round_)
    return [
        Rollout(
            rollout_id=f"{group_id}.c{k:03d}",
            group_id=group_id,
            node_id=node,
            model_id=model_id,
            node_round=round_,
            policy_version=round_,
            question=q,
            completion=text,
            completion_tokens=8,
            reward=claim,
        ).to_record()
        | {"swarm_id": "sw", "published_at": stamp}
        for k, (text, claim) in enumerate(zip(completions, claims, strict=True))
    ]


def _tagged(answers: list[str]) -> list[str]:
    return [f"<answer>{a}</answer>" for a in answers]


def publish_sybil_round(led: Any, round_: int) -> None:
    """The honest peers' group each, and the Sybils': at round 0 a 256-row group of a task
    the receiver cannot judge, then only groups whose shipped answer is tampered, claimed
    informative and stamped last (so that `fresh` would draw them first)."""
    stamp = T0 + timedelta(minutes=round_)
    for k, node in enumerate(HONEST):
        q = TaskSource(TASKS, seed=100 + k).draw(round_, 1)[0]
        texts = _tagged([q.answer, "-1", q.answer, "-1"])
        led.publish(rollout_records(node, round_, q, texts, [1, 0, 1, 0], published_at=stamp))
    later = stamp + timedelta(seconds=59)
    for k, node in enumerate(SYBILS):
        if round_ == 0:
            q = TaskSource(OTHER, seed=200 + k).draw(0, 1)[0]
            texts = _tagged([q.answer] * 256)
            led.publish(rollout_records(node, 0, q, texts, [1.0, 0.0] * 128, published_at=later))
        else:
            q = TaskSource(TASKS, seed=300 + k).draw(round_, 1)[0]
            bad = dataclasses.replace(q, answer="-1")
            texts = _tagged(["-1", "0", "-1", "0"])
            led.publish(rollout_records(node, round_, bad, texts, [1, 0, 1, 0], published_at=later))


def publish_copier_over_cap(led: Any) -> dict[str, set[str]]:
    """Honest peers ``o`` and ``p`` publish 3 groups each and copier ``cp`` all 6 (round 0
    and 1): the peers holding each content, by its digest."""
    for k, node in enumerate(("o", "p")):
        rows = round_rows(node, 0, [[1, 0] if node == "o" else [0, 1]] * 3)
        led.publish(rows)
        led.publish(copied(rows, "cp", k))
    holders: dict[str, set[str]] = {}
    for node, digest in led.query("SELECT node_id, content_digest FROM groups").iter_rows():
        holders.setdefault(digest, set()).add(node)
    return holders


def short_with_room(
    drawn: list[str], contents: list[str], holders: dict[str, set[str]], j: int, cap: int
) -> bool:
    """Whether a draw of ``j`` groups (``contents`` their digests) came back short although
    a peer with room under ``cap`` holds a content left out."""
    per_peer = Counter(g.split(".")[1] for g in drawn)
    left_out = set(holders) - set(contents)
    return len(drawn) < j and any(per_peer[n] < cap for c in left_out for n in holders[c])


def drawn_groups(frame: Any) -> list[Group]:
    """A drawn frame's rows as groups (every row converted: the tests' rows are well formed)."""
    rows, dropped = from_records(frame.iter_rows(named=True))
    assert dropped == 0
    return group_rollouts(rows, "external")


RECEIVER_SECRET = b"the receiver's draw secret, known to no peer"
"""What keys the receiver's draws, as a node's key does (NodeKey.draw_secret)."""


def receiver_round(
    led: Any,
    reputation: Reputation,
    policy: Any,
    round_: int,
    receiver: NodeConfig = RECEIVER,
    secret: bytes = RECEIVER_SECRET,
) -> tuple[list[Group], JudgedPeers]:
    """One round of the receiver's draw as a node makes it (flows/node/steps.py
    ``draw_request``: keyed by its ``secret``, excluded and known peers from
    ``reputation``, only tasks it judges, at most its group size of each group), its sample
    log, and its verdicts, added to ``reputation``: the groups drawn and what judging them
    showed."""
    known = reputation.known()
    frame = led.sample(
        receiver.node_id,
        receiver.external_groups,
        policy,
        seed=round_,
        swarm_id="sw",
        exclude_nodes=reputation.excluded(),
        known_nodes=known or None,
        standing=reputation.standing(),
        for_round=round_,
        tasks=judged_tasks(receiver),
        draw_key=round_draw_key(secret, "sw", receiver.node_id, round_),
        rows_per_group=receiver.generation.completions_per_question,
    )
    led.write_sample("sw", receiver.node_id, round_, frame, policy=policy.kind, seed=round_)
    groups = drawn_groups(frame)
    judged = judge_peers(groups, receiver, round_)
    reputation.update(judged.evidence)
    return groups, judged
