"""What a reader accepts from peers, as pure functions and SQL fragments.

Nothing a peer writes may crash a reader. Whole files are judged by their Parquet footer
(corrupt, wrong schema, too large, outside the layout); rows by one SQL ``CASE`` expression
that names the first rule a row breaks; groups by size and consistency. Everything skipped is
counted by reason and logged; the rest stays readable.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

import pyarrow as pa

from ledger.config import RowLimits
from ledger.schema import COLUMNS, MIN_READABLE_VERSION, Column, required_columns

# File-level reasons.
CORRUPT: Final = "corrupt"
SCHEMA_MISMATCH: Final = "schema_mismatch"
OVERSIZED_FILE: Final = "oversized_file"
MISPLACED: Final = "misplaced"
# Row-level reasons.
UNSUPPORTED_VERSION: Final = "unsupported_version"
MISSING_FIELD: Final = "missing_field"
INVALID_ID: Final = "invalid_id"
OVERSIZED_TEXT: Final = "oversized_text"
INVALID_VALUE: Final = "invalid_value"
INVALID_REWARD: Final = "invalid_reward"
DUPLICATE_ID: Final = "duplicate_id"
# Group-level reasons (counted per row of the group).
OVERSIZED_GROUP: Final = "oversized_group"
INCONSISTENT_GROUP: Final = "inconsistent_group"
DUPLICATE_GROUP: Final = "duplicate_group"

MAX_SHORT_TEXT: Final = 1024
"""Longest model_id or task name."""


def _kind_of_arrow(t: pa.DataType) -> str:
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        return "string"
    if pa.types.is_integer(t):
        return "integer"
    if pa.types.is_floating(t):
        return "float"
    if pa.types.is_timestamp(t):
        return "timestamp"
    return "other"


# A column of kind (key) may be stored as any of (value): DuckDB widens these losslessly.
_ACCEPTED: Final = {
    "string": {"string"},
    "integer": {"integer"},
    "float": {"float", "integer"},
    "timestamp": {"timestamp"},
}


def parquet_kind(physical: str | None, converted: str | None, logical: str | None) -> str:
    """Classify one Parquet leaf column (as DuckDB's ``parquet_schema`` reports it)."""
    converted = (converted or "").upper()
    logical = logical or ""
    if physical == "BYTE_ARRAY":
        if converted in ("UTF8", "JSON", "ENUM") or logical.startswith(("String", "Json", "Enum")):
            return "string"
        return "other"
    if physical == "INT96":
        return "timestamp"
    if physical in ("INT32", "INT64"):
        if converted.startswith("TIMESTAMP") or logical.startswith("Timestamp"):
            return "timestamp"
        if converted in ("", "INT_8", "INT_16", "INT_32", "INT_64") and (
            not logical or logical.startswith("Int")
        ):
            return "integer"
        if converted.startswith("UINT") or logical.startswith("Int"):
            return "integer"
        return "other"
    if physical in ("FLOAT", "DOUBLE"):
        return "float"
    return "other"


SchemaRow = tuple[str, str | None, str | None, str | None, int | None]
"""(name, physical type, converted type, logical type, number of children)."""


def top_level_kinds(rows: Sequence[SchemaRow]) -> dict[str, str]:
    """Top-level field kinds from a file's flattened Parquet schema (root first, depth-first)."""
    if not rows:
        return {}
    kinds: dict[str, str] = {}
    index = 1

    def skip_subtree(i: int) -> int:
        children = rows[i][4] or 0
        i += 1
        for _ in range(children):
            i = skip_subtree(i)
        return i

    for _ in range(rows[0][4] or 0):
        if index >= len(rows):
            break
        name, physical, converted, logical, children = rows[index]
        kinds[name] = "other" if children else parquet_kind(physical, converted, logical)
        index = skip_subtree(index)
    return kinds


def schema_problem(kinds: dict[str, str], columns: tuple[Column, ...] = COLUMNS) -> str | None:
    """Why a file with these top-level column kinds cannot be read, or None if it can.

    Columns added after ``MIN_READABLE_VERSION`` may be absent (older writers); extra
    columns from newer writers are ignored.
    """
    missing = [
        c.name for c in required_columns(MIN_READABLE_VERSION, columns) if c.name not in kinds
    ]
    if missing:
        return f"missing columns {missing}"
    wrong = [
        f"{c.name}: {kinds[c.name]} (want {_kind_of_arrow(c.type)})"
        for c in columns
        if c.name in kinds and kinds[c.name] not in _ACCEPTED[_kind_of_arrow(c.type)]
    ]
    if wrong:
        return "wrong column types " + "; ".join(wrong)
    return None


def reject_reason_sql(limits: RowLimits, columns: tuple[Column, ...] = COLUMNS) -> str:
    """A SQL expression over the public columns: the first rule a row breaks, or NULL.

    The limits are validated integers, so inlining them is safe.
    """
    present = [
        f"{c.name} IS NULL"
        if c.since <= MIN_READABLE_VERSION
        # A column newer than the row's writer is allowed to be missing.
        else f"(schema_version >= {c.since} AND {c.name} IS NULL)"
        for c in columns
        if not c.nullable
    ]
    long_text = {
        "question": limits.max_question_chars,
        "answer": limits.max_answer_chars,
        "completion": limits.max_completion_chars,
        "metadata": limits.max_metadata_chars,
        "task_config": limits.max_task_config_chars,
        "model_id": MAX_SHORT_TEXT,
        "task": MAX_SHORT_TEXT,
    }
    oversized = " OR ".join(f"coalesce(strlen({name}), 0) > {n}" for name, n in long_text.items())
    return f"""CASE
        WHEN schema_version IS NULL OR schema_version < {MIN_READABLE_VERSION}
            THEN '{UNSUPPORTED_VERSION}'
        WHEN {" OR ".join(present)} THEN '{MISSING_FIELD}'
        WHEN strlen(rollout_id) > {limits.max_id_chars} OR strlen(group_id) > {limits.max_id_chars}
            OR strlen(rollout_id) = 0 OR strlen(group_id) = 0 THEN '{INVALID_ID}'
        WHEN {oversized} THEN '{OVERSIZED_TEXT}'
        WHEN node_round < 0 OR policy_version < 0 OR task_index < 0 OR completion_tokens < 0
            OR completion_tokens > {limits.max_completion_tokens} THEN '{INVALID_VALUE}'
        WHEN reward IS NOT NULL AND (isnan(reward) OR reward < 0 OR reward > 1)
            THEN '{INVALID_REWARD}'
        ELSE NULL
    END"""


def group_problem_sql(limits: RowLimits) -> str:
    """An aggregate SQL expression over one group's rows: why the group is rejected, or NULL.

    The completions of one group answer one question: a group whose rows disagree on it was
    not written by an honest publisher and is not trained on.
    """
    same = " OR ".join(
        f"count(DISTINCT {expr}) > 1"
        for expr in (
            "task",
            "task_config",
            "task_seed",
            "task_index",
            "question",
            "coalesce(answer, chr(0))",
            "node_round",
            "swarm_id",
            "node_id",
        )
    )
    return f"""CASE
        WHEN count(*) > {limits.max_group_size} THEN '{OVERSIZED_GROUP}'
        WHEN {same} THEN '{INCONSISTENT_GROUP}'
        ELSE NULL
    END"""
