"""SQL text shared by the ledger's queries: quoting, and the scan over Parquet files."""

from __future__ import annotations

import re
from typing import Any

from ledger.schema import COLUMN_NAMES, COLUMNS

_DUCK_TYPES = {
    "string": "VARCHAR",
    "int64": "BIGINT",
    "int32": "INTEGER",
    "double": "DOUBLE",
    "timestamp[us, tz=UTC]": "TIMESTAMPTZ",
    "list<item: int32>": "INTEGER[]",
    "list<item: float>": "FLOAT[]",
}
TYPED_EMPTY = (
    "SELECT "
    + ", ".join(f"NULL::{_DUCK_TYPES[str(c.type)]} AS {c.name}" for c in COLUMNS)
    + ", NULL::DATE AS day, NULL::VARCHAR AS filename LIMIT 0"
)
TYPED_EMPTY_NUMBERED = TYPED_EMPTY.replace(" LIMIT 0", ", NULL::BIGINT AS file_row_number LIMIT 0")
"""The same, with ``file_row_number`` (see ``scan_sql``'s ``row_numbers``)."""
PUBLIC_COLUMNS_SQL = ", ".join(COLUMN_NAMES)
SCANNED_COLUMNS_SQL = PUBLIC_COLUMNS_SQL + ", day, filename"
EMPTY_ROLLOUTS_SQL = f"SELECT {PUBLIC_COLUMNS_SQL} FROM ({TYPED_EMPTY})"


def scan_sql(files_expr: str, where: str = "", row_numbers: bool = False) -> str:
    """A relation over Parquet files with every public column, whatever version wrote them.

    Only the public columns (plus ``day`` and ``filename``) are selected by name: whatever
    else a file carries is never read, and cannot collide with a name a query adds.
    ``UNION ALL BY NAME`` with a typed empty relation fills columns that older files lack
    with NULL; the Hive keys come from the path, which outranks any same-named column a
    peer put inside its file. ``where`` filters inside the scan, where DuckDB can push it
    down to row-group statistics.
    ``row_numbers`` adds ``file_row_number``, each row's position in its file.
    """
    options = (
        "hive_partitioning = true, filename = true, "
        "hive_types = {'swarm_id': 'VARCHAR', 'node_id': 'VARCHAR', 'day': 'DATE'}"
    )
    columns = SCANNED_COLUMNS_SQL
    if row_numbers:
        options += ", file_row_number = true"
        columns += ", file_row_number"
    filtered = f" WHERE {where}" if where else ""
    typed_empty = TYPED_EMPTY_NUMBERED if row_numbers else TYPED_EMPTY
    return (
        f"SELECT {columns} FROM (({typed_empty}) UNION ALL BY NAME "
        f"SELECT * FROM read_parquet({files_expr}, union_by_name = true, {options})){filtered}"
    )


def sql_str(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"


def sql_list(values: list[str]) -> str:
    return "[" + ", ".join(sql_str(x) for x in values) + "]"


def sql_in(values: list[str]) -> str:
    """``values`` as the parenthesised list of an ``IN``; never empty (an empty IN is a
    syntax error), matching nothing when there are none."""
    return "(" + (", ".join(sql_str(x) for x in values) or "NULL") + ")"


_PARAMETER = re.compile(r"\$([A-Za-z_][A-Za-z0-9_]*)")
_COMMENT = re.compile(r"--[^\n]*")


def sql_code(sql: str) -> str:
    """``sql`` without its ``--`` comments."""
    return _COMMENT.sub("", sql)


def named_parameters(sql: str) -> set[str]:
    """The ``$name`` parameters ``sql`` uses (not those its comments mention)."""
    return set(_PARAMETER.findall(sql_code(sql)))


def parameters_for(sql: str, params: dict[str, Any]) -> dict[str, Any]:
    """Of ``params``, those ``sql`` uses: DuckDB refuses a statement any others."""
    named = named_parameters(sql)
    return {k: v for k, v in params.items() if k in named}
