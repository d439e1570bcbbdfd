"""Run records: the few kilobytes of a finished run that an experiment's statistics need.

A sweep of many hours outlives the machine it started on: the ledger, the MLflow store and
the checkpoints are gigabytes on one disk, and a replaced machine loses them. What the
paired-seed statistics read from them is small: the per-node-round rows, the discoveries,
each node's model, the peer groups it trained on, the held-out questions the run also
trained on and how far each generator was from each node (peers' drift, from version 3). A
run record holds exactly that, as CSV files in one folder per run
(``<records>/<swarm_id>/``), meant to be committed as each run finishes. The statistics are
computed from records alone, so a report can combine runs done on different machines, and
a sweep skips a run whose record exists (flows/experiments/flow.py).

Here, the tables and how a ledger gives them; their folders on disk (written whole, read
back refusing any damage, replaced without losing what the old one knew) are
analysis/record_folders.py.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, fields
from typing import Any

import polars as pl
from polars.datatypes import DataTypeClass

import dashboards

Query = Callable[[str], pl.DataFrame]  # ledger SQL -> rows (Ledger.query)
Schema = dict[str, DataTypeClass | pl.DataType]

NODE_ROUNDS: Schema = {
    "swarm_id": pl.String, "configuration": pl.String, "seed": pl.Int64,
    "node_id": pl.String, "node_round": pl.Int64, "claimed_reward": pl.Float64,
    "tokens_generated": pl.Int64, "informative_trained": pl.Int64,
    "informative_local": pl.Int64, "informative_external": pl.Int64,
    "training_reward": pl.Float64, "tokens_trained": pl.Int64, "accuracy": pl.Float64,
    "seconds_update": pl.Float64,
}  # fmt: skip
DISCOVERIES: Schema = {
    "swarm_id": pl.String, "configuration": pl.String, "seed": pl.Int64,
    "node_id": pl.String, "task": pl.String, "first_drawn": pl.Int64,
    "first_round": pl.Int64, "rounds_seen": pl.Int64, "peer_groups_before": pl.Int64,
    "from_peers": pl.String,
}  # fmt: skip
MODELS: Schema = {"swarm_id": pl.String, "node_id": pl.String, "model_id": pl.String}
PEER_GROUPS: Schema = {
    "swarm_id": pl.String, "node_id": pl.String, "node_round": pl.Int64,
    "group_id": pl.String, "peer_node_id": pl.String,
}  # fmt: skip
HELDOUT_SEEN: Schema = {"swarm_id": pl.String, "task": pl.String, "question": pl.String}
# Per run, node, round and generator (the node itself for its own rows): the token-weighted
# means of the `trainings` log's drift_* columns, so that any pooling of them is exact.
DRIFT: Schema = {
    "swarm_id": pl.String, "node_id": pl.String, "node_round": pl.Int64,
    "peer_node_id": pl.String, "origin": pl.String, "tokens": pl.Int64, "kl": pl.Float64,
    "weight_mean": pl.Float64, "weight_sq_mean": pl.Float64, "capped": pl.Float64,
}  # fmt: skip
SCHEMAS: dict[str, Schema] = {
    "node_rounds": NODE_ROUNDS, "discoveries": DISCOVERIES, "models": MODELS,
    "peer_groups": PEER_GROUPS, "heldout_seen": HELDOUT_SEEN, "drift": DRIFT,
}  # fmt: skip
SINCE_VERSION = {"drift": 3}  # tables a record of an earlier version does not have


@dataclass
class RunRecords:
    """Every table the statistics read, for one run or many (a `swarm_id` column each)."""

    node_rounds: pl.DataFrame  # per run, node and round (node_rounds below)
    discoveries: pl.DataFrame  # per run, node and task: first rewarded round
    models: pl.DataFrame  # per run and node: the model its manifest declares
    peer_groups: pl.DataFrame  # per run, node and round: peers' groups it trained on
    heldout_seen: pl.DataFrame  # per run: held-out questions it also generated for training
    drift: pl.DataFrame  # per run, node, round and generator: peers' drift (empty before v3)

    def swarm_ids(self) -> list[str]:
        return sorted(set(self.node_rounds["swarm_id"].to_list()))

    def only(self, swarm_ids: Iterable[str]) -> RunRecords:
        keep = pl.Series(list(swarm_ids), dtype=pl.String).implode()
        return RunRecords(
            **{
                f.name: getattr(self, f.name).filter(pl.col("swarm_id").is_in(keep))
                for f in fields(self)
            }
        )

    @staticmethod
    def concat(parts: Iterable[RunRecords]) -> RunRecords:
        parts = list(parts)
        return RunRecords(
            **{
                name: pl.concat([getattr(p, name) for p in parts], how="vertical")
                if parts
                else pl.DataFrame(schema=schema)
                for name, schema in SCHEMAS.items()
            }
        )


def _conform(frame: pl.DataFrame, schema: Schema) -> pl.DataFrame:
    """``frame`` with exactly ``schema``'s columns and types (absent ones null)."""
    return frame.select(
        (pl.col(c) if c in frame.columns else pl.lit(None)).cast(t).alias(c)
        for c, t in schema.items()
    )


def runs_frame(replicates: dict[str, tuple[str, int]]) -> pl.DataFrame:
    return pl.DataFrame(
        [(s, c, seed) for s, (c, seed) in replicates.items()],
        schema={"swarm_id": pl.String, "configuration": pl.String, "seed": pl.Int64},
        orient="row",
    )


def node_rounds(
    query: Query, runs: pl.DataFrame, update_seconds: pl.DataFrame | None = None
) -> pl.DataFrame:
    """Per run, node and round: own reward, training reward, held-out accuracy where
    evaluated, the informative groups trained (own and from peers), and compute: tokens
    generated and trained on, and (from ``update_seconds``, MLflow's ``seconds_update``
    per swarm_id, node_id and node_round, when given) the update's seconds."""
    keys = ["swarm_id", "node_id", "node_round"]
    rewards = query(dashboards.query("reward_per_node_round")).select(
        *keys, "claimed_reward", "tokens_generated"
    )
    trained = query(dashboards.query("training_compute")).select(
        *keys, "training_reward", "tokens_trained"
    )
    accuracy = query(dashboards.query("heldout_accuracy")).select(*keys, "accuracy")
    informative = query(dashboards.query("informative_groups")).select(
        *keys, "informative_trained", "informative_local", "informative_external"
    )
    # Full joins first (the final evaluation sits one round past the last training round,
    # with no reward row), then the run's labels onto every row.
    measured = (
        rewards.join(informative, on=keys, how="left")
        .join(trained, on=keys, how="left")
        .join(accuracy, on=keys, how="full", coalesce=True)
    )
    seconds = update_seconds.select(*keys, "seconds_update") if update_seconds is not None else None
    if seconds is not None:
        measured = measured.join(seconds, on=keys, how="left")
    else:
        measured = measured.with_columns(pl.lit(None, pl.Float64).alias("seconds_update"))
    frame = runs.join(measured, on="swarm_id", how="inner")
    return frame.sort(["configuration", "seed", "node_id", "node_round"])


def records_from_ledger(
    query: Query,
    replicates: dict[str, tuple[str, int]],
    *,
    update_seconds: pl.DataFrame | None = None,
    heldout: set[tuple[str, str]] | None = None,
) -> RunRecords:
    """The records of ``replicates`` (swarm_id -> (configuration, seed)) from ledger SQL
    (`Ledger.query`), with MLflow's update seconds when given and, when the held-out
    questions are given (task, text), the ones each run also generated for training."""
    runs = runs_frame(replicates)
    keep = runs["swarm_id"].implode()
    in_runs = pl.col("swarm_id").is_in(keep)
    rows = node_rounds(query, runs, update_seconds)
    found = runs.join(query(dashboards.query("discoveries")), on="swarm_id")
    models = query("SELECT DISTINCT swarm_id, node_id, model_id FROM manifests").filter(in_runs)
    peers = query(
        "SELECT DISTINCT swarm_id, node_id, node_round, group_id, peer_node_id FROM trainings "
        "WHERE origin = 'external' AND trained"
    ).filter(in_runs)
    drift = query(dashboards.query("peer_drift")).filter(in_runs)
    seen = pl.DataFrame(schema=HELDOUT_SEEN)
    if heldout:
        asked = pl.DataFrame(sorted(heldout), schema=["task", "question"], orient="row")
        generated = query("SELECT DISTINCT swarm_id, task, question FROM rollouts").filter(in_runs)
        seen = generated.join(asked, on=["task", "question"], how="semi")
    return RunRecords(
        _conform(rows, NODE_ROUNDS),
        _conform(found, DISCOVERIES),
        _conform(models, MODELS),
        _conform(peers, PEER_GROUPS),
        _conform(seen, HELDOUT_SEEN),
        _conform(drift, DRIFT),
    )


_MOVED = frozenset(
    {"RECORD_VERSION", "RecordError", "read_record", "read_records", "record_manifest",
     "recorded", "write_record"}
)  # fmt: skip


def __getattr__(name: str) -> Any:
    """The record folders' names, here before: one line naming where they are now."""
    if name in _MOVED:
        raise AttributeError(f"analysis.records.{name} is now analysis.record_folders.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["RunRecords", "records_from_ledger"]
