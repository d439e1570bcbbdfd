"""Readers beside a compactor, and storage that cannot be reached."""

from __future__ import annotations

import queue
import threading
import time
from collections import Counter
from typing import Any

import pytest

from ledger import Ledger, StorageError
from ledger.catalog import FileChanged
from ledger.storage import open_store
from tests.factories import open_ledger, round_rows

HOLD_TIMEOUT_S = 30.0
"""Longest either side of a held compaction waits for the other: a bug fails, never hangs."""
WHOLE = (60, 60, 24, 24, 30, 30, 12)
"""What ``_whole_read`` sees of ``_fill``'s ledger: 60 rows (60 ids), 24 groups (24 ids), and
in a sample for node a of every peer group: b's 12 groups, 30 rows (30 ids)."""
FILES_AT = {"merged written": 7, "half the inputs deleted": 4, "inputs deleted": 1}
"""Parquet files in the partition being merged (six inputs) at each point, as the store has
them: what shows that a hold is where its name says."""


def _fill(led, nodes=("a", "b"), rounds=6):
    for node in nodes:
        for r in range(rounds):
            led.publish(round_rows(node, r, [[1, 0], [0, 1, 1]]))


def _whole_read(reader) -> tuple[int, ...]:
    """Everything a reader serves: rows and distinct rollout ids, groups and distinct group
    ids, and the rows, distinct ids and groups of a sample for node a of all b's groups."""
    counts = reader.query(
        """SELECT * FROM
            (SELECT count(*), count(DISTINCT rollout_id) FROM rollouts),
            (SELECT count(*), count(DISTINCT group_id) FROM groups)"""
    ).row(0)
    drawn = reader.sample("a", 100, seed=3, swarm_id="sw")
    return (*counts, drawn.height, drawn["rollout_id"].n_unique(), drawn["group_id"].n_unique())


class _Gate:
    """Holds the compactor's thread at named points, each until the test lets it go on."""

    def __init__(self) -> None:
        self.stops: queue.Queue[tuple[str, str, threading.Event] | None] = queue.Queue()
        self.opened = threading.Event()

    def hold(self, point: str, key: str) -> None:
        """In the compactor's thread: wait at ``point`` (reached writing or deleting
        ``key``) until released, or the gate opened; TimeoutError past HOLD_TIMEOUT_S."""
        go = threading.Event()
        self.stops.put((point, key, go))
        deadline = time.monotonic() + HOLD_TIMEOUT_S
        while not go.wait(0.05):
            if self.opened.is_set():
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"compaction held at {point!r} for {HOLD_TIMEOUT_S} s")

    def next_stop(self) -> tuple[str, str, threading.Event] | None:
        """The next point the compactor holds at; None once it finished."""
        try:
            return self.stops.get(timeout=HOLD_TIMEOUT_S)
        except queue.Empty:
            message = f"the compactor neither held nor ended in {HOLD_TIMEOUT_S} s"
            raise AssertionError(message) from None

    def open(self) -> None:
        """Let the compactor run to its end, wherever it is held."""
        self.opened.set()
        while True:
            try:
                stop = self.stops.get_nowait()
            except queue.Empty:
                return
            if stop is not None:
                stop[2].set()


def _hold_compaction(monkeypatch, store, gate: _Gate, inputs: set[str]) -> list[str]:
    """Make the compactor's ``store`` hold at each dangerous point of the merge of
    ``inputs`` (one partition's files), the real writes and deletes done: the merged file
    written, half the inputs deleted, all deleted. Behind a change log (S3) also once the
    store's objects changed but the markers that announce it are not yet written
    (", unmarked"), and once they are (", marked"). The points, in the order reached."""
    partition = min(inputs).rsplit("/", 1)[0]

    def is_merged(key: str) -> bool:
        return key.rsplit("/", 1)[0] == partition and key not in inputs

    def holding(target, marks: str, halves: bool) -> None:
        put_new, delete = target.put_new, target.delete

        def held_put_new(key: str, data: bytes) -> bool:
            fresh = put_new(key, data)
            if is_merged(key):
                gate.hold("merged written" + marks, key)
            return fresh

        def held_delete(keys) -> None:
            keys = list(keys)
            if not keys or not set(keys) <= inputs:  # signatures, markers, other partitions
                delete(keys)
                return
            if halves:
                delete(keys[: len(keys) // 2])
                gate.hold("half the inputs deleted" + marks, keys[0])
                keys = keys[len(keys) // 2 :]
            delete(keys)
            gate.hold("inputs deleted" + marks, keys[0])

        monkeypatch.setattr(target, "put_new", held_put_new)
        monkeypatch.setattr(target, "delete", held_delete)

    inner = getattr(store, "inner", None)
    if inner is None:
        holding(store, "", halves=True)
        return list(FILES_AT)
    holding(inner, ", unmarked", halves=True)  # the data
    holding(store, ", marked", halves=False)  # the data and its markers
    return [
        "merged written, unmarked",
        "merged written, marked",
        "half the inputs deleted, unmarked",
        "inputs deleted, unmarked",
        "inputs deleted, marked",
    ]


def _compact(writer, gate: _Gate, outcome: dict[str, Any]) -> None:
    try:
        outcome["report"] = writer.compact(all_nodes=True)
    except BaseException as exc:
        outcome["error"] = exc
    finally:
        gate.stops.put(None)


def test_readers_running_during_compaction_never_lose_or_duplicate_rows(site, monkeypatch):
    """The compaction merges node a's partition, then b's; it is held at each dangerous
    point of b's merge (a's merged already), and while it is held three readers read
    everything: one indexed before the compaction began that reads there first, one
    indexed before that reads at every point, and one opened there."""
    writer = site.open()
    _fill(writer)
    assert _whole_read(writer) == WHOLE
    inputs = {o.key for o in writer.store.list("swarm_id=sw/node_id=b/")}
    assert len(inputs) == 6 and all(k.endswith(".parquet") for k in inputs)
    gate = _Gate()
    plan = _hold_compaction(monkeypatch, writer.store, gate, inputs)
    raw = open_store(site.url, site.storage_options or None)  # what the store holds
    partition = min(inputs).rsplit("/", 1)[0] + "/"
    opened: list[Ledger] = []

    def indexed() -> Ledger:
        reader = site.open()
        opened.append(reader)
        reader.refresh()
        return reader

    outcome: dict[str, Any] = {}
    compactor = threading.Thread(target=_compact, args=(writer, gate, outcome), daemon=True)
    held: list[tuple[str, int]] = []  # (point, parquet files in b's partition there)
    reads: list[tuple[str, str, tuple[int, ...]]] = []  # (point, reader, what it saw)
    try:
        steady, late = indexed(), indexed()  # late reads only once the compaction ended
        first = [indexed() for _ in plan]  # one for each point, read there first
        compactor.start()
        while (stop := gate.next_stop()) is not None:
            point, _, go = stop
            if len(held) == len(plan):
                pytest.fail(f"compaction held at {point!r}, past the plan {plan}")
            held.append((point, sum(o.key.endswith(".parquet") for o in raw.list(partition))))
            with site.open() as fresh:
                for name, reader in (
                    ("first", first[len(held) - 1]),
                    ("steady", steady),
                    ("fresh", fresh),
                ):
                    reads.append((point, name, _whole_read(reader)))
            go.set()
        compactor.join(HOLD_TIMEOUT_S)
        assert not compactor.is_alive(), "the compaction did not finish"
        with site.open() as fresh:
            readers = {"steady": steady, "late": late, "fresh": fresh, "writer": writer}
            after = {name: _whole_read(reader) for name, reader in readers.items()}
    finally:
        gate.open()
        if compactor.ident is not None:
            compactor.join(HOLD_TIMEOUT_S)
        for reader in opened:
            reader.close()
    assert "error" not in outcome, outcome
    report = outcome["report"]
    assert (report.jobs, report.files_in, report.files_out) == (2, 12, 2)
    # The compaction was held at every point, each where its name says ...
    assert [point for point, _ in held] == plan
    assert all(files == FILES_AT[point.split(",")[0]] for point, files in held), held
    # ... every reader read there while it was held ...
    assert Counter(point for point, _, _ in reads) == dict.fromkeys(plan, 3)
    # ... and every read, during and after, saw every row and group exactly once.
    assert [read for read in reads if read[2] != WHOLE] == []
    assert after == dict.fromkeys(after, WHOLE)


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

    ingest = reader.catalog.groups.ingest

    def fail(batch, failure):
        ingest(batch, failure)  # the new file's groups are indexed, then the read fails
        raise StorageError("connection reset while reading the new file")

    monkeypatch.setattr(reader.catalog.groups, "ingest", fail)
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
    led = open_ledger("s3://nowhere/ledger", dead)
    rows = round_rows("n1", 0, [[1, 0]])
    with pytest.raises(StorageError, match="s3://nowhere/ledger"):
        led.publish(rows)
    with pytest.raises(StorageError):
        led.query("SELECT count(*) FROM rollouts")
    # The caller still holds its rows: publishing them once storage is back just works.
    bucket = s3_server.new_bucket()
    alive = open_ledger(f"s3://{bucket}/ledger", s3_server.storage_options)
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
