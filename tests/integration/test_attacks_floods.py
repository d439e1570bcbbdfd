"""Issue 27, floods a peer can write under its own prefix: sample logs of tens of MB, and
thousands of folders under ``_signatures/``.

A sample log bigger than any node writes (J <= 1024 lines) is skipped unread; signatures are
read by key and never listed, so folders of them cost a refresh nothing. On main at 9f11f5f
readers took 30-64 s and 1.2 GB over the logs, and every refresh walked the folders.
"""

from __future__ import annotations

from ledger import identity as ident
from ledger import node_logs
from tests import hostile
from tests.factories import round_rows


def test_a_sample_log_bigger_than_any_node_writes_is_skipped_unread(site):
    led = site.open()
    led.publish(round_rows("good1", 0, [[1, 0]]))
    line = b'{"node_round": 0, "group_id": "' + b"g" * 100 + b'", "peer_node_id": "good1"}\n'
    big = line * (2 * node_logs.SAMPLES.max_bytes // len(line))  # 2 MB of honest-looking lines
    key = "_samples/swarm_id=sw/node_id=evil/day=2026-03-01/s00000000-0123456789abcdef0123.jsonl"
    hostile.put_raw(led, key, big)
    reader = site.open()
    assert reader.query("SELECT count(*) FROM samples").item() == 0
    assert reader.validate().skipped[node_logs.OVERSIZED] == 1
    assert reader.query("SELECT count(*) FROM rollouts").item() == 2


def test_folders_of_signatures_are_never_listed(site):
    led = site.open()
    led.publish(round_rows("good1", 0, [[1, 0]]))
    store = getattr(led.store, "inner", led.store)  # S3: the store under the change log
    if site.kind == "s3":
        store.page_keys = 10  # a few keys make several pages
    # Keys that sort before and after `_signatures/`, and 60 signature objects under the
    # attacker's own names, each in a folder of its own.
    store.put_new("_samples/swarm_id=sw/node_id=a/day=2026-03-01/s1-x.jsonl", b"{}\n")
    store.put_new(ident.swarm_rules_key("sw"), ident.rules_object("open"))
    for i in range(60):
        key = f"swarm_id=sw/node_id=evil/day=2026-03-01/r{i:08d}-x.parquet"
        store.put_new(ident.signature_key(key, f"{i:064x}"), b"{}")
    listed = {o.key for o in store.list(skip=ident.SIGNATURES_PREFIX)}
    every = {o.key for o in store.list()}
    assert every - listed == {k for k in every if k.startswith(ident.SIGNATURES_PREFIX)}
    assert len(every - listed) == 60
    assert "_samples/swarm_id=sw/node_id=a/day=2026-03-01/s1-x.jsonl" in listed
    assert ident.swarm_rules_key("sw") in listed
    assert sum(k.startswith("swarm_id=sw/node_id=good1/") for k in listed) == 1
    store.requests.clear()
    store.list()
    walked = store.requests["list"]  # S3: 7 pages of 10; local: 60-odd folders, every time
    store.requests.clear()
    store.list(skip=ident.SIGNATURES_PREFIX)
    assert walked >= 7 and store.requests["list"] <= (2 if site.kind == "s3" else 20)
    assert site.open().query("SELECT count(*) FROM rollouts").item() == 2
    if site.kind == "s3":  # the change log's held listing leaves them out too
        assert not any(o.key.startswith(ident.SIGNATURES_PREFIX) for o in led.store.list())
