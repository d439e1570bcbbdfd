"""Issue 27, identity under shared credentials: a peer that can write anywhere in the bucket
(every local ledger, a bucket without per-node credentials) rewrites another node's key
object, or names one before it exists.

A reader pins the first usable reading of a key (and keeps it in its index): a rewrite is
refused and reported, never adopted; an object named but missing is read when it appears.
Both failed on main at 2825c99 (the forgery adopted by a restarted reader, the victim unable
to restart; the future key unreadable for good).
"""

from __future__ import annotations

import time
from datetime import date

from ledger import NodeKey
from ledger import identity as ident
from ledger.changes import marker_key
from ledger.keys import compacted_key
from ledger.records import to_table
from tests import hostile
from tests.factories import round_rows


def _signed_swarm(site):
    setup = site.open()
    setup.declare_swarm("sw", "required")
    victim = NodeKey.generate("sw", "good1")
    site.open(signer=victim).register_key(victim)
    site.open(signer=victim).publish(round_rows("good1", 0, [[1, 0]]))
    return victim


def _forge(site, thief: NodeKey) -> None:
    """Overwrite good1's key object with the thief's and publish as good1, signed."""
    where = ident.key_object_key("sw", "good1")
    time.sleep(0.01)  # a local rewrite moves the mtime
    hostile.put_raw(site.open(), where, thief.key_object())
    data = hostile.parquet_bytes(to_table(round_rows("good1", 7, [[1, 0]])))
    key = "swarm_id=sw/node_id=good1/day=2026-03-01/r00000007-forged.parquet"
    store = site.open().store
    store.put_new(
        ident.signature_key(key, ident.sha256_of(data)), thief.signature_object(key, data)
    )
    store.put_new(key, data)


def _assert_pinned(reader) -> None:
    assert reader.query("SELECT count(*) FROM rollouts WHERE node_round = 7").item() == 0
    assert reader.query("SELECT count(*) FROM rollouts WHERE node_round = 0").item() == 2
    report = reader.validate()
    assert report.skipped[ident.REWRITTEN] == 1
    assert report.skipped[ident.BAD_SIGNATURE] == 1  # the forgery, under the pinned key


def test_a_rewritten_key_is_refused_by_readers_that_read_it_before(site, tmp_path):
    victim = _signed_swarm(site)
    index = tmp_path / "reader.duckdb"
    running = site.open(index_path=index)
    node_index = tmp_path / "victim.duckdb"  # the victim's own reader, before the forgery
    first = site.open(signer=victim, index_path=node_index)
    first.refresh()
    first.close()
    assert running.query("SELECT count(*) FROM rollouts").item() == 2
    _forge(site, NodeKey.generate("sw", "good1"))

    # The reader that kept running, then the same reader restarted from its index.
    _assert_pinned(running)
    running.close()
    _assert_pinned(site.open(index_path=index))

    # The victim, restarted with its index, keeps publishing; its files stay its own.
    again = site.open(signer=victim, index_path=node_index)
    again.register_key(victim)  # raised 'registered with another key' on main
    again.publish(round_rows("good1", 1, [[0, 1]]))
    assert again.query("SELECT count(*) FROM rollouts WHERE node_round IN (0, 1)").item() == 4


def test_a_marker_naming_a_key_before_it_exists_is_no_verdict(s3_site, tmp_path):
    led = s3_site.open()
    led.declare_swarm("sw", "required")
    index = tmp_path / "reader.duckdb"
    reader = s3_site.open(index_path=index)
    running = s3_site.open()
    reader.refresh()
    running.refresh()
    # An empty marker announcing good1's key object, which nobody has written yet.
    where = ident.key_object_key("sw", "good1")
    stamp = int(time.time() * 1000)
    hostile._write_raw(led.store.inner, marker_key(where, True, stamp), b"")
    for seen_it in (reader, running):
        seen_it.refresh()
        assert ("sw", "good1") not in seen_it.catalog.registry.keys
    reader.close()

    newcomer = NodeKey.generate("sw", "good1")
    s3_site.open(signer=newcomer).register_key(newcomer)
    s3_site.open(signer=newcomer).publish(round_rows("good1", 0, [[1, 0]]))
    for later in (s3_site.open(index_path=index), running):
        assert later.query("SELECT count(*) FROM rollouts WHERE node_id = 'good1'").item() == 2
        assert later.validate().skipped[ident.UNKNOWN_SIGNER] == 0


def test_a_squatted_compaction_output_keeps_the_inputs(site):
    """With shared credentials a peer writes the key the victim's next compaction will write
    (a digest of its inputs' keys, which anyone can list): the inputs stay."""
    victim = site.open()
    for node_round in range(3):
        victim.publish(round_rows("good1", node_round, [[1, 0], [0, 1]]))
    inputs = sorted(k for k in victim.catalog.files) if victim.refresh() else []
    partition = inputs[0].rsplit("/", 1)[0]
    squat = compacted_key(partition, inputs)
    hostile.put_raw(victim, squat, b"not parquet")  # judged corrupt: not an input itself
    report = victim.compact(["good1"], before=date(2100, 1, 1))
    assert report.skipped_partitions == [partition] and report.jobs == 0
    reader = site.open()
    assert reader.query("SELECT count(*) FROM rollouts WHERE node_id = 'good1'").item() == 12
    assert all(reader.store.exists(k) for k in inputs)
