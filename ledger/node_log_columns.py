"""One column of a node log (ledger/node_logs.py): its type and bounds, how a writer checks
a value for it, and the SQL a reader types and bounds a line's field with."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any, Final

from ledger.schema import MAX_SEED, check_id, time_window_sql
from ledger.sqltext import sql_str

MAX_TEXT_CHARS: Final = 1024
"""Longest string a reader keeps in a log's VARCHAR column (ids, task names, policy kinds)."""
MAX_TIMESTAMP_CHARS: Final = 64
_TYPES = ("BIGINT", "DOUBLE", "VARCHAR", "BOOLEAN", "TIMESTAMPTZ")


@dataclass(frozen=True)
class LogColumn:
    """One field of a log line and the column it fills."""

    name: str
    type: str
    """DuckDB type: one of BIGINT, DOUBLE, VARCHAR, BOOLEAN, TIMESTAMPTZ."""
    required: bool = False
    """A line without it (or with it null) is skipped by readers."""
    optional: bool = False
    """A writer may leave it out (written as null): a column added after logs without it
    were written, so a caller of the older form still writes."""
    low: float | None = None
    high: float | None = None
    """Inclusive bounds of a number; readers skip lines outside, writers refuse them."""
    choices: tuple[str, ...] = ()
    """The values a string may take; empty: any."""
    node_id: bool = False
    """Writers check the value as a node id."""
    max_chars: int = MAX_TEXT_CHARS
    pattern: str | None = None
    """Longest string a VARCHAR holds; a regular expression it must match whole."""

    def __post_init__(self) -> None:
        if self.type not in _TYPES:
            raise ValueError(f"{self.name}: unsupported log column type {self.type}")

    @property
    def bounds(self) -> tuple[float | None, float | None]:
        """(low, high), inclusive. An integer is never unbounded: one that fits in 64 bits
        can still overflow the first sum a report takes (schema.MAX_SEED)."""
        if self.type == "BIGINT":
            return (
                -MAX_SEED if self.low is None else self.low,
                MAX_SEED if self.high is None else self.high,
            )
        return self.low, self.high


def checked_value(log: str, i: int, col: LogColumn, value: Any) -> Any:
    """``value`` as a writer may write it in ``col``; ValueError otherwise."""
    where = f"{log} row {i}: {col.name}"
    if value is None:
        if col.optional:
            return None
        raise ValueError(f"{where} is missing")
    if col.type == "BIGINT":
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"{where} must be an int, got {type(value).__name__}")
    elif col.type == "DOUBLE":
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ValueError(f"{where} must be a number, got {type(value).__name__}")
        value = float(value)
        if not math.isfinite(value):
            raise ValueError(f"{where} must be finite, got {value}")
    elif col.type == "BOOLEAN":
        if not isinstance(value, bool):
            raise ValueError(f"{where} must be a bool, got {type(value).__name__}")
    elif col.type == "VARCHAR":
        if not isinstance(value, str):
            raise ValueError(f"{where} must be a str, got {type(value).__name__}")
        if not 0 < len(value) <= col.max_chars:
            raise ValueError(f"{where} must hold 1 to {col.max_chars} characters")
        if col.pattern is not None and re.fullmatch(col.pattern, value) is None:
            raise ValueError(f"{where} must match {col.pattern}")
        if col.choices and value not in col.choices:
            raise ValueError(f"{where} must be one of {list(col.choices)}, got {value!r}")
        if col.node_id:
            check_id(col.name, value)
    low, high = col.bounds
    if low is not None and value < low:
        raise ValueError(f"{where} must be >= {low}, got {value}")
    if high is not None and value > high:
        raise ValueError(f"{where} must be <= {high}, got {value}")
    return value


def typed_sql(col: LogColumn) -> tuple[str, str]:
    """(whether the JSON field ``col.name`` has the column's type, its typed value)."""
    c = col.name
    if col.type == "BIGINT":
        value = f"TRY_CAST({c} AS BIGINT)"
        return f"(json_type({c}) IN ('BIGINT', 'UBIGINT') AND {value} IS NOT NULL)", value
    if col.type == "DOUBLE":
        value = f"TRY_CAST({c} AS DOUBLE)"
        return f"(json_type({c}) IN ('DOUBLE', 'BIGINT', 'UBIGINT') AND isfinite({value}))", value
    if col.type == "BOOLEAN":
        return f"json_type({c}) = 'BOOLEAN'", f"TRY_CAST({c} AS BOOLEAN)"
    text = f"({c} ->> '$')"
    if col.type == "VARCHAR":
        shape = (
            "" if col.pattern is None else f" AND regexp_full_match({text}, {sql_str(col.pattern)})"
        )
        return f"(json_type({c}) = 'VARCHAR' AND strlen({text}) <= {col.max_chars}{shape})", text
    value = f"TRY_CAST({text} AS TIMESTAMPTZ)"  # TIMESTAMPTZ
    return (
        f"(json_type({c}) = 'VARCHAR' AND strlen({text}) <= {MAX_TIMESTAMP_CHARS} "
        f"AND {time_window_sql(value)})",
        value,
    )


def bounds_sql(col: LogColumn) -> str:
    """A predicate over the typed column (true when NULL): its bounds and choices."""
    rules = []
    low, high = col.bounds
    if low is not None:
        rules.append(f"{col.name} >= {low!r}")
    if high is not None:
        rules.append(f"{col.name} <= {high!r}")
    if col.choices:
        rules.append(f"{col.name} IN ({', '.join(sql_str(v) for v in col.choices)})")
    return f"coalesce({' AND '.join(rules)}, true)" if rules else ""
