"""Readers beside a compactor, and storage that cannot be reached."""

from __future__ import annotations

import threading
import time

import pytest

from ledger import Ledger, StorageError
from ledger.catalog import FileChanged
from tests.factories import round_rows


def _fill(led, nodes=("a", "b"), rounds=6):
    for node in nodes:
        for r in range(rounds):
            led.publish(round_rows(node, r, [[1, 0], [0, 1, 1]]))


def test_readers_running_during_compaction_never_lose_or_duplicate_rows(site):
    writer = site.open()
    _fill(writer)
    expected_rows = writer.query("SELECT count(*) FROM rollouts").item()
    expected_groups = writer.query("SELECT count(*) FROM groups").item()
    seen: list[tuple[int, int, int]] = []
    errors: list[BaseException] = []
    stop = threading.Event()

    def read(reader) -> None:
        rows = reader.query("SELECT count(*), count(DISTINCT rollout_id) FROM rollouts")
        drawn = reader.sample("a", 100, seed=3, swarm_id="sw")
        seen.append((*rows.row(0), drawn.get_column("group_id").n_unique()))

    thread = threading.Thread(target=_until_stopped, args=(stop, errors, site.open, read))
    thread.start()
    deadline = time.monotonic() + 60
    while not seen and not errors and time.monotonic() < deadline:
        time.sleep(0.01)  # the reader has its index before the compactor starts
    report = writer.compact(all_nodes=True)
    after = len(seen)
    while len(seen) < after + 2 and not errors and time.monotonic() < deadline:
        time.sleep(0.01)  # and reads again after it finished
    stop.set()
    thread.join(timeout=60)
    assert not errors, errors
    assert report.files_in == 12 and report.files_out == 2
    assert len(seen) >= 3
    # Every read, before, during and after, saw every row exactly once.
    assert {s[:2] for s in seen} == {(expected_rows, expected_rows)}
    assert {s[2] for s in seen} == {expected_groups // 2}  # b's groups, all mixed


def test_a_reader_whose_files_vanished_lists_again(site):
    writer, reader = site.open(), site.open()
    _fill(writer, nodes=("a",), rounds=3)
    reader.refresh()
    stale = reader.catalog.ok_paths()
    writer.compact(["a"])
    ids = reader.query("SELECT group_id FROM groups ORDER BY 1").get_column("group_id").to_list()
    assert reader.catalog.ok_paths() != stale  # query() re-listed
    assert reader.sample("b", 10, seed=0).get_column("group_id").n_unique() == len(ids)


def test_stale_paths_fail_loudly_rather_than_silently(site):
    writer, reader = site.open(), site.open()
    _fill(writer, nodes=("a",), rounds=3)
    reader.refresh()
    writer.compact(["a"])
    ids = [f"sw.a.r{r}.g0" for r in range(3)]
    if reader.catalog.copies is not None:
        # A reader with local copies (S3) serves what it checked, vanished or not ...
        assert reader.catalog.fetch_groups(ids).get_column("group_id").n_unique() == 3
    else:
        # ... one without forgets the vanished files and says so; the ledger lists again.
        with pytest.raises(FileChanged):
            reader.catalog.fetch_groups(ids)
        assert not reader.catalog.files
    assert reader.sample("b", 3, seed=0).get_column("group_id").n_unique() == 3


def test_a_refresh_that_fails_midway_leaves_no_group_of_a_forgotten_file(site, monkeypatch):
    writer, reader = site.open(), site.open()
    (gone,) = writer.publish(round_rows("a", 0, [[1, 0]]))
    reader.refresh()
    writer.store.delete([gone])
    writer.publish(round_rows("a", 1, [[1, 0]]))

    def fail(batch):
        raise StorageError("connection reset while reading the new file")

    monkeypatch.setattr(reader.catalog, "_ingest", fail)
    with pytest.raises(StorageError):
        reader.catalog.refresh()
    assert reader.catalog.con.execute("SELECT count(*) FROM groups").fetchone() == (0,)
    monkeypatch.undo()
    drawn = reader.sample("b", 10, seed=0)
    assert drawn.get_column("group_id").unique().to_list() == ["sw.a.r1.g0"]
    assert reader.validate().clean


def test_unreachable_storage_is_a_clear_error_and_loses_nothing(s3_server):
    dead = {
        "key": "k",
        "secret": "s",
        "endpoint_url": "http://127.0.0.1:9",
        "config_kwargs": {"retries": {"max_attempts": 1}},
    }
    led = Ledger("s3://nowhere/ledger", dead)
    rows = round_rows("n1", 0, [[1, 0]])
    with pytest.raises(StorageError, match="s3://nowhere/ledger"):
        led.publish(rows)
    with pytest.raises(StorageError):
        led.query("SELECT count(*) FROM rollouts")
    # The caller still holds its rows: publishing them once storage is back just works.
    bucket = s3_server.new_bucket()
    alive = Ledger(f"s3://{bucket}/ledger", s3_server.storage_options)
    assert len(alive.publish(rows)) == 1
    assert alive.query("SELECT count(*) FROM rollouts").item() == 2


def test_a_node_compacting_as_it_publishes_keeps_few_files_and_readers_whole(site):
    writer = site.open()
    seen: list[tuple[int, int]] = []
    errors: list[BaseException] = []
    stop = threading.Event()
    count_sql = "SELECT count(*), count(DISTINCT rollout_id) FROM rollouts"
    thread = threading.Thread(
        target=_until_stopped,
        args=(stop, errors, site.open, lambda r: seen.append(r.query(count_sql).row(0))),
    )
    thread.start()
    most_files = 0
    try:
        for r in range(20):
            writer.publish(round_rows("a", r, [[1, 0], [0, 1, 1]]))
            writer.compact_own("sw", "a", at_files=6)
            files = [o.key for o in writer.store.list("swarm_id=sw/node_id=a/")]
            most_files = max(most_files, sum(k.endswith(".parquet") for k in files))
    finally:
        stop.set()
        thread.join(timeout=60)
    assert not errors, errors
    assert most_files <= 6  # merged each time the partition reached six files
    assert writer.query("SELECT count(*) FROM rollouts").item() == 20 * 5
    # Every read saw each row once, and never fewer rows than the read before.
    assert all(total == distinct for total, distinct in seen)
    totals = [total for total, _ in seen]
    assert totals == sorted(totals) and len(totals) >= 2


def _until_stopped(stop, errors, open_reader, read) -> None:
    """Read with a reader of its own until ``stop``; keep what went wrong in ``errors``."""
    reader = open_reader()
    try:
        while not stop.is_set():
            read(reader)
    except BaseException as exc:
        errors.append(exc)
