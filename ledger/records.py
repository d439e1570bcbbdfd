"""Turning what a publisher hands over (Arrow, polars or dicts) into a ledger table."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, TypeAlias

import pyarrow as pa

from ledger.schema import CLAIM_COLUMNS, COLUMN_NAMES, SCHEMA_VERSION, arrow_schema

if TYPE_CHECKING:
    import polars as pl

Rows: TypeAlias = "pa.Table | pl.DataFrame | Sequence[Mapping[str, Any]]"

FILLED_BY_PUBLISH = ("published_at", "schema_version")
"""Columns a publisher may leave out: publish stamps the time and the writer's version."""
OPTIONAL = (*FILLED_BY_PUBLISH, *CLAIM_COLUMNS)
"""...and the generator's claim, NULL when left out (rows as schema 1 wrote them)."""


class RecordError(ValueError):
    """Rows that cannot be published, with the reason."""


def _as_arrow(rows: Any) -> pa.Table:
    if isinstance(rows, pa.Table):
        return rows
    if hasattr(rows, "to_arrow") and hasattr(rows, "columns"):  # a polars DataFrame
        table: pa.Table = rows.to_arrow()
        return table
    if isinstance(rows, Sequence) and all(isinstance(r, Mapping) for r in rows):
        if not rows:
            return pa.table({})
        return pa.Table.from_pylist([dict(r) for r in rows])
    raise RecordError(
        f"rows must be a pyarrow Table, a polars DataFrame or a list of dicts, not {type(rows)!r}"
    )


def to_table(rows: Any, now: datetime | None = None) -> pa.Table:
    """The rows as a table of exactly the public columns in the current schema.

    Raises RecordError for unknown or missing columns and for values that do not convert.
    """
    table = _as_arrow(rows)
    if table.num_rows == 0:
        raise RecordError("nothing to publish: no rows")
    names = set(table.column_names)
    unknown = sorted(names - set(COLUMN_NAMES))
    if unknown:
        raise RecordError(f"unknown columns {unknown}; the public columns are {list(COLUMN_NAMES)}")
    missing = [c for c in COLUMN_NAMES if c not in names and c not in OPTIONAL]
    if missing:
        raise RecordError(f"missing columns {missing}")

    stamp = now or datetime.now(UTC)
    n = table.num_rows
    if "published_at" not in names:
        table = table.append_column(
            "published_at", pa.array([stamp] * n, pa.timestamp("us", "UTC"))
        )
    table = table.drop_columns(["schema_version"]) if "schema_version" in names else table
    table = table.append_column("schema_version", pa.array([SCHEMA_VERSION] * n, pa.int32()))
    for name in CLAIM_COLUMNS:
        if name not in names:
            table = table.append_column(name, pa.nulls(n))

    schema = arrow_schema()
    columns = []
    for field in schema:
        column = table.column(field.name)
        if pa.types.is_timestamp(column.type) and column.type.tz is None:
            column = column.cast(pa.timestamp(column.type.unit, "UTC"))  # naive means UTC
        if field.name == "published_at" and pa.types.is_null(column.type):
            column = column.cast(field.type)  # every stamp left out
        if field.name == "published_at" and column.null_count:
            column = pa.chunked_array([_fill_time(column, stamp)])
        try:
            columns.append(column.cast(field.type))
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError) as exc:
            raise RecordError(
                f"column {field.name!r} does not convert to {field.type}: {exc}"
            ) from exc
    return pa.Table.from_arrays(columns, schema=pa.schema([f.with_nullable(True) for f in schema]))


def _fill_time(column: pa.ChunkedArray, stamp: datetime) -> pa.Array:
    import pyarrow.compute as pc

    filled: pa.Array = pc.fill_null(column.combine_chunks(), pa.scalar(stamp, column.type))
    return filled
