"""Nothing a peer writes can crash a reader: every kind of bad object, on disk and on S3."""

from __future__ import annotations

import io
import logging

import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from ledger import RowLimits
from ledger import validation as v
from ledger.records import to_table
from ledger.schema import arrow_schema
from tests import hostile
from tests.factories import round_rows

PEER = "swarm_id=sw/node_id=evil/day=2026-03-01"
CLAIM = {"token_ids": [7, 8, 9, 10, 11], "token_logprobs": [-0.5] * 5, "tokenizer": "0f" * 8}
"""A well-formed claim for factories' rows (completion_tokens 5)."""


def parquet_bytes(table: pa.Table) -> bytes:
    buf = io.BytesIO()
    pq.write_table(table, buf)
    return buf.getvalue()


def evil_table(groups=((1, 0),), **overrides) -> pa.Table:
    return to_table(round_rows("evil", 0, [list(g) for g in groups], **overrides))


@pytest.fixture
def honest(site):
    """A ledger with good data from two honest peers, plus the receiver's own."""
    return hostile.seed_honest(site.open())


plant = hostile.plant


def assert_still_serves_the_honest_data(led):
    assert led.query("SELECT count(*) FROM rollouts WHERE node_id <> 'evil'").item() == 9
    drawn = set(led.sample("me", 10, seed=1, swarm_id="sw").get_column("node_id"))
    assert {"good1", "good2"} <= drawn and "me" not in drawn


def reopen_and_validate(site, **kw):
    led = site.open(**kw)
    return led, led.validate()


@pytest.mark.parametrize(
    ("name", "payload", "status"),
    [
        ("r1-random.parquet", b"\x00garbage, not parquet at all" * 10, v.CORRUPT),
        ("r2-empty.parquet", b"", v.CORRUPT),
        ("r3-truncated.parquet", None, v.CORRUPT),
        ("r4-missing-column.parquet", "missing", v.SCHEMA_MISMATCH),
        ("r5-wrong-type.parquet", "wrongtype", v.SCHEMA_MISMATCH),
        ("r6-ids-as-text.parquet", "idstext", v.SCHEMA_MISMATCH),
        ("r7-ids-nested.parquet", "idsnested", v.SCHEMA_MISMATCH),
    ],
)
def test_unreadable_files_are_skipped_whole(site, honest, caplog, name, payload, status):
    good = parquet_bytes(evil_table())
    if payload is None:
        payload = good[: len(good) // 2]
    elif payload == "missing":
        payload = parquet_bytes(evil_table().drop_columns(["completion"]))
    elif payload == "wrongtype":
        table = evil_table()
        i = table.schema.get_field_index("reward")
        payload = parquet_bytes(table.set_column(i, "reward", pa.array(["lots", "more"])))
    elif payload == "idstext":  # a list of strings where the claim's ids are numbers
        column = pa.array([["7"], ["8"]], pa.list_(pa.string()))
        payload = parquet_bytes(hostile.with_column(evil_table(), "token_ids", column))
    elif payload == "idsnested":  # lists of lists
        column = pa.array([[[7]], [[8]]], pa.list_(pa.list_(pa.int32())))
        payload = parquet_bytes(hostile.with_column(evil_table(), "token_ids", column))
    key = plant(honest, name, payload)
    with caplog.at_level(logging.WARNING, logger="ledger"):
        assert_still_serves_the_honest_data(honest)
    assert f"skipping {key}: {status}" in caplog.text
    led, report = reopen_and_validate(site)
    assert report.skipped == {status: 1}
    assert [(k, s) for k, s, _ in report.bad_files] == [(key, status)]
    assert_still_serves_the_honest_data(led)


def test_a_bad_file_among_many_new_ones_spoils_nothing(site, honest):
    plant(honest, "r0-corrupt.parquet", b"PAR1 not really")
    plant(honest, "r9-fine.parquet", parquet_bytes(evil_table()))
    fresh = site.open()  # meets all files in one batch
    assert fresh.query("SELECT count(*) FROM rollouts").item() == 11
    assert fresh.validate().skipped == {v.CORRUPT: 1}


@pytest.mark.parametrize(
    ("overrides", "reason", "skipped_rows"),
    [
        ({"question": None}, v.MISSING_FIELD, 2),
        ({"completion": "x" * 500}, v.OVERSIZED_TEXT, 2),
        ({"reward": float("nan")}, v.INVALID_REWARD, 2),
        ({"reward": 7.0}, v.INVALID_REWARD, 2),
        ({"completion_tokens": -4}, v.INVALID_VALUE, 2),
        ({"rollout_id": "r" * 300}, v.INVALID_ID, 2),
        # the generator's claim (schema 2): malformed as no honest writer makes it
        ({"token_ids": [1] * 5}, v.INVALID_CLAIM, 2),  # ids without log-probs
        ({**CLAIM, "tokenizer": None}, v.INVALID_CLAIM, 2),
        ({**CLAIM, "tokenizer": "not hex digits!"}, v.INVALID_CLAIM, 2),
        ({**CLAIM, "token_ids": [1] * 4}, v.INVALID_CLAIM, 2),  # completion_tokens is 5
        ({**CLAIM, "token_logprobs": [-1.0] * 6}, v.INVALID_CLAIM, 2),
        ({**CLAIM, "token_ids": [1, 2, -3, 4, 5]}, v.INVALID_CLAIM, 2),
        ({**CLAIM, "token_ids": [1, 2, None, 4, 5]}, v.INVALID_CLAIM, 2),
        ({**CLAIM, "token_logprobs": [-1.0, 0.5, -1.0, -1.0, -1.0]}, v.INVALID_CLAIM, 2),
        ({**CLAIM, "token_logprobs": [-1.0, float("nan"), -1.0, -1.0, -1.0]}, v.INVALID_CLAIM, 2),
        ({**CLAIM, "token_logprobs": [-float("inf")] * 5}, v.INVALID_CLAIM, 2),
        ({**CLAIM, "token_logprobs": [-1.0, None, -1.0, -1.0, -1.0]}, v.INVALID_CLAIM, 2),
    ],
)
def test_bad_rows_are_skipped_with_their_reason(site, honest, overrides, reason, skipped_rows):
    bad = round_rows("evil", 0, [[1, 0]], **overrides)
    good = round_rows("evil", 0, [[1, 0]])
    for row in good:  # a second, valid group in the same file
        row["group_id"] += "x"
        row["rollout_id"] += "x"
        row["task_index"] = 99
    plant(
        honest,
        "r0-rows.parquet",
        parquet_bytes(
            pa.Table.from_pylist(
                [{**r, "schema_version": 1} for r in bad + good], schema=evil_table().schema
            )
        ),
    )
    led, report = reopen_and_validate(site, limits=RowLimits(max_completion_chars=400))
    assert report.skipped == {reason: skipped_rows}
    assert led.query("SELECT count(*) FROM rollouts WHERE node_id = 'evil'").item() == 2
    assert_still_serves_the_honest_data(led)


def test_a_well_formed_claim_is_served_as_written_and_a_file_of_schema_1_reads_as_before(
    site, honest
):
    logprobs = [-0.5, -100.0, 0.0, -0.125, -7.25]  # float32 exactly
    claimed = round_rows("evil", 0, [[1, 0]], **{**CLAIM, "token_logprobs": logprobs})
    plant(honest, "r0-claims.parquet", parquet_bytes(to_table(claimed)))
    old = pa.Table.from_pylist(
        [{**r, "schema_version": 1} for r in round_rows("evil", 1, [[1, 0]])],
        schema=arrow_schema(1),
    )
    assert "token_ids" not in old.column_names
    plant(honest, "r1-schema-1.parquet", parquet_bytes(old))
    led, report = reopen_and_validate(site)
    assert report.skipped == {}
    rows = led.query(
        "SELECT node_round, token_ids, token_logprobs, tokenizer, schema_version FROM rollouts "
        "WHERE node_id = 'evil' ORDER BY node_round, rollout_id"
    ).rows()
    assert rows[0] == (0, [7, 8, 9, 10, 11], [-0.5, -100.0, 0.0, -0.125, -7.25], "0f" * 8, 2)
    assert rows[2][1:] == (None, None, None, 1)
    # both are drawn, and a schema-1 row arrives with no claim (its text is trained)
    drawn = led.sample("me", 10, seed=1, swarm_id="sw").filter(pl.col("node_id") == "evil")
    assert sorted(set(drawn["node_round"])) == [0, 1]
    from sapo_core.rollouts import RECORD_FIELDS, from_records

    got, dropped = from_records(drawn.select(RECORD_FIELDS).to_dicts())
    assert dropped == 0
    by_round = {r.node_round: r for r in got}
    assert by_round[0].token_ids == (7, 8, 9, 10, 11) and by_round[0].tokenizer == "0f" * 8
    assert by_round[0].claimed_logprobs == (-0.5, -100.0, 0.0, -0.125, -7.25)
    assert by_round[1].token_ids is None and by_round[1].claimed_logprobs is None
    assert_still_serves_the_honest_data(led)


def test_duplicated_ids_within_and_across_files_count_once(site, honest):
    table = evil_table()
    plant(honest, "r0-dup.parquet", parquet_bytes(pa.concat_tables([table, table.slice(0, 1)])))
    plant(honest, "r1-again.parquet", parquet_bytes(table))  # the same group republished
    led, report = reopen_and_validate(site)
    assert report.skipped == {v.DUPLICATE_ID: 1, v.DUPLICATE_GROUP: 2}
    assert led.query("SELECT count(*) FROM rollouts WHERE node_id = 'evil'").item() == 2
    assert led.query("SELECT size FROM groups WHERE node_id = 'evil'").rows() == [(2,)]
    drawn = led.sample("me", 10, seed=0, swarm_id="sw")
    assert drawn.filter(drawn.get_column("node_id") == "evil").height == 2
    assert_still_serves_the_honest_data(led)


def test_groups_that_disagree_or_overflow_are_not_served(site, honest):
    rows = round_rows("evil", 0, [[1, 0, 1]])
    rows[2]["question"] = "a question swapped in"
    big = round_rows("evil", 1, [[1, 0] * 5])
    plant(honest, "r0-groups.parquet", parquet_bytes(to_table(rows + big)))
    led, report = reopen_and_validate(site, limits=RowLimits(max_group_size=8))
    assert report.skipped == {v.INCONSISTENT_GROUP: 3, v.OVERSIZED_GROUP: 10}
    assert led.query("SELECT count(*) FROM groups WHERE node_id = 'evil'").item() == 0
    assert_still_serves_the_honest_data(led)


def test_misplaced_and_oversized_objects_are_skipped(site, honest):
    plant(honest, "stray.parquet", parquet_bytes(evil_table()), prefix="elsewhere")
    plant(honest, "r0-big.parquet", parquet_bytes(evil_table(groups=[(1, 0)] * 300)))
    led, report = reopen_and_validate(site, limits=RowLimits(max_file_bytes=8192))
    assert report.skipped == {v.MISPLACED: 1, v.OVERSIZED_FILE: 1}
    assert_still_serves_the_honest_data(led)


def test_a_peer_cannot_claim_another_nodes_identity_inside_its_file(site, honest):
    # Says node good1 and uses good1's ids, sits under evil/: the path names the publisher,
    # and ids outside the publisher's namespace <swarm>.<node>. are refused.
    spoof = to_table(round_rows("good1", 5, [[1, 0]]))
    plant(honest, "r5-spoof.parquet", parquet_bytes(spoof))
    relabelled = to_table(round_rows("evil", 6, [[1, 0]]))
    relabelled = relabelled.set_column(
        relabelled.schema.get_field_index("node_id"), "node_id", pa.array(["good1"] * 2)
    )
    plant(honest, "r6-relabelled.parquet", parquet_bytes(relabelled))
    led = site.open()
    owners = led.query("SELECT node_id, node_round FROM rollouts WHERE node_round >= 5").rows()
    assert owners == [("evil", 6), ("evil", 6)]
    assert led.validate().skipped[v.FOREIGN_ID] == 2
    # so "me" cannot be fooled into treating it as its own, nor good1 into skipping it.
    assert "evil" in set(led.sample("good1", 10, seed=0).get_column("node_id"))


def test_a_garbage_sample_log_is_skipped(site, honest):
    drawn = honest.sample("me", 2, seed=0, swarm_id="sw")
    honest.write_sample("sw", "me", 0, drawn, policy="paper", seed=0)
    plant(honest, "s00000001-junk.jsonl", b"{{{ not json\n\x00\xff", prefix="_samples/" + PEER)
    led = site.open()
    assert led.query("SELECT count(*) FROM samples").item() == 2
    assert_still_serves_the_honest_data(led)


def test_leftovers_of_a_killed_local_writer_are_invisible(local_site):
    led = local_site.open()
    led.publish(round_rows("n1", 0, [[1, 0]]))
    part = led.store.root / PEER
    part.mkdir(parents=True)
    # What a writer killed before its atomic link leaves behind: a hidden temporary file.
    (part / ".r00000000-abc.parquet.1234.tmp").write_bytes(parquet_bytes(evil_table())[:100])
    assert [o.key for o in led.store.list()] == [o.key for o in led.store.list() if "n1" in o.key]
    assert led.validate().clean
