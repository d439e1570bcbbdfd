"""Admission of a rollout file: whether a reader serves anything from it at all.

A file new to a listing is judged before any of its rows is read: its place (a node's own
``swarm_id=/node_id=/day=/`` prefix; a member of its swarm if the swarm is closed), its size,
the length of its Parquet footer (by its last 8 bytes, before anything parses it), its
schema and the size of its content (by the footer alone: ``parquet_schema``,
``parquet_metadata``), the bytes its text decodes to (a scan of lengths), and its node's
signature over exactly the bytes examined. With local copies (S3's default), each file is
read once, in one bounded GET, and everything after judges that copy. Each verdict is a
status and a detail on the file's ``FileState``; rows are judged later, as they are indexed
(ledger/group_index.py).
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from ledger import validation as v
from ledger.config import RowLimits
from ledger.copies import LocalCopies
from ledger.keys import parse_key
from ledger.registry import IdentityIndex
from ledger.retrying import first_line
from ledger.schema import COLUMN_NAMES, COLUMNS
from ledger.sqltext import scan_sql, sql_list, sql_str
from ledger.storage import NotRegularFile, ObjectInfo, OversizedObject, Store, in_threads, is_local

OK = "ok"
VANISHED = "vanished"
"""Listed, then deleted before it was read (compaction): not a fault, and not remembered."""
LIST_VALUE_BYTES = 8
"""What a reader counts for each value of a list column (an id or log-prob with its place)."""
EXAMINE_CHUNK = 256
"""Footers are read in chunks, a few chunks at a time (``in_threads``)."""

SCHEMA_SQL = (
    "SELECT file_name, name, type, converted_type, logical_type, num_children "
    "FROM parquet_schema({files})"
)
LIST_COLUMNS = tuple(c.name for c in COLUMNS if pa.types.is_list(c.type))
CONTENT_SQL = (
    "SELECT file_name, count(DISTINCT row_group_id), "
    "coalesce(sum(row_group_num_rows) FILTER (column_id = 0), 0), "
    "coalesce(sum(total_uncompressed_size) FILTER (path_in_schema IN ("
    + ", ".join(sql_str(c) for c in COLUMN_NAMES)
    + ")), 0) + "
    # A list's leaf is counted by its values, 8 bytes each, not by its encoded size: runs
    # and dictionaries pack a million equal ids into a few bytes that decode to megabytes.
    + f"{LIST_VALUE_BYTES} * coalesce(sum(num_values) FILTER ("
    + " OR ".join(f"starts_with(path_in_schema, {sql_str(c + ', ')})" for c in LIST_COLUMNS)
    + "), 0) FROM parquet_metadata({files}) GROUP BY file_name"
)
"""Per file, from its footer: row groups, rows, and bytes its public columns unpack to."""

TEXT_COLUMNS = tuple(c.name for c in COLUMNS if pa.types.is_string(c.type))
TEXT_BYTES_SQL = (
    "SELECT filename, coalesce(sum("
    + " + ".join(f"coalesce(strlen({c}), 0)" for c in TEXT_COLUMNS)
    + "), 0) FROM ({scan}) GROUP BY filename"
)
"""Per file, the bytes its text columns decode to, every value counted where it occurs. A
scan of lengths alone: DuckDB keeps dictionary-encoded values as a dictionary vector, so
this costs rows, not the text's bytes (0.2 s for 11 GB of one repeated string)."""
PARQUET_MAGIC = b"PAR1"


@dataclass
class FileState:
    key: str
    size: int
    path: str
    version: str | None = None
    """The store's version of the object when it was examined (S3 ETag; local mtime)."""
    status: str = OK
    detail: str = ""
    rows: int = 0
    unpacked: int = 0
    """Bytes its public columns decompress to, by its footer."""
    rejected: Counter[str] = field(default_factory=Counter)


class Admission:
    """The judge of new rollout files, for one reader (its store, limits and identities)."""

    def __init__(
        self,
        store: Store,
        con: duckdb.DuckDBPyConnection,
        limits: RowLimits,
        identities: IdentityIndex,
        copies: LocalCopies | None = None,
    ) -> None:
        self.store = store
        self.con = con
        self.limits = limits
        self.identities = identities
        self.copies = copies

    def examine(self, objects: list[ObjectInfo]) -> tuple[list[FileState], float]:
        """Judge new files by their place, size, Parquet footer and signature, chunks in
        parallel; and the seconds spent reading them into local copies (none without)."""
        read_seconds = 0.0
        states = [self._place_and_size(o) for o in objects]
        for state in states:
            if state.status == OK and (refused := self.identities.registry.not_a_member(state.key)):
                state.status, state.detail = refused
        if self.copies is not None:
            started = time.perf_counter()
            in_threads(self._take_copy, [s for s in states if s.status == OK])
            read_seconds = time.perf_counter() - started
        for state in states:
            if state.status == OK:
                self._check_footer_size(state)
        pending = [s for s in states if s.status == OK]
        chunks = [pending[i : i + EXAMINE_CHUNK] for i in range(0, len(pending), EXAMINE_CHUNK)]
        in_threads(self._check_schemas, chunks)
        signed = [s for s in states if s.status == OK and self.identities.must_sign_file(s.key)]
        in_threads(self._check_signature, signed)
        return states, read_seconds

    def _check_signature(self, state: FileState) -> None:
        """The file's bytes must be signed by its node's registered key (ledger/identity.py)."""
        parts = parse_key(state.key)
        assert parts is not None
        public = self.identities.registry.signing_key(parts.swarm_id, parts.node_id)
        if isinstance(public, tuple):
            state.status, state.detail = public
            return
        if self.copies is not None:
            found = self._signed(state, Path(state.path).read_bytes(), public)
        else:
            found = self.read_checked(state, public)
        if isinstance(found, tuple):
            state.status, state.detail = found

    def _take_copy(self, state: FileState) -> None:
        """Read ``state``'s object in one GET (bounded) and keep it as its local copy."""
        assert self.copies is not None
        try:
            data, version = self.store.read_versioned(state.key, self.limits.max_file_bytes)
        except FileNotFoundError:
            state.status = VANISHED
            return
        except OversizedObject:
            state.status = v.OVERSIZED_FILE
            state.detail = f"more than {self.limits.max_file_bytes} bytes"
            return
        except (NotRegularFile, PermissionError) as exc:
            state.status, state.detail = v.CORRUPT, f"unreadable: {exc}"
            return
        if (state.size and state.size != len(data)) or (
            state.version and version and state.version != version
        ):
            # Not the object the listing showed: kept as changed until a listing shows
            # another version (then it is examined afresh).
            state.status, state.detail = v.CHANGED, "changed while it was examined"
            return
        state.size, state.version = len(data), version
        state.path = self.copies.write(state.key, version, data)

    def read_checked(
        self, state: FileState, public: Ed25519PublicKey | None
    ) -> bytes | tuple[str, str]:
        """The bytes of an examined file if they are still what was examined (its size, read
        with that bound) and, given ``public``, signed by that key over exactly these bytes;
        otherwise (status, why). What the caller then uses are these bytes, not a re-read."""
        try:
            data = self.store.read(state.key, self.limits.max_file_bytes)
        except FileNotFoundError:
            return VANISHED, ""
        except (NotRegularFile, PermissionError) as exc:
            return v.CORRUPT, f"unreadable: {exc}"
        except OversizedObject:
            return v.CHANGED, "grew while it was examined"
        if len(data) != state.size:
            return v.CHANGED, "changed while it was examined"
        return self._signed(state, data, public)

    def _signed(
        self, state: FileState, data: bytes, public: Ed25519PublicKey | None
    ) -> bytes | tuple[str, str]:
        """``data`` if ``public`` is None or signed ``data`` as ``state``'s object; else
        (status, why)."""
        refused = self.identities.signed(state.key, data, public)
        return data if refused is None else refused

    def _place_and_size(self, obj: ObjectInfo) -> FileState:
        state = FileState(obj.key, obj.size or 0, self.store.reader_path(obj.key), obj.version)
        if parse_key(obj.key) is None:
            state.status, state.detail = v.MISPLACED, "not under swarm_id=/node_id=/day=/"
            return state
        if obj.size is None and self.copies is None:
            try:
                state.size, state.version = self.store.stat(obj.key)
            except FileNotFoundError:
                state.status = VANISHED
                return state
            except NotRegularFile as exc:
                state.status, state.detail = v.NOT_REGULAR, str(exc)
                return state
            except PermissionError as exc:
                state.status, state.detail = v.CORRUPT, f"unreadable: {exc}"
                return state
        if state.size > self.limits.max_file_bytes:
            state.status = v.OVERSIZED_FILE
            state.detail = f"{state.size} bytes > {self.limits.max_file_bytes}"
        return state

    def _check_footer_size(self, state: FileState) -> None:
        """Refuse a file whose footer is longer than ``max_footer_bytes``, by the length in
        its last 8 bytes, before anything parses it. Only where the file is on local disk
        (a local ledger, or a local copy: on by default for S3); elsewhere DuckDB's parse
        is bounded by ``max_row_groups`` and the schema's size alone."""
        if self.copies is None and not is_local(self.store):
            return
        try:
            with open(state.path, "rb") as f:
                f.seek(0, 2)
                size = f.tell()
                if size < 12:
                    state.status, state.detail = v.CORRUPT, f"{size} bytes: not Parquet"
                    return
                f.seek(size - 8)
                tail = f.read(8)
        except FileNotFoundError:
            state.status = VANISHED
            return
        except OSError as exc:
            state.status, state.detail = v.CORRUPT, f"unreadable: {exc}"
            return
        footer = int.from_bytes(tail[:4], "little")
        if tail[4:] != PARQUET_MAGIC or footer + 12 > size:
            state.status, state.detail = v.CORRUPT, "no Parquet footer"
        elif footer > self.limits.max_footer_bytes:
            state.status = v.OVERSIZED_CONTENT
            state.detail = f"{footer} footer bytes > {self.limits.max_footer_bytes}"

    def _check_schemas(self, chunk: list[FileState]) -> None:
        """Judge the chunk's footers: schema (``parquet_schema``), then size of content
        (``parquet_metadata``) for those whose schema passed; file by file if one of them is
        corrupt. Nothing here reads a column's data."""
        cursor = self.con.cursor()  # one connection per thread
        try:
            try:
                schemas = self._footer_rows(cursor, SCHEMA_SQL, chunk)
                by_file: dict[str, list[v.SchemaRow]] = {}
                for file_name, *schema_row in schemas:  # a file's rows come in schema order
                    by_file.setdefault(file_name, []).append(tuple(schema_row))
                for state in chunk:
                    self._judge_schema(state, by_file.get(state.path, []))
                passed = {s.path: s for s in chunk if s.status == OK}
                if passed:
                    for path, row_groups, rows, unpacked in self._footer_rows(
                        cursor, CONTENT_SQL, list(passed.values())
                    ):
                        self._judge_content(passed[path], row_groups, rows, unpacked)
                    sized = [s for s in passed.values() if s.status == OK]
                    if sized:
                        scan = scan_sql(sql_list([s.path for s in sized]))
                        for path, text in cursor.execute(
                            TEXT_BYTES_SQL.format(scan=scan)
                        ).fetchall():
                            self._judge_text(passed[path], int(text))
            except duckdb.Error:
                if len(chunk) > 1:
                    for state in chunk:
                        if state.status == OK:
                            self._check_schemas([state])
                    return
                raise
        except duckdb.Error as exc:
            chunk[0].status, chunk[0].detail = self.failure(chunk[0].key, exc)
            return
        finally:
            cursor.close()

    @staticmethod
    def _footer_rows(
        cursor: duckdb.DuckDBPyConnection, sql: str, chunk: list[FileState]
    ) -> list[tuple[Any, ...]]:
        # Lists go into the SQL text: DuckDB converts a Python list parameter element by
        # element, which costs more than the query on long lists. Keys are safe by then.
        return cursor.execute(sql.format(files=sql_list([s.path for s in chunk]))).fetchall()

    def _judge_schema(self, state: FileState, rows: list[v.SchemaRow]) -> None:
        problem = v.footer_problem(rows)
        kinds = {} if problem else v.top_level_kinds(rows)
        problem = problem or v.schema_problem(kinds)
        if problem:
            state.status, state.detail = v.SCHEMA_MISMATCH, problem

    def _judge_content(self, state: FileState, row_groups: int, rows: int, unpacked: int) -> None:
        limits = self.limits
        state.unpacked = int(unpacked)
        for what, n, most in (
            ("row groups", row_groups, limits.max_row_groups),
            ("rows", rows, limits.max_file_rows),
            ("uncompressed bytes", unpacked, limits.max_uncompressed_bytes),
        ):
            if n > most:
                state.status, state.detail = v.OVERSIZED_CONTENT, f"{n} {what} > {most}"
                return

    def _judge_text(self, state: FileState, text: int) -> None:
        # What a file costs to read is what it decodes to: compaction sizes its merged
        # files by the larger of the two measures.
        state.unpacked = max(state.unpacked, text)
        if text > self.limits.max_text_bytes:
            state.status = v.OVERSIZED_CONTENT
            state.detail = f"{text} text bytes decoded > {self.limits.max_text_bytes}"

    def failure(self, key: str, exc: duckdb.Error) -> tuple[str, str]:
        """Why reading ``key`` failed: it is corrupt, or gone, or the read itself failed (an
        I/O or HTTP error: like a vanished file, not remembered, so that the next refresh
        examines it again instead of holding an honest file corrupt until a restart)."""
        if self.copies is not None:  # read from its local copy: the bytes are at fault
            return v.CORRUPT, first_line(exc)
        if isinstance(exc, duckdb.IOException | duckdb.HTTPException):
            return VANISHED, first_line(exc)
        return (v.CORRUPT if self.store.exists(key) else VANISHED), first_line(exc)
