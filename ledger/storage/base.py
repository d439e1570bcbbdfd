"""The storage contract and what every store shares: errors, object info, the ``Store``
protocol, and bounded, key-checked reads."""

from __future__ import annotations

import builtins
import re
from collections import Counter
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, TypeVar

from ledger.keys import is_safe_key

if TYPE_CHECKING:
    import duckdb


S3_READ_THREADS = 8
"""Requests to a store in flight at once (DuckDB's reads of remote Parquet, and ``in_threads``)."""
_MTIME_SLACK_NS = 2_000_000_000
A = TypeVar("A")
R = TypeVar("R")


LEDGER_ENTRY = re.compile(r"^(swarm_id=[^/]+|_[a-z]+)$")
"""A ledger's top-level names: its partitions (``swarm_id=S``) and its own folders
(``_manifests``, ``_keys``, ``_samples``, ...)."""


class StorageError(RuntimeError):
    """The ledger's storage cannot be reached or refused an operation."""


class StoreUnusable(StorageError):
    """The store answered, and no retry will help: its bucket is missing or the credentials
    are refused. Never retried, never read as an empty ledger."""


class ObjectForbidden(StorageError, PermissionError):
    """The store refused to serve one object (S3: 403 on its GET or HEAD): readers skip it
    with a reason, as they skip a corrupt one."""


OBJECT_READS = frozenset({"get", "head"})
"""Requests about one object. A refusal of a listing or a write means the credentials."""


class NotRegularFile(OSError):
    """A local ledger entry that is a link, FIFO, socket or device: never opened (a FIFO
    would block its reader forever, a link could point anywhere)."""


class OversizedObject(ValueError):
    """An object larger than its reader reads: never read past the bound, whatever a listing
    said its size was when it was checked."""


MAX_UNSAFE_KEYS = 1000
"""Unsafe keys a store remembers for ``sapo ledger validate`` (a peer could make millions)."""


def _bounded(key: str, data: bytes, most: int | None) -> bytes:
    if most is not None and len(data) > most:
        raise OversizedObject(f"{key} holds more than {most} bytes")
    return data


def _check_key(key: str) -> str:
    """``key`` (or a prefix of keys, with a trailing ``/``) if it is safe; else ValueError."""
    if not is_safe_key(key.removesuffix("/")):
        raise ValueError(f"unsafe ledger key {key!r}: see ledger.keys.is_safe_key")
    return key


@dataclass(frozen=True)
class ObjectInfo:
    key: str
    """Path below the ledger root, '/'-separated."""
    size: int | None
    """Bytes, where the listing tells it for free (S3); None where it costs a call (local)."""
    version: str | None = None
    """What changes when the object is overwritten, where the listing tells it (S3's ETag)."""


LEDGER_SUFFIXES = (".parquet", ".jsonl")


def _visible(name: str) -> bool:
    # Temporary and hidden files are never part of the ledger.
    return name.endswith(LEDGER_SUFFIXES) and not name.startswith(".")


class Store(Protocol):
    url: str
    unsafe_keys: set[str]
    """Listed objects whose keys ``is_safe_key`` refuses (at most ``MAX_UNSAFE_KEYS``, as
    ``repr``): skipped by ``list``, never read, reported by ``validate``."""

    lists_versions: bool
    """Whether ``list`` reports each object's version (else ``stat`` is the way to tell)."""

    requests: Counter[str]
    """Requests made, by kind (list pages, get, head, put, delete): what the swarm simulator
    prints. A local store counts its directory scans as list requests."""

    def list(self, prefix: str = "", skip: str = "") -> list[ObjectInfo]:
        """Every visible object under ``prefix``, except those under ``skip`` (a top-level
        prefix ending in '/', e.g. signatures, which readers fetch by key: not walked or
        paged through at all)."""
        ...

    def list_after(
        self, prefix: str, start_after: str, stop_after: str | None = None
    ) -> builtins.list[str]:
        """Every key under ``prefix`` that sorts after ``start_after`` (and not after
        ``stop_after``), in key order, whatever its suffix (the change log's markers are not
        ledger objects). A store stops listing past ``stop_after``: what lies beyond costs
        no request."""
        ...

    def size(self, key: str) -> int: ...
    def stat(self, key: str) -> tuple[int, str | None]: ...
    def put_new(self, key: str, data: bytes) -> bool: ...
    def read(self, key: str, most: int | None = None) -> bytes:
        """The object's bytes; OversizedObject once more than ``most`` arrive."""
        ...

    def read_versioned(self, key: str, most: int | None = None) -> tuple[bytes, str | None]:
        """``read``, with the version of what was read (as ``stat`` tells it), from the
        same request."""
        ...

    def exists(self, key: str) -> bool: ...
    def delete(self, keys: Sequence[str]) -> None: ...
    def reader_path(self, key: str) -> str: ...
    def check_exists(self) -> None:
        """StoreUnusable unless the ledger's place exists (a folder, a bucket): what readers
        call first, so that a mistyped path is an error rather than an empty ledger."""
        ...

    def configure_duckdb(self, con: duckdb.DuckDBPyConnection) -> None: ...


def in_threads(work: Callable[[A], R], items: Sequence[A]) -> list[R]:
    """``work`` over ``items`` in order, on up to ``S3_READ_THREADS`` threads when there is
    more than one: each item is a round trip to the store on S3."""
    if len(items) <= 1:
        return [work(item) for item in items]
    with ThreadPoolExecutor(min(S3_READ_THREADS, len(items))) as pool:
        return list(pool.map(work, items))
