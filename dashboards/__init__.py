"""Read-only views of a swarm: SQL over the ledger a user can paste into DuckDB."""

from __future__ import annotations

import importlib.abc
import sys
from importlib import resources


def query(name: str) -> str:
    """The text of ``dashboards/sql/<name>.sql``."""
    return resources.files(__package__).joinpath("sql", f"{name}.sql").read_text()


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
