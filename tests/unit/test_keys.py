from __future__ import annotations

from datetime import date

from ledger.keys import compacted_key, digest, parse_key, round_key


def test_round_key_is_the_hive_layout_and_ignores_row_order():
    key = round_key("sw", "n1", date(2026, 3, 1), 7, ["b", "a", "c"])
    assert key.startswith("swarm_id=sw/node_id=n1/day=2026-03-01/r00000007-")
    assert key.endswith(".parquet")
    assert key == round_key("sw", "n1", date(2026, 3, 1), 7, ["c", "a", "b"])
    assert key != round_key("sw", "n1", date(2026, 3, 1), 7, ["a", "b"])


def test_parse_key_round_trips_and_refuses_foreign_paths():
    key = round_key("sw", "n1", date(2026, 3, 1), 0, ["x"])
    parts = parse_key(key)
    assert parts is not None
    assert (parts.swarm_id, parts.node_id, parts.day) == ("sw", "n1", date(2026, 3, 1))
    assert parts.partition == "swarm_id=sw/node_id=n1/day=2026-03-01"
    assert not parts.name.startswith("c-")  # a compacted file's name
    for bad in (
        "stray.parquet",
        "swarm_id=sw/node_id=n1/stray.parquet",
        "swarm_id=sw/node_id=1bad/day=2026-03-01/x.parquet",
        "swarm_id=sw/node_id=n1/day=2026-13-01/x.parquet",
        "swarm_id=sw/node_id=n1/day=2026-03-01/deeper/x.parquet",
    ):
        assert parse_key(bad) is None, bad


def test_compacted_key_depends_only_on_the_set_of_inputs():
    part = "swarm_id=sw/node_id=n1/day=2026-03-01"
    a = compacted_key(part, ["k2", "k1"])
    assert a == compacted_key(part, ["k1", "k2"])
    assert parse_key(a) is not None and parse_key(a).name.startswith("c-")  # type: ignore[union-attr]
    assert digest(["a"]) != digest(["b"])
