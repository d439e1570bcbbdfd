"""What the stack of `sapo infra` keeps between `down` and `up`, and where: PostgreSQL's
cluster (Prefect's and MLflow's databases) under the home, and a copy of moto's objects,
which moto holds only in memory (flows/services/stack.py starts and stops the services)."""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any, Protocol

log = logging.getLogger(__name__)


class Stack(Protocol):
    """What these functions read of flows/services/stack.py's `Stack`."""

    home: str
    env: dict[str, str]
    s3_endpoint: str


def _as_postgres() -> list[str]:
    """PostgreSQL refuses to run as root: run its programs as the ``postgres`` user then."""
    return ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []


PG_POINTER = "postgres-data"
"""A file in the home naming PostgreSQL's data folder where it cannot live in the home."""


def pg_home(home: Path) -> Path:
    """Where the stack at ``home`` keeps PostgreSQL's data, kept across ``down`` and ``up``:
    ``<home>/postgres``, unless the server's user cannot enter the home (run as root, the
    server runs as ``postgres``; a home under /root or a test's private folder is closed to
    it): then a folder of its own under /var/tmp, named in ``<home>/postgres-data``."""
    pointer = home / PG_POINTER
    if pointer.is_file():
        named = Path(pointer.read_text().strip())
        if not (named.is_absolute() and named.name.startswith("sapo-postgres-")):
            raise ValueError(f"{pointer} names {str(named)!r}, not a folder the stack made")
        return named
    inside = home / "postgres"
    if os.geteuid() != 0 or _enterable_by_postgres(home):
        return inside
    outside = Path(tempfile.mkdtemp(prefix="sapo-postgres-", dir="/var/tmp"))
    pointer.write_text(str(outside))
    return outside


def _enterable_by_postgres(folder: Path) -> bool:
    probe = [*_as_postgres(), "test", "-x", str(folder)]
    return subprocess.run(probe, capture_output=True, timeout=30).returncode == 0


def object_store(stack: Stack) -> Any:
    """An s3fs file system on the stack's S3 server, as its root user."""
    import s3fs

    return s3fs.S3FileSystem(
        key=stack.env["MINIO_ROOT_USER"],
        secret=stack.env["MINIO_ROOT_PASSWORD"],
        client_kwargs={"endpoint_url": stack.s3_endpoint, "region_name": "us-east-1"},
    )


def buckets(stack: Stack) -> tuple[str, str]:
    """The ledger's bucket and MLflow's."""
    return stack.env["SAPO_BUCKET"], stack.env["MLFLOW_BUCKET"]


OBJECTS = "s3"
"""The folder of the home that holds moto's objects between ``down`` and ``up``."""
OBJECTS_MARK = ".sapo-objects"
"""The file that marks that folder as the stack's own copy."""


def save_objects(stack: Stack) -> int:
    """Copy every object of the stack's buckets into ``<home>/s3/<bucket>/<key>``; how many.
    A bucket's copy replaces its last one once complete (another bucket's, of an earlier
    configuration, stays); a key that would land outside its folder (``..``) or on a
    folder of another key is left out, with a warning."""
    fs = object_store(stack)
    root = Path(stack.home) / OBJECTS
    root.mkdir(parents=True, exist_ok=True)
    (root / OBJECTS_MARK).touch()
    count = 0
    for bucket in buckets(stack):
        partial = root / f".{bucket}.partial"
        shutil.rmtree(partial, ignore_errors=True)
        partial.mkdir()
        for path in fs.find(bucket):
            key = path.removeprefix(f"{bucket}/")
            target = (partial / key).resolve()
            if not target.is_relative_to(partial.resolve()) or target.is_dir():
                log.warning("not copied: %s/%s (its name cannot be a file here)", bucket, key)
                continue
            target.parent.mkdir(parents=True, exist_ok=True)
            fs.get_file(path, str(target))
            count += 1
        old = root / f".{bucket}.old"
        shutil.rmtree(old, ignore_errors=True)
        if (root / bucket).exists():
            (root / bucket).rename(old)
        partial.rename(root / bucket)
        shutil.rmtree(old, ignore_errors=True)
    return count


def load_objects(stack: Stack) -> int:
    """Put back what ``save_objects`` kept (nothing when the home has no copy); how many."""
    root = Path(stack.home) / OBJECTS
    if not root.is_dir():
        return 0
    fs = object_store(stack)
    count = 0
    for bucket in buckets(stack):
        for path in sorted((root / bucket).rglob("*")):
            if path.is_file():
                fs.put_file(str(path), f"{bucket}/{path.relative_to(root / bucket).as_posix()}")
                count += 1
    return count


DATABASES_MADE = "databases-made"
"""Written in PostgreSQL's data folder once its databases exist: an ``up`` that failed
after ``initdb`` and before them makes them on the next ``up``."""


def purge_data(home: Path) -> list[Path]:
    """Delete what the stack at ``home`` kept: PostgreSQL's data (where it lives) and the
    copy of moto's objects; only folders the stack made (a mistyped ``--home`` deletes
    nothing of the user's). The folders deleted."""
    gone = []
    data = pg_home(home) if (home / PG_POINTER).is_file() else home / "postgres"
    if (data / "cluster" / "PG_VERSION").is_file() or (data / DATABASES_MADE).is_file():
        shutil.rmtree(data, ignore_errors=True)
        gone.append(data)
    (home / PG_POINTER).unlink(missing_ok=True)
    if (home / OBJECTS / OBJECTS_MARK).is_file():
        shutil.rmtree(home / OBJECTS, ignore_errors=True)
        gone.append(home / OBJECTS)
    return gone
