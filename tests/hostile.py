"""What a hostile peer writes: the payloads of issue 12's attacks, for tests and
``benchmarks/attacks.py``. Pure builders of tables and bytes; planting them is the caller's."""

from __future__ import annotations

import io
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from ledger.changes import ChangeLogStore, marker_key
from ledger.records import to_table
from tests.factories import round_rows

ATTACKER = "evil"
PREFIX = f"swarm_id=sw/node_id={ATTACKER}/day=2026-03-01"
"""The attacker's own partition: everything below is written where it may write."""


def parquet_bytes(table: pa.Table, **options: Any) -> bytes:
    buffer = io.BytesIO()
    pq.write_table(table, buffer, **options)
    return buffer.getvalue()


def attacker_table(groups: list[list[float | None]] | None = None, **overrides: Any) -> pa.Table:
    return to_table(round_rows(ATTACKER, 0, groups or [[1, 0]], **overrides))


def with_column(table: pa.Table, name: str, values: pa.Array) -> pa.Table:
    """``table`` with column ``name`` replaced (or appended)."""
    index = table.schema.get_field_index(name)
    if index < 0:
        return table.append_column(name, values)
    return table.set_column(index, name, values)


def nested_column(depth: int, rows: int) -> pa.Array:
    """A struct column nested ``depth`` levels deep."""
    kind: pa.DataType = pa.int64()
    value: Any = 1
    for _ in range(depth):
        kind = pa.struct([("x", kind)])
        value = {"x": value}
    return pa.array([value] * rows, type=kind)


def deep_nesting(depth: int) -> bytes:
    table = attacker_table()
    return parquet_bytes(table.append_column("deep", nested_column(depth, table.num_rows)))


def reason_column() -> bytes:
    """An extra column named as the reader's own judging column, beside an invalid reward."""
    table = attacker_table([[5.0, 0.0]])  # reward 5 is out of [0, 1]
    return parquet_bytes(
        table.append_column("reason", pa.array([None] * table.num_rows, pa.string()))
    )


def nul_in_group_id() -> pa.Table:
    table = attacker_table()
    bad = [f"sw.{ATTACKER}.r0.g0\x00'; DROP TABLE groups; --"] * table.num_rows
    return with_column(table, "group_id", pa.array(bad))


def paired_groups(rows: int) -> pa.Table:
    """``rows`` of the attacker's round 0 in groups of two (rewards 0 and 1), built column by
    column: fast at millions of rows."""
    ids = [f"sw.{ATTACKER}.r0.g{i // 2}" for i in range(rows)]
    base = round_rows(ATTACKER, 0, [[1, 0]])[0]
    columns = {name: [value] * rows for name, value in base.items()}
    columns["group_id"] = ids
    columns["rollout_id"] = [f"{g}.c{i}" for i, g in enumerate(ids)]
    columns["reward"] = [float(i % 2) for i in range(rows)]
    return to_table(pa.table(columns))


def decompression_bomb(rows: int, chars: int, dictionary: bool = False) -> bytes:
    """``rows`` completions of ``chars`` identical characters: tiny compressed, huge unpacked
    (plain encoding, so the footer's uncompressed size tells; with a dictionary it would not,
    and the reader's streaming scans are what bound it)."""
    table = paired_groups(rows) if rows else attacker_table()
    table = with_column(table, "completion", pa.array(["a" * chars] * rows, pa.string()))
    return parquet_bytes(
        table, compression="zstd", row_group_size=max(1, rows), use_dictionary=dictionary
    )


def claim_bomb(rows: int, tokens: int) -> bytes:
    """``rows`` completions each claiming ``tokens`` zero ids and -1.0 log-probs (with
    ``completion_tokens`` to match, so every row passes the row rules): run-length encoding
    packs them into a few KB that decode to ``rows x tokens`` values a column."""
    import numpy as np

    table = paired_groups(rows)
    table = with_column(table, "completion_tokens", pa.array([tokens] * rows, pa.int64()))
    offsets = pa.array(np.arange(rows + 1, dtype=np.int32) * tokens)
    ids = pa.ListArray.from_arrays(offsets, pa.array(np.zeros(rows * tokens, np.int32)))
    table = with_column(table, "token_ids", ids)
    logprobs = pa.array(np.full(rows * tokens, -1.0, np.float32))
    table = with_column(table, "token_logprobs", pa.ListArray.from_arrays(offsets, logprobs))
    table = with_column(table, "tokenizer", pa.array(["0f" * 8] * rows, pa.string()))
    return parquet_bytes(table, compression="zstd", row_group_size=max(1, rows))


def many_tiny_rows(rows: int) -> bytes:
    """``rows`` one-completion groups in one file, as small as Parquet makes them."""
    return decompression_bomb(rows, 1)


def shadowing(victim: str, victim_round: int = 0) -> bytes:
    """The attacker's file, reusing a victim's group and rollout ids with its own content."""
    table = attacker_table([[1, 0]])
    gid = f"sw.{victim}.r{victim_round}.g0"
    table = with_column(table, "group_id", pa.array([gid, gid]))
    table = with_column(table, "rollout_id", pa.array([f"{gid}.c0", f"{gid}.c1"]))
    return parquet_bytes(with_column(table, "question", pa.array(["forged", "forged"])))


def dotted_namespace(victim: str, victim_round: int = 0) -> tuple[str, bytes]:
    """(prefix, file) of node ``<victim>.r<round>``, whose namespace ``sw.<victim>.r<round>.``
    would hold the victim's own group ids if node ids could contain dots."""
    node = f"{victim}.r{victim_round}"
    gid = f"sw.{victim}.r{victim_round}.g0"
    table = to_table(round_rows(node, victim_round, [[1, 0]], question="forged"))
    table = with_column(table, "group_id", pa.array([gid, gid]))
    table = with_column(table, "rollout_id", pa.array([f"{gid}.c0", f"{gid}.c1"]))
    return f"swarm_id=sw/node_id={node}/day=2026-03-01", parquet_bytes(table)


def from_the_future(node_round: int = 0) -> pa.Table:
    stamp = datetime(2100, 1, 1, tzinfo=UTC)
    return to_table(round_rows(ATTACKER, node_round, [[1, 0]], published_at=stamp))


def flood(groups: int, node_id: str = ATTACKER) -> pa.Table:
    """Many small informative groups (two completions, rewards 1 and 0)."""
    return to_table(round_rows(node_id, 0, [[1, 0]] * groups))


HONEST_ROUNDS = {"me": [[1, 0]], "good1": [[1, 0], [0, 1]], "good2": [[1, 0, 1]]}
"""The receiver's own round and two honest peers': 9 rows, 7 of them peers'."""


def seed_honest(led: Any) -> Any:
    """Publish ``HONEST_ROUNDS`` unsigned through ``led``; return it."""
    for node, groups in HONEST_ROUNDS.items():
        led.publish(round_rows(node, 0, groups))
    return led


def plant(led: Any, name: str, data: bytes, prefix: str = PREFIX) -> str:
    """Write an object under the attacker's prefix through the store (write-once)."""
    key = f"{prefix}/{name}"
    assert led.store.put_new(key, data)
    return key


def put_raw(led: Any, key: str, data: bytes) -> None:
    """Write ``key`` past the store's key checks, as a peer with bucket access could; where
    readers follow a change log, announce it there too, as a peer that wants it read would."""
    store = led.store
    if isinstance(store, ChangeLogStore):
        _write_raw(store.inner, key, data)
        _write_raw(store.inner, marker_key(key, True, int(time.time() * 1000)), b"")
    else:
        _write_raw(store, key, data)


def _write_raw(store: Any, key: str, data: bytes) -> None:
    if hasattr(store, "root"):  # a local folder
        path = Path(store.root) / key
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    else:
        store.fs.pipe_file(f"{store.bucket}/{store.prefix}/{key}", data)


# -- issue 27: values of the right type but out of any sane range ------------------------

YEAR_10000_US = 253_402_300_800_000_000
"""0001-01-01 + this many microseconds is 10000-01-01: no Python datetime holds it."""
INT64_MAX = 2**63 - 1
"""As microseconds, DuckDB reads it as the timestamp 'infinity'."""


def stamped_at(micros: int) -> bytes:
    """The attacker's round with ``published_at`` = ``micros`` microseconds since 1970."""
    table = attacker_table()
    stamps = pa.array([micros] * table.num_rows, pa.int64()).cast(pa.timestamp("us", tz="UTC"))
    return parquet_bytes(with_column(table, "published_at", stamps))


def endless_round() -> bytes:
    """A group whose ``node_round`` is INT64_MAX (its ids name that round)."""
    table = attacker_table()
    gid = f"sw.{ATTACKER}.r{INT64_MAX}.g0"
    table = with_column(table, "node_round", pa.array([INT64_MAX] * 2, pa.int64()))
    table = with_column(table, "group_id", pa.array([gid, gid]))
    return parquet_bytes(with_column(table, "rollout_id", pa.array([f"{gid}.c0", f"{gid}.c1"])))


def repeated_text(rows: int, chars: int) -> bytes:
    """``rows`` completions of one ``chars``-long string, dictionary-encoded: the footer counts
    the string once (a few KB), decoding materialises it ``rows`` times."""
    table = paired_groups(rows)
    # Built as a dictionary, so that making the file costs no more than reading it should.
    one = pa.DictionaryArray.from_arrays(pa.array([0] * rows, pa.int32()), ["a" * chars])
    table = with_column(table, "completion", one)
    return parquet_bytes(table, compression="zstd", use_dictionary=True, store_schema=False)


def many_row_groups(groups: int, extra_columns: int) -> bytes:
    """One row per row group, ``extra_columns`` flat columns beside the public ones: every
    limit on rows, row groups and schema holds, and the footer is tens of MB."""
    table = attacker_table([[1, 0]] * (groups // 2 or 1))
    for i in range(extra_columns):
        table = table.append_column(f"x{i}", pa.array([i] * table.num_rows, pa.int64()))
    return parquet_bytes(table, row_group_size=1)
