"""A reader's index on its own disk (ledger/reader_index.py): a restarted reader resumes
without examining again what it examined, and still sees every change made meanwhile."""

from __future__ import annotations

import logging

import pytest

from ledger import reader_index as index_file
from ledger.config import RowLimits
from tests.factories import round_rows, signed_swarm


@pytest.fixture
def signed(site):
    """A swarm that requires signatures; node a publishes three rounds, b one."""
    keys = signed_swarm(site)
    writers = {node: site.open(signer=key) for node, key in keys.items()}
    for r in range(3):
        writers["a"].publish(round_rows("a", r, [[1, 0], [0, 1, 1]]))
    writers["b"].publish(round_rows("b", 0, [[1, 1, 0]]))
    return writers


def _index_once(site, path) -> None:
    """A reader that refreshes once and closes, leaving its index at ``path``."""
    reader = site.open(index_path=path)
    reader.refresh()
    reader.close()


def _one_file_and_its_index(site, path):
    writer = site.open()
    writer.publish(round_rows("a", 0, [[1, 0]]))
    _index_once(site, path)
    return writer


def _ok(led) -> list[str]:
    return sorted(k for k, s in led.catalog.files.items() if s.status == "ok")


def test_a_restarted_reader_resumes_without_examining_again(site, signed, tmp_path):
    path = tmp_path / "index" / "reader.duckdb"
    first = site.open(index_path=path)
    drawn = first.sample("x", 3, seed=7, swarm_id="sw")
    files, groups = _ok(first), first.query("SELECT count(*) FROM groups").item()
    first.close()  # saves
    assert path.is_file()

    again = site.open(index_path=path)
    assert _ok(again) == files  # loaded before any listing
    stats = again.refresh()
    assert (stats.added, stats.removed, stats.bad_files) == (0, 0, 0)  # nothing re-examined
    assert again.query("SELECT count(*) FROM groups").item() == groups
    assert again.sample("x", 3, seed=7, swarm_id="sw").equals(drawn)
    assert again.validate().clean
    # Signed files published while it was down are checked with the keys it had read.
    signed["b"].publish(round_rows("b", 1, [[0, 1]]))
    assert again.refresh().added == 1
    assert len(_ok(again)) == len(files) + 1


def test_changes_made_while_a_reader_was_down_are_seen(site, signed, tmp_path):
    path = tmp_path / "reader.duckdb"
    _index_once(site, path)
    signed["a"].publish(round_rows("a", 3, [[1, 1]]))
    report = signed["a"].compact(["a"])  # a's four files become one
    assert report.files_in == 4 and report.files_out == 1
    resumed = site.open(index_path=path)
    resumed.refresh()
    fresh = site.open()
    fresh.refresh()
    assert _ok(resumed) == _ok(fresh)
    count = "SELECT count(*) FROM rollouts"
    assert resumed.query(count).item() == fresh.query(count).item() == 5 * 3 + 2 + 3


def test_an_index_for_other_settings_or_unreadable_is_ignored(local_site, tmp_path, caplog):
    path = tmp_path / "reader.duckdb"
    _one_file_and_its_index(local_site, path)
    strict = local_site.open(index_path=path, limits=RowLimits(max_group_size=4))
    assert not strict.catalog.files  # indexed under other limits: examined afresh
    assert strict.query("SELECT count(*) FROM rollouts").item() == 2
    path.write_bytes(b"not a database" * 100)
    with caplog.at_level(logging.WARNING):
        broken = local_site.open(index_path=path)
    assert not broken.catalog.files and "ignoring the reader index" in caplog.text
    assert broken.query("SELECT count(*) FROM rollouts").item() == 2


def test_a_save_that_fails_keeps_the_previous_index(local_site, tmp_path, monkeypatch, caplog):
    path = tmp_path / "reader.duckdb"
    writer = _one_file_and_its_index(local_site, path)
    before = path.read_bytes()
    reader = local_site.open(index_path=path)
    writer.publish(round_rows("a", 1, [[1, 0]]))
    reader.refresh()

    def crash(*_: object) -> None:
        raise OSError("disk full")  # as a kill or a full disk would leave it

    monkeypatch.setattr(index_file, "_write", crash)
    with caplog.at_level(logging.WARNING):
        reader.close()
    assert "could not save the reader index" in caplog.text
    assert path.read_bytes() == before
    monkeypatch.undo()
    resumed = local_site.open(index_path=path)
    assert len(resumed.catalog.files) == 1
    assert resumed.query("SELECT count(*) FROM rollouts").item() == 4
