"""The ledger's contract, run alike on a local directory and on S3 over HTTP."""

from __future__ import annotations

from pathlib import Path

import duckdb
import polars as pl
import pyarrow.parquet as pq
import pytest

from ledger import COLUMN_NAMES, RecordError
from ledger.duck import httpfs_extension_path
from tests.factories import round_rows


def plain_duckdb(site) -> duckdb.DuckDBPyConnection:
    """A DuckDB session set up by hand, as a user would, with no project code."""
    con = duckdb.connect()
    if site.kind == "s3":
        opts = site.storage_options
        con.execute(f"LOAD '{httpfs_extension_path()}'")
        host = opts["endpoint_url"].removeprefix("http://")
        con.execute(
            f"CREATE SECRET (TYPE s3, KEY_ID '{opts['key']}', SECRET '{opts['secret']}', "
            f"REGION 'us-east-1', ENDPOINT '{host}', URL_STYLE 'path', USE_SSL false)"
        )
    return con


def object_bytes(led, keys):
    return {k: led.store.read(k) for k in keys}


def test_publish_writes_once_under_the_node_prefix_and_retries_are_noops(site):
    led = site.open()
    rows = round_rows("n1", 0, [[1, 0], [0, 0, 1]])
    keys = led.publish(rows)
    assert len(keys) == 1 and keys[0].startswith("swarm_id=sw/node_id=n1/day=2026-03-01/r00000000-")
    before = object_bytes(led, keys)
    assert led.publish(list(reversed(rows))) == keys  # a retry, rows in another order
    assert led.publish(pl.DataFrame(rows)) == keys
    assert [o.key for o in led.store.list()] == keys
    assert object_bytes(led, keys) == before
    table = pq.read_table(__import__("io").BytesIO(before[keys[0]]))
    assert table.num_rows == 5 and table.schema.names == list(COLUMN_NAMES)


def test_plain_duckdb_reads_the_ledger_with_the_public_columns(site):
    led = site.open()
    led.publish(round_rows("n1", 0, [[1, 0], [0, 1]]))
    led.publish(round_rows("n2", 3, [[1, 1, 0]]))
    con = plain_duckdb(site)
    root = site.url if site.kind == "s3" else Path(site.url).as_posix()
    rel = con.sql(
        f"SELECT * FROM read_parquet('{root}/**/*.parquet', hive_partitioning=true, "
        "union_by_name=true)"
    )
    assert set(COLUMN_NAMES) <= set(rel.columns)
    counts = con.sql(
        f"SELECT node_id, count(*), sum(reward) FROM read_parquet('{root}/**/*.parquet', "
        "hive_partitioning=true, union_by_name=true) GROUP BY 1 ORDER BY 1"
    ).fetchall()
    assert counts == [("n1", 4, 2.0), ("n2", 3, 2.0)]


def test_views_and_query(site):
    led = site.open()
    led.publish(round_rows("n1", 0, [[1, 0], [0, 0]]))
    led.publish(round_rows("n2", 0, [[1, 1, 1]]))
    frame = led.query("SELECT node_id, count(*) AS n FROM rollouts GROUP BY 1 ORDER BY 1")
    assert isinstance(frame, pl.DataFrame)
    assert frame.rows() == [("n1", 4), ("n2", 3)]
    groups = led.query(
        "SELECT group_id, size, reward_mean, reward_min, reward_max FROM groups ORDER BY 1"
    )
    assert groups.rows() == [
        ("sw.n1.r0.g0", 2, 0.5, 0.0, 1.0),
        ("sw.n1.r0.g1", 2, 0.0, 0.0, 0.0),
        ("sw.n2.r0.g0", 3, 1.0, 1.0, 1.0),
    ]
    assert led.query("SELECT count(*) FROM ledger_files WHERE status = 'ok'").item() == 2


def test_a_reader_sees_what_another_writer_publishes_later(site):
    writer, reader = site.open(), site.open()
    writer.publish(round_rows("n1", 0, [[1, 0]]))
    assert reader.query("SELECT count(*) FROM rollouts").item() == 2
    writer.publish(round_rows("n1", 1, [[1, 0, 1]]))
    assert reader.query("SELECT count(*) FROM rollouts").item() == 5
    stats = reader.refresh()
    assert (stats.added, stats.removed) == (0, 0)


def test_sampling_returns_whole_peer_groups_and_replays(site):
    a, b = site.open(), site.open()
    a.publish(round_rows("me", 0, [[1, 0], [0, 1]]))
    b.publish(round_rows("p1", 0, [[1, 0, 0], [0, 0, 0], [1, 1, 0]]))
    b.publish(round_rows("p2", 0, [[0, 1], [1, 0]]))
    drawn = a.sample("me", 3, seed=5, swarm_id="sw")
    assert drawn.columns == list(COLUMN_NAMES)
    assert set(drawn.get_column("node_id")) <= {"p1", "p2"}
    per_group = dict(drawn.group_by("group_id").len().iter_rows())
    assert len(per_group) == 3 and "sw.p1.r0.g1" not in per_group  # rewards all agree
    expected_sizes = {"sw.p1.r0.g0": 3, "sw.p1.r0.g2": 3, "sw.p2.r0.g0": 2, "sw.p2.r0.g1": 2}
    assert all(expected_sizes[g] == n for g, n in per_group.items())
    assert b.sample("me", 3, seed=5, swarm_id="sw").equals(drawn)


def test_own_invalid_rows_are_refused_and_nothing_is_written(site):
    led = site.open()
    rows = round_rows("n1", 0, [[1, 0]])
    rows[1]["reward"] = 3.0
    with pytest.raises(RecordError, match="1 invalid_reward"):
        led.publish(rows)
    dup = round_rows("n1", 0, [[1, 0]])
    with pytest.raises(RecordError, match="duplicate_id"):
        led.publish(dup + dup[:1])
    mixed = round_rows("n1", 0, [[1]]) + round_rows("n2", 0, [[1]])
    with pytest.raises(RecordError, match="one node_id"):
        led.publish(mixed)
    assert led.store.list() == []


def test_compaction_merges_without_losing_or_duplicating_rows(site):
    led = site.open()
    for r in range(5):
        led.publish(round_rows("n1", r, [[1, 0], [0, 1, 1]]))
        led.publish(round_rows("n2", r, [[1, 0, 0]]))
    before = led.query("SELECT * FROM rollouts ORDER BY rollout_id")
    report = led.compact(["n1"], before=None)
    assert report.files_in == 5 and report.files_out == 1 and report.rows == 25
    keys = [o.key for o in led.store.list()]
    assert sum("node_id=n1/" in k for k in keys) == 1
    assert sum("node_id=n2/" in k for k in keys) == 5  # not ours: untouched
    assert site.open().query("SELECT * FROM rollouts ORDER BY rollout_id").equals(before)
    led.compact(all_nodes=True)  # default cutoff: today; these rows are from March
    assert len(led.store.list()) == 2
    fresh = site.open()
    assert fresh.query("SELECT * FROM rollouts ORDER BY rollout_id").equals(before)
    assert fresh.query("SELECT count(*) FROM groups").item() == 15


def test_compaction_leaves_today_alone_by_default(site):
    led = site.open()
    for r in range(3):  # stamped now by publish
        led.publish([{**row, "published_at": None} for row in round_rows("n1", r, [[1, 0]])])
    assert led.compact(["n1"]).files_in == 0
    with pytest.raises(ValueError, match="name the nodes"):
        led.compact()


def test_a_ledger_opens_from_a_path_as_users_first_write_it(tmp_path) -> None:
    """Issue 47: `Ledger("sapo-work/ledger")`, the natural call (and the API before the last
    release), failed with "'str' object has no attribute 'url'"."""
    from ledger import Ledger, LedgerConfig
    from tests.factories import round_rows

    root = tmp_path / "ledger"
    with Ledger.open(str(root)) as led:
        led.publish(round_rows("a", 0, [[1, 0]]))
    for given in (str(root), root, LedgerConfig(url=str(root))):
        with Ledger(given) as led:
            assert led.query("SELECT count(*) AS n FROM rollouts").item() == 2
    with pytest.raises(TypeError, match=r"not dict; with storage options: Ledger\.open"):
        Ledger({"url": str(root)})  # type: ignore[arg-type]
