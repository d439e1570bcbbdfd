"""Peers that compute offline where their rows land (issue 57): rows of
``benchmarks/receiver_attacks.py``, which runs each in a fresh receiver process and prints
it beside the others.

- ``sybils-ground-ids-paper`` / ``-fresh`` (issue 57): two Sybils publish one verifiable
  group a round each, its group id ground offline (32k nonces) against c073e2c's public
  `paper` draw; or, under `fresh`, publish like the two honest peers with node ids ground
  so that c073e2c's peer order put them first for 8 rounds. Against the same Sybils with
  ordinary ids, over 8 receiver secrets. Target: the ground Sybils' share of J within 0.15
  of the ordinary ones', honest peers' judged rows not fewer.
- ``padded-copies-paper`` / ``-fresh`` (issue 57): a copier republishes the receiver's own
  group plus one padding row, named for the row c073e2c's public seed dropped. Target:
  trained on in no round.

    python benchmarks/receiver_attacks.py --only sybils-ground-ids-paper \
        sybils-ground-ids-fresh padded-copies-paper padded-copies-fresh
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

GROUND_SECRETS = 8
"""Receiver secrets each ground-id attack runs under (its outcome varies with the key)."""


def ground_ids(policy: str) -> Callable[[Any], dict[str, Any]]:
    """Issue 57: two Sybils whose ids were ground offline against c073e2c's public draw
    (group ids under `paper`, node ids under `fresh`), against the same Sybils with ordinary
    ids, over several receiver secrets."""

    def attack(site: Any) -> dict[str, Any]:
        from ledger import parse_policy
        from tests.grinding import Outcome, ground_group_ids_attack, ground_node_ids_attack

        run, rounds = (
            (ground_group_ids_attack, 10) if policy == "paper" else (ground_node_ids_attack, 8)
        )
        totals = {True: Outcome(), False: Outcome()}
        for k in range(GROUND_SECRETS):
            for ground in (True, False):
                led = site.sibling(f"{'ground' if ground else 'plain'}-{k}").open()
                out = run(led, parse_policy(policy), rounds, ground=ground,
                          secret=f"receiver secret {k}".encode())  # fmt: skip
                total = totals[ground]
                total.drawn += out.drawn
                total.by_attackers += out.by_attackers
                total.honest_rows += out.honest_rows
        ground, plain = totals[True], totals[False]
        wrong = int(ground.share > plain.share + 0.15) + int(ground.honest_rows < plain.honest_rows)
        return {
            "wrong": wrong,
            "extra": f"Sybils' share of J: ground ids {ground.share:.0%}, ordinary "
            f"{plain.share:.0%}; honest peers' judged rows: {ground.honest_rows} vs "
            f"{plain.honest_rows} "
            f"({GROUND_SECRETS} receiver secrets x {rounds} rounds, J = 2)",
        }

    return attack


def padded_copies(policy: str) -> Callable[[Any], dict[str, Any]]:
    """Issue 57: a copier republishes the receiver's own group with one padding row, named
    for the row c073e2c's public seed dropped (under `fresh`: its round-0 group padded
    anew each round); 6 rounds of the receiver's real draw, verifier and reputation."""

    def attack(site: Any) -> dict[str, Any]:
        from ledger import parse_policy
        from tests.grinding import padded_copies_attack

        out = padded_copies_attack(site.open(), parse_policy(policy), 6, fresh=policy == "fresh")
        return {
            "wrong": out.trained_rounds,
            "extra": f"padded copies drawn {out.by_attackers} of {out.drawn} groups; rounds "
            f"trained on them: {out.trained_rounds} of 6",
        }

    return attack


STEERING: dict[str, Callable[[Any], dict[str, Any]]] = {
    "sybils-ground-ids-paper": ground_ids("paper"),
    "sybils-ground-ids-fresh": ground_ids("fresh"),
    "padded-copies-paper": padded_copies("paper"),
    "padded-copies-fresh": padded_copies("fresh"),
}
