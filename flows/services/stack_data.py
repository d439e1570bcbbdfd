"""What the stack of `sapo infra` keeps between `down` and `up`, and where: PostgreSQL's
cluster (Prefect's and MLflow's databases) under the home, and a copy of moto's objects,
which moto holds only in memory (flows/services/stack.py starts and stops the services)."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any, Protocol


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
        return Path(pointer.read_text().strip())
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


def save_objects(stack: Stack) -> int:
    """Copy every object of the stack's buckets into ``<home>/s3/<bucket>/<key>`` (a fresh
    copy replaces the last one whole, once complete); how many."""
    fs = object_store(stack)
    home = Path(stack.home)
    partial = home / f"{OBJECTS}.partial"
    shutil.rmtree(partial, ignore_errors=True)
    count = 0
    for bucket in buckets(stack):
        (partial / bucket).mkdir(parents=True)
        for path in fs.find(bucket):
            target = partial / bucket / path.removeprefix(f"{bucket}/")
            target.parent.mkdir(parents=True, exist_ok=True)
            fs.get_file(path, str(target))
            count += 1
    shutil.rmtree(home / OBJECTS, ignore_errors=True)
    partial.rename(home / OBJECTS)
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


def purge_data(home: Path) -> None:
    """Delete what the stack at ``home`` kept: PostgreSQL's data (where it lives) and the
    copy of moto's objects."""
    shutil.rmtree(pg_home(home), ignore_errors=True)
    (home / PG_POINTER).unlink(missing_ok=True)
    shutil.rmtree(home / OBJECTS, ignore_errors=True)
