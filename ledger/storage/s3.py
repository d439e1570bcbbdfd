"""A ledger under an S3 (or MinIO, or any S3-compatible) prefix, through s3fs."""

from __future__ import annotations

import builtins
import errno
from collections import Counter
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any
from urllib.parse import urlparse

from fsspec.asyn import sync

from ledger.keys import is_safe_key
from ledger.storage.settings import S3Settings

if TYPE_CHECKING:
    import duckdb


from ledger.storage.base import (
    LEDGER_ENTRY,
    MAX_UNSAFE_KEYS,
    OBJECT_READS,
    S3_READ_THREADS,
    ObjectForbidden,
    ObjectInfo,
    StorageError,
    StoreUnusable,
    _bounded,
    _check_key,
    _visible,
)


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
        """The bucket exists and, under a prefix, the prefix holds a ledger's entries. A
        prefix exists only once something is written under it, so a mistyped one would
        read as an empty ledger and exit 0; a bucket named alone may be empty (a ledger no
        one wrote yet), as a folder may."""
        self._check_bucket()
        if not self.prefix:
            return
        names = self._top_level_names()
        if not names:
            raise StoreUnusable(f"no ledger at {self.url}: nothing is stored under that prefix")
        if not any(LEDGER_ENTRY.match(name) for name in names):
            shown = ", ".join(sorted(names)[:5])
            raise StoreUnusable(
                f"{self.url} is not a ledger (none of its entries is a ledger's: {shown})"
            )

    def _top_level_names(self) -> set[str]:
        """The first names below the prefix (folders and objects), from one listing page."""
        root = f"{self.prefix}/"
        page = self._call(
            "list", self.fs.call_s3, "list_objects_v2",
            Bucket=self.bucket, Prefix=root, Delimiter="/", MaxKeys=self.page_keys,
        )  # fmt: skip
        found = [p["Prefix"] for p in page.get("CommonPrefixes", [])]
        found += [item["Key"] for item in page.get("Contents", [])]
        return {key[len(root) :].strip("/") for key in found if key.startswith(root)} - {""}

    def _check_bucket(self) -> None:
        """StoreUnusable unless the bucket exists: an empty listing of a missing bucket
        must not read as an empty ledger."""
        try:
            self._call("head bucket", self.fs.info, self.bucket)
        except FileNotFoundError as exc:
            raise StoreUnusable(f"bucket {self.bucket!r} does not exist ({self.url})") from exc

    def put_new(self, key: str, data: bytes) -> bool:
        path = self._path(key)
        # With conditional writes the server refuses an overwrite (If-None-Match: *), so one
        # request does it; asking first would cost two more (s3fs's exists is a HEAD and then
        # a listing), each a round trip on a slow link (benchmarks/slow_link.py).
        if not self.settings.conditional_writes and self.exists(key):
            return False
        mode = "create" if self.settings.conditional_writes else "overwrite"
        bound = self.settings.put_timeout_s(len(data))
        try:
            self._call(
                "put", sync, self.fs.loop, self.fs._pipe_file, path, data, mode=mode, timeout=bound
            )
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
