"""Names that left a module of sapo_core: importing one from its old home fails in one line
saying what replaces it (the project's rule for a public API change), instead of a bare
"cannot import name"."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any


def moved_names(module: str, moved: Mapping[str, str]) -> Callable[[str], Any]:
    """A ``__getattr__`` for ``module``: each name of ``moved`` raises ImportError with
    ``<module>.<name> <what replaces it>``; any other missing name is an AttributeError."""

    def __getattr__(name: str) -> Any:
        if name in moved:
            raise ImportError(f"{module}.{name} {moved[name]}")
        raise AttributeError(f"module {module!r} has no attribute {name!r}")

    return __getattr__
