"""A hand-made experiment of replicates whose statistics are worked out by hand: its ledger
(rollouts, held-out evaluations and training logs) and its experiment file, shared by the
statistics tests (test_replicates.py) and the run-record tests (test_records.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import polars as pl

from analysis.records import records_from_ledger
from analysis.replicates import ReplicateTables, tables_from_records
from ledger import Ledger
from tests.factories import round_rows

BASE, SHARED = "2/0", "1/1"
SEEDS = (0, 1, 2)
NODES = ("n0", "n1")
# Own-completion group rewards per (configuration, seed, node): one group per round, two
# rounds. Baseline: 0.25 each round -> each node's cumulative 0.5. Shared: 0.5 + 0.5
# (seeds 0, 1) and 0.25 + 0.25 (seed 2) -> 1.0, 1.0, 0.5; node n0 of seed 0 earns nothing in
# round 0 and everything in round 1 (0 + 1 = 1.0 too): a discovery after a peer's group.
QUARTER, HALF = [1.0, 0.0, 0.0, 0.0], [1.0, 1.0, 0.0, 0.0]


def own(conf: str, seed: int, node: str, round_: int) -> list[float]:
    if conf == BASE:
        return QUARTER
    if seed == 0 and node == "n0":
        return [0.0] * 4 if round_ == 0 else [1.0] * 4
    return HALF if seed < 2 else QUARTER


def swarm(conf: str, seed: int) -> str:
    return f"x-{conf.replace('/', 'x')}-s{seed}"


def eval_rows(accuracy: float) -> list[dict[str, object]]:
    return [
        {"task": task, "questions": 4, "completions": 4, "correct": 4 * accuracy,
         "accuracy": accuracy, "policy_version": 0, "eval_seed": 99}
        for task in ("basic_arithmetic", "gcd")
    ]  # fmt: skip


def training_row(
    group_id: str, origin: str, peer: str, informative: bool, drift: dict[str, object]
) -> dict[str, object]:
    return {"group_id": group_id, "origin": origin, "peer_node_id": peer,
            "task": "basic_arithmetic", "completions": 4,
            "reward_mean": 0.5 if informative else 0.0,
            "informative": informative, "trained": informative, **drift}  # fmt: skip


def drift(origin: str, seed: int, node: str, round_: int) -> dict[str, object]:
    """How far each group's generator was: own rows exact (n1's within 1e-6); a peer's row
    of n0 10 tokens in round 0 and 20 in round 1, of n1 three times as many, at KL 0.1 (s + 1)
    for n0 and 0.3 (s + 1) for n1, ratios of mean 1 and mean square 2 (n0) or 4 (n1), 10% or
    30% of them over the cap. Per seed and round, over both nodes: KL (1 x 0.1 + 3 x 0.3) / 4
    (s + 1) = 0.25 (s + 1) (a plain mean of the nodes would give 0.2), 25% over the cap; the
    ESS fraction of n0's update 1^2 / 2 = 1/2, of n1's 1/4, weighted by tokens 5/16 (pooling
    both nodes' ratios as one batch would give 2/7, averaging the two 3/8)."""
    first = node == "n0"
    if origin == "local":
        kl, square, capped = (0.0 if first else 1e-6), 1.0, 0.0
    else:
        kl, square, capped = (
            (0.1 if first else 0.3) * (seed + 1),
            (2.0 if first else 4.0),
            (0.1 if first else 0.3),
        )
    tokens = 10 * (round_ + 1) * (1 if first or origin == "local" else 3)
    return {"drift_tokens": tokens, "drift_kl": kl, "drift_weight_mean": 1.0,
            "drift_weight_sq_mean": square, "drift_capped": capped}  # fmt: skip


def replicate_ledger(root: Path) -> Ledger:
    """The hand-made ledger: 2/0 and 1/1 over seeds 0-2, two nodes, two rounds, evaluated
    at rounds 0 and 2 (held-out accuracy 0.125, then 0.25 alone and 0.5 sharing)."""
    led = Ledger.open(str(root))
    for conf in (BASE, SHARED):
        for seed in SEEDS:
            sid = swarm(conf, seed)
            for node in NODES:
                for r in (0, 1):
                    led.publish(round_rows(node, r, [own(conf, seed, node, r)], swarm_id=sid))
                    peer = "n1" if node == "n0" else "n0"
                    rows = [
                        training_row(
                            f"{sid}.{node}.r{r}.g0",
                            "local",
                            node,
                            not (conf == SHARED and seed == 0 and node == "n0" and r == 0),
                            drift("local", seed, node, r),
                        )
                    ]
                    if conf == SHARED:
                        peers = drift("external", seed, node, r)
                        group = f"{sid}.{peer}.r{r}.g0"
                        rows.append(training_row(group, "external", peer, True, peers))
                    led.write_training(sid, node, r, rows)
                led.write_evaluation(sid, node, 0, eval_rows(0.125))
                led.write_evaluation(sid, node, 2, eval_rows(0.25 if conf == BASE else 0.5))
    return led


def mini_experiment(workdir: Path) -> dict[str, Any]:
    """The experiment whose runs the ``ledger`` fixture holds (under ``workdir``)."""
    return {
        "experiment": "x", "workdir": str(workdir), "seeds": list(SEEDS),
        "swarm": {"rounds": 2, "node_count": 2, "tracking": {"enabled": False},
                  "defaults": {"model": "some/model", "evaluation": {"every": 2}}},
        "configurations": [{"local_groups": 2, "external_groups": 0},
                           {"local_groups": 1, "external_groups": 1}],
    }  # fmt: skip


def replicate_tables(
    query: Any,
    replicates: dict[str, tuple[str, int]],
    *,
    baseline: str,
    rounds: int,
    nodes: int | None = None,
    update_seconds: pl.DataFrame | None = None,
) -> ReplicateTables:
    """The experiment's statistics from ledger SQL, as the sweep's report makes them
    (flows/experiments/records.py: records from the ledger, then tables from records)."""
    records = records_from_ledger(query, replicates, update_seconds=update_seconds)
    return tables_from_records(records, baseline=baseline, rounds=rounds, nodes=nodes)
