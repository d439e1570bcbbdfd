"""Issue 27, a node's reports under shared credentials: a peer that can write anywhere in
the bucket writes an evaluation line, a training log or a manifest under another node's
prefix, or rewrites a swarm's rules to ``open`` and publishes unsigned files as a node.

Every object a node writes is signed, and a node with a registered key must sign whatever
its swarm's rules say: forged reports are skipped (``unsigned``, ``bad_signature``), the real
ones read. On main at 9f11f5f the forged evaluation and manifest were read as the node's
(earliest wins), and a fresh reader served the unsigned file after the rules were reopened.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

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
