"""Files the node's runtime keeps in its working directory, written whole or not at all."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path


def write_atomically(path: Path, data: str | bytes | Callable[[Path], object]) -> None:
    """Write ``path`` whole or not at all: ``data`` (text, bytes, or a writer given the
    path to write) goes to a hidden temporary file beside it, renamed into place. A kill
    midway leaves the previous file, and at most a hidden temporary one that readers ignore."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        if isinstance(data, str):
            tmp.write_text(data)
        elif isinstance(data, bytes):
            tmp.write_bytes(data)
        else:
            data(tmp)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
