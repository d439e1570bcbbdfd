"""A ledger in a local (or mounted network) directory."""

from __future__ import annotations

import builtins
import errno
import os
import stat
import time
import uuid
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from ledger.keys import is_safe_key

if TYPE_CHECKING:
    import duckdb


from ledger.storage.base import (
    _MTIME_SLACK_NS,
    LEDGER_ENTRY,
    MAX_UNSAFE_KEYS,
    NotRegularFile,
    ObjectInfo,
    Store,
    StoreUnusable,
    _bounded,
    _check_key,
    _visible,
)


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
        """The folder exists and is a ledger: empty (a ledger no one wrote yet), or holding
        a ledger's entries. A work folder, or any other folder, is refused, saying where a
        ledger inside it is: read as a ledger it would give no rows, and exit 0."""
        if not self.root.is_dir():
            raise StoreUnusable(f"no ledger at {self.root}: the folder does not exist")
        if looks_like_ledger(self.root):
            return
        inner = [
            p
            for p in sorted(self.root.iterdir())
            if p.is_dir() and any(p.iterdir()) and looks_like_ledger(p)
        ]
        where = f"; the ledger is at {inner[0]}" if inner else ""
        raise StoreUnusable(
            f"{self.root} is not a ledger (none of its entries is a ledger's){where}"
        )


def looks_like_ledger(folder: Path) -> bool:
    """Whether ``folder`` is empty (a ledger no one wrote yet) or holds a ledger's entries
    (a file of the user's beside them does not make it another folder)."""
    names = [p.name for p in folder.iterdir() if not p.name.startswith(".")]
    return not names or any(LEDGER_ENTRY.match(name) for name in names)
