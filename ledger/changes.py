"""The change log: readers learn of new objects from markers, not by listing the whole store.

On S3 a listing returns 1,000 keys a request, so a reader that lists the ledger on every
refresh pays for the ledger's age (16k keys: 780 ms; 2M keys: 2,000 requests). Instead every
object a writer puts or deletes gets an empty marker beside the ledger::

    <root>/_changes/<ms since the epoch, 13 digits>/<the object's key>.added
    <root>/_changes/<ms>/<the object's key>.removed

S3 lists keys in order, so a reader asks only for markers after the last it has seen
(ListObjectsV2 ``StartAfter``): one request per 1,000 new markers, whatever the ledger holds.

Markers are hints and are never trusted. A marked key joins the listing without a size or
version, which only the store gives: the reader's read of it (one GET) confirms it, and a
read that finds nothing drops it. A key leaves only once the store says it is gone; only
keys a full listing would show are considered. A marker that lands late (a slow PUT, a
writer whose clock lags) is still read: each poll lists again from ``grace_s`` before its
own clock. One that never comes (an older writer, a peer that skips it, a clock far behind)
is caught by a full listing every ``full_listing_every_s``. A marker stamped far ahead of
the reader's clock waits for its time, so a peer's clock cannot push the reader past others'
markers. Markers carry neither ledger suffix, so a plain
``read_parquet('<root>/**/*.parquet')`` and the full listing never see them.
"""

from __future__ import annotations

import builtins
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ledger.config import ChangeLogConfig
from ledger.identity import SIGNATURES_PREFIX
from ledger.keys import is_safe_key
from ledger.storage import LEDGER_SUFFIXES, NotRegularFile, ObjectInfo, Store, in_threads

if TYPE_CHECKING:
    import duckdb

CHANGES_PREFIX = "_changes/"
ADDED = ".added"
REMOVED = ".removed"
UNMARKED = (CHANGES_PREFIX, SIGNATURES_PREFIX)
"""Objects no marker announces: markers, and signatures (readers fetch them by key)."""


@dataclass(frozen=True)
class Marker:
    at_ms: int
    key: str
    added: bool


def marker_key(key: str, added: bool, at_ms: int) -> str:
    return f"{CHANGES_PREFIX}{at_ms:013d}/{key}{ADDED if added else REMOVED}"


def parse_marker(name: str) -> Marker | None:
    """The marker a listed name is, or None for anything else (never an error: peers name
    objects under ``_changes/`` as they please)."""
    stamp, _, rest = name.removeprefix(CHANGES_PREFIX).partition("/")
    if not name.startswith(CHANGES_PREFIX) or len(stamp) != 13 or not stamp.isdigit():
        return None
    for suffix, added in ((ADDED, True), (REMOVED, False)):
        key = rest.removesuffix(suffix)
        listable = key.endswith(LEDGER_SUFFIXES) and not key.startswith(UNMARKED)
        if key != rest and listable and is_safe_key(key):
            return Marker(int(stamp), key, added)
    return None


@dataclass
class FeedStats:
    """What keeping the listing current has cost so far (the simulator prints it)."""

    polls: int = 0
    full_listings: int = 0
    markers_read: int = 0
    stats: int = 0
    last: Counter[str] = field(default_factory=Counter)
    """Requests made by the latest poll or full listing, by kind."""


class ChangeLogStore:
    """A store whose listing is kept current from the change log; everything else is the
    inner store's. Writes through it leave markers (see the module doc)."""

    lists_versions = False  # marked objects are stat'ed once; reads stat them again

    def __init__(
        self, inner: Store, config: ChangeLogConfig, clock: Callable[[], float] = time.time
    ) -> None:
        self.inner = inner
        self.config = config
        self.clock = clock
        self.url = inner.url
        self.unsafe_keys = inner.unsafe_keys  # the same objects: one count for both
        self.requests = inner.requests
        self.feed = FeedStats()
        self._listing: dict[str, ObjectInfo] = {}
        self._listed_fully_at = -float("inf")
        self._cursor_ms = 0
        self._seen: dict[str, int] = {}
        """Markers already acted on that a poll lists again (within the grace window)."""

    # -- listing -----------------------------------------------------------------------

    def list(self, prefix: str = "", skip: str = "") -> builtins.list[ObjectInfo]:
        if prefix.startswith(SIGNATURES_PREFIX):  # never in the held listing: ask the store
            return self.inner.list(prefix)
        before = Counter(self.inner.requests)
        now = self.clock()
        if now - self._listed_fully_at >= self.config.full_listing_every_s:
            self.list_fully(now)
        else:
            self.poll(now)
        self.feed.last = Counter(self.inner.requests) - before
        # In no particular order, as the inner stores' listings: sorting 20k keys on every
        # refresh cost more than the poll. Signatures are left out of the held listing
        # (readers fetch them by key; a peer can write them by the hundred thousand), and
        # so are keys under ``skip``.
        return [
            o
            for key, o in self._listing.items()
            if key.startswith(prefix)
            and not key.startswith(SIGNATURES_PREFIX)
            and not (skip and key.startswith(skip))
        ]

    def list_fully(self, now: float) -> None:
        """Replace the listing with the store's own (signatures left out); markers from
        ``grace_s`` before it started are read by the next poll (they may name what the
        listing missed)."""
        self._listing = {o.key: o for o in self.inner.list(skip=SIGNATURES_PREFIX)}
        self._listed_fully_at = now
        self._advance(int(now * 1000))
        self.feed.full_listings += 1

    def poll(self, now: float) -> None:
        """Read markers since the cursor; stat what they name; move the cursor."""
        now_ms = int(now * 1000)
        horizon = now_ms + int(self.config.future_tolerance_s * 1000)
        start = f"{CHANGES_PREFIX}{self._cursor_ms:013d}"
        # Markers stamped past the horizon wait for their time; listing stops before them,
        # so a flood stamped in the far future costs a poll nothing (was: a request per
        # 1,000 of them, at every poll, for ever). ``~`` sorts after every digit and '/'.
        stop = f"{CHANGES_PREFIX}{horizon:013d}~"
        names = self.inner.list_after(CHANGES_PREFIX, start, stop)
        fresh: list[tuple[str, Marker]] = []
        for name in names:
            marker = parse_marker(name)
            if marker is not None and name not in self._seen and marker.at_ms <= horizon:
                fresh.append((name, marker))
        # A key new to the listing joins it unconfirmed (no size, no version): the reader
        # reads it next, and that read confirms it or drops it (``read_versioned``), so
        # that a new object costs one request, not a HEAD and then a GET. Keys marked again
        # since the full listing (an overwrite: the version tells), and removed keys still
        # listed, are stat'ed.
        listed, listed_fully_ms = self._listing, self._listed_fully_at * 1000
        new = {m.key for _, m in fresh if m.added and m.key not in listed}
        touched = {
            m.key
            for _, m in fresh
            if m.key not in new
            and ((m.key in listed) != m.added or (m.added and m.at_ms > listed_fully_ms))
        }
        for key in new:
            listed[key] = ObjectInfo(key, None)
        self._settle(sorted(touched))
        for name, marker in fresh:
            self._seen[name] = marker.at_ms
        self._advance(now_ms)
        self.feed.polls += 1
        self.feed.markers_read += len(fresh)

    def _advance(self, now_ms: int) -> None:
        self._cursor_ms = max(self._cursor_ms, now_ms - int(self.config.grace_s * 1000))
        self._seen = {name: at for name, at in self._seen.items() if at >= self._cursor_ms}

    def _settle(self, keys: Sequence[str]) -> None:
        """Each key is listed as the store has it now, or not at all."""
        if not keys:
            return
        found = in_threads(self._stat_or_none, keys)
        self.feed.stats += len(keys)
        for key, info in zip(keys, found, strict=True):
            if info is None:
                self._listing.pop(key, None)
            else:
                self._listing[key] = info

    def _stat_or_none(self, key: str) -> ObjectInfo | None:
        try:
            size, version = self.inner.stat(key)
        except (FileNotFoundError, NotRegularFile):
            return None
        return ObjectInfo(key, size, version)

    def snapshot(self) -> dict[str, Any]:
        """The listing and cursor, for a reader's saved index (ledger/reader_index.py)."""
        return {
            "listing": [[o.key, o.size, o.version] for o in self._listing.values()],
            "listed_fully_at": self._listed_fully_at,
            "cursor_ms": self._cursor_ms,
            "seen": self._seen,
        }

    def restore(self, state: dict[str, Any]) -> None:
        """Resume from a snapshot: the next poll reads markers from its cursor on."""
        self._listing = {
            key: ObjectInfo(key, size, version) for key, size, version in state["listing"]
        }
        self._listed_fully_at = float(state["listed_fully_at"])
        self._cursor_ms = int(state["cursor_ms"])
        self._seen = {str(k): int(v) for k, v in state["seen"].items()}

    # -- writes leave markers ----------------------------------------------------------

    def put_new(self, key: str, data: bytes) -> bool:
        fresh = self.inner.put_new(key, data)
        # Also when the object was there already: a retry's marker may be what a crash lost.
        self._mark(key, added=True)
        if not key.startswith(UNMARKED):  # never listed
            self._listing[key] = ObjectInfo(key, len(data))
        return fresh

    def delete(self, keys: Sequence[str]) -> None:
        self.inner.delete(keys)
        for key in keys:
            self._mark(key, added=False)
            self._listing.pop(key, None)

    def _mark(self, key: str, *, added: bool) -> None:
        if not key.startswith(UNMARKED):
            self.inner.put_new(marker_key(key, added, int(self.clock() * 1000)), b"")

    def collect(
        self, before_ms: int, prefixes: Sequence[str] | None = None, since_ms: int = 0
    ) -> int:
        """Delete the markers stamped from ``since_ms`` to before ``before_ms`` that announce
        keys under ``prefixes`` (a node's own, which its credentials may delete; None: every
        marker, for an operator); how many. Readers lose nothing: one that has not polled
        since falls back to a full listing (``full_listing_every_s``), and a cursor never
        stands further back than that. A collector that passes its last ``before_ms`` as
        the next ``since_ms`` lists old markers it may not delete only once."""
        start = f"{CHANGES_PREFIX}{since_ms:013d}" if since_ms else CHANGES_PREFIX
        stop = f"{CHANGES_PREFIX}{max(before_ms - 1, 0):013d}~"
        doomed = []
        for name in self.inner.list_after(CHANGES_PREFIX, start, stop):
            stamp, _, rest = name.removeprefix(CHANGES_PREFIX).partition("/")
            if not stamp.isdigit() or int(stamp) >= before_ms:
                continue
            # Read leniently: markers of keys no reader lists (signatures, by older writers)
            # are collected too.
            key = rest.removesuffix(ADDED).removesuffix(REMOVED)
            if prefixes is None or key.startswith(tuple(prefixes)):
                doomed.append(name)
        for first in range(0, len(doomed), 1000):
            self.inner.delete(doomed[first : first + 1000])
        return len(doomed)

    # -- the rest is the inner store's, and a missing object leaves the listing ----------

    def stat(self, key: str) -> tuple[int, str | None]:
        try:
            return self.inner.stat(key)
        except FileNotFoundError:
            self._listing.pop(key, None)
            raise

    def size(self, key: str) -> int:
        return self.stat(key)[0]

    def read(self, key: str, most: int | None = None) -> bytes:
        return self.read_versioned(key, most)[0]

    def read_versioned(self, key: str, most: int | None = None) -> tuple[bytes, str | None]:
        try:
            return self.inner.read_versioned(key, most)
        except FileNotFoundError:
            self._listing.pop(key, None)
            raise

    def list_after(
        self, prefix: str, start_after: str, stop_after: str | None = None
    ) -> builtins.list[str]:
        return self.inner.list_after(prefix, start_after, stop_after)

    def exists(self, key: str) -> bool:
        return self.inner.exists(key)

    def reader_path(self, key: str) -> str:
        return self.inner.reader_path(key)

    def check_exists(self) -> None:
        self.inner.check_exists()

    def configure_duckdb(self, con: duckdb.DuckDBPyConnection) -> None:
        self.inner.configure_duckdb(con)


def with_change_log(store: Store, config: ChangeLogConfig) -> Store:
    """``store`` behind a change log where the config asks for one (auto: on S3)."""
    from ledger.storage import S3Store

    wanted = config.use == "on" or (config.use == "auto" and isinstance(store, S3Store))
    return ChangeLogStore(store, config) if wanted else store
