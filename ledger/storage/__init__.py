"""Object storage behind one small contract: a local directory and S3 are two implementations.

Objects are immutable and written once. ``put_new`` makes an object visible whole or not at
all (a local write goes to a hidden temporary file that is hard-linked into place; an S3 PUT
is atomic) and never replaces an existing object, which is what makes a retried publish a
no-op.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlparse

from ledger.storage.base import (
    LEDGER_SUFFIXES,
    S3_READ_THREADS,
    NotRegularFile,
    ObjectForbidden,
    ObjectInfo,
    OversizedObject,
    StorageError,
    Store,
    StoreUnusable,
    in_threads,
)
from ledger.storage.local import LocalStore, is_local
from ledger.storage.s3 import S3Store
from ledger.storage.settings import S3Settings

__all__ = [
    "LEDGER_SUFFIXES",
    "S3_READ_THREADS",
    "LocalStore",
    "NotRegularFile",
    "ObjectForbidden",
    "ObjectInfo",
    "OversizedObject",
    "S3Store",
    "StorageError",
    "Store",
    "StoreUnusable",
    "in_threads",
    "is_local",
    "is_local_url",
    "open_store",
]


def is_local_url(url: str) -> bool:
    """Whether ``url`` names a local directory: a path, ``file://`` or ``local://``."""
    scheme = urlparse(url).scheme
    return scheme in ("", "local", "file") or len(scheme) == 1  # 1 letter: Windows drive


def open_store(url: str, storage_options: dict[str, Any] | None = None) -> Store:
    """The store for ``url``: a local path or ``file://`` URL, or ``s3://bucket/prefix``."""
    options = dict(storage_options or {})
    parsed = urlparse(url)
    if parsed.scheme in ("s3", "s3a"):
        return S3Store(url.replace("s3a://", "s3://", 1), S3Settings.resolve(options))
    if parsed.scheme == "file":
        return LocalStore(parsed.path)
    if is_local_url(url):
        if options:
            raise ValueError(f"storage options {sorted(options)} make no sense for a local ledger")
        return LocalStore(url if parsed.scheme != "local" else parsed.path)
    raise ValueError(f"unsupported ledger URL {url!r}: use a local path, file:// or s3://")
