"""Peers that compute offline where their rows land (issue 57), for tests and
``benchmarks/receiver_attacks.py``.

Everything main at c073e2c hashed to order a draw was public: the receiver's id, its seed
(written in its manifest and sample log) and the round. So a Sybil could grind its group ids
(``ground_group_id``) or its node id (``ground_node_ids``) against ``public_place``, the
order of c073e2c's `paper` and `fresh` draws, and a copier could name a padding row so that
the receiver's public seed cut it (``padded_copy``). The receiver here draws as a node does
now (tests.peer_rounds.receiver_round: keyed by its secret); the attackers still compute
what c073e2c would have done, which is all they can compute.
"""

from __future__ import annotations

import dataclasses
import random
from typing import Any

import duckdb

from sapo_core.reputation import Reputation
from sapo_core.tasks import TaskSource
from tests.peer_rounds import (
    HONEST,
    RECEIVER,
    RECEIVER_SECRET,
    TASKS,
    _tagged,
    receiver_round,
    rollout_records,
)

PUBLIC_PLACE = "hash(xor(hash({x}), hash(concat_ws('/', $receiver, $seed))))"
"""Where ``x`` (a group id, or a peer's node id under `fresh`) fell in c073e2c's draw for
``$receiver`` with ``$seed``: lower first. Public: anyone can compute it."""


def ground_group_id(node: str, round_: int, receiver: str = "me", nonces: int = 32_768) -> str:
    """Of ``nonces`` group ids for ``node``'s group of ``round_``, the one c073e2c's `paper`
    draw (receiver seed = round) puts first: a Sybil's offline grinding."""
    place = PUBLIC_PLACE.format(x="gid")
    found = duckdb.sql(
        f"SELECT arg_min(gid, {place}) FROM (SELECT concat('sw.', $node, '.r', $round, '.n', "
        "i) AS gid FROM range($nonces) t(i))",
        params={"node": node, "round": round_, "nonces": nonces, "receiver": receiver,
                "seed": round_},
    ).fetchone()  # fmt: skip
    assert found is not None
    return str(found[0])


def ground_node_ids(
    rivals: tuple[str, ...], rounds: int, count: int = 2, candidates: int = 60_000
) -> list[str]:
    """``count`` node ids that c073e2c's `fresh` peer order puts before every one of
    ``rivals`` in each of the receiver's first ``rounds`` rounds (seed = round): Sybils'
    ids ground before they register."""
    place = PUBLIC_PLACE.format(x="node")
    rival = PUBLIC_PLACE.format(x="r")
    found = duckdb.sql(
        f"""WITH ids AS (SELECT concat('sy', i) AS node FROM range($n) t(i)),
        seeds AS (SELECT s FROM range($rounds) t(s))
        SELECT node FROM ids, seeds
        GROUP BY node
        HAVING bool_and({place.replace("$seed", "s")} < (
            SELECT min({rival.replace("$seed", "s")}) FROM unnest($rivals) u(r)))
        ORDER BY node LIMIT $count""",
        params={"n": candidates, "rounds": rounds, "count": count, "rivals": list(rivals),
                "receiver": "me"},
    ).fetchall()  # fmt: skip
    ids = [str(r[0]) for r in found]
    assert len(ids) == count, f"only {len(ids)} ground ids among {candidates}"
    return ids


def honest_round(
    led: Any, round_: int, groups: int, nodes: tuple[str, ...] = HONEST, seeds: int = 100
) -> None:
    """Each of ``nodes`` publishes ``groups`` verifiable, informative groups of its own
    questions (task seeds from ``seeds``)."""
    for k, node in enumerate(nodes):
        for q in TaskSource(TASKS, seed=seeds + k).draw(round_, groups):
            texts = _tagged([q.answer, "-1", q.answer, "-1"])
            led.publish(rollout_records(node, round_, q, texts, [1, 0, 1, 0]))


def sybil_group(led: Any, node: str, round_: int, k: int, group_id: str | None = None) -> None:
    """One verifiable, informative group of Sybil ``node`` (under ``group_id`` if given)."""
    q = TaskSource(TASKS, seed=300 + k).draw(round_, 1)[0]
    rows = rollout_records(node, round_, q, _tagged([q.answer, "-1", q.answer, "0"]), [1, 0, 1, 0])
    if group_id is not None:
        rows = [r | {"group_id": group_id, "rollout_id": f"{group_id}.c{j}"} for j, r in
                enumerate(rows)]  # fmt: skip
    led.publish(rows)


@dataclasses.dataclass
class Outcome:
    """What peers got of a receiver's draws over some rounds."""

    drawn: int = 0
    """Groups the receiver drew."""
    by_attackers: int = 0
    """Of them, the attackers'."""
    honest_rows: int = 0
    """Rows of honest peers the receiver's verifier judged."""
    trained_rounds: int = 0
    """Rounds in which an attacker's group would be trained on (judged informative)."""

    @property
    def share(self) -> float:
        return self.by_attackers / max(self.drawn, 1)


def _tally(out: Outcome, groups: list[Any], judged: Any, attackers: set[str]) -> None:
    out.drawn += len(groups)
    out.by_attackers += sum(g.rollouts[0].node_id in attackers for g in groups)
    out.honest_rows += sum(e.rows for p, e in judged.evidence.items() if p in HONEST)
    out.trained_rounds += any(
        g.group.rollouts[0].node_id in attackers and len(set(g.rewards)) > 1 for g in judged.scored
    )


def ground_group_ids_attack(
    led: Any, policy: Any, rounds: int, *, ground: bool, secret: bytes = RECEIVER_SECRET
) -> Outcome:
    """Two Sybils publish one verifiable group a round each (ids ground against the public
    draw, or ordinary ones); two honest peers four each; the receiver draws J = 2."""
    reputation = Reputation.empty(RECEIVER.reputation)
    out = Outcome()
    for round_ in range(rounds):
        honest_round(led, round_, 4)
        for k, node in enumerate(("s1", "s2")):
            gid = ground_group_id(node, round_) if ground else None
            sybil_group(led, node, round_, k, gid)
        groups, judged = receiver_round(led, reputation, policy, round_, secret=secret)
        _tally(out, groups, judged, {"s1", "s2"})
    return out


def ground_node_ids_attack(
    led: Any, policy: Any, rounds: int, *, ground: bool, secret: bytes = RECEIVER_SECRET
) -> Outcome:
    """Two Sybils, their node ids ground against c073e2c's `fresh` peer order (or ordinary
    ones), publish like the two honest peers: two verifiable groups a round each."""
    sybils = ground_node_ids(HONEST, rounds) if ground else ["sy1", "sy2"]
    reputation = Reputation.empty(RECEIVER.reputation)
    out = Outcome()
    for round_ in range(rounds):
        honest_round(led, round_, 2)
        honest_round(led, round_, 2, tuple(sybils), seeds=300)
        groups, judged = receiver_round(led, reputation, policy, round_, secret=secret)
        _tally(out, groups, judged, set(sybils))
    return out


def padded_copy(
    rows: list[dict[str, Any]], copier: str, round_: int, tag: str
) -> list[dict[str, Any]]:
    """``rows`` (one of the receiver's groups) republished by ``copier`` with one padding row,
    its ids named so that the padding sorts to the row c073e2c's receiver cut dropped (its
    seed ``<node seed>/<round>/external`` is public): the rows kept are the receiver's own."""
    gid = f"sw.{copier}.r{round_}.p{tag}"
    size = RECEIVER.generation.completions_per_question
    seed = f"{RECEIVER.seed}/{round_}/external"
    kept = random.Random(f"{seed}/{gid}").sample(range(len(rows) + 1), size)
    [dropped] = set(range(len(rows) + 1)) - set(kept)
    # Own rows as c1, c3, ...; the padding as c0, c2, ... at the dropped place: ids sort so.
    own = iter(rows)
    out = []
    for place in range(len(rows) + 1):
        if place == dropped:
            text, claim = f"<answer>padding {tag}</answer>", 0.0
        else:
            row = next(own)
            text, claim = row["completion"], row["reward"]
        out.append(rows[0] | {"group_id": gid, "rollout_id": f"{gid}.c{place}",
                              "node_id": copier, "completion": text, "reward": claim})  # fmt: skip
    return out


def padded_copies_attack(led: Any, policy: Any, rounds: int, *, fresh: bool) -> Outcome:
    """Each round the receiver publishes two groups and an honest peer one; a copier that
    generates nothing republishes the receiver's groups, each padded with one row (under
    `fresh`: its round-0 group, padded anew each round)."""
    reputation = Reputation.empty(RECEIVER.reputation)
    out = Outcome()
    first: list[dict[str, Any]] = []
    for round_ in range(rounds):
        mine = []
        for q in TaskSource(TASKS, seed=7).draw(round_, 2):
            texts = _tagged([q.answer, "-1", q.answer, "0"])
            mine.append(rollout_records("me", round_, q, texts, [1, 0, 1, 0]))
        for rows in mine:
            led.publish(rows)
        first = first or mine[0]
        honest_round(led, round_, 1, HONEST[:1])
        targets = [first] if fresh else mine
        for k, rows in enumerate(targets):
            led.publish(padded_copy(rows, "cp", round_, f"{round_}x{k}"))
        groups, judged = receiver_round(led, reputation, policy, round_)
        _tally(out, groups, judged, {"cp"})
    return out
