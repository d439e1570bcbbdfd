"""Read-only views of a swarm: SQL over the ledger a user can paste into DuckDB."""

from __future__ import annotations

import importlib.abc
import sys
from importlib import resources


def query(name: str) -> str:
    """The text of ``dashboards/sql/<name>.sql``."""
    return resources.files(__package__).joinpath("sql", f"{name}.sql").read_text()


INPUTS = {"sweep_summary": {"sweep_rewards": "sweep_reward_per_round"}}
"""Queries that read another query's result as a table: {query: {table it reads: the query
that makes it}}. The report registers those tables from frames it holds; a user's query of a
ledger gets them computed inline (``runnable``)."""


def runnable(name: str) -> str:
    """``name``'s SQL as one statement over a ledger's views alone: the tables it reads from
    other queries (INPUTS) computed inline as common table expressions before its own."""
    text = query(name)
    inputs = INPUTS.get(name)
    if not inputs:
        return text
    made = ",\n".join(
        f"{table} AS (\n{_body(runnable(source))}\n)" for table, source in inputs.items()
    )
    body = _body(text)
    if body[:5].upper() == "WITH ":
        return f"WITH {made},\n{body[5:]}"
    return f"WITH {made}\n{body}"


def _body(text: str) -> str:
    """A query without its leading comment lines and its final semicolon."""
    lines = text.strip().splitlines()
    while lines and (not lines[0].strip() or lines[0].lstrip().startswith("--")):
        lines.pop(0)
    return "\n".join(lines).rstrip().removesuffix(";")


def names() -> list[str]:
    folder = resources.files(__package__).joinpath("sql")
    return sorted(p.name.removesuffix(".sql") for p in folder.iterdir() if p.name.endswith(".sql"))


MOVED = ("records", "replicates", "replicate_report", "statistics", "paper", "families")
"""An experiment's statistics, once modules of this package, now `analysis`'s (issue 45)."""


class _MovedModules(importlib.abc.MetaPathFinder):
    """``import dashboards.records`` (and the rest of MOVED) fails in one line naming the
    module's new home, where it would say only that no such module exists."""

    def find_spec(self, fullname: str, path: object = None, target: object = None) -> None:
        package, _, name = fullname.rpartition(".")
        if package == __name__ and name in MOVED:
            raise ModuleNotFoundError(f"{fullname} moved to analysis.{name}: import that instead")


if not any(isinstance(f, _MovedModules) for f in sys.meta_path):
    sys.meta_path.append(_MovedModules())  # after the finders that find what is here
