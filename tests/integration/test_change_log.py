"""The change log: a reader that refreshes from markers sees what a full listing sees, pays
for new objects only, and trusts no marker."""

from __future__ import annotations

import time

import pytest

from ledger import NodeKey
from ledger.changes import ChangeLogStore, marker_key
from ledger.config import ChangeLogConfig
from tests.factories import round_rows

ON = ChangeLogConfig(use="on")


class Clock:
    def __init__(self, now: float = 2_000_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def _open(site, clock: Clock | None = None):
    led = site.open(change_log=ON)
    assert isinstance(led.store, ChangeLogStore)
    if clock is not None:
        led.store.clock = clock
    return led


def _keys(store) -> set[str]:
    return {o.key for o in store.list()}


def _publish(led, nodes, rounds):
    for node in nodes:
        for r in rounds:
            led.publish(round_rows(node, r, [[1, 0], [0, 1, 1]]))


def _same_as_full_listing(reader) -> None:
    """The reader's listing, and what its catalog serves, equal a fresh full listing's."""
    inner = reader.store.inner
    assert _keys(reader.store) == {o.key for o in inner.list()}
    fresh = sorted(s.key for s in reader.catalog.files.values() if s.status == "ok")
    full = sorted(o.key for o in inner.list() if o.key.endswith(".parquet") and o.key[0] != "_")
    assert fresh == full


def test_incremental_refresh_sees_what_a_full_listing_sees(site):
    clock = Clock()
    writer, reader = _open(site, clock), _open(site, clock)
    _publish(writer, ("a", "b"), range(3))
    reader.refresh()  # the first refresh lists fully
    assert reader.store.feed.full_listings == 1
    _same_as_full_listing(reader)
    for step in range(3):
        clock.now += 1
        _publish(writer, ("a", "c"), range(3 + step, 4 + step))
        reader.refresh()
        _same_as_full_listing(reader)
    assert reader.store.feed.full_listings == 1 and reader.store.feed.polls >= 3
    # Compaction writes the merged file, then deletes the inputs: both are marked.
    clock.now += 1
    report = writer.compact(all_nodes=True)
    assert report.files_in > 0
    reader.refresh()
    _same_as_full_listing(reader)
    total = reader.query("SELECT count(*) FROM rollouts").item()
    assert (
        total == writer.query("SELECT count(*) FROM rollouts").item() == 5 * 12
    )  # 12 rounds published, 5 rows each
    # A file deleted behind the log's back leaves once a read meets its absence (a reader
    # that serves verified local copies, as on S3, never meets it: it serves what it
    # checked until the full listing) ...
    victim = next(k for k in _keys(reader.store) if k.startswith("swarm_id=sw/node_id=c/"))
    reader.store.inner.delete([victim])
    reader.refresh()
    assert reader.sample("r", 100, seed=0).height > 0
    assert (victim in reader.catalog.files) == (reader.catalog.copies is not None)
    # ... and in any case at the next full listing.
    clock.now += ON.full_listing_every_s
    reader.refresh()
    assert reader.store.feed.full_listings == 2
    _same_as_full_listing(reader)


@pytest.mark.s3
def test_a_poll_costs_requests_for_new_objects_not_for_the_ledger(s3_server):
    from tests.conftest import LedgerSite

    bucket = s3_server.new_bucket()
    site = LedgerSite(f"s3://{bucket}/ledger", s3_server.storage_options, "s3")
    clock = Clock()
    writer, reader = _open(site, clock), _open(site, clock)
    _publish(writer, [f"n{i}" for i in range(40)], range(2))  # 80 files
    reader.refresh()
    grown = reader.store.feed.last
    clock.now += ON.grace_s + 1  # earlier markers are out of the window
    reader.refresh()
    idle = reader.store.feed.last
    assert idle["list"] == 1 and not idle["head"]
    clock.now += 1
    _publish(writer, ("n0", "n1", "n2"), [7])
    before = dict(reader.store.requests)
    reader.refresh()
    new = reader.store.feed.last
    assert new["list"] == 1 and not new["head"]  # one page of markers, however many
    spent = {k: n - before.get(k, 0) for k, n in reader.store.requests.items()}
    # One request per new object: the GET of each new file's local copy, which confirms
    # its marker (a reader without copies stats each, then lets DuckDB read it).
    assert {k: n for k, n in spent.items() if n} == {"list": 1, "get": 3}
    assert grown["list"] >= 1
    _same_as_full_listing(reader)


def test_markers_are_hints_never_trusted(local_site):
    clock = Clock()
    writer, reader = _open(local_site, clock), _open(local_site, clock)
    _publish(writer, ("a",), range(2))
    reader.refresh()
    inner = writer.store.inner
    kept = next(k for k in _keys(reader.store) if k.endswith(".parquet"))
    stamp = int(clock.now * 1000)
    lies = [
        marker_key("swarm_id=sw/node_id=a/day=2026-03-01/r9-missing.parquet", True, stamp),
        marker_key(kept, False, stamp),  # a removal of a file that is still there
        "_changes/notastamp/swarm_id=sw/node_id=a/x.parquet.added",
        marker_key("swarm_id=sw/node_id=a/day=2026-03-01/r9-x.parquet", True, stamp)[:-1],
    ]
    for name in lies:
        inner.put_new(name, b"")
    clock.now += 1
    reader.refresh()
    assert kept in _keys(reader.store)
    _same_as_full_listing(reader)
    # A marker stamped far ahead waits for its time: it cannot move the cursor past others'.
    future = clock.now + ON.future_tolerance_s + 600  # before the next full listing
    late = writer.store.inner  # write the object and a marker from the future, by hand
    unmarked = ChangeLogStore(late, ON, clock=lambda: future)
    key = "swarm_id=sw/node_id=b/day=2026-03-01/r00000000-handmade.parquet"
    data = writer.store.read(kept)
    unmarked.put_new(key, data)
    clock.now += 1
    reader.refresh()
    assert key not in _keys(reader.store)
    _publish(writer, ("c",), [0])  # an honest marker after it is still read
    clock.now += 1
    reader.refresh()
    assert any(k.startswith("swarm_id=sw/node_id=c/") for k in _keys(reader.store))
    clock.now = future
    reader.refresh()
    assert key in _keys(reader.store) and reader.store.feed.full_listings == 1


def test_objects_written_without_markers_appear_at_the_next_full_listing(local_site):
    clock = Clock()
    writer, reader = _open(local_site, clock), _open(local_site, clock)
    _publish(writer, ("a",), range(1))
    reader.refresh()
    plain = local_site.open(change_log=ChangeLogConfig(use="off"))  # an older writer
    plain.publish(round_rows("old", 0, [[1, 0]]))
    clock.now += 1
    reader.refresh()
    assert not any("node_id=old/" in k for k in _keys(reader.store))
    clock.now += ON.full_listing_every_s
    reader.refresh()
    assert any("node_id=old/" in k for k in _keys(reader.store))
    _same_as_full_listing(reader)


def test_on_s3_the_change_log_is_on_by_default(site):
    led = site.open()
    assert isinstance(led.store, ChangeLogStore) == (site.kind == "s3")


def _markers(store) -> list[str]:
    return store.inner.list_after("_changes/", "_changes/")


def test_old_markers_are_collected_each_node_its_own_and_readers_lose_nothing(s3_site):
    clock = Clock(time.time())
    keys = {n: NodeKey.generate("sw", n) for n in ("a", "b")}
    for node, key in keys.items():
        led = s3_site.open(change_log=ON, signer=key)
        led.store.clock = clock
        led.register_key(key)
        led.publish(round_rows(node, 0, [[1, 0]]))
    before = _markers(led.store)
    # One marker per object: the key objects and the rollout files; none for signatures.
    assert len(before) == 4 and not any("_signatures/" in m for m in before)
    reader = s3_site.open(change_log=ON)
    assert reader.query("SELECT count(*) FROM rollouts").item() == 4
    later = clock.now + 2 * ON.full_listing_every_s + ON.grace_s + 1
    a = s3_site.open(change_log=ON, signer=keys["a"])
    assert a.collect_markers(now=clock.now) == 0  # young markers stay
    assert a.collect_markers(now=later) == 2  # a's own: its key object and its file
    assert all("node_id=b/" in m for m in _markers(a.store))
    assert s3_site.open(change_log=ON).collect_markers(now=later) == 2  # the operator's: b's
    assert _markers(a.store) == []
    assert s3_site.open(change_log=ON).query("SELECT count(*) FROM rollouts").item() == 4
    reader.refresh()
    assert reader.query("SELECT count(*) FROM rollouts").item() == 4


def test_a_node_collects_its_markers_when_it_publishes_at_most_once_a_period(s3_site):
    key = NodeKey.generate("sw", "a")
    led = s3_site.open(change_log=ON, signer=key)
    old_ms = int((time.time() - 3 * ON.full_listing_every_s) * 1000)
    stale = marker_key("swarm_id=sw/node_id=a/day=2026-03-01/r0-x.parquet", True, old_ms)
    theirs = marker_key("swarm_id=sw/node_id=b/day=2026-03-01/r0-x.parquet", True, old_ms)
    for name in (stale, theirs):
        led.store.inner.put_new(name, b"")
    led.publish(round_rows("a", 0, [[1, 0]]))
    markers = _markers(led.store)
    assert stale not in markers and theirs in markers
    led.store.inner.put_new(stale, b"")
    led.publish(round_rows("a", 1, [[1, 0]]))  # within the period: not again
    assert stale in _markers(led.store)
