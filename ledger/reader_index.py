"""A reader's index on its own disk: what it examined survives a restart.

Indexing a file costs its footer, its rows and (in signed swarms) its signature: at 1M rows
in 16k files a new reader spends tens of seconds before its first sample. Objects are
immutable, so a reader that restarts need not pay again: ``save`` writes the catalog's state
to a DuckDB file (one table per relation, the files' states keyed by object key and version,
the identity and manifest objects it read, the change log's cursor), and ``load`` reads it
back into a fresh catalog. The first refresh after a load then lists as usual and drops or
re-examines what changed: a file whose listed size or version (S3's ETag) differs from the
saved one, or that is gone.

The file is the reader's own and trusted like its memory. It is written to a temporary file
and renamed into place, so a reader killed mid-save keeps the previous index. An index
written for another ledger, other row limits or another signature mode, or by another format
version, is ignored (the reader indexes afresh).
"""

from __future__ import annotations

import json
import logging
import os
from collections import Counter
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa

from ledger import group_index, node_logs
from ledger.admission import OK, FileState
from ledger.catalog import Catalog
from ledger.changes import ChangeLogStore
from ledger.sqltext import sql_str

log = logging.getLogger(__name__)

FORMAT = 9
"""2: valid_rows holds one row per file, with its accepted row numbers as a list. 3: node
logs and manifests judged by their signatures and swarms' members (older indexes hold
reports a reader now refuses: they are read afresh). 4: each object index saves its own
state (``state()``, ``restore()``). 5: manifests carry ``prompt_format``. 6: and ``adapter``.
7: groups carry ``content_digest``. 8: and ``completion_keys`` and ``claims``. 9: rows with a
malformed generator's claim (schema 2) are rejected as ``invalid_claim``."""
TABLES = (*group_index.TABLES, *(n.name for n in node_logs.ALL))
"""The catalog's own relations, copied as they are."""


def fingerprint(catalog: Catalog) -> str:
    """What an index must have been written for to be usable by this catalog."""
    return json.dumps(
        {
            "format": FORMAT,
            "url": catalog.store.url,
            "limits": catalog.limits.model_dump(mode="json"),
            "signatures": catalog.check_signatures,
            "copies": catalog.copies is not None and str(catalog.copies.folder),
        },
        sort_keys=True,
    )


def save(catalog: Catalog, path: str | Path) -> None:
    """Write the catalog's state to ``path`` (atomically: a temporary file, renamed)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.unlink(missing_ok=True)
    con = catalog.con
    con.execute(f"ATTACH {sql_str(str(tmp))} AS _index")
    try:
        try:
            for table in TABLES:
                con.execute(f"CREATE TABLE _index.{table} AS SELECT * FROM {table}")
            _write(con, "files", _files_table(catalog))
            _write(con, "state", pa.table({"name": ["state"], "value": [_state_json(catalog)]}))
            con.execute("CHECKPOINT _index")
        finally:
            con.execute("DETACH _index")
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
        tmp.with_name(tmp.name + ".wal").unlink(missing_ok=True)


def load(catalog: Catalog, path: str | Path) -> bool:
    """Fill a fresh catalog from the index at ``path``; False (and nothing changed) when
    there is none, or it was written for something else, or it cannot be read."""
    path = Path(path)
    if not path.is_file():
        return False
    con = catalog.con
    try:
        con.execute(f"ATTACH {sql_str(str(path))} AS _index (READ_ONLY)")
    except duckdb.Error as exc:
        log.warning("ignoring the reader index %s: %s", path, exc)
        return False
    try:
        row = con.execute("SELECT value FROM _index.state WHERE name = 'state'").fetchone()
        state = json.loads(row[0]) if row else {}
        if state.get("fingerprint") != fingerprint(catalog):
            log.info("ignoring the reader index %s: written for another ledger or setting", path)
            return False
        for table in TABLES:
            con.execute(f"INSERT INTO {table} SELECT * FROM _index.{table}")
        files = con.execute("SELECT * FROM _index.files").fetchall()
    except duckdb.Error as exc:
        log.warning("ignoring the reader index %s: %s", path, exc)
        for table in TABLES:
            con.execute(f"DELETE FROM {table}")
        return False
    finally:
        con.execute("DETACH _index")
    _restore(catalog, files, state)
    return True


# -- what is saved besides the tables ---------------------------------------------------


def _files_table(catalog: Catalog) -> pa.Table:
    states = list(catalog.files.values())
    return pa.table(
        {
            "key": [s.key for s in states],
            "size": pa.array([s.size for s in states], pa.int64()),
            "path": [s.path for s in states],
            "version": pa.array([s.version for s in states], pa.string()),
            "status": [s.status for s in states],
            "detail": [s.detail for s in states],
            "rows": pa.array([s.rows for s in states], pa.int64()),
            "unpacked": pa.array([s.unpacked for s in states], pa.int64()),
            "rejected": [json.dumps(dict(s.rejected)) for s in states],
        }
    )


def _state_json(catalog: Catalog) -> str:
    indexes = [catalog.identities, *catalog.reports]
    state: dict[str, Any] = {
        "fingerprint": fingerprint(catalog),
        "indexes": {index.name: index.state() for index in indexes},
    }
    store = catalog.store
    if isinstance(store, ChangeLogStore):
        state["change_log"] = store.snapshot()
    return json.dumps(state)


def _restore(catalog: Catalog, files: list[tuple[Any, ...]], state: dict[str, Any]) -> None:
    lost = []
    for key, size, path, version, status, detail, rows, unpacked, rejected in files:
        file_state = FileState(key, size, path, version, status, detail, rows, unpacked)
        file_state.rejected = Counter(json.loads(rejected))
        catalog.track(file_state)
        copies = catalog.copies
        if status == OK and copies is not None and not copies.holds(path, size):
            lost.append(path)
    # Files whose local copy is gone or not whole are forgotten, and examined afresh.
    catalog.evict(lost)
    saved = state["indexes"]
    for index in [catalog.identities, *catalog.reports]:  # identities first, as refreshed
        index.restore(saved[index.name])
    if isinstance(catalog.store, ChangeLogStore) and "change_log" in state:
        catalog.store.restore(state["change_log"])
    catalog.settle_rules()
    catalog.mark_views_stale()


def _write(con: duckdb.DuckDBPyConnection, name: str, table: pa.Table) -> None:
    con.register("_index_arrow", table)
    try:
        con.execute(f"CREATE TABLE _index.{name} AS SELECT * FROM _index_arrow")
    finally:
        con.unregister("_index_arrow")
