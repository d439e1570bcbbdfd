"""Issue 12's table of attacks, one test each: a hostile peer, writing where it may write
(its own prefix, or through ``publish``), cannot stop, fool or flood a reader.

Each test failed on the ledger before the hardening; on local disk and on S3 over HTTP
where the attack applies to both.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from datetime import UTC, datetime, timedelta

import pyarrow as pa
import pytest

from ledger import Ledger, RecordError, RetryPolicy, RowLimits, StorageError, StoreUnusable
from ledger import validation as v
from ledger.policies import RewardFilteredPolicy
from ledger.records import to_table
from ledger.storage import NotRegularFile, OversizedObject
from tests import hostile
from tests.factories import open_ledger, round_rows

HONEST_ROWS = 9


@pytest.fixture
def honest(site):
    """Two honest peers and the receiver's own round."""
    return hostile.seed_honest(site.open())


plant = hostile.plant


def assert_serves_the_honest_data(led: Ledger, seeds: int = 5) -> None:
    assert led.query("SELECT count(*) FROM rollouts WHERE node_id <> 'evil'").item() == HONEST_ROWS
    for seed in range(seeds):
        drawn = set(led.sample("me", 10, seed=seed, swarm_id="sw").get_column("node_id"))
        assert {"good1", "good2"} <= drawn and "me" not in drawn


def test_a_nul_byte_in_an_id_is_refused_at_publish_and_skipped_when_planted(site, honest):
    with pytest.raises(RecordError, match=v.INVALID_ID):
        honest.publish(hostile.nul_in_group_id())
    plant(honest, "r0-nul.parquet", hostile.parquet_bytes(hostile.nul_in_group_id()))
    reader = site.open()
    assert_serves_the_honest_data(reader, seeds=20)
    assert reader.validate().skipped[v.INVALID_ID] == 2


@pytest.mark.parametrize("depth", [50, 1000])
def test_deeply_nested_extra_columns_are_refused_quickly(site, honest, depth):
    key = plant(honest, f"r0-deep{depth}.parquet", hostile.deep_nesting(depth))
    reader = site.open()
    started = time.monotonic()
    assert_serves_the_honest_data(reader)
    assert time.monotonic() - started < 30
    bad = {k: (status, detail) for k, status, detail in reader.validate().bad_files}
    assert bad[key][0] == v.SCHEMA_MISMATCH


def test_an_extra_column_named_reason_switches_no_check_off(site, honest):
    plant(honest, "r0-reason.parquet", hostile.reason_column())
    reader = site.open()
    assert_serves_the_honest_data(reader)
    assert reader.query("SELECT count(*) FROM rollouts WHERE reward > 1").item() == 0
    assert reader.validate().skipped[v.INVALID_REWARD] == 1


def test_unsafe_keys_are_listed_and_never_read(site, honest):
    good = hostile.parquet_bytes(hostile.attacker_table())
    hostile.put_raw(honest, f"{hostile.PREFIX}/*.parquet", good)
    if site.kind == "s3":
        hostile.put_raw(honest, f"{hostile.PREFIX}/x/../r9-dots.parquet", good)
    reader = site.open()
    assert_serves_the_honest_data(reader)
    unsafe = [k for k, status, _ in reader.validate().bad_files if status == v.UNSAFE_KEY]
    assert len(unsafe) == (2 if site.kind == "s3" else 1)
    assert reader.query("SELECT count(*) FROM rollouts WHERE node_id = 'evil'").item() == 0


def test_compacting_beside_a_glob_named_object_deletes_exactly_its_inputs(site, honest):
    evil = site.open()
    for node_round in range(3):
        evil.publish(round_rows("evil", node_round, [[1, 0]]))
    stray = f"{hostile.PREFIX}/*.parquet"
    hostile.put_raw(honest, stray, hostile.parquet_bytes(hostile.attacker_table()))
    report = evil.compact(["evil"], before=datetime(2100, 1, 1, tzinfo=UTC).date())
    assert report.files_in == 3 and report.files_out == 1
    reader = site.open()
    assert reader.query("SELECT count(*) FROM rollouts WHERE node_id = 'evil'").item() == 6
    assert_serves_the_honest_data(reader)


@pytest.mark.parametrize("kind", ["symlink", "fifo"])
def test_links_and_fifos_in_a_local_ledger_are_never_opened(local_site, kind, tmp_path):
    led = local_site.open()
    led.publish(round_rows("me", 0, [[1, 0]]))
    led.publish(round_rows("good1", 0, [[1, 0], [0, 1]]))
    led.publish(round_rows("good2", 0, [[1, 0, 1]]))
    folder = os.path.join(led.store.root, hostile.PREFIX)
    os.makedirs(folder)
    target = os.path.join(folder, "r0-trap.parquet")
    if kind == "fifo":
        os.mkfifo(target)
    else:
        outside = tmp_path / "outside.parquet"
        outside.write_bytes(hostile.parquet_bytes(hostile.attacker_table()))
        os.symlink(outside, target)
    done = threading.Event()

    def read() -> None:
        assert_serves_the_honest_data(local_site.open())
        done.set()

    worker = threading.Thread(target=read, daemon=True)
    worker.start()
    worker.join(60)
    if not done.is_set() and kind == "fifo":
        with open(target, "wb"):  # unblock the reader so the test run can end
            pass
    assert done.is_set(), "the reader blocked"


def test_reads_stop_at_their_bound_whatever_the_object_became(site, honest):
    # A key or signature object is checked small, then swapped for a large one: the read
    # itself is bounded (a ranged GET on S3), not only the size check before it.
    key = plant(honest, "r0-grown.parquet", b"x" * 5000)
    with pytest.raises(OversizedObject):
        honest.store.read(key, 4096)
    assert honest.store.read(key, 5000) == b"x" * 5000


@pytest.mark.parametrize("kind", ["symlink", "fifo"])
def test_a_local_read_refuses_links_and_fifos_swapped_in_after_a_stat(local_site, kind, tmp_path):
    led = local_site.open()
    key = plant(led, "r0-swap.parquet", b"small")
    path = os.path.join(led.store.root, key)
    assert led.store.stat(key)[0] == 5
    os.unlink(path)
    if kind == "fifo":
        os.mkfifo(path)  # a plain open() would wait for a writer forever
    else:
        (tmp_path / "secret").write_bytes(b"not the ledger's")
        os.symlink(tmp_path / "secret", path)
    with pytest.raises(NotRegularFile):
        led.store.read(key, 4096)


def test_a_decompression_bomb_is_refused_by_its_footer(site, honest):
    # 2,000 completions of 20,000 identical characters: ~40 MB unpacked, a few KB on disk.
    key = plant(honest, "r0-bomb.parquet", hostile.decompression_bomb(2000, 20_000))
    assert honest.store.size(key) < 200_000
    reader = site.open(limits=RowLimits(max_uncompressed_bytes=8 * 2**20))
    assert_serves_the_honest_data(reader)
    bad = {k: (status, detail) for k, status, detail in reader.validate().bad_files}
    assert bad[key][0] == v.OVERSIZED_CONTENT and "uncompressed" in bad[key][1]


def test_a_claim_of_millions_of_repeated_ids_is_refused_by_its_footer(site, honest):
    # 600 rows x 65,536 claimed tokens (the default max_completion_tokens, so every row passes
    # the row rules): 79 M values (629 MB at 8 bytes, over the default 512 MiB) that run-length
    # encoding packs into a few KB.
    key = plant(honest, "r0-claims.parquet", hostile.claim_bomb(600, 65_536))
    assert honest.store.size(key) < 20_000
    reader = site.open()
    assert_serves_the_honest_data(reader)
    bad = {k: (status, detail) for k, status, detail in reader.validate().bad_files}
    assert bad[key][0] == v.OVERSIZED_CONTENT and "uncompressed" in bad[key][1]


def test_millions_of_tiny_rows_are_refused_by_their_footer(site, honest):
    key = plant(honest, "r0-tiny.parquet", hostile.many_tiny_rows(20_000))
    reader = site.open(limits=RowLimits(max_file_rows=10_000))
    assert_serves_the_honest_data(reader)
    bad = {k: (status, detail) for k, status, detail in reader.validate().bad_files}
    assert bad[key] == (v.OVERSIZED_CONTENT, "20000 rows > 10000")


def test_a_peer_cannot_shadow_another_nodes_ids(site, honest):
    plant(honest, "r0-shadow.parquet", hostile.shadowing("good1"))
    reader = site.open()
    assert_serves_the_honest_data(reader)
    questions = reader.query(
        "SELECT DISTINCT question FROM rollouts WHERE group_id = 'sw.good1.r0.g0'"
    )
    assert questions.rows() == [("q0 of good1",)]
    assert reader.validate().skipped[v.FOREIGN_ID] == 2


def test_a_node_id_with_a_dot_cannot_claim_another_nodes_namespace(site, honest):
    # Node `good1.r0` would own ids starting `sw.good1.r0.`, which are good1's round 0.
    with pytest.raises(ValueError, match="no dots"):
        honest.publish(to_table(round_rows("good1.r0", 0, [[1, 0]])))
    gid = "sw.good1.r0.g0"
    prefix, forged = hostile.dotted_namespace("good1")
    plant(honest, "r0-dotted.parquet", forged, prefix=prefix)
    reader = site.open()
    assert_serves_the_honest_data(reader)
    assert reader.query(
        f"SELECT DISTINCT question FROM rollouts WHERE group_id = '{gid}'"
    ).rows() == [("q0 of good1",)]
    assert reader.validate().bad_files[0][1] == v.MISPLACED


def test_a_narrow_column_type_in_one_file_does_not_break_reading_the_others(site, honest):
    # A peer whose files sort first stores task_index as INT8; an honest file read in the
    # same scan holds 1000. Reading by name widens both instead of failing the sample.
    narrow = hostile.attacker_table()
    narrow = hostile.with_column(narrow, "task_index", pa.array([1, 1], pa.int8()))
    hostile.plant(
        honest,
        "r0-narrow.parquet",
        hostile.parquet_bytes(narrow),
        prefix=("swarm_id=sw/node_id=Aevil/day=2026-03-01"),
    )
    honest.publish(round_rows("good3", 0, [[1, 0]], task_index=1000))
    reader = site.open()
    for seed in range(10):
        frame = reader.sample("me", 10, seed=seed, swarm_id="sw")
        assert frame.height > 0
    assert 1000 in reader.query("SELECT task_index FROM rollouts").get_column("task_index")


def test_a_peer_that_keeps_deleting_its_files_does_not_fail_reads(site, honest):
    reader = site.open()
    evil = site.open()
    keys = [
        hostile.plant(evil, f"r{i}-gone.parquet", hostile.parquet_bytes(hostile.attacker_table()))
        for i in range(3)
    ]
    # Listed, then deleted before they are read: the read goes on without them.
    listing = reader.store.list

    def list_then_delete(prefix: str = "", skip: str = ""):
        found = listing(prefix, skip)
        evil.store.delete(keys)
        return found

    reader.store.list = list_then_delete
    assert_serves_the_honest_data(reader)


def test_a_flooding_peer_is_held_to_its_cap(site, honest):
    honest.publish(hostile.flood(300))
    honest.publish(round_rows("good3", 0, [[1, 0]] * 10))
    drawn = []
    for seed in range(10):
        frame = honest.sample("me", 8, "paper", seed=seed, swarm_id="sw")
        drawn += frame.unique("group_id").get_column("node_id").to_list()
    assert drawn.count("evil") <= 4 * 10  # half of every draw at most
    assert len(drawn) == 80


def test_a_flood_of_new_ids_is_held_to_the_budget_for_unknown_peers(site, honest):
    for sybil in range(40):
        honest.publish(hostile.flood(3, node_id=f"sybil{sybil}"))
    honest.publish(round_rows("good3", 0, [[1, 0]] * 10))
    known = ["good1", "good2", "good3"]  # peers the receiver has verified enough of
    drawn = []
    for seed in range(10):
        frame = honest.sample("me", 8, "paper", seed=seed, swarm_id="sw", known_nodes=known)
        drawn += frame.unique("group_id").get_column("node_id").to_list()
    assert len(drawn) == 80
    assert sum(n.startswith("sybil") for n in drawn) <= 2 * 10  # ceil(0.25 x 8) a draw
    # Knowing no one, the receiver draws from everyone alike: the ids take most slots.
    blind = honest.sample_group_ids("me", 8, "paper", seed=0, swarm_id="sw")
    assert sum(g.startswith("sw.sybil") for g in blind) > 4


def test_a_date_in_the_future_does_not_make_a_group_recent(site, honest):
    honest.publish(hostile.from_the_future(node_round=1))
    policy = RewardFilteredPolicy(max_age_s=3600)
    now = datetime.now(UTC)
    soon = set(honest.sample("me", 10, policy, now=now, swarm_id="sw").get_column("node_id"))
    assert "evil" in soon  # first seen just now: recent
    later = set(
        honest.sample("me", 10, policy, now=now + timedelta(hours=2), swarm_id="sw")
        .get_column("node_id")
        .to_list()
    )
    assert "evil" not in later


def test_an_indexed_file_overwritten_with_the_same_size_is_examined_again(site, honest):
    table = hostile.attacker_table([[1.0, 0.0]])
    key = plant(honest, "r0-swap.parquet", hostile.parquet_bytes(table))
    reader = site.open()
    assert reader.query("SELECT count(*) FROM rollouts WHERE node_id = 'evil'").item() == 2
    forged = hostile.with_column(table, "reward", pa.array([5.0, 0.0]))  # out of [0, 1]
    data = hostile.parquet_bytes(forged)
    assert len(data) == honest.store.size(key)
    time.sleep(0.01)  # a new mtime
    hostile.put_raw(honest, key, data)
    for seed in range(5):
        frame = reader.sample("me", 10, seed=seed, swarm_id="sw")
        assert frame.filter(frame["reward"] > 1).height == 0
    # garbage of the same size: skipped as corrupt, never a failing sample
    hostile.put_raw(honest, key, b"\x00" * len(data))
    assert_serves_the_honest_data(reader)
    statuses = {k: status for k, status, _ in reader.validate().bad_files}
    state = reader.catalog.files.get(key)
    assert statuses.get(key) in (v.CORRUPT, v.CHANGED), (state, reader.catalog.files.keys())


@pytest.fixture
def silent_server():
    """A TCP server on loopback that accepts connections and never answers."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(64)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        listener.settimeout(0.2)
        while not stop.is_set():
            try:
                held.append(listener.accept()[0])
            except TimeoutError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{listener.getsockname()[1]}"
    stop.set()
    thread.join()
    for conn in held:
        conn.close()
    listener.close()


@pytest.mark.s3
def test_a_server_that_never_answers_costs_a_bounded_wait(silent_server):
    options = {
        "key": "k",
        "secret": "s",
        "endpoint_url": silent_server,
        "connect_timeout_s": 1,
        "read_timeout_s": 1,
        "config_kwargs": {"retries": {"max_attempts": 1}},
    }
    led = open_ledger(
        "s3://hung/ledger", options, retry=RetryPolicy(attempts=2, initial_wait_s=0.1)
    )
    started = time.monotonic()
    with pytest.raises(StorageError):
        led.publish(round_rows("n1", 0, [[1, 0]]))
    with pytest.raises(StorageError):
        led.sample("me", 2, swarm_id="sw")
    assert time.monotonic() - started < 60


@pytest.mark.s3
def test_a_missing_bucket_is_a_clear_error_not_an_empty_ledger(s3_server):
    led = open_ledger("s3://no-such-bucket/ledger", s3_server.storage_options)
    with pytest.raises(StoreUnusable, match="no-such-bucket"):
        led.query("SELECT count(*) FROM rollouts")
    with pytest.raises(StoreUnusable, match="no-such-bucket"):
        led.publish(round_rows("n1", 0, [[1, 0]]))


def test_one_ledger_serves_several_threads(site):
    led = site.open()
    errors: list[BaseException] = []

    def publish(node: str) -> None:
        try:
            for node_round in range(3):
                led.publish(round_rows(node, node_round, [[1, 0]]))
                led.sample(node, 2, swarm_id="sw")
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=publish, args=(f"n{i}",), daemon=True) for i in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert not any(t.is_alive() for t in threads), "a thread never returned"
    assert not errors
    assert led.query("SELECT count(*) FROM rollouts").item() == 18
