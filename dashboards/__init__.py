"""Read-only views of a swarm: SQL over the ledger a user can paste into DuckDB."""

from __future__ import annotations

from importlib import resources


def query(name: str) -> str:
    """The text of ``dashboards/sql/<name>.sql``."""
    return resources.files(__package__).joinpath("sql", f"{name}.sql").read_text()


def names() -> list[str]:
    folder = resources.files(__package__).joinpath("sql")
    return sorted(p.name.removesuffix(".sql") for p in folder.iterdir() if p.name.endswith(".sql"))
