"""Run records on disk: one folder per run, ``<records>/<swarm_id>/``, its tables as CSV
(analysis/records.py) and ``record.json`` (the version, the facts of what made it, and each
file's SHA-256).

Read back with fixed schemas, a folder that does not parse is an error naming the file,
never a silently smaller table. A CSV cut short (a copy or an edit that stopped mid-file)
parses as fewer rows, so every file must end a whole row with every field, and the SHA-256
(from version 2) catches a file cut at a row's end or edited by hand as well.

A folder is written whole: staged under a name of its own, then renamed into place. A
record that exists is replaced by moving it aside first (``.<swarm_id>.old-*``), so a
process killed between the two renames leaves the old record to put back
(``recover``), never no record: a sweep skips a recorded run, and would otherwise run it
again. Whether a record should be replaced at all is ``replacement_losses``: a machine
whose ledger or MLflow store holds less of a run must not overwrite what another recorded.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import os
import re
import shutil
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import polars as pl

from analysis.records import SCHEMAS, SINCE_VERSION, RunRecords

# 3: drift.csv (peers' drift); 2: record.json has each file's SHA-256; 1 (issue 32's sweep)
RECORD_VERSION = 3
READABLE_VERSIONS = (1, 2, 3)
MANIFEST = "record.json"
_SHA256 = re.compile(r"[0-9a-f]{64}")
_SORT_KEYS = ("node_id", "node_round", "task", "group_id", "peer_node_id")


class RecordError(ValueError):
    """A run record that cannot be read as written."""


def _tables(version: int) -> list[str]:
    return [name for name in SCHEMAS if SINCE_VERSION.get(name, 1) <= version]


def encode_record(records: RunRecords, swarm_id: str) -> dict[str, bytes]:
    """The run's tables as the CSV bytes its record holds (file name -> bytes)."""
    mine = records.only([swarm_id])
    out = {}
    for name in SCHEMAS:
        frame: pl.DataFrame = getattr(mine, name)
        # The natural keys first, then every other column: one order whatever order the
        # ledger's SQL gave (DISTINCT has none), so the same run is the same bytes.
        sort = [c for c in _SORT_KEYS if c in frame.columns]
        sort += [c for c in frame.columns if c not in sort]
        out[f"{name}.csv"] = frame.sort(sort, nulls_last=True).write_csv().encode()
    return out


def digests_of(files: dict[str, bytes]) -> dict[str, str]:
    return {name: hashlib.sha256(data).hexdigest() for name, data in files.items()}


def write_record(records: RunRecords, swarm_id: str, root: Path, **facts: object) -> Path:
    """``<root>/<swarm_id>/``: the run's tables as CSV and ``record.json`` with ``facts``
    (what code and machine made it, when), written whole (see the module doc); a record
    already there is replaced."""
    files = encode_record(records, swarm_id)
    meta = {**facts, "version": RECORD_VERSION, "swarm_id": swarm_id, "sha256": digests_of(files)}
    files[MANIFEST] = (json.dumps(meta, indent=1, sort_keys=True) + "\n").encode()
    root.mkdir(parents=True, exist_ok=True)
    recover(root, swarm_id)
    staging = Path(tempfile.mkdtemp(prefix=f".{swarm_id}.partial-", dir=root))
    for name, data in files.items():
        with open(staging / name, "wb") as out:
            out.write(data)
            out.flush()
            os.fsync(out.fileno())
    folder = root / swarm_id
    aside = None
    if folder.exists():
        aside = Path(tempfile.mkdtemp(prefix=f".{swarm_id}.old-", dir=root)) / swarm_id
        folder.rename(aside)
    staging.rename(folder)
    if aside is not None:
        shutil.rmtree(aside.parent)
    return folder


def recover(root: Path, swarm_id: str) -> None:
    """Put back a record moved aside by a write that did not finish (see the module doc),
    and drop what such writes left staged."""
    folder = root / swarm_id
    for aside in sorted(root.glob(f".{swarm_id}.old-*")):
        if not folder.exists() and (aside / swarm_id / MANIFEST).is_file():
            (aside / swarm_id).rename(folder)
        shutil.rmtree(aside, ignore_errors=True)
    for staged in root.glob(f".{swarm_id}.partial*"):
        shutil.rmtree(staged, ignore_errors=True)


def replacement_losses(old: RunRecords, new: RunRecords) -> list[str]:
    """What replacing the record ``old`` by ``new`` would lose: per table, fewer rows, or
    fewer values in a column both have (a machine whose ledger, logs or MLflow store hold
    less of the run than the one that recorded it). Empty when nothing is lost."""
    lost = []
    for name in SCHEMAS:
        before, after = getattr(old, name), getattr(new, name)
        if after.height < before.height:
            lost.append(f"{name}: {after.height} rows where the record has {before.height}")
            continue
        for column in before.columns:
            had, has = before[column].count(), after[column].count()
            if column in after.columns and has < had:
                lost.append(f"{name}.{column}: {has} values where the record has {had}")
    return lost


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
    return RunRecords.concat(read_record(root / s) for s in swarm_ids if recorded(root, s))


def recorded(root: Path, swarm_id: str) -> bool:
    """Whether ``root`` holds a record of the run, first putting back one that a killed
    write moved aside (``recover``): every reader asks this before it reads a record."""
    if root.is_dir():
        recover(root, swarm_id)
    return (root / swarm_id / MANIFEST).is_file()


def record_manifest(root: Path, swarm_id: str) -> dict[str, object]:
    """What a run's ``record.json`` says beside its tables (code, host, time, wall time);
    empty where there is none or it is not a record of that run (reading it says why)."""
    if not recorded(root, swarm_id):
        return {}
    try:
        return _manifest(root / swarm_id)
    except RecordError:
        return {}


__all__ = [
    "RECORD_VERSION",
    "RecordError",
    "encode_record",
    "read_record",
    "read_records",
    "record_manifest",
    "recorded",
    "recover",
    "replacement_losses",
    "write_record",
]
