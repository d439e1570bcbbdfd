"""Verified local copies (ledger/copies.py): on S3 a new file costs one GET, sampling reads
no store, what is served is exactly what was checked, and copies outlive a restart with the
reader index."""

from __future__ import annotations

from pathlib import Path

import pytest

from ledger import Ledger
from tests.factories import round_rows, signed_swarm
from tests.hostile import _write_raw, put_raw


def _publish(led, nodes, rounds) -> None:
    for node in nodes:
        for r in rounds:
            led.publish(round_rows(node, r, [[1, 0], [0, 1, 1]]))


def _requests(led, call) -> dict[str, int]:
    before = dict(led.store.requests)
    call()
    return {k: n - before.get(k, 0) for k, n in led.store.requests.items() if n - before.get(k, 0)}


def _copies(led) -> list[Path]:
    return sorted(p for p in led.catalog.copies.folder.rglob("*.parquet"))


@pytest.mark.s3
def test_on_s3_a_new_file_costs_one_get_and_sampling_reads_no_store(s3_site):
    writer, reader = s3_site.open(), s3_site.open()
    assert reader.catalog.copies is not None  # the default on S3
    _publish(writer, ("a", "b"), range(2))
    reader.refresh()
    _publish(writer, ("a", "b", "c"), [5])
    spent = _requests(reader, reader.refresh)
    # One page of markers and a GET per new object, which confirms what its marker says.
    assert spent == {"list": 1, "get": 3}
    assert len(_copies(reader)) == 7
    drawn = _requests(reader, lambda: reader.sample("z", 6, seed=1))
    assert drawn == {"list": 1}  # the poll; rows come from the copies
    frame = reader.sample("z", 6, seed=1)
    assert frame.get_column("group_id").n_unique() == 6
    # The same rows a reader that lets DuckDB read S3 serves.
    direct = s3_site.open(local_copies="off")
    assert direct.catalog.copies is None
    assert direct.sample("z", 6, seed=1).equals(frame)
    assert reader.query("SELECT count(*) FROM rollouts").item() == 7 * 5


@pytest.mark.s3
def test_what_is_served_is_what_was_checked_when_a_peer_overwrites(s3_site, tmp_path):
    writer, reader = s3_site.open(), s3_site.open()
    writer.publish(round_rows("a", 0, [[1, 0]]))
    reader.refresh()
    (key,) = reader.catalog.files
    version = reader.catalog.files[key].version
    before = reader.sample("z", 1, seed=0)
    # Other rows of the same node, as the peer could write them.
    scratch = Ledger.open(str(tmp_path / "scratch"))
    scratch.publish(round_rows("a", 1, [[0, 1, 1]]))
    scratch.refresh()
    (other,) = scratch.catalog.files
    forged = scratch.store.read(other)
    # Overwritten in place without a word: the reader serves the bytes it checked.
    _write_raw(reader.store.inner, key, forged)
    assert reader.sample("z", 1, seed=0).equals(before)
    # Announced (a new marker): the new version is examined afresh and served.
    put_raw(reader, key, forged)
    stats = reader.refresh()
    assert (stats.removed, stats.added) == (1, 1)
    assert reader.catalog.files[key].version != version
    assert reader.sample("z", 1, seed=0).height == 3


def test_copies_outlive_a_restart_with_the_reader_index(local_site, tmp_path):
    writer = local_site.open()
    _publish(writer, ("a", "b"), range(3))
    index = tmp_path / "index" / "reader.duckdb"
    first = local_site.open(index_path=index, local_copies="on")
    drawn = first.sample("z", 4, seed=3)
    copies = _copies(first)
    assert len(copies) == 6 and all(p.is_relative_to(index.with_suffix(".copies")) for p in copies)
    first.close()
    assert all(p.is_file() for p in copies)  # kept with the index

    again = local_site.open(index_path=index, local_copies="on")
    assert again.refresh().added == 0  # nothing read again
    assert again.sample("z", 4, seed=3).equals(drawn)
    again.close()
    # A copy lost while the reader was down: that file alone is examined again.
    copies[0].unlink()
    third = local_site.open(index_path=index, local_copies="on")
    assert third.refresh().added == 1
    assert third.sample("z", 4, seed=3).equals(drawn)
    assert len(_copies(third)) == 6
    third.close()


def test_a_reader_without_an_index_keeps_copies_until_it_closes(local_site):
    writer = local_site.open()
    _publish(writer, ("a",), range(2))
    reader = local_site.open(local_copies="on")
    reader.refresh()
    folder = reader.catalog.copies.folder
    assert len(_copies(reader)) == 2
    # Compaction replaces the inputs: their copies go with them.
    writer.compact(all_nodes=True)
    reader.refresh()
    assert len(_copies(reader)) == 1
    reader.close()
    assert not folder.exists()


def test_a_file_that_fails_its_checks_is_not_kept(local_site):
    keys = signed_swarm(local_site)
    local_site.open(signer=keys["a"]).publish(round_rows("a", 0, [[1, 0]]))
    reader = local_site.open(local_copies="on")
    reader.refresh()
    (key,) = reader.catalog.files
    # a's bytes again under another of a's names: no signature for it, read once, refused,
    # and not kept on disk.
    put_raw(reader, key.replace("r00000000-", "r00000007-"), reader.store.read(key))
    reader.refresh()
    statuses = sorted(s.status for s in reader.catalog.files.values())
    assert statuses == ["ok", "unsigned"]
    assert len(_copies(reader)) == 1
