"""One node log's table, kept equal to the sound lines of its files in the store.

A ``NodeLogIndex`` has the manifests' interface (``refresh(listed, gone, again)``, its
state saved and restored by the reader index): each file new to a listing is read once, an
oversized or outsider's file skipped and reported, a signed one read once and ingested from
exactly the bytes whose signature was checked; the rows of a file gone from the store go.
"""

from __future__ import annotations

import logging
import tempfile
from collections.abc import Set as AbstractSet
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa

from ledger import validation as v
from ledger.keys import object_place
from ledger.node_logs import OVERSIZED, UNREADABLE, NodeLog, Problem
from ledger.registry import IdentityIndex
from ledger.sqltext import sql_list
from ledger.storage import NotRegularFile, ObjectInfo, OversizedObject, Store, in_threads

log = logging.getLogger(__name__)

INGEST_BATCH_FILES = 2000
"""Files read per ingest query: bounds memory when a reader first meets a large ledger."""
SIGNED_LOG_CHUNK = 8
"""Signed node logs read (into memory, then a local copy) and ingested at a time."""


class NodeLogIndex:
    def __init__(
        self,
        node_log: NodeLog,
        store: Store,
        con: duckdb.DuckDBPyConnection,
        identities: IdentityIndex,
    ) -> None:
        self.node_log = node_log
        self.name = node_log.name
        self.store = store
        self.con = con
        self.identities = identities
        self.files: dict[str, int | None] = {}
        """Key -> size of every file of this log seen (read or skipped)."""
        self.problems: dict[str, Problem] = {}
        """Files skipped whole, or in part (malformed lines), by key."""
        con.execute(f"CREATE TABLE {node_log.name} ({node_log.table_columns})")

    def known_keys(self) -> set[str]:
        return set(self.files)

    def refresh(
        self,
        listed: list[ObjectInfo],
        gone_keys: AbstractSet[str],
        again: AbstractSet[str] = frozenset(),
    ) -> None:
        """Keep the table = the sound lines of the log's files now in the store, given the
        objects new to the listing (any kind: this log's are picked), the keys gone from it,
        and keys to read afresh (their node's signing rule changed)."""
        known = self.files
        current = {o.key: o.size for o in listed if self.node_log.is_key(o.key)}
        self.forget([k for k in gone_keys | again if k in known])
        registry = self.identities.registry
        readable: dict[str, str] = {}  # path -> key
        signed: list[str] = []  # keys whose node must sign them
        for key, size in current.items():
            if key in known:
                continue
            if size is None:
                try:
                    size = self.store.size(key)
                except FileNotFoundError:
                    continue  # deleted since the listing: not remembered
                except NotRegularFile as exc:
                    known[key] = None
                    self._problem(key, Problem(v.NOT_REGULAR, str(exc)))
                    continue
                except PermissionError as exc:
                    known[key] = None
                    self._problem(key, Problem(UNREADABLE, str(exc)))
                    continue
            known[key] = size
            place = object_place(key)
            if size > self.node_log.max_bytes:
                self._problem(key, Problem(OVERSIZED, f"{size} bytes > {self.node_log.max_bytes}"))
            elif refused := registry.not_a_member(key):
                self._problem(key, Problem(*refused))
            elif place is not None and registry.must_sign_reports(
                *place, self.identities.check_signatures
            ):
                signed.append(key)
            else:
                readable[self.store.reader_path(key)] = key
        try:
            paths = list(readable)
            for start in range(0, len(paths), INGEST_BATCH_FILES):
                batch = paths[start : start + INGEST_BATCH_FILES]
                for path, problem in self.node_log.ingest(self.con, batch).items():
                    self._problem(readable.get(path, path), problem)
            if signed:
                self._ingest_signed(signed)
        except BaseException:
            # Not remembered, and none of their rows kept: the next refresh reads them
            # afresh (a storage error on one read must not lose a log for good).
            self.forget([*readable.values(), *signed])
            raise

    def forget(self, keys: list[str]) -> None:
        """Drop ``keys``' rows from the table and forget the files: a later listing that
        shows them has them read afresh."""
        if not keys:
            return
        paths = sql_list([self.store.reader_path(k) for k in keys])
        self.con.execute(f"DELETE FROM {self.name} WHERE list_contains({paths}, source_file)")
        for key in keys:
            self.files.pop(key, None)
            self.problems.pop(key, None)

    def _ingest_signed(self, keys: list[str]) -> None:
        """Read each file once, check its signature over those bytes, and ingest exactly
        those bytes (from a private copy in the log's layout, so the partitions still name
        the node); rows keep the store's path as ``source_file``. A few files at a time:
        memory and disk hold at most ``SIGNED_LOG_CHUNK`` of them."""
        for first in range(0, len(keys), SIGNED_LOG_CHUNK):
            chunk = keys[first : first + SIGNED_LOG_CHUNK]
            with tempfile.TemporaryDirectory(prefix="sapo-node-logs-") as tmp:
                copies: dict[str, str] = {}  # copy path -> key
                read = in_threads(self._read_vouched, chunk)
                for key, outcome in zip(chunk, read, strict=True):
                    if outcome is None:
                        self.files.pop(key, None)  # vanished: seen again
                    elif isinstance(outcome, Problem):
                        self._problem(key, outcome)
                    else:
                        copy = Path(tmp, key)
                        copy.parent.mkdir(parents=True, exist_ok=True)
                        copy.write_bytes(outcome)
                        copies[str(copy)] = key
                del read
                if copies:
                    self._ingest_copies(copies)

    def _ingest_copies(self, copies: dict[str, str]) -> None:
        """Ingest local copies (path -> key), their rows renamed to the store's paths."""
        batch = list(copies)
        for path, problem in self.node_log.ingest(self.con, batch).items():
            self._problem(copies.get(path, path), problem)
        renamed = pa.table(
            {"copy": batch, "stored": [self.store.reader_path(copies[c]) for c in batch]}
        )
        self.con.register("_renamed", renamed)
        try:
            self.con.execute(
                f"UPDATE {self.name} SET source_file = _renamed.stored "
                f"FROM _renamed WHERE {self.name}.source_file = _renamed.copy"
            )
        finally:
            self.con.unregister("_renamed")

    def _read_vouched(self, key: str) -> bytes | Problem | None:
        """The bytes of a node's log if its node signed them; why not; None if gone."""
        try:
            data = self.store.read(key, self.node_log.max_bytes)
        except FileNotFoundError:
            return None
        except (NotRegularFile, PermissionError, OversizedObject) as exc:
            return Problem(UNREADABLE, str(exc))
        refused = self.identities.vouch(key, data)
        return data if refused is None else Problem(*refused)

    def _problem(self, key: str, problem: Problem) -> None:
        self.problems[key] = problem
        what = "lines of" if problem.lines else "node log"
        log.warning("skipping %s %s: %s (%s)", what, key, problem.reason, problem.detail)

    def state(self) -> dict[str, Any]:
        return {"files": self.files, "problems": {k: vars(p) for k, p in self.problems.items()}}

    def restore(self, state: dict[str, Any]) -> None:
        self.files.update(state["files"])
        self.problems.update({k: Problem(**p) for k, p in state["problems"].items()})
