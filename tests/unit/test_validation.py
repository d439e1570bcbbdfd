from __future__ import annotations

import math
import tempfile

import duckdb
import pyarrow as pa
import pytest

from ledger import validation as v
from ledger.config import RowLimits
from ledger.records import to_table
from tests.factories import group_rows


@pytest.mark.parametrize(
    ("physical", "converted", "logical", "kind"),
    [
        ("BYTE_ARRAY", "UTF8", "StringType()", "string"),
        ("BYTE_ARRAY", None, None, "other"),
        ("INT64", None, None, "integer"),
        ("INT32", "INT_32", None, "integer"),
        ("INT64", "TIMESTAMP_MICROS", "TimestampType(isAdjustedToUTC=1, ...)", "timestamp"),
        ("INT96", None, None, "timestamp"),
        ("INT32", "DATE", "DateType()", "other"),
        ("DOUBLE", None, None, "float"),
        ("BOOLEAN", None, None, "other"),
    ],
)
def test_parquet_kind(physical, converted, logical, kind):
    assert v.parquet_kind(physical, converted, logical) == kind


def test_top_level_kinds_skips_nested_children():
    rows = [
        ("schema", None, None, None, 3),
        ("a", "INT64", None, None, 0),
        ("s", None, None, None, 2),  # a struct: its children are not top-level columns
        ("reward", "DOUBLE", None, None, 0),
        ("x", "INT64", None, None, 0),
        ("b", "DOUBLE", None, None, 0),
    ]
    assert v.top_level_kinds(rows) == {"a": "integer", "s": "nested", "b": "float"}


def _kinds_of(table: pa.Table) -> dict[str, str]:
    con = duckdb.connect()
    con.register("t", table)
    with tempfile.NamedTemporaryFile(suffix=".parquet") as f:
        con.execute(f"COPY t TO '{f.name}' (FORMAT parquet)")
        rows = con.execute(
            "SELECT name, type, converted_type, logical_type, num_children "
            f"FROM parquet_schema('{f.name}')"
        ).fetchall()
    return v.top_level_kinds(rows)


def test_schema_problem_on_real_files():
    good = to_table(group_rows("n", 0, 0, [1.0]))
    assert v.schema_problem(_kinds_of(good)) is None
    missing = good.drop_columns(["completion"])
    assert v.schema_problem(_kinds_of(missing)) == "missing columns ['completion']"
    wrong = good.set_column(good.schema.get_field_index("reward"), "reward", pa.array(["high"]))
    assert "reward: string (want float)" in (v.schema_problem(_kinds_of(wrong)) or "")
    extra = good.append_column("from_the_future", pa.array([1]))
    assert v.schema_problem(_kinds_of(extra)) is None


def _reasons(rows, limits: RowLimits | None = None):
    con = duckdb.connect()
    con.register("t", to_table(rows))
    sql = f"SELECT {v.reject_reason_sql(limits or RowLimits())} FROM t"
    return [r[0] for r in con.execute(sql).fetchall()]


def test_reject_reason_names_the_first_rule_a_row_breaks():
    ok = group_rows("n", 0, 0, [1.0])[0]
    cases = {
        None: ok,
        v.MISSING_FIELD: {**ok, "question": None},
        v.INVALID_ID: {**ok, "rollout_id": "x" * 200},
        v.OVERSIZED_TEXT: {**ok, "completion": "y" * 40_000},
        v.INVALID_VALUE: {**ok, "completion_tokens": -1},
        v.INVALID_REWARD: {**ok, "reward": 1.5},
    }
    assert _reasons(list(cases.values())) == list(cases)
    assert _reasons([{**ok, "reward": math.nan}]) == [v.INVALID_REWARD]
    assert _reasons([{**ok, "reward": None, "answer": None}]) == [None]
    tight = RowLimits(max_completion_chars=3)
    assert _reasons([ok], tight) == [v.OVERSIZED_TEXT]


def test_group_problem_flags_oversized_and_inconsistent_groups():
    con = duckdb.connect()
    rows = group_rows("n", 0, 0, [1.0, 0.0, 1.0])
    rows[1]["question"] = "a different question"
    con.register("t", to_table(rows + group_rows("n", 0, 1, [1.0, 0.0])))
    con.execute(f"CREATE VIEW judged AS SELECT {v.JUDGED_COLUMNS} FROM t")
    problem = v.group_problem_sql(RowLimits(max_group_size=2))
    sql = f"SELECT group_id, {problem} FROM judged GROUP BY 1"
    problems = dict(con.execute(sql).fetchall())
    assert problems == {"sw.n.r0.g0": v.OVERSIZED_GROUP, "sw.n.r0.g1": None}
    sql = f"SELECT group_id, {v.group_problem_sql(RowLimits())} FROM judged GROUP BY 1"
    assert dict(con.execute(sql).fetchall())["sw.n.r0.g0"] == v.INCONSISTENT_GROUP


def test_the_longest_sample_log_a_node_writes_fits_the_readers_bound() -> None:
    # J is at most 1024 and ids at most 128 characters (RowLimits.max_id_chars): the
    # biggest honest sample log stays under the bound readers skip larger logs by.
    from datetime import UTC, datetime

    from ledger import node_logs, samples

    picks = [("g" * 128, "n" * 128)] * node_logs.MAX_RECORDED_GROUPS
    rows = samples.sample_rows(picks, {"g" * 128: "f" * 32}, policy="p" * 64, seed=-(2**62))
    lines = node_logs.SAMPLES.lines(
        [{**row, "node_round": 2**31 - 1} for row in rows], datetime.now(UTC)
    )
    assert len(lines) <= node_logs.SAMPLES.max_bytes
