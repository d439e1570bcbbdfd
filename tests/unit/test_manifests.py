"""Node manifests as values: their key, their encoding, and what a reader refuses."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest
from pydantic import ValidationError

from ledger import NodeManifest, parse_policy
from ledger import manifests as mf

WHEN = datetime(2026, 1, 1, tzinfo=UTC)


def manifest(**changes: Any) -> NodeManifest:
    fields: dict[str, Any] = {
        "swarm_id": "alpha",
        "node_id": "node-0",
        "experiment": "exp",
        "local_groups": 2,
        "external_groups": 2,
        "policy": parse_policy({"kind": "reward_filtered", "max_per_peer": 1}),
        "model_id": "some/model",
        "seed": 7,
        "written_at": WHEN,
    }
    fields.update(changes)
    return NodeManifest.for_node(**fields)


def stored(m: NodeManifest, **changes: Any) -> tuple[str, bytes]:
    """A manifest's key and bytes, with its JSON fields changed after encoding."""
    body = json.loads(mf.encode(m))
    body.update(changes)
    return mf.manifest_key(m), (json.dumps(body) + "\n").encode()


def test_for_node_records_the_policy_kind_and_parameters() -> None:
    m = manifest()
    assert m.policy == "reward_filtered"
    params = json.loads(m.policy_params)
    assert params["max_per_peer"] == 1 and "kind" not in params
    paper = json.loads(manifest(policy=parse_policy("paper")).policy_params)
    assert paper == {"max_per_peer": None, "max_peer_share": 0.5, "max_unknown_share": 0.25}


def test_key_is_under_the_nodes_prefix_and_ignores_the_write_time() -> None:
    key = mf.manifest_key(manifest())
    assert key.startswith("_manifests/swarm_id=alpha/node_id=node-0/manifest-")
    assert key.endswith(".jsonl") and mf.is_manifest_key(key)
    # A resumed node (same configuration, later start) lands on the same key ...
    assert mf.manifest_key(manifest(written_at=WHEN + timedelta(days=1))) == key
    # ... a changed configuration does not.
    assert mf.manifest_key(manifest(external_groups=1)) != key
    assert mf.manifest_key(manifest(experiment=None)) != key


def test_encoding_round_trips_as_one_json_line() -> None:
    m = manifest()
    data = mf.encode(m)
    assert data.count(b"\n") == 1 and data.endswith(b"\n")
    assert mf.parse(mf.manifest_key(m), data) == m


def test_times_are_utc_and_must_say_their_zone() -> None:
    local = datetime(2026, 1, 1, 3, tzinfo=UTC).astimezone(timezone(timedelta(hours=3)))
    assert manifest(written_at=local).written_at == datetime(2026, 1, 1, 3, tzinfo=UTC)
    with pytest.raises(ValidationError, match="time zone"):
        manifest(written_at=datetime(2026, 1, 1))


@pytest.mark.parametrize(
    ("changes", "match"),
    [
        ({"swarm_id": "../escape"}, "invalid swarm_id"),
        ({"experiment": "1-starts-with-a-digit"}, "invalid experiment"),
        ({"local_groups": -1}, "greater than or equal"),
        ({"model_id": ""}, "at least 1"),
    ],
)
def test_bad_values_are_refused_when_writing(changes: dict[str, Any], match: str) -> None:
    with pytest.raises(ValidationError, match=match):
        manifest(**changes)


@pytest.mark.parametrize(
    ("changes", "reason"),
    [
        ({"local_groups": "2"}, mf.INVALID),  # strict: no coercion of peers' text
        ({"external_groups": True}, mf.INVALID),
        ({"surprise": 1}, mf.INVALID),  # unknown keys are refused
        ({"policy": "DROP TABLE"}, mf.INVALID),
        ({"policy_params": "[1, 2]"}, mf.INVALID),
        ({"node_id": "node-1"}, mf.FOREIGN),  # another node's manifest in node-0's prefix
        ({"seed": 8}, mf.DIGEST_MISMATCH),  # content that is not what the name says
        ({"schema_version": 99}, mf.NEWER_VERSION),
        ({"policy_params": "[" * 4_000}, mf.UNREADABLE),  # deep JSON inside a field
    ],
)
def test_a_reader_refuses_what_does_not_validate(changes: dict[str, Any], reason: str) -> None:
    key, data = stored(manifest(), **changes)
    with pytest.raises(mf.ManifestError) as caught:
        mf.parse(key, data)
    assert caught.value.reason == reason


@pytest.mark.parametrize(
    ("key", "data", "reason"),
    [
        ("_manifests/elsewhere.jsonl", b"{}", mf.MISPLACED),
        (None, b"\xff\xfe not utf-8", mf.UNREADABLE),
        (None, b"{not json", mf.UNREADABLE),
        (None, b"[1, 2, 3]", mf.UNREADABLE),
        (None, b"", mf.UNREADABLE),
        (None, b"{}\n{}\n", mf.UNREADABLE),
        (None, b" " * (mf.MAX_MANIFEST_BYTES + 1), mf.OVERSIZED),
        (None, b"[" * 16_000, mf.UNREADABLE),  # nested past Python's recursion limit
    ],
)
def test_a_reader_refuses_malformed_bytes(key: str | None, data: bytes, reason: str) -> None:
    with pytest.raises(mf.ManifestError) as caught:
        mf.parse(key or mf.manifest_key(manifest()), data)
    assert caught.value.reason == reason
