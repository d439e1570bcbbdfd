"""Verified local copies of a remote ledger's rollout files.

On S3 a reader that lets DuckDB read a new file pays several round trips for it: its footer
and schema when it is examined, its rows when it is indexed, the rows again (and a HEAD to
check the file did not change) each time a group of it is sampled. With copies, each new
file costs one GET. Its bytes are bounded by the row limits' ``max_file_bytes`` and written
to a local file. The signature check, the footer checks and the index all read that copy,
and sampling serves rows from it. What is served is exactly what was checked: a peer that
overwrites its object afterwards changes nothing a reader holds (the next listing shows a
new version, and the object is examined afresh).

A copy sits at its object's key (safe by then, and the Hive partition keys of the path are
what readers take for a row's swarm, node and day), under a name that adds a digest of the
key and version. Copies of files that leave the ledger (compaction) are
deleted with them. Kept next to a node's reader index, they survive a restart; a reader
without an index keeps them in a temporary folder removed on close.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
import weakref
from pathlib import Path
from typing import Any


class LocalCopies:
    """A folder of verified copies (see the module doc)."""

    def __init__(self, folder: str | Path | None = None) -> None:
        self._cleanup: weakref.finalize[Any, Any] | None = None
        if folder is None:
            self.folder = Path(tempfile.mkdtemp(prefix="sapo-ledger-copies-"))
            # Removed on close, or when the reader is collected or the process exits.
            self._cleanup = weakref.finalize(self, shutil.rmtree, self.folder, True)
        else:
            self.folder = Path(folder).resolve()
            self.folder.mkdir(parents=True, exist_ok=True)

    def path_for(self, key: str, version: str | None) -> Path:
        """The copy's place: the key's folders (its Hive partition keys, which readers take
        from the path), and a name that holds a digest of the key and version. ``key`` is
        safe (ledger.keys.is_safe_key), so the path stays inside the folder."""
        folder, _, name = key.rpartition("/")
        digest = hashlib.sha256(f"{key}\0{version or ''}".encode()).hexdigest()[:24]
        return self.folder / folder / f"{digest}-{name}"

    def write(self, key: str, version: str | None, data: bytes) -> str:
        """Keep ``data`` as the copy of ``key`` at ``version``; its path. Written to a
        temporary name and renamed: a reader killed mid-write leaves no half copy."""
        path = self.path_for(key, version)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.{id(data)}.tmp")
        tmp.write_bytes(data)
        os.replace(tmp, path)
        return str(path)

    def holds(self, path: str, size: int) -> bool:
        """Whether ``path`` is a copy in this folder of ``size`` bytes (a saved index is
        trusted only for copies that are still there, whole)."""
        copy = Path(path)
        try:
            return copy.is_relative_to(self.folder) and copy.stat().st_size == size
        except OSError:
            return False

    def remove(self, paths: list[str]) -> None:
        for path in paths:
            if Path(path).is_relative_to(self.folder):
                Path(path).unlink(missing_ok=True)

    def clear(self) -> None:
        """Remove every copy (they belong to no index any more)."""
        shutil.rmtree(self.folder, ignore_errors=True)
        self.folder.mkdir(parents=True, exist_ok=True)

    def close(self) -> None:
        if self._cleanup is not None:
            self._cleanup()
