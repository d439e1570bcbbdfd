"""Issue 27, a node's reports under shared credentials: a peer that can write anywhere in
the bucket writes an evaluation line, a training log or a manifest under another node's
prefix, or rewrites a swarm's rules to ``open`` and publishes unsigned files as a node.

Every object a node writes is signed, and a node with a registered key must sign whatever
its swarm's rules say: forged reports are skipped (``unsigned``, ``bad_signature``), the real
ones read. On main at 9f11f5f the forged evaluation and manifest were read as the node's
(earliest wins), and a fresh reader served the unsigned file after the rules were reopened.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest

from ledger import NodeKey, NodeManifest, node_logs, parse_policy
from ledger import identity as ident
from ledger import manifests as mf
from ledger.records import to_table
from tests import hostile
from tests.factories import round_rows
from tests.integration.test_node_logs import evaluation

T0 = datetime(2026, 3, 2, 12, tzinfo=UTC)


def _victim(site) -> NodeKey:
    """good1 of swarm sw (signatures required), registered, with one round and its
    evaluation and manifest, all written by its own signed ledger."""
    site.open().declare_swarm("sw", "required")
    victim = NodeKey.generate("sw", "good1")
    led = site.open(signer=victim)
    led.register_key(victim)
    led.write_manifest(_manifest(external_groups=2, written_at=T0))
    led.publish(round_rows("good1", 0, [[1, 0]]))
    led.write_evaluation("sw", "good1", 0, [evaluation("chain_sum", 2, 8, 2.0, 0)], now=T0)
    return victim


def _manifest(**changes) -> NodeManifest:
    fields = {
        "swarm_id": "sw",
        "node_id": "good1",
        "experiment": "exp",
        "local_groups": 2,
        "external_groups": 2,
        "policy": parse_policy({"kind": "paper"}),
        "model_id": "m",
        "seed": 0,
    }
    return NodeManifest.for_node(**{**fields, **changes})


def _forged_reports(site, signer: NodeKey | None = None) -> None:
    """An evaluation dated before good1's (earliest wins) claiming accuracy 1.0, and a
    manifest claiming J = 0 and another experiment, both under good1's prefix; signed by
    ``signer`` (the attacker's own key) or unsigned."""
    store = site.open().store
    early = T0 - timedelta(days=1)
    line = node_logs.EVALUATIONS.lines(
        node_logs.EVALUATIONS.validate([evaluation("chain_sum", 8, 8, 8.0, 0)], 0), early
    )
    where = node_logs.EVALUATIONS.key("sw", "good1", 0, early)
    forged = _manifest(external_groups=0, experiment="other", written_at=early)
    for key, data in ((where, line), (mf.manifest_key(forged), mf.encode(forged))):
        if signer is not None:
            sha = ident.sha256_of(data)
            store.put_new(ident.signature_key(key, sha), signer.signature_object(key, data))
        store.put_new(key, data)


def _assert_only_the_real_reports(reader, reason: str) -> None:
    accuracy = reader.query("SELECT accuracy FROM evaluations WHERE node_id = 'good1'")
    assert accuracy["accuracy"].to_list() == [0.25]
    manifest = reader.query("SELECT experiment, external_groups FROM manifests").rows()
    assert manifest == [("exp", 2)]
    report = reader.validate()
    assert report.skipped[reason] == 2, report.skipped


def test_a_peers_unsigned_reports_under_another_nodes_prefix_are_skipped(site):
    _victim(site)
    _forged_reports(site)
    _assert_only_the_real_reports(site.open(), ident.UNSIGNED)


def test_reports_signed_by_another_key_are_skipped(site):
    _victim(site)
    _forged_reports(site, signer=NodeKey.generate("sw", "good1"))  # the thief's own key
    _assert_only_the_real_reports(site.open(), ident.BAD_SIGNATURE)


def test_reopened_rules_open_nothing_of_a_node_with_a_key(site):
    # With shared credentials a peer rewrites the rules object to `open` before a fresh
    # reader first reads it, then publishes an unsigned file as good1.
    _victim(site)
    hostile.put_raw(site.open(), ident.swarm_rules_key("sw"), ident.rules_object("open"))
    data = hostile.parquet_bytes(to_table(round_rows("good1", 7, [[1, 1]])))
    site.open().store.put_new("swarm_id=sw/node_id=good1/day=2026-03-01/r7-forged.parquet", data)
    fresh = site.open()
    assert fresh.query("SELECT DISTINCT node_round FROM rollouts").rows() == [(0,)]
    assert fresh.validate().skipped[ident.UNSIGNED] == 1
    # A node without a key in an open swarm still publishes unsigned files, as before.
    site.open().publish(round_rows("plain", 0, [[1, 0]]))
    assert fresh.query("SELECT count(*) FROM rollouts WHERE node_id = 'plain'").item() == 2


def test_reports_read_before_the_node_registered_are_judged_again(site):
    # An open swarm: a forged evaluation for good1 is read while good1 has no key; once good1
    # registers, the reader judges good1's reports again and drops the forgery.
    site.open().declare_swarm("sw", "open")
    _forged_reports(site)
    reader = site.open()
    assert reader.query("SELECT count(*) FROM evaluations").item() == 1
    assert reader.query("SELECT count(*) FROM manifests").item() == 1
    victim = NodeKey.generate("sw", "good1")
    led = site.open(signer=victim)
    led.register_key(victim)
    led.write_evaluation("sw", "good1", 1, [evaluation("chain_sum", 2, 8, 2.0, 0)], now=T0)
    rows = reader.query("SELECT node_round, accuracy FROM evaluations").rows()
    assert rows == [(1, 0.25)]
    assert reader.query("SELECT count(*) FROM manifests").item() == 0


def test_a_signed_ledger_writes_reports_only_under_its_own_prefix(local_site):
    victim = NodeKey.generate("sw", "good1")
    led = local_site.open(signer=victim)
    try:
        led.write_evaluation("sw", "other", 0, [evaluation("chain_sum", 2, 8, 2.0, 0)], now=T0)
    except ValueError as exc:
        assert "writes as sw/good1" in str(exc)
    else:
        raise AssertionError("wrote under another node's prefix")


# -- a manifest that joins another swarm ------------------------------------------------------


def _sweep_node(site, swarm: str, node: str, j: int, rewards: list[list[float]]) -> None:
    """A sweep's node: declares its closed swarm (nodes a and b), registers, writes its
    manifest (experiment exp, I = 4 - j) and publishes one round."""
    key = NodeKey.generate(swarm, node)
    led = site.open(signer=key)
    led.declare_swarm(swarm, "required", members=["a", "b"])
    led.register_key(key)
    manifest = _manifest(
        swarm_id=swarm, node_id=node, local_groups=4 - j, external_groups=j, written_at=T0
    )
    led.write_manifest(manifest)
    led.publish(round_rows(node, 0, rewards, swarm_id=swarm))


def _summary(reader) -> dict[str, tuple]:
    from dashboards.report import report_tables

    tables = report_tables(reader.query)
    return {
        r["swarm_id"]: (
            r["local_groups"],
            r["external_groups"],
            r["nodes"],
            r["cumulative_claimed_reward"],
            r["gain_over_baseline"],
        )
        for r in tables.summary.to_dicts()
    }


def _intrude(site, swarm: str) -> None:
    """evil registers its own key in ``swarm`` (trust on first use lets it), writes a signed
    manifest claiming J = 2 and publishes a perfect round, all under its own prefix."""
    evil = NodeKey.generate(swarm, "evil")
    led = site.open(signer=evil)
    led.register_key(evil)
    led.write_manifest(_manifest(swarm_id=swarm, node_id="evil", written_at=T0))
    led.publish(round_rows("evil", 0, [[1, 1], [1, 1]], swarm_id=swarm))


def test_a_stranger_cannot_join_a_closed_swarm_or_change_its_sweep(site):
    _sweep_node(site, "exp-4x0", "a", 0, [[1, 0], [0, 0]])
    _sweep_node(site, "exp-4x0", "b", 0, [[1, 0], [1, 0]])
    _sweep_node(site, "exp-2x2", "a", 2, [[1, 1], [1, 0]])
    _sweep_node(site, "exp-2x2", "b", 2, [[1, 0], [1, 0]])
    honest = _summary(site.open())
    assert honest["exp-4x0"][:3] == (4, 0, 2) and honest["exp-2x2"][4] == pytest.approx(
        1.25 / 0.75 - 1
    )
    _intrude(site, "exp-4x0")
    reader = site.open()
    assert _summary(reader) == honest  # was: exp-4x0's J unknown, no baseline, 3 nodes
    assert reader.query("SELECT count(*) FROM rollouts WHERE node_id = 'evil'").item() == 0
    assert reader.validate().skipped[ident.NOT_A_MEMBER] == 2  # its manifest and its file


def test_a_node_holds_to_its_own_members_when_a_stranger_declared_the_swarm_first(site):
    # With shared credentials a stranger writes the rules first (open to anyone); the
    # sweep's nodes list their members in their own configuration and hold to it.
    site.open().declare_swarm("exp-4x0", "open")
    _sweep_node(site, "exp-4x0", "a", 0, [[1, 0], [0, 0]])
    _intrude(site, "exp-4x0")
    node = site.open(signer=NodeKey.generate("exp-4x0", "b"))
    node.declare_swarm("exp-4x0", "required", members=["a", "b"])
    assert node.query("SELECT DISTINCT node_id FROM rollouts").rows() == [("a",)]


def test_a_swarm_closed_after_a_stranger_published_stops_serving_it(local_site, tmp_path):
    # A reader (with its index) served a stranger's files before the swarm's rules closed
    # it; a node restarted from that index with its own members list stops serving them.
    _intrude(local_site, "exp-4x0")
    index = tmp_path / "reader.duckdb"
    before = local_site.open(index_path=index)
    assert before.query("SELECT count(*) FROM rollouts").item() == 4
    before.close()
    node = local_site.open(index_path=index, signer=NodeKey.generate("exp-4x0", "a"))
    node.declare_swarm("exp-4x0", "required", members=["a", "b"])
    assert node.query("SELECT count(*) FROM rollouts").item() == 0
    assert node.query("SELECT count(*) FROM manifests").item() == 0


def test_a_closed_swarm_of_256_nodes_declares_and_reads_its_members(local_site):
    members = [f"node-{i:03d}-" + "x" * 110 for i in range(256)]  # ids up to 128 characters
    local_site.open().declare_swarm("big", "required", members=members)  # ~30 KB of rules
    reader = local_site.open()
    reader.refresh()
    assert reader.catalog.registry.members("big") == frozenset(members)


def test_reports_of_a_node_whose_key_predates_signed_reports_stay_readable(site):
    # A ledger written before reports were signed: good1's key object says nothing of
    # reports, and its evaluation and manifest are unsigned. Readers keep them.
    site.open().declare_swarm("sw", "required")
    victim = NodeKey.generate("sw", "good1")
    legacy = ident.key_object_key("sw", "good1")
    record = json.loads(victim.key_object())
    del record["signs"]
    hostile.put_raw(site.open(), legacy, (json.dumps(record) + "\n").encode())
    led = site.open()  # no signer: as the old node wrote its reports
    led.write_manifest(_manifest(written_at=T0))
    led.write_evaluation("sw", "good1", 0, [evaluation("chain_sum", 2, 8, 2.0, 0)], now=T0)
    reader = site.open()
    assert reader.query("SELECT count(*) FROM manifests").item() == 1
    assert reader.query("SELECT accuracy FROM evaluations").item() == 0.25
    assert reader.validate().clean


def test_a_node_holds_its_open_swarm_open_when_a_stranger_declared_it_closed(local_site):
    # A stranger squats the rules object listing only itself; the swarm's own nodes, open
    # by their configuration, still read each other.
    local_site.open().declare_swarm("sw", "open", members=["evil"])
    for node in ("a", "b"):
        key = NodeKey.generate("sw", node)
        led = local_site.open(signer=key)
        led.declare_swarm("sw", "open")
        led.register_key(key)
        led.publish(round_rows(node, 0, [[1, 0]]))
    assert led.query("SELECT count(*) FROM rollouts").item() == 4


def test_a_signed_log_whose_read_failed_once_is_read_by_a_later_refresh(local_site):
    from ledger.storage import StorageError

    _victim(local_site)
    reader = local_site.open()
    real = reader.store.read
    failures = {"left": 1}

    def flaky(key, most=None):
        if key.startswith("_evaluations/") and failures["left"]:
            failures["left"] -= 1
            raise StorageError(f"reading {key}: connection reset")
        return real(key, most)

    reader.store.read = flaky
    with pytest.raises(StorageError, match="connection reset"):
        reader.catalog.refresh()
    assert failures["left"] == 0
    assert reader.query("SELECT accuracy FROM evaluations").rows() == [(0.25,)]


def test_files_forged_before_a_node_registered_are_dropped_once_it_has(site):
    # An open swarm: a peer publishes unsigned rows as good1 before good1 starts; a reader
    # serves them (good1 has no key yet). Once good1 registers, the reader drops them.
    site.open().declare_swarm("sw", "open")
    site.open().publish(round_rows("good1", 7, [[1, 1]]))
    reader = site.open()
    assert reader.query("SELECT count(*) FROM rollouts").item() == 2
    victim = NodeKey.generate("sw", "good1")
    led = site.open(signer=victim)
    led.register_key(victim)
    led.publish(round_rows("good1", 0, [[1, 0]]))
    assert reader.query("SELECT DISTINCT node_round FROM rollouts").rows() == [(0,)]
    assert reader.validate().skipped[ident.UNSIGNED] == 1
