"""Writes to S3 as the server sees them: each new object is one conditional PUT, which the
server refuses for a key that exists, so a publish costs one round trip per object written
(on a slow link, each request is a round trip: benchmarks/slow_link.py)."""

from __future__ import annotations

import pytest

from tests.conftest import LedgerSite, S3Server
from tests.factories import round_rows

pytestmark = pytest.mark.s3


def _spent(store, before: dict[str, int]) -> dict[str, int]:
    return {k: n - before.get(k, 0) for k, n in store.requests.items() if n - before.get(k, 0)}


def test_a_publish_is_one_put_per_object_and_a_retry_writes_nothing(s3_site: LedgerSite) -> None:
    led = s3_site.open()
    inner = led.store.inner  # the S3 store under the change log
    before = dict(inner.requests)
    keys = led.publish(round_rows("n1", 0, [[1, 0], [0, 1]]))
    # the round's file and its change marker, each one PUT: nothing asked first
    assert _spent(inner, before) == {"put": 2}
    data = inner.read(keys[0])
    before = dict(inner.requests)
    assert led.publish(round_rows("n1", 0, [[1, 0], [0, 1]])) == keys  # a retry
    assert "head" not in _spent(inner, before)
    assert inner.read(keys[0]) == data


def test_the_server_refuses_to_overwrite_an_object(s3_site: LedgerSite) -> None:
    inner = s3_site.open().store.inner
    assert inner.put_new("_samples/x.jsonl", b"first")
    assert not inner.put_new("_samples/x.jsonl", b"second, a forgery")
    assert inner.read("_samples/x.jsonl") == b"first"


def test_without_conditional_writes_a_write_asks_first(s3_server: S3Server) -> None:
    options = {**s3_server.storage_options, "conditional_writes": False}
    inner = LedgerSite(f"s3://{s3_server.new_bucket()}/ledger", options, "s3").open().store.inner
    assert inner.put_new("_samples/x.jsonl", b"first")
    before = dict(inner.requests)
    assert not inner.put_new("_samples/x.jsonl", b"second")
    assert _spent(inner, before) == {"head": 1}
    assert inner.read("_samples/x.jsonl") == b"first"
