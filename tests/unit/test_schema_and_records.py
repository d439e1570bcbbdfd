from __future__ import annotations

from datetime import UTC, datetime

import polars as pl
import pyarrow as pa
import pytest

from ledger.records import RecordError, to_table
from ledger.schema import (
    COLUMN_NAMES,
    SCHEMA_VERSION,
    Column,
    arrow_schema,
    check_id,
    required_columns,
)
from tests.factories import group_rows

PUBLIC = [
    "rollout_id",
    "group_id",
    "swarm_id",
    "node_id",
    "model_id",
    "node_round",
    "policy_version",
    "task",
    "task_config",
    "task_seed",
    "task_index",
    "question",
    "answer",
    "metadata",
    "completion",
    "completion_tokens",
    "reward",
    "published_at",
    "schema_version",
    "token_ids",
    "token_logprobs",
    "tokenizer",
]


def test_public_columns_are_the_documented_ones_in_order():
    assert list(COLUMN_NAMES) == PUBLIC
    schema = arrow_schema()
    assert schema.field("published_at").type == pa.timestamp("us", tz="UTC")
    assert schema.field("answer").nullable and schema.field("reward").nullable
    assert not schema.field("completion").nullable
    assert schema.field("token_ids").type == pa.list_(pa.int32())
    assert schema.field("token_logprobs").type == pa.list_(pa.float32())


def test_rows_without_a_claim_publish_with_null_claims_and_rows_with_one_keep_it():
    rows = group_rows("n1", 0, 0, [1.0, 0.0])
    table = to_table(rows)
    assert table.column("token_ids").to_pylist() == [None, None]
    claimed = [
        {**r, "token_ids": [5, 6, 7], "token_logprobs": [-0.5, -1.0, 0.0], "tokenizer": "ab" * 8}
        for r in rows
    ]
    table = to_table(claimed)
    assert table.column("token_ids").to_pylist() == [[5, 6, 7]] * 2
    assert table.column("token_logprobs").to_pylist() == [[-0.5, -1.0, 0.0]] * 2
    with pytest.raises(RecordError, match="token_ids"):
        to_table([{**claimed[0], "token_ids": [2**40]}])


def test_columns_added_later_are_not_required_of_older_files():
    cols = (Column("a", pa.string(), False, 1, ""), Column("b", pa.int64(), False, 2, ""))
    assert [c.name for c in required_columns(1, cols)] == ["a"]
    assert arrow_schema(1, cols).names == ["a"]
    assert arrow_schema(2, cols).names == ["a", "b"]


@pytest.mark.parametrize("good", ["n", "node-1", "Node_2-b", "a" * 128])
def test_valid_ids(good):
    assert check_id("node_id", good) == good


@pytest.mark.parametrize("bad", ["", "1node", "a/b", "x=y", "a b", "a" * 129, "../up", "a.r0"])
def test_invalid_ids_are_refused(bad):
    with pytest.raises(ValueError, match="invalid node_id"):
        check_id("node_id", bad)


def test_to_table_accepts_dicts_polars_and_arrow_alike():
    rows = group_rows("n1", 0, 0, [1.0, 0.0])
    from_dicts = to_table(rows)
    from_polars = to_table(pl.DataFrame(rows))
    from_arrow = to_table(pa.Table.from_pylist(rows))
    assert from_dicts.schema.names == list(COLUMN_NAMES)
    assert from_dicts.equals(from_polars) and from_dicts.equals(from_arrow)
    assert from_dicts.column("schema_version").to_pylist() == [SCHEMA_VERSION] * 2


def test_to_table_stamps_publish_time_and_reads_naive_times_as_utc():
    rows = group_rows("n1", 0, 0, [1.0])
    now = datetime(2026, 5, 1, 8, 30, tzinfo=UTC)
    del rows[0]["published_at"]
    assert to_table(rows, now).column("published_at").to_pylist() == [now]
    rows[0]["published_at"] = datetime(2026, 5, 2, 9, 0)  # naive
    stamp = to_table(rows).column("published_at").to_pylist()[0]
    assert stamp == datetime(2026, 5, 2, 9, 0, tzinfo=UTC)


def test_to_table_rejects_unknown_missing_and_unconvertible_columns():
    rows = group_rows("n1", 0, 0, [1.0])
    with pytest.raises(RecordError, match="unknown columns"):
        to_table([{**rows[0], "extra": 1}])
    partial = dict(rows[0])
    del partial["completion"]
    with pytest.raises(RecordError, match=r"missing columns \['completion'\]"):
        to_table([partial])
    with pytest.raises(RecordError, match="node_round"):
        to_table([{**rows[0], "node_round": "seven"}])
    with pytest.raises(RecordError, match="no rows"):
        to_table([])
    with pytest.raises(RecordError, match="polars DataFrame"):
        to_table("not rows")
