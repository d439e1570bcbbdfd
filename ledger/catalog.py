"""An incremental, validated index of a ledger, held in one DuckDB connection.

Objects are immutable, so each file is examined once: its footer is checked, its rows judged,
and one summary row per group is kept in ``group_index``. A refresh lists the store and only
reads what appeared since; files that disappeared (compaction) drop out. The public relations
live in the same connection:

- ``groups``: one row per group (deduplicated across files), what sampling policies query;
- ``rollouts``: one row per valid completion, a view over the valid files;
- ``ledger_files``: every object seen, with its status;
- ``manifests``: one row per node, what it declared when it started (ledger/manifests.py);
- ``samples``, ``evaluations``, ``trainings``: the nodes' self-reports, one table per node
  log (ledger/node_logs.py), kept in sync file by file like the rest.
"""

from __future__ import annotations

import logging
import tempfile
import time
from collections import Counter
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import duckdb
import polars as pl
import pyarrow as pa

from ledger import identity, manifests, node_logs
from ledger import validation as v
from ledger.config import RowLimits
from ledger.copies import LocalCopies
from ledger.keys import parse_key
from ledger.retrying import first_line
from ledger.schema import COLUMN_NAMES, COLUMNS
from ledger.sqltext import (
    PUBLIC_COLUMNS_SQL,
    TYPED_EMPTY_NUMBERED,
    scan_sql,
    sql_in,
    sql_list,
    sql_str,
)
from ledger.storage import (
    NotRegularFile,
    ObjectInfo,
    OversizedObject,
    StorageError,
    Store,
    in_threads,
    is_local,
)

log = logging.getLogger(__name__)

OK = "ok"
VANISHED = "vanished"
"""Listed, then deleted before it was read (compaction): not a fault, and not remembered."""
INGEST_BATCH_FILES = 2000
"""Files read per ingest query: bounds memory when a reader first meets a large ledger."""
EXAMINE_CHUNK = 256
"""Footers are read in chunks, a few chunks at a time (``in_threads``)."""
SIGNED_LOG_CHUNK = 8
"""Signed node logs read (into memory, then a local copy) and ingested at a time."""

GROUP_COLUMNS = """
    group_id VARCHAR, swarm_id VARCHAR, node_id VARCHAR, model_id VARCHAR, task VARCHAR,
    node_round BIGINT, policy_version BIGINT, size INTEGER, reward_mean DOUBLE,
    reward_std DOUBLE, reward_min DOUBLE, reward_max DOUBLE, published_at TIMESTAMPTZ,
    day DATE, source_file VARCHAR, first_seen TIMESTAMPTZ
"""
"""``first_seen``: when this reader first indexed the group, by its own clock. Recency
windows use ``least(published_at, first_seen)``: a publisher's clock may make its group
look older, never newer than the reader saw it."""


SCHEMA_SQL = (
    "SELECT file_name, name, type, converted_type, logical_type, num_children "
    "FROM parquet_schema({files})"
)
CONTENT_SQL = (
    "SELECT file_name, count(DISTINCT row_group_id), "
    "coalesce(sum(row_group_num_rows) FILTER (column_id = 0), 0), "
    "coalesce(sum(total_uncompressed_size) FILTER (path_in_schema IN ("
    + ", ".join(sql_str(c) for c in COLUMN_NAMES)
    + ")), 0) FROM parquet_metadata({files}) GROUP BY file_name"
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


def _changed(state: FileState, listed: ObjectInfo) -> bool:
    """Whether the listing shows that an examined object was overwritten."""
    return (listed.size is not None and listed.size != state.size) or (
        listed.version is not None and listed.version != state.version
    )


CONSISTENT_COLUMNS = ("task", "task_config", "task_seed", "task_index", "question", "answer")
"""Columns every row of a served group shares (the question it answers)."""


class FileChanged(StorageError):
    """An indexed file is no longer what was examined (overwritten or unreadable): it was
    forgotten, and the read is retried after listing again."""


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


@dataclass
class RefreshStats:
    added: int = 0
    removed: int = 0
    bad_files: int = 0
    rejected_rows: int = 0
    vanished: int = 0
    seconds: float = 0.0
    """How long the refresh took (listing, examining and indexing), of which:"""
    list_seconds: float = 0.0
    """listing the store (a change-log poll, a local walk);"""
    read_seconds: float = 0.0
    """reading new files into local copies (with copies; else DuckDB reads as it examines)."""


class Catalog:
    def __init__(
        self,
        store: Store,
        con: duckdb.DuckDBPyConnection,
        limits: RowLimits,
        signatures: str = "swarm",
        copies: LocalCopies | None = None,
    ) -> None:
        self.store = store
        self.copies = copies
        """Where new rollout files are copied, checked and served from (ledger/copies.py);
        None: DuckDB reads them in the store."""
        self.con = con
        self.limits = limits
        self.signatures = signatures
        """'swarm' (check where the swarm's rules require it), 'required' or 'off'."""
        self.registry = identity.Registry()
        self.identity_objects: dict[str, bytes | None] = {}
        self._identity_stats: dict[str, tuple[int, str | None]] = {}
        """Local stores: (size, mtime) of each identity object when last read."""
        """The key and rules objects read, as read (None: unreadable): a saved index
        (ledger/reader_index.py) learns them again without reading the store."""
        self.files: dict[str, FileState] = {}
        self._listed: dict[str, ObjectInfo] = {}
        """The last listing read through, by key: what the next refresh compares with."""
        self._by_path: dict[str, FileState] = {}
        self._rules_seen: frozenset[tuple[str, ...]] | None = None
        """The identity rules as the last refresh left them (``_rules``): a rule that is
        stricter since (a key, a pin) has what it governs judged again."""
        self.log_files: dict[str, dict[str, int | None]] = {log.name: {} for log in node_logs.ALL}
        """Per node log (by name): key -> size of every file of it seen (read or skipped)."""
        self.sample_files = self.log_files[node_logs.SAMPLES.name]
        self.log_problems: dict[str, node_logs.Problem] = {}
        """Node-log files skipped whole, or in part (malformed lines), by key."""
        self._reason_sql = v.reject_reason_sql(limits)
        self._group_problem_sql = v.group_problem_sql(limits)
        con.execute(f"CREATE TABLE group_index ({GROUP_COLUMNS})")
        con.execute(f"CREATE TABLE groups ({GROUP_COLUMNS})")
        # Sampling looks up a handful of drawn groups among up to millions, and a refresh
        # serves a new group unless its id is served already: both through the key's index.
        con.execute("ALTER TABLE groups ADD PRIMARY KEY (group_id)")
        # Every accepted row by its place in its file: what ``rollouts`` serves, found by a
        # join instead of judging (and de-duplicating) the rows again on every query. One
        # row per file: a sample finds its few files' rows without a pass over every row.
        con.execute("CREATE TABLE valid_rows (filename VARCHAR, file_row_numbers BIGINT[])")
        con.execute(
            "CREATE TABLE ledger_files (key VARCHAR, size BIGINT, status VARCHAR, "
            "detail VARCHAR, rows BIGINT, rejected_rows BIGINT)"
        )
        for node_log in node_logs.ALL:
            con.execute(f"CREATE TABLE {node_log.name} ({node_log.table_columns})")
        self.manifests = manifests.ManifestIndex(store, con, vouch=self.vouch)
        self._views_stale = True
        self.ensure_views()

    # -- refresh -----------------------------------------------------------------------

    def refresh(self) -> RefreshStats:
        """Bring the index up to date with the store; read only files not seen before.

        One listing, read once. A file that vanished between listing and reading (a
        compactor replaced it, writing the merged file before deleting) is counted in
        ``stats.vanished`` and not remembered: the listing was stale, and listing again is
        the caller's call (``Ledger`` does it under its retry policy, the only retry layer).
        """
        start = time.perf_counter()
        stats = self._refresh_once()
        stats.seconds = time.perf_counter() - start
        return stats

    def _refresh_once(self) -> RefreshStats:
        started = time.perf_counter()
        # Signatures are read by key, never listed: a ledger holds one per file, and a peer
        # can add folders of them by the hundred thousand.
        listing = self.store.list(skip=identity.SIGNATURES_PREFIX)
        listed_in = time.perf_counter() - started
        current = {o.key: o for o in listing}
        # What differs from the last listing read through: a refresh costs what is new,
        # not what the ledger holds. Stores hand back the same ObjectInfo for an object
        # they have not re-listed, so identity settles almost every comparison.
        last = self._listed
        listed = [o for o in listing if (seen := last.get(o.key)) is not o and seen != o]
        gone = (last.keys() if last else self._known_keys()) - current.keys()
        # Keys and rules first: they decide which node logs, manifests and files must be
        # signed, and by whom. Node logs and manifests a node's new key or its swarm's new
        # rules now require signed are judged again.
        # (A first refresh has judged nothing yet; the rules seen advance only when a
        # refresh completes, so one that fails is judged again by the next.)
        before = self._rules_seen
        for key in self._refresh_registry(listed):
            current.pop(key)  # listed again until it can be read
        rules = self._rules()
        became = frozenset() if before is None else rules - before
        self._close_swarms({fact[1] for fact in became if fact[0] == "closed"})
        listed += self._recheck_keyed({(f[1], f[2]) for f in became if f[0] == "key"}, current)
        again = self._judge_again(listing, became)
        again_keys = {o.key for o in again}
        listed_again = [o for o in listed if o.key not in again_keys] + again
        for node_log in node_logs.ALL:
            mine = [o for o in listed_again if node_log.is_key(o.key)]
            self._refresh_node_log(node_log, mine, gone, again_keys)
        self.manifests.refresh(listed_again, gone, again_keys)
        # Objects are written once, but a peer may overwrite its own: a known key is
        # examined again when the listing shows a new size or version (S3's ETag). A local
        # listing has neither; fetch_groups re-checks the files it reads instead.
        added = [
            o
            for o in listed
            if o.key.endswith(".parquet")
            and not o.key.startswith(node_logs.PREFIXES)
            and (o.key not in self.files or _changed(self.files[o.key], o))
        ]
        overwritten = [o.key for o in added if o.key in self.files]
        removed = [k for k in gone if k in self.files] + overwritten
        stats = RefreshStats(added=len(added), removed=len(removed), list_seconds=listed_in)
        if not added and not removed:
            self._listed = current
            self._rules_seen = rules
            return stats
        # Forgotten files lose their groups at once: whatever fails below, the index never
        # holds a group whose file it no longer tracks.
        if removed:
            self._drop_files(self._forget(removed))
        self._views_stale = True
        new_states = self._examine_all(added, stats)
        ok = [s for s in new_states if s.status == OK]
        try:
            for start in range(0, len(ok), INGEST_BATCH_FILES):
                self._ingest(ok[start : start + INGEST_BATCH_FILES])
        except BaseException:
            # Not yet tracked, so not yet served: drop what was indexed of them, and the
            # next refresh examines them afresh.
            self._drop_files([s.path for s in ok])
            raise
        vanished = {s.key for s in new_states if s.status == VANISHED}
        if self.copies is not None:  # only what is served is kept
            self.copies.remove([s.path for s in new_states if s.status != OK])
        for state in new_states:
            if state.status == VANISHED:
                stats.added -= 1
                stats.vanished += 1
                continue
            self.track(state)
            if state.status != OK:
                stats.bad_files += 1
                log.warning("skipping %s: %s (%s)", state.key, state.status, state.detail)
            elif state.rejected:
                stats.rejected_rows += sum(state.rejected.values())
                log.warning("skipping rows of %s: %s", state.key, dict(state.rejected))
        # A file that vanished is looked at again if it is listed again.
        self._listed = {k: o for k, o in current.items() if k not in vanished}
        self._rules_seen = rules
        return stats

    def _rules(self) -> frozenset[tuple[str, ...]]:
        """The identity rules in force, as facts: ("key", swarm, node) for each node with a
        usable key, ("signed", swarm) for each swarm whose rules (or this reader) require
        signatures, ("closed", swarm, members) for each closed swarm."""
        facts: set[tuple[str, ...]] = {
            ("key", *place)
            for place, key in self.registry.keys.items()
            if isinstance(key, identity.Ed25519PublicKey)
        }
        facts |= {("reports", *place) for place in self.registry.reporters}
        swarms = set(self.registry.rules) | self.registry.pinned | set(self.registry.pinned_members)
        for swarm in swarms:
            if self.registry.requires_signatures(swarm, "swarm"):
                facts.add(("signed", swarm))
            members = self.registry.members(swarm)
            if members is not None:
                facts.add(("closed", swarm, ",".join(sorted(members))))
        return frozenset(facts)

    def settle_rules(self) -> None:
        """Take the identity rules as they are now as what everything held was judged by (a
        loaded index): a rule made stricter before the next refresh is applied by it."""
        self._rules_seen = self._rules()

    def _judge_again(
        self, listing: list[ObjectInfo], became: frozenset[tuple[str, ...]]
    ) -> list[ObjectInfo]:
        """The node logs and manifests in ``listing`` of nodes, or swarms, whose rules
        ``became`` stricter (a new key, signatures required, the swarm closed): what they
        were found to be no longer holds."""
        nodes = {(f[1], f[2]) for f in became if f[0] in ("key", "reports")}
        swarms = {f[1] for f in became if f[0] in ("signed", "closed")}
        if not nodes and not swarms:
            return []
        reports = (manifests.PREFIX, *node_logs.PREFIXES)
        places = {o.key: identity.object_place(o.key) for o in listing if o.key.startswith(reports)}
        return [
            o
            for o in listing
            if (place := places.get(o.key)) and (place in nodes or place[0] in swarms)
        ]

    def _recheck_keyed(
        self, nodes: set[tuple[str, str]], current: dict[str, ObjectInfo]
    ) -> list[ObjectInfo]:
        """Forget the served files of nodes that now have a key (their unsigned files were
        served while they had none): returned to be examined again in this refresh."""
        if not nodes:
            return []
        keys = []
        for state in self.files.values():
            parts = parse_key(state.key)
            if state.status == OK and parts and (parts.swarm_id, parts.node_id) in nodes:
                keys.append(state.key)
        if keys:
            self._drop_files(self._forget(keys))
            self._views_stale = True
        return [current[k] for k in keys if k in current]

    def _close_swarms(self, swarms: set[str]) -> None:
        """Stop serving files that nodes outside a newly closed swarm's members wrote in it
        (read before its rules were: a peer that published before the swarm started)."""
        if not swarms:
            return
        outsiders = []
        for state in self.files.values():
            place = identity.object_place(state.key)
            refused = self.registry.not_a_member(state.key)
            if state.status == OK and place is not None and place[0] in swarms and refused:
                log.warning("skipping %s from now on: %s", state.key, refused[1])
                state.status, state.detail = refused
                outsiders.append(state.path)
        if outsiders:
            self._drop_files(outsiders)
            self._views_stale = True

    def _known_keys(self) -> set[str]:
        """Every key the catalog holds something for (what a first listing may drop)."""
        keys = set(self.files) | self.manifests.valid.keys() | self.manifests.skipped.keys()
        for known in self.log_files.values():
            keys |= known.keys()
        return keys

    def track(self, state: FileState) -> None:
        """Hold ``state`` as what its file was found to be (by a refresh or a saved index)."""
        self.files[state.key] = state
        self._by_path[state.path] = state

    def _forget(self, keys: list[str]) -> list[str]:
        """Drop ``keys`` from the file set (their groups go in ``_drop_files``); their
        paths. A forgotten key still in the store is examined afresh at the next refresh."""
        for key in keys:
            self._listed.pop(key, None)  # listed again, it is new again
        paths = [self.files.pop(k).path for k in keys if k in self.files]
        for path in paths:
            self._by_path.pop(path, None)
        return paths

    def condemn(self, paths: list[str], detail: str) -> None:
        """Stop serving files that misbehaved after they were examined, for good: their
        groups go, and they stay listed as CHANGED (re-examining them could loop)."""
        states = [self._by_path[p] for p in paths if p in self._by_path]
        for state in states:
            log.warning("skipping %s from now on: %s", state.key, detail)
            state.status, state.detail = v.CHANGED, detail
        self._drop_files([s.path for s in states])
        self._views_stale = True

    def evict(self, paths: list[str]) -> None:
        """Forget files found changed since they were examined, with their groups."""
        keys = [self._by_path[p].key for p in paths if p in self._by_path]
        for key in keys:
            log.warning("%s changed since it was indexed: examining it again", key)
        self._drop_files(self._forget(keys))
        self._views_stale = True

    def _refresh_registry(self, listed: list[ObjectInfo]) -> list[str]:
        """Read key and rules objects new to the listing, or changed in it (small; a rewrite
        is refused by the registry, which pins the first reading). An object named by a
        listing or marker but missing from the store is not judged: it is read when it
        appears. Returns those keys."""
        missing: list[str] = []
        wanted = [
            o for o in listed if o.key.startswith((identity.KEYS_PREFIX, identity.SWARMS_PREFIX))
        ]
        local = is_local(self.store)
        if local:
            # A local listing carries no version: a rewrite in place shows in a stat only
            # (one per known object, microseconds each).
            named = {o.key for o in wanted}
            wanted += [ObjectInfo(k, None) for k in self._identity_stats if k not in named]
        for obj in wanted:
            if local:
                try:
                    seen = self.store.stat(obj.key)
                except (FileNotFoundError, NotRegularFile):
                    seen = None
                if seen is not None and self._identity_stats.get(obj.key) == seen:
                    continue
                if seen is not None:
                    self._identity_stats[obj.key] = seen
            try:
                most = (
                    identity.MAX_RULES_BYTES
                    if obj.key.startswith(identity.SWARMS_PREFIX)
                    else identity.MAX_OBJECT_BYTES
                )
                data: bytes | None = self.store.read(obj.key, most)
            except FileNotFoundError:
                missing.append(obj.key)
                continue
            except (NotRegularFile, PermissionError, OversizedObject):
                data = None  # a peer's unreadable object is skipped, never a reader's crash
            self.learn_identity(obj.key, data)
        return missing

    def learn_identity(self, key: str, data: bytes | None) -> None:
        if self.identity_objects.get(key) is None:  # the first usable reading is kept
            self.identity_objects[key] = data
        self.registry.learn(key, data)

    def mark_views_stale(self) -> None:
        """The file set changed outside a refresh (a loaded index): rebuild views lazily."""
        self._views_stale = True

    def _read_small(self, key: str, most: int) -> bytes | None:
        """The bytes of ``key`` if it is a regular object of at most ``most`` bytes."""
        try:
            return self.store.read(key, most)
        except (FileNotFoundError, NotRegularFile, PermissionError, OversizedObject):
            return None  # a peer's unreadable object is skipped, never a reader's crash

    def _refresh_node_log(
        self,
        node_log: node_logs.NodeLog,
        listed: list[ObjectInfo],
        gone_keys: AbstractSet[str],
        again: AbstractSet[str] = frozenset(),
    ) -> None:
        """Keep ``node_log``'s table = the sound lines of its files now in the store, given
        its files new to the listing, the keys gone from it, and keys to read afresh (their
        node's signing rule changed)."""
        known = self.log_files[node_log.name]
        current = {o.key: o.size for o in listed}
        self._forget_logs(node_log, [k for k in gone_keys | again if k in known])
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
                    self._log_problem(key, node_logs.Problem(v.NOT_REGULAR, str(exc)))
                    continue
                except PermissionError as exc:
                    known[key] = None
                    self._log_problem(key, node_logs.Problem(node_logs.UNREADABLE, str(exc)))
                    continue
            known[key] = size
            place = identity.object_place(key)
            if size > node_log.max_bytes:
                detail = f"{size} bytes > {node_log.max_bytes}"
                self._log_problem(key, node_logs.Problem(node_logs.OVERSIZED, detail))
            elif refused := self.registry.not_a_member(key):
                self._log_problem(key, node_logs.Problem(*refused))
            elif place is not None and self.registry.must_sign_reports(*place, self.signatures):
                signed.append(key)
            else:
                readable[self.store.reader_path(key)] = key
        try:
            paths = list(readable)
            for start in range(0, len(paths), INGEST_BATCH_FILES):
                problems = node_log.ingest(self.con, paths[start : start + INGEST_BATCH_FILES])
                for path, problem in problems.items():
                    self._log_problem(readable.get(path, path), problem)
            if signed:
                self._ingest_signed(node_log, signed)
        except BaseException:
            # Not remembered, and none of their rows kept: the next refresh reads them
            # afresh (a storage error on one read must not lose a log for good).
            self._forget_logs(node_log, [*readable.values(), *signed])
            raise

    def _forget_logs(self, node_log: node_logs.NodeLog, keys: list[str]) -> None:
        """Drop ``keys``' rows from the log's table and forget the files: a later listing
        that shows them has them read afresh."""
        if not keys:
            return
        paths = sql_list([self.store.reader_path(k) for k in keys])
        self.con.execute(f"DELETE FROM {node_log.name} WHERE list_contains({paths}, source_file)")
        for key in keys:
            self.log_files[node_log.name].pop(key, None)
            self.log_problems.pop(key, None)

    def _ingest_signed(self, node_log: node_logs.NodeLog, keys: list[str]) -> None:
        """Read each file once, check its signature over those bytes, and ingest exactly
        those bytes (from a private copy in the node log's layout, so the partitions still
        name the node); rows keep the store's path as ``source_file``. A few files at a
        time: memory and disk hold at most ``SIGNED_LOG_CHUNK`` of them."""
        for first in range(0, len(keys), SIGNED_LOG_CHUNK):
            chunk = keys[first : first + SIGNED_LOG_CHUNK]
            with tempfile.TemporaryDirectory(prefix="sapo-node-logs-") as tmp:
                copies: dict[str, str] = {}  # copy path -> key
                read = in_threads(lambda key: self._read_vouched(key, node_log.max_bytes), chunk)
                for key, outcome in zip(chunk, read, strict=True):
                    if outcome is None:
                        self.log_files[node_log.name].pop(key, None)  # vanished: seen again
                    elif isinstance(outcome, node_logs.Problem):
                        self._log_problem(key, outcome)
                    else:
                        copy = Path(tmp, key)
                        copy.parent.mkdir(parents=True, exist_ok=True)
                        copy.write_bytes(outcome)
                        copies[str(copy)] = key
                del read
                if copies:
                    self._ingest_copies(node_log, copies)

    def _ingest_copies(self, node_log: node_logs.NodeLog, copies: dict[str, str]) -> None:
        """Ingest local copies (path -> key), their rows renamed to the store's paths."""
        batch = list(copies)
        for path, problem in node_log.ingest(self.con, batch).items():
            self._log_problem(copies.get(path, path), problem)
        renamed = pa.table(
            {"copy": batch, "stored": [self.store.reader_path(copies[c]) for c in batch]}
        )
        self.con.register("_renamed", renamed)
        try:
            self.con.execute(
                f"UPDATE {node_log.name} SET source_file = _renamed.stored "
                f"FROM _renamed WHERE {node_log.name}.source_file = _renamed.copy"
            )
        finally:
            self.con.unregister("_renamed")

    def _read_vouched(self, key: str, most: int) -> bytes | node_logs.Problem | None:
        """The bytes of a node's object if its node signed them; why not; None if gone."""
        try:
            data = self.store.read(key, most)
        except FileNotFoundError:
            return None
        except (NotRegularFile, PermissionError, OversizedObject) as exc:
            return node_logs.Problem(node_logs.UNREADABLE, str(exc))
        refused = self.vouch(key, data)
        return data if refused is None else node_logs.Problem(*refused)

    def _log_problem(self, key: str, problem: node_logs.Problem) -> None:
        self.log_problems[key] = problem
        what = "lines of" if problem.lines else "node log"
        log.warning("skipping %s %s: %s (%s)", what, key, problem.reason, problem.detail)

    def _examine_all(self, objects: list[ObjectInfo], stats: RefreshStats) -> list[FileState]:
        """Judge new files by their place, size and Parquet footer, chunks in parallel."""
        states = [self._place_and_size(o) for o in objects]
        for state in states:
            if state.status == OK and (refused := self.registry.not_a_member(state.key)):
                state.status, state.detail = refused
        if self.copies is not None:
            started = time.perf_counter()
            in_threads(self._take_copy, [s for s in states if s.status == OK])
            stats.read_seconds = time.perf_counter() - started
        for state in states:
            if state.status == OK:
                self._check_footer_size(state)
        pending = [s for s in states if s.status == OK]
        chunks = [pending[i : i + EXAMINE_CHUNK] for i in range(0, len(pending), EXAMINE_CHUNK)]
        in_threads(self._check_schemas, chunks)
        signed = [s for s in states if s.status == OK and self._needs_signature(s)]
        in_threads(self._check_signature, signed)
        return states

    def _needs_signature(self, state: FileState) -> bool:
        parts = parse_key(state.key)
        return parts is not None and self.registry.must_sign(
            parts.swarm_id, parts.node_id, self.signatures
        )

    def vouch(self, key: str, data: bytes) -> tuple[str, str] | None:
        """Why a node log or manifest's ``data`` at ``key`` cannot be taken as its node's
        (status, detail), or None: its node is a member of its swarm (if closed) and need
        not sign, or signed exactly these bytes."""
        refused = self.registry.not_a_member(key)
        if refused is not None:
            return refused
        place = identity.object_place(key)
        if place is None or not self.registry.must_sign_reports(*place, self.signatures):
            return None
        return self.registry.vouch(key, data, self._signature_of(key, data))

    def _signature_of(self, key: str, data: bytes) -> bytes | None:
        """The signature object of ``data`` at ``key`` (named by its digest), if readable."""
        where = identity.signature_key(key, identity.sha256_of(data))
        return self._read_small(where, identity.MAX_OBJECT_BYTES)

    def _check_signature(self, state: FileState) -> None:
        """The file's bytes must be signed by its node's registered key (ledger/identity.py)."""
        parts = parse_key(state.key)
        assert parts is not None
        public = self.registry.signing_key(parts.swarm_id, parts.node_id)
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
        self, state: FileState, public: identity.Ed25519PublicKey | None
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
        self, state: FileState, data: bytes, public: identity.Ed25519PublicKey | None
    ) -> bytes | tuple[str, str]:
        """``data`` if ``public`` is None or signed ``data`` as ``state``'s object; else
        (status, why)."""
        if public is None:
            return data
        refused = identity.judge(public, state.key, data, self._signature_of(state.key, data))
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
            chunk[0].status, chunk[0].detail = self._failure(chunk[0].key, exc)
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

    def _ingest(self, batch: list[FileState]) -> None:
        """Judge the rows of ``batch`` and add one summary row per valid group."""
        try:
            self._ingest_query(batch)
        except duckdb.Error as exc:
            if len(batch) == 1:
                batch[0].status, batch[0].detail = self._failure(batch[0].key, exc)
                return
            # One bad file spoils a multi-file scan: retry one by one to isolate it.
            for state in batch:
                self._ingest([state])

    def _failure(self, key: str, exc: duckdb.Error) -> tuple[str, str]:
        """Why reading ``key`` failed: it is corrupt, or gone, or the read itself failed (an
        I/O or HTTP error: like a vanished file, not remembered, so that the next refresh
        examines it again instead of holding an honest file corrupt until a restart)."""
        if self.copies is not None:  # read from its local copy: the bytes are at fault
            return v.CORRUPT, first_line(exc)
        if isinstance(exc, duckdb.IOException | duckdb.HTTPException):
            return VANISHED, first_line(exc)
        return (v.CORRUPT if self.store.exists(key) else VANISHED), first_line(exc)

    def _ingest_query(self, batch: list[FileState]) -> None:
        con = self.con
        # Judged rows keep ids, numbers and digests of the texts (v.JUDGED_COLUMNS), never
        # the completions: memory stays small however much text a batch holds.
        con.execute(
            f"""CREATE OR REPLACE TEMP TABLE _judged AS
            WITH raw AS ({scan_sql(sql_list([s.path for s in batch]), row_numbers=True)}),
            reasoned AS (
                SELECT {v.JUDGED_COLUMNS}, day, filename, file_row_number,
                    {self._reason_sql} AS reason
                FROM raw)
            SELECT * EXCLUDE (reason),
                CASE WHEN reason IS NULL AND row_number() OVER (
                    PARTITION BY filename, rollout_id, reason IS NULL
                    ORDER BY completion_digest) > 1
                THEN '{v.DUPLICATE_ID}' ELSE reason END AS reason
            FROM reasoned"""
        )
        con.execute(
            f"""CREATE OR REPLACE TEMP TABLE _groups AS
            SELECT group_id, any_value(swarm_id) AS swarm_id, any_value(node_id) AS node_id,
                any_value(model_id) AS model_id, any_value(task) AS task,
                any_value(node_round) AS node_round, max(policy_version) AS policy_version,
                count(*)::INTEGER AS size, avg(reward) AS reward_mean,
                stddev_pop(reward) AS reward_std, min(reward) AS reward_min,
                max(reward) AS reward_max, max(published_at) AS published_at,
                any_value(day) AS day, filename AS source_file,
                current_timestamp AS first_seen,
                {self._group_problem_sql} AS problem
            FROM _judged WHERE reason IS NULL
            GROUP BY filename, group_id"""
        )
        # A group seen before (in a file compaction since merged) keeps its first sight,
        # which every indexed copy of it carries, the served one too.
        con.execute(
            """CREATE OR REPLACE TEMP TABLE _accepted AS
            SELECT g.* EXCLUDE (problem, first_seen),
                coalesce(seen.first_seen, g.first_seen) AS first_seen
            FROM _groups g LEFT JOIN (
                SELECT group_id, first_seen FROM groups SEMI JOIN _groups USING (group_id)
            ) seen USING (group_id)
            WHERE g.problem IS NULL"""
        )
        con.execute("INSERT INTO group_index SELECT * FROM _accepted")
        # Served unless its id is served already (another copy, or another file of a
        # peer that reuses ids): through the key's index, not a pass over all groups.
        # In file order, the first copy of a group the batch holds twice wins (DuckDB
        # inserts in the order given): what a window over the batch chose, for less.
        con.execute(
            "INSERT INTO groups SELECT * FROM _accepted ORDER BY source_file ON CONFLICT DO NOTHING"
        )
        con.execute(
            """INSERT INTO valid_rows
            SELECT j.filename, list(j.file_row_number ORDER BY j.file_row_number) FROM _judged j
            SEMI JOIN _groups g ON j.filename = g.source_file AND j.group_id = g.group_id
                AND g.problem IS NULL
            WHERE j.reason IS NULL
            GROUP BY j.filename"""
        )
        by_path = {s.path: s for s in batch}
        counts = con.execute(
            """SELECT filename, reason, count(*) FROM _judged GROUP BY ALL
            UNION ALL
            SELECT source_file, problem, sum(size) FROM _groups
            WHERE problem IS NOT NULL GROUP BY ALL"""
        ).fetchall()
        for path, reason, n in counts:
            state = by_path[path]
            state.rows += int(n)
            if reason is not None:
                state.rejected[reason] += int(n)
        con.execute("DROP TABLE _judged; DROP TABLE _groups; DROP TABLE _accepted")

    def _drop_files(self, paths: list[str]) -> None:
        """Stop serving the files at ``paths``: their index rows and local copies go, and
        each group one of them served is served from another indexed copy, if there is one."""
        if not paths:
            return
        if self.copies is not None:
            self.copies.remove(paths)
        con = self.con
        # Paths go in as a small table joined by hash: a list literal tested row by row
        # costs (rows x paths), and compaction removes many files at once.
        con.execute(
            "CREATE OR REPLACE TEMP TABLE _removed AS "
            f"SELECT unnest({sql_list(paths)}::VARCHAR[]) AS path"
        )
        con.execute(
            "CREATE OR REPLACE TEMP TABLE _orphaned AS SELECT group_id FROM groups "
            "WHERE source_file IN (SELECT path FROM _removed)"
        )
        for table, column in (
            ("valid_rows", "filename"),
            ("group_index", "source_file"),
            ("groups", "source_file"),
        ):
            con.execute(f"DELETE FROM {table} WHERE {column} IN (SELECT path FROM _removed)")
        # Each orphan from its first other copy by file name (DuckDB inserts in the order
        # given), as a new group is served.
        con.execute(
            """INSERT INTO groups
            SELECT gi.* FROM group_index gi SEMI JOIN _orphaned USING (group_id)
            ORDER BY gi.source_file ON CONFLICT DO NOTHING"""
        )
        con.execute("DROP TABLE _orphaned; DROP TABLE _removed")

    def ensure_views(self) -> None:
        """(Re)define ``rollouts`` and ``ledger_files`` after the file set changed.

        Deferred to the first query that may need them: binding the view reads every
        file's footer, work that sampling never needs.
        """
        if not self._views_stale:
            return
        con = self.con
        con.execute("DELETE FROM ledger_files")
        if self.files:
            import pyarrow as pa

            states = list(self.files.values())
            con.register(
                "_files_arrow",
                pa.table(
                    {
                        "key": [s.key for s in states],
                        "size": [s.size for s in states],
                        "status": [s.status for s in states],
                        "detail": [s.detail for s in states],
                        "rows": [s.rows for s in states],
                        "rejected_rows": [sum(s.rejected.values()) for s in states],
                    }
                ),
            )
            con.execute("INSERT INTO ledger_files SELECT * FROM _files_arrow ORDER BY key")
            con.unregister("_files_arrow")
        ok_paths = self.ok_paths()
        if ok_paths:
            con.execute(f"SET VARIABLE sapo_ledger_files = {sql_list(ok_paths)}")
        # Streams: no window or sort over the rows, whose texts may be large.
        source = (
            scan_sql("getvariable('sapo_ledger_files')", row_numbers=True)
            if ok_paths
            else TYPED_EMPTY_NUMBERED
        )
        con.execute(
            f"""CREATE OR REPLACE VIEW rollouts AS
            WITH raw AS ({source})
            SELECT {PUBLIC_COLUMNS_SQL} FROM raw
            SEMI JOIN (SELECT filename, unnest(file_row_numbers) AS file_row_number
                FROM valid_rows) v
                ON raw.filename = v.filename AND raw.file_row_number = v.file_row_number
            SEMI JOIN groups g ON raw.group_id = g.group_id AND raw.filename = g.source_file"""
        )
        self._views_stale = False

    # -- reads -------------------------------------------------------------------------

    def ok_paths(self) -> list[str]:
        return sorted(s.path for s in self.files.values() if s.status == OK)

    def fetch_groups(self, group_ids: list[str]) -> pl.DataFrame | None:
        """Every valid completion of ``group_ids``, in draw order, read from the one file
        indexed per group. None when none of them is indexed (any more).

        The files read must still be what was examined: a local file whose size or mtime
        moved, a file DuckDB can no longer read, or a group that no longer matches its
        index row (size, one question) is forgotten and FileChanged raised, so that the
        ledger lists again, examines the file afresh and draws again.
        """
        if not group_ids:
            return None
        # Ids go to DuckDB as parameters, never as SQL text: a peer chose them.
        params = {f"g{i}": g for i, g in enumerate(group_ids)}
        wanted = ", ".join(f"${name}" for name in params)
        located = self.con.execute(
            f"SELECT group_id, source_file, size FROM groups WHERE group_id IN ({wanted})", params
        ).fetchall()
        if not located:
            return None
        files = sorted({f for _, f, _ in located})
        self._check_unchanged(files)
        # Always by name: a peer's file may store a column in a narrower type, which a scan
        # typed by the first file would force onto the others. Only rows the index accepted
        # (valid_rows) are read out, so a file that repeats one id a million times yields
        # the group's rows, not the million.
        scan = scan_sql(sql_list(files), where=f"group_id IN ({wanted})", row_numbers=True)
        try:
            table = self.con.execute(
                f"SELECT {PUBLIC_COLUMNS_SQL}, filename FROM ({scan}) raw "
                "SEMI JOIN (SELECT filename, unnest(file_row_numbers) AS file_row_number "
                f"FROM valid_rows WHERE filename IN {sql_in(files)}) v "
                "ON raw.filename = v.filename AND raw.file_row_number = v.file_row_number "
                f"WHERE ({self._reason_sql}) IS NULL",
                params,
            ).arrow()
        except duckdb.Error as exc:
            self.evict(files)
            raise FileChanged(
                f"reading {len(files)} indexed files failed: {first_line(exc)}"
            ) from exc
        frame = pl.from_arrow(table)
        assert isinstance(frame, pl.DataFrame)
        # Each group from its indexed copy (compaction may leave two for a while), in draw
        # order; a rollout id a peer repeated inside its file is served once.
        draw_order = {g: i for i, g in enumerate(group_ids)}
        chosen = pl.DataFrame(
            {
                "group_id": [g for g, _, _ in located],
                "filename": [f for _, f, _ in located],
                "_draw": [draw_order[g] for g, _, _ in located],
                "_size": [n for _, _, n in located],
            },
            schema_overrides={"_size": pl.Int64},
        )
        served = (
            frame.join(chosen, on=["group_id", "filename"], how="inner")
            .sort(["_draw", "rollout_id", "completion"])
            .unique(subset="rollout_id", keep="first", maintain_order=True)
        )
        bad = self._groups_not_as_indexed(served, chosen)
        if bad:
            self.condemn(bad, "served groups differ from what was indexed")
            served = served.filter(~pl.col("filename").is_in(bad))
        return served.drop("_draw", "filename", "_size")

    def recover_from(self, exc: duckdb.Error) -> bool:
        """After a query over the views failed: forget the files it names and, on local disk,
        every file changed since it was examined. True if any was (worth a retry)."""
        message = str(exc)
        named = [p for p in self._by_path if p in message]
        changed = [] if self._reads_stay_put else self._changed_paths(self.ok_paths())
        suspects = sorted(set(named) | set(changed))
        if suspects:
            self.evict(suspects)
        return bool(suspects)

    @property
    def _reads_stay_put(self) -> bool:
        """Whether what is read is what was examined without checking: copies are ours,
        and a store that lists versions shows an overwrite at the next listing."""
        return self.copies is not None or self.store.lists_versions

    def _changed_paths(self, paths: list[str]) -> list[str]:
        """The paths whose object is no longer what was examined (stat'ed a few at a time:
        on S3 each is a round trip)."""
        states = [s for s in (self._by_path.get(p) for p in paths) if s is not None]
        if is_local(self.store):  # a stat takes microseconds: threads would cost more
            moved = [self._moved(s) for s in states]
        else:
            moved = in_threads(self._moved, states)
        return [s.path for s, m in zip(states, moved, strict=True) if m]

    def _moved(self, state: FileState) -> bool:
        try:
            now = self.store.stat(state.key)
        except (FileNotFoundError, NotRegularFile, PermissionError):
            return True
        return now != (state.size, state.version)

    def _check_unchanged(self, paths: list[str]) -> None:
        """Local files (whose listing carries no version) are stat'ed before they are read."""
        if self._reads_stay_put:
            return
        changed = self._changed_paths(paths)
        if changed:
            self.evict(changed)
            raise FileChanged(f"{len(changed)} indexed files changed since they were examined")

    @staticmethod
    def _groups_not_as_indexed(served: pl.DataFrame, chosen: pl.DataFrame) -> list[str]:
        """Files with a served group not of its indexed size, or not of one question."""
        summary = served.group_by("group_id", "filename").agg(
            pl.len().alias("rows"),
            pl.col("_size").first(),
            *(pl.col(c).n_unique().alias(f"n_{c}") for c in CONSISTENT_COLUMNS),
        )
        bad = summary.filter(
            (pl.col("rows") != pl.col("_size"))
            | pl.any_horizontal(pl.col(f"n_{c}") > 1 for c in CONSISTENT_COLUMNS)
        )
        missing = chosen.join(served, on=["group_id", "filename"], how="anti")
        return sorted(set(bad["filename"].to_list()) | set(missing["filename"].to_list()))

    def rejection_counts(self) -> Counter[str]:
        counts: Counter[str] = Counter()
        for state in self.files.values():
            if state.status != OK:
                counts[state.status] += 1
            counts.update(state.rejected)
        duplicates = self.con.execute(
            "SELECT coalesce(sum(size), 0) FROM group_index gi "
            "ANTI JOIN groups g USING (group_id, source_file)"
        ).fetchone()
        if duplicates and duplicates[0]:
            counts[v.DUPLICATE_GROUP] += int(duplicates[0])
        return counts
