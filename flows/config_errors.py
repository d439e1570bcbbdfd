"""A configuration file's validation error said in one line that names the key as the file
spells it (a swarm file's `defaults` and `sampling`, an experiment file's keys, `--set`)."""

from __future__ import annotations

from typing import Any, get_args

from pydantic import ValidationError

from ledger.policies import AnyPolicy

KINDS = frozenset(str(m.model_fields["kind"].default) for m in get_args(AnyPolicy))
"""The sampling policy kinds (the `kind` default of each policy model)."""


def describe_validation_error(
    exc: ValidationError,
    source: str,
    data: dict[str, Any] | None = None,
    overridden: frozenset[str] = frozenset(),
) -> str:
    """The first problem of a validation error as one line that names the key, as the file
    (`data`, when given) spells it: a node's setting that came from `defaults` or from the
    swarm's `sampling` is named there, not under each node it was merged into; a key set
    on the command line (``overridden``) is blamed on `--set`, not on the file."""
    problems = list(dict.fromkeys(_problem(error, data) for error in exc.errors()))
    more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
    key, text = problems[0]
    return f"{'--set' if key in overridden else source}: {text}{more}"


def _problem(error: Any, data: dict[str, Any] | None) -> tuple[str, str]:
    """One validation error: its key as the file spells it, and `key: message; got
    value`."""
    loc = [str(part) for part in error["loc"]]
    # Node entries are written flat in the file; their resolved form nests them under `node`.
    if len(loc) >= 3 and loc[0] == "nodes" and loc[2] == "node":
        del loc[2]
    # pydantic names the policy kind it tried (sampling.<kind>.<field>); the file has none.
    loc = [p for i, p in enumerate(loc) if not (i and loc[i - 1] == "sampling" and p in KINDS)]
    if data is not None and len(loc) >= 3 and loc[0] == "nodes" and loc[1].isdigit():
        loc = _where_in_file(data, int(loc[1]), loc[2:]) or loc
    message = str(error["msg"]).removeprefix("Value error, ")  # our validators name the key
    value = error.get("input")
    shown = f"; got {value!r}" if error["type"] != "missing" and _short(value) else ""
    key = ".".join(loc)
    where = f"{key}: " if loc else ""
    return key, f"{where}{message}{shown}"


def _where_in_file(data: dict[str, Any], index: int, path: list[str]) -> list[str] | None:
    """`defaults.<path>` or `sampling.<path>` when node `index`'s own entry does not set
    `path` but the swarm-wide section does; None to keep `nodes.<index>.<path>`."""
    nodes = data.get("nodes") or []
    entry = nodes[index] if isinstance(nodes, list) and index < len(nodes) else {}
    section, rest = ("sampling", path[1:]) if path[0] == "sampling" else ("defaults", path)
    own = entry.get("sampling", {}) if section == "sampling" and isinstance(entry, dict) else entry
    if _has(own, rest) or not _has(data.get(section), rest):
        return None
    return [section, *rest]


def _has(tree: Any, path: list[str]) -> bool:
    for part in path:
        if not isinstance(tree, dict) or part not in tree:
            return False
        tree = tree[part]
    return True


def _short(value: Any) -> bool:
    return isinstance(value, str | int | float | bool) and len(repr(value)) <= 60
