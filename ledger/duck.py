"""DuckDB connections for the ledger, and the offline load of the httpfs extension."""

from __future__ import annotations

from importlib.util import find_spec
from pathlib import Path

import duckdb


def httpfs_extension_path() -> Path:
    """The signed httpfs extension shipped by the ``duckdb-extension-httpfs`` wheel.

    ``INSTALL httpfs`` downloads from DuckDB's extension host, which offline machines cannot
    reach; the wheel carries the same file for exactly our pinned DuckDB version.
    """
    spec = find_spec("duckdb_extension_httpfs")
    if spec is None or spec.origin is None:
        raise RuntimeError(
            "reading s3:// ledgers needs the duckdb-extension-httpfs package "
            f"(pip install duckdb-extension-httpfs=={duckdb.__version__})"
        )
    path = Path(spec.origin).parent / "extensions" / f"v{duckdb.__version__}"
    path = path / "httpfs.duckdb_extension"
    if not path.exists():
        raise RuntimeError(
            f"no httpfs extension for DuckDB {duckdb.__version__} at {path}: "
            "duckdb and duckdb-extension-httpfs versions must match"
        )
    return path


def load_httpfs(con: duckdb.DuckDBPyConnection) -> None:
    con.execute("SET autoinstall_known_extensions = false")
    con.execute(f"LOAD '{httpfs_extension_path()}'")


def connect(
    threads: int | None = None, memory_limit_mb: int | None = None
) -> duckdb.DuckDBPyConnection:
    """An in-memory connection that never reaches out to the network on its own, and takes
    at most ``memory_limit_mb`` (a query past it fails instead of exhausting the machine)."""
    con = duckdb.connect(":memory:")
    con.execute("SET autoinstall_known_extensions = false")
    # DuckDB's cache of file blocks trusts a file whose size and (coarse, ~4 ms) mtime did
    # not move: a peer that overwrites its file in place would be read as it was. Readers
    # judge what is in the store now.
    con.execute("SET enable_external_file_cache = false")
    con.execute("SET enable_progress_bar = false")  # a library never draws on the terminal
    if memory_limit_mb:
        con.execute(f"SET memory_limit = '{int(memory_limit_mb)}MB'")
    if threads:
        con.execute(f"SET threads = {int(threads)}")
    return con
