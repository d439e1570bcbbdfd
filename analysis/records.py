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

Records are read back with fixed schemas; a folder that does not parse is an error naming
the file, never a silently smaller table. A CSV cut short (a copy or an edit that stopped
mid-file) parses as fewer rows, so every file must end a whole row with every field, and
``record.json`` carries each file's SHA-256 (from version 2), which catches a file cut at a
row's end or edited by hand as well.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import polars as pl
from polars.datatypes import DataTypeClass

import dashboards

Query = Callable[[str], pl.DataFrame]  # ledger SQL -> rows (Ledger.query)
# 3: drift.csv (peers' drift); 2: record.json has each file's SHA-256; 1 (issue 32's sweep)
RECORD_VERSION = 3
READABLE_VERSIONS = (1, 2, 3)
Schema = dict[str, DataTypeClass | pl.DataType]
MANIFEST = "record.json"
_SHA256 = re.compile(r"[0-9a-f]{64}")

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


def _tables(version: int) -> list[str]:
    return [name for name in SCHEMAS if SINCE_VERSION.get(name, 1) <= version]


class RecordError(ValueError):
    """A run record that cannot be read as written."""


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


def write_record(records: RunRecords, swarm_id: str, root: Path, **facts: object) -> Path:
    """``<root>/<swarm_id>/``: the run's tables as CSV and ``record.json`` with ``facts``
    (what code and machine made it, when). Written to a temporary folder and renamed, so a
    folder that exists is a whole record."""
    mine = records.only([swarm_id])
    folder = root / swarm_id
    staging = root / f".{swarm_id}.partial"
    staging.mkdir(parents=True, exist_ok=True)
    digests = {}
    keys = ("node_id", "node_round", "task", "group_id", "peer_node_id")
    for name in SCHEMAS:
        frame: pl.DataFrame = getattr(mine, name)
        # The natural keys first, then every other column: one order whatever order the
        # ledger's SQL gave (DISTINCT has none), so the same run is the same bytes.
        sort = [c for c in keys if c in frame.columns]
        sort += [c for c in frame.columns if c not in sort]
        text = frame.sort(sort, nulls_last=True).write_csv().encode()
        (staging / f"{name}.csv").write_bytes(text)
        digests[f"{name}.csv"] = hashlib.sha256(text).hexdigest()
    meta = {**facts, "version": RECORD_VERSION, "swarm_id": swarm_id, "sha256": digests}
    (staging / MANIFEST).write_text(json.dumps(meta, indent=1, sort_keys=True) + "\n")
    if folder.exists():
        for old in folder.iterdir():
            old.unlink()
        folder.rmdir()
    staging.rename(folder)
    return folder


def _manifest(folder: Path) -> dict[str, Any]:
    """The folder's ``record.json``, checked: a readable version, naming its folder, and
    (from version 2) a well-formed SHA-256 for each of its files; RecordError otherwise."""
    path = folder / MANIFEST
    try:
        meta = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise RecordError(f"{path}: not a run record ({exc})") from None
    version = meta.get("version") if isinstance(meta, dict) else None
    if type(version) is not int or version not in READABLE_VERSIONS:  # not True, not 1.0
        raise RecordError(f"{path}: unknown record version")
    if meta.get("swarm_id") != folder.name:
        raise RecordError(f"{path}: names {meta.get('swarm_id')!r}, not its folder")
    digests = meta.get("sha256")
    if version >= 2 and (
        not isinstance(digests, dict)
        or set(digests) != {f"{name}.csv" for name in _tables(version)}
        or not all(isinstance(d, str) and _SHA256.fullmatch(d) for d in digests.values())
    ):
        raise RecordError(f"{path}: no SHA-256 for each of its files")
    return meta


def read_record(folder: Path) -> RunRecords:
    """One run's record; RecordError (naming the file) when it does not parse. A table its
    version did not record (peers' drift before version 3) reads empty."""
    meta = _manifest(folder)
    digests = meta["sha256"] if meta["version"] >= 2 else {}
    tables = {name: pl.DataFrame(schema=schema) for name, schema in SCHEMAS.items()}
    for name in _tables(meta["version"]):
        schema = SCHEMAS[name]
        path = folder / f"{name}.csv"
        try:
            data = path.read_bytes()
        except OSError as exc:
            raise RecordError(f"{path}: {exc.strerror or exc}") from None
        _require_whole_rows(path, data)  # first: it says how a file was damaged
        if digests and hashlib.sha256(data).hexdigest() != digests.get(path.name):
            raise RecordError(f"{path}: not the file record.json describes (SHA-256 differs)")
        try:
            frame = pl.read_csv(io.BytesIO(data), schema=schema)
        except pl.exceptions.PolarsError as exc:
            raise RecordError(f"{path}: {str(exc).splitlines()[0]}") from None
        if frame.height and frame["swarm_id"].ne_missing(folder.name).any():
            raise RecordError(f"{path}: rows of another run")
        tables[name] = frame
    return RunRecords(**tables)


def _require_whole_rows(path: Path, data: bytes) -> None:
    """RecordError unless ``data`` ends a row and every row has the header's fields: what a
    file cut short looks like, which CSV readers would take as a smaller table."""
    if not data.endswith(b"\n"):
        raise RecordError(f"{path}: cut short (its last row does not end)")
    # csv's default 128 KiB field limit would refuse a long question polars reads
    csv.field_size_limit(max(csv.field_size_limit(), len(data)))
    try:
        rows = csv.reader(io.StringIO(data.decode()))
        header = next(rows, [])
        for number, row in enumerate(rows, start=2):
            if len(row) != len(header):
                raise RecordError(
                    f"{path}: row {number} has {len(row)} fields, the header {len(header)}"
                )
    except (UnicodeDecodeError, csv.Error) as exc:
        raise RecordError(f"{path}: not CSV text ({exc})") from None


def read_records(root: Path, swarm_ids: Iterable[str]) -> RunRecords:
    """The records under ``root`` of those of ``swarm_ids`` that have one."""
    return RunRecords.concat(
        read_record(root / s) for s in swarm_ids if (root / s / MANIFEST).is_file()
    )


def recorded(root: Path, swarm_id: str) -> bool:
    return (root / swarm_id / MANIFEST).is_file()


def record_manifest(root: Path, swarm_id: str) -> dict[str, object]:
    """What a run's ``record.json`` says beside its tables (code, host, time, wall time);
    empty where there is none or it is not a record of that run (reading it says why)."""
    try:
        return _manifest(root / swarm_id)
    except RecordError:
        return {}


__all__ = [
    "RecordError",
    "RunRecords",
    "read_record",
    "read_records",
    "record_manifest",
    "recorded",
    "records_from_ledger",
    "write_record",
]
