"""What every side of a ledger stands on (``LedgerHandle``): its store, its DuckDB connection
and catalog, its reader index, and the one retry layer of every call (ledger/retrying.py).

The ``Ledger`` (ledger/ledger.py) is this handle with a write side (ledger/writes.py), a read
side (ledger/reads.py) and maintenance (ledger/maintenance.py).
"""

from __future__ import annotations

import functools
import logging
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Self, TypeVar

import duckdb
import polars as pl

from ledger import identity
from ledger import reader_index as index_file
from ledger.catalog import Catalog, RefreshStats
from ledger.changes import with_change_log
from ledger.config import LedgerConfig
from ledger.copies import LocalCopies
from ledger.duck import connect
from ledger.identity import NodeKey
from ledger.keys import object_place
from ledger.records import RecordError
from ledger.retrying import first_line, retrying
from ledger.sqltext import EMPTY_ROLLOUTS_SQL
from ledger.storage import StorageError, StoreUnusable, is_local, open_store

log = logging.getLogger(__name__)
T = TypeVar("T")
INDEX_SAVE_EVERY_S = 60.0
"""A reader index is saved at most this often while reads change it (and on close)."""
F = TypeVar("F", bound=Callable[..., Any])


READ_ERRORS: tuple[type[BaseException], ...] = (
    duckdb.IOException,  # a file vanished between listing and reading, a bad read
    duckdb.HTTPException,
    StorageError,  # the store cannot be reached, or an indexed file changed (FileChanged)
    ConnectionError,
    TimeoutError,
)
"""What a read retries (listing again first); anything else is a bug or bad SQL."""
WRITE_ERRORS: tuple[type[BaseException], ...] = (StorageError, ConnectionError, TimeoutError)


def serialized(method: F) -> F:
    """Run ``method`` holding the ledger's lock: one DuckDB connection serves one call at a
    time (concurrent calls on it from several threads deadlock), so a Ledger shared by
    threads serves them in turn."""

    @functools.wraps(method)
    def locked(self: LedgerHandle, *args: Any, **kwargs: Any) -> Any:
        with self._lock:
            return method(self, *args, **kwargs)

    return locked  # type: ignore[return-value]


class LedgerHandle:
    """What every side of a ledger stands on: the store (with its change log), one DuckDB
    connection and the catalog over it, this reader's index, the signer, and the one retry
    layer of every store call and read."""

    def __init__(
        self,
        config: LedgerConfig | str | os.PathLike[str],
        *,
        signer: NodeKey | None = None,
        index_path: str | Path | None = None,
        threads: int | None = None,
    ) -> None:
        if isinstance(config, str | os.PathLike):  # Ledger("sapo-work/ledger"): a URL or path
            config = LedgerConfig.model_validate({"url": os.fspath(config)})
        elif not isinstance(config, LedgerConfig):
            raise TypeError(
                f"Ledger takes a URL, a path or a LedgerConfig, not {type(config).__name__}; "
                "with storage options: Ledger.open(url, **options)"
            )
        self.config = config
        self._lock = threading.RLock()
        self.store = with_change_log(
            open_store(config.url, config.storage_options or None), config.change_log
        )
        self.con = connect(threads, memory_limit_mb=config.memory_limit_mb)
        self.store.configure_duckdb(self.con)
        self.index_path = Path(index_path) if index_path else None
        """Where this reader's index is kept between runs (None: nowhere; ledger/
        reader_index.py)."""
        self.catalog = Catalog(
            self.store,
            self.con,
            config.limits,
            check_signatures=config.check_signatures,
            copies=self._local_copies(),
        )
        if self.catalog.copies is not None:
            # Copies are written once and never change under their name: each footer is
            # parsed once, not at every sample that reads the file.
            self.con.execute("SET parquet_metadata_cache = true")
        self.signer = signer
        """The node this ledger publishes as: its files are signed, and it publishes and
        compacts for that node only. None: an unsigned writer (open swarms, analysis)."""
        self._listed_at = -float("inf")
        self._markers_collected_at = -float("inf")
        self._markers_collected_before_ms = 0
        """Markers stamped before this were collected: a node lists only later ones."""
        self._last_refresh = RefreshStats()
        self._index_saved_at = time.monotonic()
        if self.index_path is not None and index_file.load(self.catalog, self.index_path):
            log.info("resuming from the reader index %s", self.index_path)
        elif self.catalog.copies is not None:
            self.catalog.copies.clear()  # copies of an index that was not loaded

    def _local_copies(self) -> LocalCopies | None:
        """The folder of verified copies (ledger/copies.py) if this reader keeps them: next
        to its reader index (they outlive a restart with it), else a temporary one."""
        wanted = self.config.local_copies
        if wanted == "off" or (wanted == "auto" and is_local(self.store)):
            return None
        if self.index_path is None:
            return LocalCopies()
        return LocalCopies(self.index_path.with_suffix(".copies"))

    @property
    def url(self) -> str:
        return self.store.url

    @serialized
    def close(self) -> None:
        try:
            self.save_index()
        finally:
            self.con.close()
            if self.catalog.copies is not None:
                self.catalog.copies.close()

    @serialized
    def save_index(self) -> None:
        """Write the reader index now (also done on close and, after changes, every
        ``INDEX_SAVE_EVERY_S``); a failure is logged, never raised: it is a cache."""
        if self.index_path is None:
            return
        try:
            index_file.save(self.catalog, self.index_path)
        except (OSError, duckdb.Error) as exc:
            log.warning("could not save the reader index %s: %s", self.index_path, exc)
        self._index_saved_at = time.monotonic()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @serialized
    def refresh(self) -> RefreshStats:
        """Pick up files published (or removed) since the last call."""
        return self._with_refresh(lambda: self._last_refresh, fresh=True)

    def _with_refresh(self, read: Callable[[], T], *, fresh: bool = False) -> T:
        """``read()`` after listing the store (unless the last listing is recent enough, see
        ``max_staleness_s``, and not ``fresh``).

        The one retry layer of a read (see ledger/retrying.py): when a file vanished between
        listing and reading (compaction), or the store or a file cannot be read, list again
        and read again, ``config.retry.attempts`` times in all; then a one-line StorageError.
        """
        policy = self.config.retry
        try:
            for attempt in retrying(
                policy, READ_ERRORS, f"reading {self.url}", log, never=(StoreUnusable,)
            ):
                with attempt:
                    stale = time.monotonic() - self._listed_at >= self.config.max_staleness_s
                    if fresh or stale or attempt.retry_state.attempt_number > 1:
                        self._list()
                    return read()
        except StoreUnusable:
            raise
        except READ_ERRORS as exc:
            raise StorageError(
                f"reading {self.url} failed after {policy.attempts} attempts: {first_line(exc)}"
            ) from exc
        raise AssertionError("unreachable")

    def _list(self) -> None:
        """List the store and index what changed. A listing that went stale while it was
        read (files vanished: a compactor's merged file may not be in it yet) is listed
        once more; files vanished again are left out of this read, never an error: a peer
        that keeps deleting its own files must not fail everyone's reads."""
        self._last_refresh = stats = self.catalog.refresh()
        if stats.vanished:
            again = self.catalog.refresh()
            stats.added += again.added
            stats.removed += again.removed
            stats.vanished = again.vanished
            stats.seconds += again.seconds
            stats.list_seconds += again.list_seconds
            stats.read_seconds += again.read_seconds
        self._listed_at = time.monotonic()
        changed = stats.added or stats.removed
        if changed and self._listed_at - self._index_saved_at >= INDEX_SAVE_EVERY_S:
            self.save_index()

    def _put_new(self, key: str, data: bytes) -> bool:
        """``store.put_new`` under the retry policy: write-once, so a retry is a no-op. The
        next read lists the store again, however recent the last listing: a handle always
        reads its own writes (``max_staleness_s`` spares listings of others' files only)."""
        written = self._store_call(f"writing {key}", self.store.put_new, key, data)
        self._listed_at = -float("inf")
        return written

    def _put_signed(self, key: str, data: bytes) -> bool:
        """``_put_new`` of an object under this ledger's node's prefix, its signature first
        (a reader never sees it missing); unsigned without a signer."""
        signer = self.signer
        if signer is not None:
            if object_place(key) != (signer.swarm_id, signer.node_id):
                raise RecordError(
                    f"this ledger writes as {signer.swarm_id}/{signer.node_id}, not at {key}"
                )
            sha = identity.sha256_of(data)
            self._put_new(identity.signature_key(key, sha), signer.signature_object(key, data))
        return self._put_new(key, data)

    def _store_call(self, what: str, call: Callable[..., T], *args: Any) -> T:
        """``call(*args)``, a single store request, under the retry policy; then a one-line
        StorageError."""
        policy = self.config.retry
        try:
            result: T = retrying(policy, WRITE_ERRORS, what, log, never=(StoreUnusable,))(
                call, *args
            )
        except StoreUnusable:
            raise
        except WRITE_ERRORS as exc:
            raise StorageError(
                f"{what} ({self.url}) failed after {policy.attempts} attempts: {first_line(exc)}"
            ) from exc
        return result

    def _empty(self) -> pl.DataFrame:
        return self.con.execute(EMPTY_ROLLOUTS_SQL).pl()
