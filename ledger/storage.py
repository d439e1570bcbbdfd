"""Object storage behind one small contract: a local directory and S3 are two implementations.

Objects are immutable and written once. ``put_new`` makes an object visible whole or not at
all (a local write goes to a hidden temporary file that is hard-linked into place; an S3 PUT
is atomic) and never replaces an existing object, which is what makes a retried publish a
no-op.
"""

from __future__ import annotations

import builtins
import errno
import os
import stat
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, TypeVar
from urllib.parse import urlparse

from fsspec.asyn import sync

from ledger.keys import is_safe_key
from ledger.s3 import S3Settings

if TYPE_CHECKING:
    import duckdb


S3_READ_THREADS = 8
"""Requests to a store in flight at once (DuckDB's reads of remote Parquet, and ``in_threads``)."""
_MTIME_SLACK_NS = 2_000_000_000
A = TypeVar("A")
R = TypeVar("R")


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


def is_local(store: Store) -> bool:
    """Whether ``store`` (or the store a change log wraps) is a local directory."""
    return isinstance(getattr(store, "inner", store), LocalStore)


class LocalStore:
    """A ledger in a local (or mounted network) directory."""

    lists_versions = False

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root).expanduser().resolve()
        self._root = str(self.root)
        self.url = self.root.as_uri()
        self._dirs: dict[str, tuple[int, list[str], dict[str, ObjectInfo]]] = {}
        self.unsafe_keys: set[str] = set()
        self.requests: Counter[str] = Counter()

    def _path(self, key: str) -> Path:
        return self.root / _check_key(key)

    def list(self, prefix: str = "", skip: str = "") -> list[ObjectInfo]:
        """Every visible object under ``prefix`` (not under ``skip``), in no particular order.

        This runs on every read of a ledger that may hold tens of thousands of files, so a
        directory is re-scanned only when its mtime moved: adding or removing an entry
        changes it. A directory modified in the last ``_MTIME_SLACK_NS`` is always
        re-scanned, since coarse file-system clocks could hide a second change within the
        same tick. Sizes are not read here: objects are immutable, and the catalog asks
        for the size of new files only. Only regular files are listed (no links, FIFOs or
        devices), and only under safe keys (others are remembered in ``unsafe_keys``).
        """
        base = str(self._path(prefix) if prefix else self.root)
        skipped = str(self._path(skip.rstrip("/"))) if skip else None
        cut = len(self._root) + 1
        now = time.time_ns()
        found: list[ObjectInfo] = []
        stack = [base]
        while stack:
            directory = stack.pop()
            if directory == skipped:
                continue
            try:
                mtime = os.stat(directory).st_mtime_ns
            except FileNotFoundError:
                self._dirs.pop(directory, None)
                continue
            except PermissionError as exc:
                self._refused(directory, base, cut, exc)
                continue
            cached = self._dirs.get(directory)
            if cached is None or cached[0] != mtime or now - mtime < _MTIME_SLACK_NS:
                self.requests["list"] += 1
                # A file seen in the last scan keeps its ObjectInfo: readers tell what is
                # new by identity, and a busy directory is scanned again and again.
                known = cached[2] if cached is not None else {}
                subdirs: list[str] = []
                files: dict[str, ObjectInfo] = {}
                try:
                    with os.scandir(directory) as entries:
                        for entry in entries:
                            if entry.is_dir(follow_symlinks=False):
                                subdirs.append(entry.path)
                            elif not _visible(entry.name):
                                continue
                            elif not entry.is_file(follow_symlinks=False):
                                self._unsafe(entry.path[cut:])
                            elif (seen := known.get(entry.name)) is not None:
                                files[entry.name] = seen
                            elif is_safe_key(key := entry.path[cut:].replace(os.sep, "/")):
                                files[entry.name] = ObjectInfo(key, None)
                            else:
                                self._unsafe(key)
                except FileNotFoundError:
                    continue
                except PermissionError as exc:
                    self._refused(directory, base, cut, exc)
                    continue
                cached = (mtime, subdirs, files)
                self._dirs[directory] = cached
            stack.extend(cached[1])
            found.extend(cached[2].values())
        return found

    def _refused(self, directory: str, base: str, cut: int, exc: PermissionError) -> None:
        """A folder the reader may not read: below the listed one, a peer's bad object
        (remembered as unsafe); the listed folder itself, the store unusable (``exc``)."""
        if directory == base:
            raise exc
        self._unsafe(directory[cut:] + "/")

    def _unsafe(self, key: str) -> None:
        if len(self.unsafe_keys) < MAX_UNSAFE_KEYS:
            self.unsafe_keys.add(repr(key.replace(os.sep, "/")))

    def list_after(
        self, prefix: str, start_after: str, stop_after: str | None = None
    ) -> builtins.list[str]:
        """A walk of ``prefix`` (uncached: the change log is an S3 device; a local ledger
        lists cheaply by directory mtimes, and this serves its tests)."""
        base = self._path(prefix.rstrip("/"))
        cut = len(self._root) + 1
        keys = []
        for directory, _, names in os.walk(base):
            self.requests["list"] += 1
            for name in names:
                key = os.path.join(directory, name)[cut:].replace(os.sep, "/")
                if not name.startswith(".") and key > start_after and is_safe_key(key):
                    keys.append(key)
        return sorted(k for k in keys if stop_after is None or k <= stop_after)

    def size(self, key: str) -> int:
        return self.stat(key)[0]

    def stat(self, key: str) -> tuple[int, str | None]:
        """Bytes and mtime of a regular file; NotRegularFile for anything else (checked
        without following links, right before a reader would open it)."""
        self.requests["head"] += 1
        info = os.lstat(os.path.join(self._root, _check_key(key)))
        if not stat.S_ISREG(info.st_mode):
            raise NotRegularFile(f"{key} is not a regular file")
        return info.st_size, str(info.st_mtime_ns)

    def put_new(self, key: str, data: bytes) -> bool:
        self.requests["put"] += 1
        final = self._path(key)
        final.parent.mkdir(parents=True, exist_ok=True)
        tmp = final.parent / f".{final.name}.{uuid.uuid4().hex}.tmp"
        with open(tmp, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        try:
            os.link(tmp, final)  # atomic and refuses to replace: write-once
            return True
        except FileExistsError:
            return False
        except OSError as exc:  # file systems without hard links
            if exc.errno not in (errno.EPERM, errno.ENOTSUP, errno.EXDEV):
                raise
            if final.exists():
                return False
            os.replace(tmp, final)
            return True
        finally:
            tmp.unlink(missing_ok=True)

    def read(self, key: str, most: int | None = None) -> bytes:
        return self.read_versioned(key, most)[0]

    def read_versioned(self, key: str, most: int | None = None) -> tuple[bytes, str | None]:
        # Checked on the open descriptor, not the name: the entry may be swapped for a link
        # or FIFO after a stat (O_NONBLOCK: opening a FIFO does not wait for a writer).
        self.requests["get"] += 1
        flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
        try:
            fd = os.open(os.path.join(self._root, _check_key(key)), flags)
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise NotRegularFile(f"{key} is not a regular file") from exc
            raise
        with os.fdopen(fd, "rb") as handle:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode):
                raise NotRegularFile(f"{key} is not a regular file")
            data = handle.read() if most is None else handle.read(most + 1)
        return _bounded(key, data, most), str(info.st_mtime_ns)

    def exists(self, key: str) -> bool:
        return self._path(key).exists()

    def delete(self, keys: Sequence[str]) -> None:
        for key in keys:
            self._path(key).unlink(missing_ok=True)

    def reader_path(self, key: str) -> str:
        return str(self._path(key))

    def configure_duckdb(self, con: duckdb.DuckDBPyConnection) -> None:
        return None

    def check_exists(self) -> None:
        if not self.root.is_dir():
            raise StoreUnusable(f"no ledger at {self.root}: the folder does not exist")


class S3Store:
    """A ledger under ``s3://bucket/prefix`` on AWS, MinIO or any S3-compatible store."""

    lists_versions = True

    def __init__(self, url: str, settings: S3Settings) -> None:
        import s3fs  # deferred: only S3 users pay for botocore's import

        parsed = urlparse(url)
        if not parsed.netloc:
            raise ValueError(f"S3 URL {url!r} names no bucket")
        self.bucket = parsed.netloc
        self.prefix = parsed.path.strip("/")
        self.url = f"s3://{self.bucket}/{self.prefix}".rstrip("/")
        self.settings = settings
        self.fs = s3fs.S3FileSystem(**settings.s3fs_kwargs())
        self.fs.retries = settings.s3fs_retries
        self.unsafe_keys: set[str] = set()
        self.page_keys = 1000
        """Keys per listing page (S3's largest; tests lower it to page through few keys)."""
        self.requests: Counter[str] = Counter()

    def _path(self, key: str) -> str:
        return "/".join(p for p in (self.bucket, self.prefix, key and _check_key(key)) if p)

    def _call(self, what: str, fn: Any, *args: Any, **kwargs: Any) -> Any:
        self.requests[what] += 1
        try:
            return fn(*args, **kwargs)
        except PermissionError as exc:
            if what in OBJECT_READS:
                # One object refused while the store lists: that object is unreadable (a
                # peer may write one no reader may read), not the store unusable.
                raise ObjectForbidden(f"{what} of an object on {self.url} refused: {exc}") from exc
            raise StoreUnusable(
                f"{what} on {self.url} was refused ({exc}): check the credentials"
            ) from exc
        except (FileNotFoundError, FileExistsError):
            raise
        except OSError as exc:
            raise StorageError(f"{what} on {self.url} failed: {exc}") from exc
        except Exception as exc:  # botocore connection errors are not OSErrors
            if type(exc).__module__.startswith(("botocore", "aiohttp", "aiobotocore")):
                raise StorageError(f"{what} on {self.url} failed: {exc}") from exc
            raise

    def _pages(self, prefix: str, start_after: str = "") -> Iterator[list[dict[str, Any]]]:
        """ListObjectsV2 pages (up to 1,000 keys each, in key order) of keys below the
        ledger root starting with ``prefix``; keys are returned relative to the root."""
        root = f"{self.prefix}/" if self.prefix else ""
        request: dict[str, Any] = {
            "Bucket": self.bucket,
            "Prefix": root + prefix,
            "MaxKeys": self.page_keys,
        }
        if start_after:
            request["StartAfter"] = root + start_after
        while True:
            try:
                page = self._call("list", self.fs.call_s3, "list_objects_v2", **request)
            except FileNotFoundError:
                self._check_bucket()
                raise
            yield [
                {**item, "Key": item["Key"][len(root) :]}
                for item in page.get("Contents", [])
                if item["Key"].startswith(root)
            ]
            token = page.get("NextContinuationToken")
            if not page.get("IsTruncated") or not token:
                return
            request["ContinuationToken"] = token

    def list(self, prefix: str = "", skip: str = "") -> list[ObjectInfo]:
        out = []
        listed = 0
        for page in self._skipping(_check_key(prefix) if prefix else "", skip):
            listed += len(page)
            for item in page:
                key = item["Key"]
                if not _visible(key.rsplit("/", 1)[-1]):
                    continue
                if not is_safe_key(key):
                    if len(self.unsafe_keys) < MAX_UNSAFE_KEYS:
                        self.unsafe_keys.add(repr(key))
                    continue
                etag = item.get("ETag")
                out.append(ObjectInfo(key, int(item.get("Size", 0)), etag and str(etag)))
        if not listed:
            self._check_bucket()
        return sorted(out, key=lambda o: o.key)

    def _skipping(self, prefix: str, skip: str) -> Iterator[builtins.list[dict[str, Any]]]:
        """``_pages`` of ``prefix`` without the keys under ``skip``: paging stops where they
        begin and starts again after them (keys come in order), so they cost no request."""
        if not skip or not skip.startswith(prefix) or not skip.endswith("/"):
            yield from self._pages(prefix)
            return
        for page in self._pages(prefix):
            before = [item for item in page if item["Key"] < skip]
            yield before
            if len(before) < len(page):
                break
        # '0' follows '/': every key under ``skip`` sorts before ``skip[:-1] + "0"`` (which
        # is outside the ledger's layout, so not listing it loses nothing).
        yield from self._pages(prefix, skip[:-1] + "0")

    def list_after(
        self, prefix: str, start_after: str, stop_after: str | None = None
    ) -> builtins.list[str]:
        keys: builtins.list[str] = []
        for page in self._pages(_check_key(prefix), start_after):
            keys += [item["Key"] for item in page]
            if stop_after is not None and page and page[-1]["Key"] > stop_after:
                break  # keys come in order: the rest of the listing lies beyond
        return [k for k in keys if is_safe_key(k) and (stop_after is None or k <= stop_after)]

    def check_exists(self) -> None:
        self._check_bucket()

    def _check_bucket(self) -> None:
        """StoreUnusable unless the bucket exists: an empty listing of a missing bucket
        must not read as an empty ledger."""
        try:
            self._call("head bucket", self.fs.info, self.bucket)
        except FileNotFoundError as exc:
            raise StoreUnusable(f"bucket {self.bucket!r} does not exist ({self.url})") from exc

    def put_new(self, key: str, data: bytes) -> bool:
        path = self._path(key)
        if self.exists(key):
            return False
        mode = "create" if self.settings.conditional_writes else "overwrite"
        try:
            self._call("put", self.fs.pipe_file, path, data, mode=mode)
        except FileExistsError:  # lost a race with an identical retry
            return False
        except FileNotFoundError:
            self._check_bucket()
            raise
        return True

    def read(self, key: str, most: int | None = None) -> bytes:
        return self.read_versioned(key, most)[0]

    def read_versioned(self, key: str, most: int | None = None) -> tuple[bytes, str | None]:
        # A ranged GET: an object overwritten since its size was checked still costs at most
        # ``most`` + 1 bytes.
        path = self._path(key)
        try:
            data, etag = self._call("get", sync, self.fs.loop, self._get_object, path, most)
        except StorageError as exc:
            # S3 answers 416 to any range of an empty object (a range from byte 0 is
            # unsatisfiable only there): a peer's empty file is data to judge, not an outage.
            cause = exc.__cause__
            if most is not None and isinstance(cause, OSError) and cause.errno == errno.EINVAL:
                return b"", None
            raise
        return _bounded(key, data, most), etag

    async def _get_object(self, path: str, most: int | None) -> tuple[bytes, str | None]:
        """GetObject's body and ETag (s3fs's ``cat_file`` drops the headers)."""
        bucket, key, _ = self.fs.split_path(path)
        ranged = {} if most is None else {"Range": f"bytes=0-{most}"}
        answer = await self.fs._call_s3("get_object", Bucket=bucket, Key=key, **ranged)
        try:
            data: bytes = await answer["Body"].read()
        finally:
            answer["Body"].close()
        etag = answer.get("ETag")
        return data, etag and str(etag)

    def size(self, key: str) -> int:
        return self.stat(key)[0]

    def stat(self, key: str) -> tuple[int, str | None]:
        info = self._call("head", self.fs.info, self._path(key))
        etag = info.get("ETag") or info.get("etag")
        return int(info.get("size", 0)), etag and str(etag)

    def exists(self, key: str) -> bool:
        return bool(self._call("head", self.fs.exists, self._path(key)))

    def delete(self, keys: Sequence[str]) -> None:
        """Delete exactly ``keys``: each is checked safe (no glob characters), and the
        names are deleted as given, never as a pattern's expansion."""
        for path in [self._path(k) for k in keys]:  # all checked before any is deleted
            try:
                self._call("delete", self.fs.rm_file, path)
            except FileNotFoundError:
                continue

    def reader_path(self, key: str) -> str:
        return "s3://" + self._path(key)

    def configure_duckdb(self, con: duckdb.DuckDBPyConnection) -> None:
        from ledger.duck import load_httpfs

        load_httpfs(con)
        con.execute(self.settings.duckdb_secret_sql(scope=f"s3://{self.bucket}"))
        # Remote reads wait on the network, not the CPU: more threads keep more requests
        # in flight (DuckDB's advice for remote Parquet).
        con.execute(f"SET http_timeout = {max(1, round(self.settings.read_timeout_s))}")
        con.execute("SET http_retries = 1")  # the ledger's retry policy re-lists and retries
        threads = con.execute("SELECT current_setting('threads')").fetchone()
        if threads is not None and int(threads[0]) < S3_READ_THREADS:
            con.execute(f"SET threads = {S3_READ_THREADS}")


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
