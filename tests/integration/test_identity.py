"""Node identity: signed files, registered keys, swarm rules (ledger/identity.py).

Forged, missing and replayed signatures are all skipped by readers, on disk and on S3.
"""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from ledger import IdentityError, NodeKey, RecordError
from ledger import identity as ident
from ledger.records import to_table
from tests.factories import round_rows
from tests.hostile import parquet_bytes


@pytest.fixture
def swarm(site):
    """A swarm that requires signatures, with two registered, publishing nodes."""
    keys = {node: NodeKey.generate("sw", node) for node in ("a", "b")}
    setup = site.open()
    assert setup.declare_swarm("sw", "required") == "required"
    for key in keys.values():
        setup.register_key(key)
    for node, key in keys.items():
        site.open(signer=key).publish(round_rows(node, 0, [[1, 0], [0, 1]]))
    return keys


def statuses(led):
    return {key: status for key, status, _ in led.validate().bad_files}


def served_nodes(led):
    return set(led.query("SELECT DISTINCT node_id FROM rollouts").get_column("node_id"))


def test_signed_files_are_served(site, swarm):
    reader = site.open()
    assert served_nodes(reader) == {"a", "b"}
    assert reader.validate().clean
    assert set(reader.sample("a", 4, swarm_id="sw").get_column("node_id")) == {"b"}


def test_a_file_signed_with_another_key_is_skipped(site, swarm):
    thief = NodeKey.generate("sw", "a")  # claims to be a, holds its own key
    rows = to_table(round_rows("a", 1, [[1, 0]]))
    key = "swarm_id=sw/node_id=a/day=2026-03-01/r00000001-forged.parquet"
    data = parquet_bytes(rows)
    writer = site.open()
    writer.store.put_new(
        ident.signature_key(key, ident.sha256_of(data)), thief.signature_object(key, data)
    )
    writer.store.put_new(key, data)
    reader = site.open()
    assert statuses(reader)[key] == ident.BAD_SIGNATURE
    assert reader.query("SELECT count(*) FROM rollouts WHERE node_round = 1").item() == 0


def test_an_unsigned_file_and_an_unregistered_node_are_skipped(site, swarm):
    writer = site.open()  # no signer: writes unsigned files
    writer.publish(round_rows("a", 2, [[1, 0]]))
    writer.publish(round_rows("stranger", 0, [[1, 0]]))
    reader = site.open()
    found = statuses(reader)
    assert sorted(found.values()) == [ident.UNKNOWN_SIGNER, ident.UNSIGNED]
    assert served_nodes(reader) == {"a", "b"}
    assert reader.query("SELECT max(node_round) FROM rollouts").item() == 0


def test_a_signature_replayed_for_another_node_or_name_is_skipped(site, swarm):
    writer = site.open()
    original = next(
        k for k in writer.catalog.store.list() if k.key.startswith("swarm_id=sw/node_id=a/")
    )
    data = writer.store.read(original.key)
    sha = ident.sha256_of(data)
    signature = writer.store.read(ident.signature_key(original.key, sha))
    for copy in (
        original.key.replace("node_id=a", "node_id=b"),  # b's prefix, a's signature
        original.key.replace(".parquet", "0.parquet"),  # a's prefix, another name
    ):
        writer.store.put_new(ident.signature_key(copy, sha), signature)
        writer.store.put_new(copy, data)
    found = statuses(site.open())
    assert len(found) == 2 and set(found.values()) == {ident.BAD_SIGNATURE}


def test_bytes_changed_beside_their_signature_are_unsigned(site, swarm):
    # Someone with the bucket's write access replaces a signed file: its signature names
    # the old bytes' digest, so the new bytes have none.
    writer = site.open()
    original = next(
        o.key for o in writer.store.list() if o.key.startswith("swarm_id=sw/node_id=b/")
    )
    writer.store.delete([original])
    writer.store.put_new(original, parquet_bytes(to_table(round_rows("b", 0, [[1, 1]]))))
    reader = site.open()
    assert statuses(reader) == {original: ident.UNSIGNED}
    assert served_nodes(reader) == {"a"}


def test_a_publish_that_failed_after_its_signature_succeeds_when_retried(site, swarm, monkeypatch):
    # The signature landed, the file did not; the retry (a later round, a new published_at)
    # writes other bytes, which get their own signature instead of meeting the first one.
    a = site.open(signer=swarm["a"])

    def put_signature_only(key, data):
        if key.endswith(".parquet"):
            raise OSError("connection reset while writing the file")
        return real(key, data)

    real = a.store.put_new
    monkeypatch.setattr(a.store, "put_new", put_signature_only)
    rows = round_rows("a", 1, [[1, 0]])
    with pytest.raises(OSError):
        a.publish(rows, now=datetime(2026, 3, 1, 10, tzinfo=UTC))
    monkeypatch.setattr(a.store, "put_new", real)
    a.publish(rows, now=datetime(2026, 3, 1, 11, tzinfo=UTC))
    reader = site.open()
    assert reader.validate().clean
    assert reader.query("SELECT count(*) FROM rollouts WHERE node_round = 1").item() == 2


def test_json_nested_thousands_deep_in_a_key_or_signature_is_refused_not_raised(site, swarm):
    """A peer's own key object, or the signature object of a file it publishes, holding
    `[[[[...` 4,000 deep (within the 4 KiB object bound) made every read of every reader
    raise RecursionError, on disk and on S3. Now the key is unusable and the file unsigned,
    like any unreadable object, and the honest nodes' rows are served as before."""
    writer = site.open()
    writer.store.put_new(ident.key_object_key("sw", "evil"), b"[" * 4000)
    rows = to_table(round_rows("b", 3, [[1, 0]]))
    key = "swarm_id=sw/node_id=b/day=2026-03-01/r00000003-deep.parquet"
    data = parquet_bytes(rows)
    writer.store.put_new(ident.signature_key(key, ident.sha256_of(data)), b"[" * 4000)
    writer.store.put_new(key, data)
    writer.store.put_new(
        "swarm_id=sw/node_id=evil/day=2026-03-01/r00000000-evil.parquet",
        parquet_bytes(to_table(round_rows("evil", 0, [[1, 0]]))),
    )
    reader = site.open()
    assert served_nodes(reader) == {"a", "b"}
    assert statuses(reader)[key] == ident.BAD_SIGNATURE
    assert reader.query("SELECT count(*) FROM rollouts WHERE node_round = 3").item() == 0
    assert set(reader.sample("a", 4, swarm_id="sw").get_column("node_id")) == {"b"}


def test_a_node_id_holds_the_first_key_registered(site, swarm):
    led = site.open()
    led.register_key(swarm["a"])  # the same key again: fine
    with pytest.raises(IdentityError, match="registered with another key"):
        led.register_key(NodeKey.generate("sw", "a"))


def test_a_signing_ledger_publishes_for_its_own_node_only(site, swarm):
    with pytest.raises(RecordError, match="publishes as sw/a"):
        site.open(signer=swarm["a"]).publish(round_rows("b", 5, [[1, 0]]))


def test_only_a_node_compacts_its_signed_files(site, swarm):
    later = datetime(2100, 1, 1, tzinfo=UTC).date()
    a = site.open(signer=swarm["a"])
    a.publish(round_rows("a", 1, [[1, 0]]))
    stranger = site.open().compact(["a"], before=later)
    assert stranger.jobs == 0 and stranger.unsigned_partitions and not stranger.skipped_partitions
    own = a.compact(["a"], before=later)
    assert own.jobs == 1 and own.files_in == 2
    reader = site.open()
    assert reader.validate().clean
    assert reader.query("SELECT count(*) FROM rollouts WHERE node_id = 'a'").item() == 6


def test_a_node_never_signs_a_merge_of_files_it_did_not_sign(site, swarm):
    # An unsigned file in a's own prefix (a shared credential, or a signature lost). Even a
    # ledger that indexes it (signature checks off) will not merge it under a's signature.
    later = datetime(2100, 1, 1, tzinfo=UTC).date()
    site.open().publish(round_rows("a", 3, [[1, 0]]))
    own = site.open(signer=swarm["a"], check_signatures="off").compact(["a"], before=later)
    assert own.jobs == 0 and own.skipped_partitions
    reader = site.open()
    assert list(statuses(reader).values()) == [ident.UNSIGNED]
    assert reader.query("SELECT count(*) FROM rollouts WHERE node_id = 'a'").item() == 4


def test_a_node_that_declared_signatures_required_keeps_requiring_them(site, swarm):
    # A member with bucket access rewrites the swarm's rules to 'open' and publishes unsigned
    # rows as b, and as c, a node with no key. A plain reader now follows the rules object
    # for c, but b has a registered key: its files must be signed whatever the rules say. A
    # node whose own configuration says 'required' refuses both.
    writer = site.open()
    writer.store.delete([ident.swarm_rules_key("sw")])
    writer.store.put_new(ident.swarm_rules_key("sw"), ident.rules_object("open"))
    writer.publish(round_rows("b", 4, [[1, 0]]))
    writer.publish(round_rows("c", 5, [[1, 0]]))
    plain = site.open()
    assert plain.query("SELECT count(*) FROM rollouts WHERE node_round = 4").item() == 0
    assert plain.query("SELECT count(*) FROM rollouts WHERE node_round = 5").item() == 2
    node = site.open(signer=swarm["a"])
    assert node.declare_swarm("sw", "required") == "open"
    assert node.query("SELECT count(*) FROM rollouts WHERE node_round >= 4").item() == 0
    assert sorted(statuses(node).values()) == [ident.UNKNOWN_SIGNER, ident.UNSIGNED]


def test_open_swarms_serve_unsigned_files_unless_the_reader_requires_signatures(site):
    site.open().publish(round_rows("a", 0, [[1, 0]], swarm_id="open"))
    assert served_nodes(site.open()) == {"a"}
    strict = site.open(check_signatures="required")
    assert served_nodes(strict) == set()
    assert set(statuses(strict).values()) == {ident.UNKNOWN_SIGNER}


def test_keys_survive_a_restart(tmp_path):
    path = tmp_path / "keys" / "a.pem"
    first = NodeKey.load_or_create(path, "sw", "a")
    again = NodeKey.load_or_create(path, "sw", "a")
    assert first.public_b64 == again.public_b64
    assert oct(path.stat().st_mode & 0o777) == "0o600"
