"""An incremental, validated index of a ledger, held in one DuckDB connection.

Objects are immutable, so each is examined once. A refresh lists the store, diffs the
listing with the last one, and hands what is new (and what is gone) to the indexes of each
kind of object, identities first (they decide what must be signed, and by whom):

- ``IdentityIndex`` (ledger/registry.py): key and rules objects, into the registry;
- ``NodeLogIndex`` (ledger/node_log_index.py), one per node log: the tables ``samples``,
  ``evaluations``, ``trainings``, the nodes' self-reports;
- ``ManifestIndex`` (ledger/manifests.py): ``manifests``, what each node declared;
- rollout files: judged whole by ``Admission`` (ledger/admission.py), their rows by the
  ``GroupIndex`` (ledger/group_index.py): ``groups`` (one row per group, what sampling
  policies query), ``rollouts`` (one row per valid completion), ``ledger_files`` (every
  object seen, with its status).

Serving is the catalog's own: a group is read from the file it was indexed from and checked
against its index row (``ledger/served.py``). A file found changed since it was examined
(overwritten, unreadable) is forgotten and the caller lists again (``FileChanged``); one
whose groups are not what its index rows say is condemned and its groups left out.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from dataclasses import dataclass

import duckdb
import polars as pl

from ledger import manifests, node_logs
from ledger import validation as v
from ledger.admission import OK, VANISHED, Admission, FileState
from ledger.config import RowLimits
from ledger.copies import LocalCopies
from ledger.group_index import INGEST_BATCH_FILES, GroupIndex
from ledger.identity import SIGNATURES_PREFIX
from ledger.keys import object_place, parse_key
from ledger.node_log_index import NodeLogIndex
from ledger.node_logs import PREFIXES
from ledger.registry import IdentityIndex, Registry
from ledger.retrying import first_line
from ledger.served import in_draw_order
from ledger.storage import NotRegularFile, ObjectInfo, StorageError, Store, in_threads, is_local

log = logging.getLogger(__name__)


def _changed(state: FileState, listed: ObjectInfo) -> bool:
    """Whether the listing shows that an examined object was overwritten."""
    return (listed.size is not None and listed.size != state.size) or (
        listed.version is not None and listed.version != state.version
    )


class FileChanged(StorageError):
    """An indexed file is no longer what was examined (overwritten or unreadable): it was
    forgotten, and the read is retried after listing again."""


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
        check_signatures: str = "swarm",
        copies: LocalCopies | None = None,
    ) -> None:
        self.store = store
        self.copies = copies
        """Where new rollout files are copied, checked and served from (ledger/copies.py);
        None: DuckDB reads them in the store."""
        self.con = con
        self.limits = limits
        self.check_signatures = check_signatures
        """What this reader requires signed: 'swarm' (where the swarm's rules require it),
        'required' or 'off' (LedgerConfig.check_signatures)."""
        self.identities = IdentityIndex(store, check_signatures)
        self.admission = Admission(store, con, limits, self.identities, copies)
        self.groups = GroupIndex(con, limits)
        self.node_logs = [NodeLogIndex(n, store, con, self.identities) for n in node_logs.ALL]
        self.manifests = manifests.ManifestIndex(store, con, vouch=self.identities.vouch)
        self.reports: list[NodeLogIndex | manifests.ManifestIndex] = [
            *self.node_logs,
            self.manifests,
        ]
        """The indexes of the nodes' reports, refreshed alike after the identities."""
        self.files: dict[str, FileState] = {}
        self._listed: dict[str, ObjectInfo] = {}
        """The last listing read through, by key: what the next refresh compares with."""
        self._by_path: dict[str, FileState] = {}
        self._rules_seen: frozenset[tuple[str, ...]] | None = None
        """The identity rules as the last refresh left them (``IdentityIndex.rules``): a
        rule that is stricter since (a key, a pin) has what it governs judged again."""
        self._views_stale = True
        self.ensure_views()

    @property
    def registry(self) -> Registry:
        return self.identities.registry

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
        listing = self.store.list(skip=SIGNATURES_PREFIX)
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
        for key in self.identities.refresh(listed):
            current.pop(key)  # listed again until it can be read
        rules = self.identities.rules()
        became = frozenset() if before is None else rules - before
        self._close_swarms({fact[1] for fact in became if fact[0] == "closed"})
        listed += self._recheck_keyed({(f[1], f[2]) for f in became if f[0] == "key"}, current)
        again = self._judge_again(listing, became)
        again_keys = {o.key for o in again}
        listed_again = [o for o in listed if o.key not in again_keys] + again
        for index in self.reports:
            index.refresh(listed_again, gone, again_keys)
        # Objects are written once, but a peer may overwrite its own: a known key is
        # examined again when the listing shows a new size or version (S3's ETag). A local
        # listing has neither; fetch_groups re-checks the files it reads instead.
        added = [
            o
            for o in listed
            if o.key.endswith(".parquet")
            and not o.key.startswith(PREFIXES)
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
            self._drop(self._forget(removed))
        self._views_stale = True
        new_states, stats.read_seconds = self.admission.examine(added)
        ok = [s for s in new_states if s.status == OK]
        try:
            for start in range(0, len(ok), INGEST_BATCH_FILES):
                self.groups.ingest(ok[start : start + INGEST_BATCH_FILES], self.admission.failure)
        except BaseException:
            # Not yet tracked, so not yet served: drop what was indexed of them, and the
            # next refresh examines them afresh.
            self._drop([s.path for s in ok])
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

    def settle_rules(self) -> None:
        """Take the identity rules as they are now as what everything held was judged by (a
        loaded index): a rule made stricter before the next refresh is applied by it."""
        self._rules_seen = self.identities.rules()

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
        places = {o.key: object_place(o.key) for o in listing if o.key.startswith(reports)}
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
            self._drop(self._forget(keys))
            self._views_stale = True
        return [current[k] for k in keys if k in current]

    def _close_swarms(self, swarms: set[str]) -> None:
        """Stop serving files that nodes outside a newly closed swarm's members wrote in it
        (read before its rules were: a peer that published before the swarm started)."""
        if not swarms:
            return
        outsiders = []
        for state in self.files.values():
            place = object_place(state.key)
            refused = self.registry.not_a_member(state.key)
            if state.status == OK and place is not None and place[0] in swarms and refused:
                log.warning("skipping %s from now on: %s", state.key, refused[1])
                state.status, state.detail = refused
                outsiders.append(state.path)
        if outsiders:
            self._drop(outsiders)
            self._views_stale = True

    def _known_keys(self) -> set[str]:
        """Every key the catalog holds something for (what a first listing may drop)."""
        keys = set(self.files)
        for index in self.reports:
            keys |= index.known_keys()
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
        self._drop([s.path for s in states])
        self._views_stale = True

    def evict(self, paths: list[str]) -> None:
        """Forget files found changed since they were examined, with their groups."""
        keys = [self._by_path[p].key for p in paths if p in self._by_path]
        for key in keys:
            log.warning("%s changed since it was indexed: examining it again", key)
        self._drop(self._forget(keys))
        self._views_stale = True

    def _drop(self, paths: list[str]) -> None:
        """Stop serving the files at ``paths``: their groups and local copies go."""
        if self.copies is not None and paths:
            self.copies.remove(paths)
        self.groups.drop(paths)

    def mark_views_stale(self) -> None:
        """The file set changed outside a refresh (a loaded index): rebuild views lazily."""
        self._views_stale = True

    def ensure_views(self) -> None:
        """(Re)define ``rollouts`` and ``ledger_files`` after the file set changed.

        Deferred to the first query that may need them: binding the view reads every
        file's footer, work that sampling never needs.
        """
        if self._views_stale:
            self.groups.define_views(list(self.files.values()), self.ok_paths())
            self.con.execute(manifests.REVISIONS_VIEW_SQL)  # it reads `rollouts`
            self._views_stale = False

    # -- reads -------------------------------------------------------------------------

    def ok_paths(self) -> list[str]:
        return sorted(s.path for s in self.files.values() if s.status == OK)

    def fetch_groups(self, group_ids: list[str]) -> pl.DataFrame | None:
        """Every valid completion of ``group_ids``, in draw order, read from the one file
        indexed per group. None when none of them is indexed (any more).

        The files read must still be what was examined: a local file whose size or mtime
        moved, or a file DuckDB can no longer read, is forgotten and FileChanged raised, so
        that the ledger lists again, examines the file afresh and draws again. A file with a
        group that no longer matches its index row (size, one question) is condemned and
        its groups are left out.
        """
        if not group_ids:
            return None
        located, params = self.groups.locate(group_ids)
        if not located:
            return None
        files = sorted({f for _, f, _ in located})
        self._check_unchanged(files)
        try:
            table = self.groups.read_rows(files, params)
        except duckdb.Error as exc:
            self.evict(files)
            raise FileChanged(
                f"reading {len(files)} indexed files failed: {first_line(exc)}"
            ) from exc
        frame = pl.from_arrow(table)
        assert isinstance(frame, pl.DataFrame)
        served, bad = in_draw_order(frame, located, group_ids)
        if bad:
            self.condemn(bad, "served groups differ from what was indexed")
            served = served.filter(~pl.col("filename").is_in(bad))
        return served.drop("filename")

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

    def rejection_counts(self) -> Counter[str]:
        counts: Counter[str] = Counter()
        for state in self.files.values():
            if state.status != OK:
                counts[state.status] += 1
            counts.update(state.rejected)
        duplicates = self.groups.duplicate_rows()
        if duplicates:
            counts[v.DUPLICATE_GROUP] += duplicates
        return counts

    def log_problems(self) -> dict[str, node_logs.Problem]:
        """Node-log files skipped whole, or in part (malformed lines), by key."""
        return {k: p for index in self.node_logs for k, p in index.problems.items()}
