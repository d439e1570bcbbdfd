"""Node manifests in a real ledger (local disk and S3 over HTTP): written once, read back as
the `manifests` view, and nothing a peer puts under `_manifests/` can crash a reader."""

from __future__ import annotations

import json
import logging
from datetime import UTC, datetime, timedelta
from typing import Any

import duckdb
import pytest

from ledger import NodeManifest, parse_policy
from ledger import manifests as mf
from tests.conftest import LedgerSite

WHEN = datetime(2026, 1, 1, tzinfo=UTC)


def manifest(node_id: str = "node-0", **changes: Any) -> NodeManifest:
    fields: dict[str, Any] = {
        "swarm_id": "alpha",
        "node_id": node_id,
        "experiment": "exp",
        "local_groups": 3,
        "external_groups": 1,
        "policy": parse_policy({"kind": "variance_weighted", "max_per_peer": 2}),
        "model_id": "some/model",
        "seed": 11,
        "written_at": WHEN,
    }
    fields.update(changes)
    return NodeManifest.for_node(**fields)


def listed(site: LedgerSite) -> list[str]:
    with site.open() as led:
        return sorted(o.key for o in led.store.list(mf.PREFIX))


def test_manifests_round_trip_one_row_per_node(site: LedgerSite) -> None:
    written = [manifest("node-0"), manifest("node-1", experiment=None, seed=12)]
    with site.open() as led:
        keys = [led.write_manifest(m) for m in written]
    assert keys == [mf.manifest_key(m) for m in written]
    with site.open() as reader:
        rows = reader.query("SELECT * FROM manifests ORDER BY node_id").to_dicts()
    assert [r.pop("revisions") for r in rows] == [1, 1]
    assert rows == [m.model_dump() for m in written]
    assert json.loads(rows[0]["policy_params"])["max_per_peer"] == 2


def test_writing_the_same_manifest_again_is_a_no_op(site: LedgerSite) -> None:
    first = manifest()
    with site.open() as led:
        key = led.write_manifest(first)
        # A retry, and a node resumed later with the same configuration: same key.
        assert led.write_manifest(first) == key
        assert led.write_manifest(manifest(written_at=WHEN + timedelta(hours=5))) == key
        assert led.store.read(key) == mf.encode(first)  # the first start's time is kept
    assert listed(site) == [key]


def test_a_node_resumed_with_another_configuration_keeps_its_first_manifest(
    site: LedgerSite, caplog: pytest.LogCaptureFixture
) -> None:
    first, changed = manifest(), manifest(external_groups=2, written_at=WHEN + timedelta(hours=1))
    with site.open() as led:
        led.write_manifest(first)
        with caplog.at_level(logging.WARNING, logger="ledger.writes"):
            led.write_manifest(changed)
    assert "readers keep the earliest" in caplog.text
    assert len(listed(site)) == 2
    with site.open() as reader:
        (row,) = reader.query("SELECT * FROM manifests").to_dicts()
    assert (row["external_groups"], row["revisions"]) == (1, 2)


def hostile_objects() -> dict[str, tuple[bytes, str]]:
    """key -> (bytes, the reason a reader gives for skipping it)."""
    good = manifest("node-1")
    foreign = manifest("node-2")  # node-3 poses as node-2 in its own prefix
    foreign_key = mf.manifest_key(foreign).replace("node_id=node-2", "node_id=node-3")
    tampered = json.loads(mf.encode(manifest("node-4")))
    tampered["local_groups"] = 99
    extra = json.loads(mf.encode(manifest("node-5")))
    extra["admin"] = True
    return {
        mf.manifest_key(manifest("node-6")): (b"{not json at all", mf.UNREADABLE),
        mf.manifest_key(manifest("node-7")): (
            b'{"pad": "' + b"x" * mf.MAX_MANIFEST_BYTES + b'"}',
            mf.OVERSIZED,
        ),
        foreign_key: (mf.encode(foreign), mf.FOREIGN),
        mf.manifest_key(manifest("node-4")): (json.dumps(tampered).encode(), mf.DIGEST_MISMATCH),
        mf.manifest_key(manifest("node-5")): (json.dumps(extra).encode(), mf.INVALID),
        "_manifests/swarm_id=alpha/stray.jsonl": (mf.encode(good), mf.MISPLACED),
        # JSON nested past Python's recursion limit, under a manifest's name
        mf.manifest_key(manifest("node-6")): (b"[" * 16_000, mf.UNREADABLE),
    }


def test_malformed_oversized_and_foreign_manifests_are_skipped_not_fatal(
    site: LedgerSite, caplog: pytest.LogCaptureFixture
) -> None:
    hostile = hostile_objects()
    with site.open() as led:
        for key, (data, _) in hostile.items():
            assert led.store.put_new(key, data)
        led.write_manifest(manifest("node-1"))
    with caplog.at_level(logging.WARNING, logger="ledger.manifests"), site.open() as reader:
        rows = reader.query("SELECT node_id FROM manifests").rows()
        report = reader.validate()
    assert rows == [("node-1",)]
    assert {k: s for k, s, _ in report.bad_files} == {k: r for k, (_, r) in hostile.items()}
    assert sum(report.skipped.values()) == len(hostile)
    assert caplog.text.count("skipping manifest") == len(hostile)


def test_a_manifest_removed_from_the_store_leaves_the_view(local_site: LedgerSite) -> None:
    with local_site.open() as led:
        key = led.write_manifest(manifest())
        assert led.query("SELECT count(*) AS n FROM manifests")["n"][0] == 1
        led.store.delete([key])
        assert led.query("SELECT count(*) AS n FROM manifests")["n"][0] == 0


def test_plain_duckdb_reads_manifests_as_the_docstring_says(local_site: LedgerSite) -> None:
    written = [manifest("node-0"), manifest("node-1", experiment=None)]
    with local_site.open() as led:
        for m in written:
            led.write_manifest(m)
    doc = mf.__doc__ or ""
    recipe = doc[doc.index("CREATE VIEW manifests") : doc.index("= 1;") + 3]
    con = duckdb.connect()
    con.execute(recipe.replace("<root>", local_site.url))
    rows = con.execute("SELECT * FROM manifests ORDER BY node_id").pl().to_dicts()
    assert rows == [{**m.model_dump(), "revisions": 1} for m in written]


@pytest.mark.parametrize(
    ("field", "first", "second", "bad"),
    [
        ("prompt_format", "plain", "chat", "markdown"),
        ("adapter", "lora-r16", "lora-r8", "lora rank 8; DROP TABLE"),
    ],
)
def test_a_field_added_later_is_recorded_and_older_manifests_keep_their_keys(
    local_site: LedgerSite, field: str, first: str, second: str, bad: str
) -> None:
    one, two, older = (
        manifest("node-0", **{field: first}),
        manifest("node-1", **{field: second}),
        manifest("node-2"),
    )
    # A manifest written before the field existed: its key's digest left the field out.
    body = {k: v for k, v in json.loads(older.model_dump_json()).items() if k != field}
    assert mf.parse(mf.manifest_key(older), json.dumps(body).encode()) == older
    assert mf.manifest_key(one) != mf.manifest_key(manifest("node-0"))
    with local_site.open() as led:
        for m in (one, two, older):
            led.write_manifest(m)
        rows = led.query(f"SELECT node_id, {field} FROM manifests ORDER BY node_id").rows()
    assert rows == [("node-0", first), ("node-1", second), ("node-2", None)]
    with pytest.raises(ValueError):
        manifest("node-3", **{field: bad})
