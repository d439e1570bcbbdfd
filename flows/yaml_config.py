"""YAML files of configuration and `--set a.b=value` overrides, with errors that are one line
naming the file, or the override, and the key."""

from __future__ import annotations

import copy
from typing import Any

import yaml


class ConfigError(ValueError):
    """A swarm or experiment file that cannot run; the message is one line naming the key."""


def apply_overrides(data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """`a.b.c=value` pairs onto a config dict; values are parsed as YAML (numbers, lists...)."""
    out = copy.deepcopy(data)
    for item in overrides:
        key, sep, raw = item.partition("=")
        if not sep or not key:
            raise ConfigError(f"override {item!r} is not key=value")
        parts = key.split(".")
        target: Any = out
        for part in parts[:-1]:
            target = _child(target, part, item)
        if isinstance(target, list):
            target[_index(target, parts[-1], item)] = _yaml_value(raw, item)
        else:
            target[parts[-1]] = _yaml_value(raw, item)
    return out


def _yaml_value(raw: str, item: str) -> Any:
    try:
        return yaml.safe_load(raw)
    except yaml.YAMLError as exc:
        why = yaml_problem(exc)
        raise ConfigError(f"override {item!r}: the value is not YAML ({why})") from exc


def _index(items: list[Any], part: str, item: str) -> int:
    if not part.isdigit() or int(part) >= len(items):
        raise ConfigError(f"override {item!r}: {part!r} is not an index of a {len(items)}-list")
    return int(part)


def _child(target: Any, part: str, item: str) -> Any:
    """One step down a key path: a mapping's key (created if absent) or a list's index."""
    if isinstance(target, list):
        nxt = target[_index(target, part, item)]
    else:
        nxt = target.setdefault(part, {})
    if not isinstance(nxt, dict | list):
        raise ConfigError(f"override {item!r}: {part!r} is not a mapping or a list")
    return nxt


def parse_yaml_mapping(text: str, name: str, *, what: str = "swarm file") -> dict[str, Any]:
    """YAML text's top-level mapping (empty text: none); errors name its source."""
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{name}: not valid YAML: {yaml_problem(exc)}") from exc
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{name}: a {what} is a mapping of keys, not {type(data).__name__}")
    return data


def yaml_problem(exc: Exception) -> str:
    """One line for an error; for YAML, its problem and where (not PyYAML's multi-line
    excerpt, whose caret means nothing on one line)."""
    problem, mark = getattr(exc, "problem", None), getattr(exc, "problem_mark", None)
    if problem and mark is not None:
        return f"{problem} at line {mark.line + 1}, column {mark.column + 1}"
    return " ".join(str(exc).split())[:200]
