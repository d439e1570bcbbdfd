"""One retry layer at the I/O boundary: a failing read lists the store `attempts` times, not
attempts to the power of the number of layers; a persistent failure is one clear line."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import duckdb
import pytest
from pydantic import ValidationError

from ledger import Ledger, LedgerConfig, StorageError
from ledger.retrying import RetryPolicy, call_with_retry
from ledger.storage import ObjectInfo
from tests.factories import open_ledger, round_rows

NO_WAIT = {"initial_wait_s": 0.0, "max_wait_s": 0.0, "jitter_s": 0.0}


def policy(attempts: int) -> RetryPolicy:
    return RetryPolicy(attempts=attempts, **NO_WAIT)


class Flaky:
    """Wraps a callable: raises ``error`` on the first ``failures`` calls (all, if None)."""

    def __init__(self, call: Callable[..., Any], failures: int | None, error: BaseException):
        self.call, self.failures, self.error, self.calls = call, failures, error, 0

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        self.calls += 1
        if self.failures is None or self.calls <= self.failures:
            raise self.error
        return self.call(*args, **kwargs)


@pytest.fixture
def filled(tmp_path: Any) -> str:
    url = str(tmp_path / "ledger")
    writer = Ledger.open(url)
    writer.publish(round_rows("me", 0, [[1, 0]]))
    writer.publish(round_rows("peer", 0, [[1, 0], [0, 1, 1]]))
    writer.close()
    return url


def test_policy_bounds_and_unknown_keys() -> None:
    assert RetryPolicy().attempts >= 1
    with pytest.raises(ValidationError):
        RetryPolicy(attempts=0)
    with pytest.raises(ValidationError, match="max_wait_s"):
        RetryPolicy(initial_wait_s=2.0, max_wait_s=1.0)
    with pytest.raises(ValidationError, match="retries"):
        RetryPolicy.model_validate({"retries": 3})
    cfg = LedgerConfig.model_validate({"url": "x", "retry": {"attempts": 2, "jitter_s": 0}})
    assert cfg.retry == RetryPolicy(attempts=2, jitter_s=0.0)
    with pytest.raises(ValidationError, match="fetch_retries"):
        LedgerConfig.model_validate({"url": "x", "fetch_retries": 3})


def test_retrying_logs_each_retry_and_reraises(caplog: pytest.LogCaptureFixture) -> None:
    flaky = Flaky(lambda: "ok", 2, ConnectionError("refused"))
    with caplog.at_level(logging.INFO, logger="ledger.retrying"):
        assert call_with_retry(policy(3), flaky, (ConnectionError,), "ping") == "ok"
    assert flaky.calls == 3
    retries = [r.getMessage() for r in caplog.records if "ping failed" in r.getMessage()]
    assert len(retries) == 2 and "try 1 of 3" in retries[0] and "refused" in retries[0]
    never = Flaky(lambda: "ok", None, ValueError("a bug"))
    with pytest.raises(ValueError):  # not a retried kind: one call, raised as is
        call_with_retry(policy(3), never, (ConnectionError,), "ping")
    assert never.calls == 1


@pytest.mark.parametrize("failures", [1, 2])
def test_a_listing_that_fails_a_few_times_is_retried_by_the_ledger_alone(
    filled: str, monkeypatch: pytest.MonkeyPatch, failures: int
) -> None:
    led = open_ledger(filled, retry=policy(3))
    listing = Flaky(led.store.list, failures, StorageError("listing failed: timeout"))
    monkeypatch.setattr(led.store, "list", listing)
    drawn = led.sample("me", 5, seed=0)
    assert drawn.get_column("group_id").n_unique() == 2
    assert listing.calls == failures + 1


def test_a_persistent_listing_failure_lists_attempts_times_then_one_line(
    filled: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    led = open_ledger(filled, retry=policy(4))
    error = StorageError("listing on s3://b/ledger failed: connection refused\n  botocore trace")
    listing = Flaky(led.store.list, None, error)
    monkeypatch.setattr(led.store, "list", listing)
    with pytest.raises(StorageError) as raised:
        led.sample("me", 5, seed=0)
    assert listing.calls == 4  # not 4 x 4 x 6: one layer retries
    message = str(raised.value)
    assert "\n" not in message
    assert "failed after 4 attempts" in message and "connection refused" in message
    listing.calls = 0
    with pytest.raises(StorageError):
        led.query("SELECT count(*) FROM rollouts")
    assert listing.calls == 4


def test_a_read_that_keeps_failing_lists_once_per_attempt(
    filled: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    led = open_ledger(filled, retry=policy(3))
    listing = Flaky(led.store.list, 0, RuntimeError("never"))
    monkeypatch.setattr(led.store, "list", listing)
    fetch = Flaky(led.catalog.fetch_groups, None, duckdb.IOException("No files found: x"))
    monkeypatch.setattr(led.catalog, "fetch_groups", fetch)
    with pytest.raises(StorageError, match="after 3 attempts: No files found"):
        led.sample("me", 5, seed=0)
    assert (listing.calls, fetch.calls) == (3, 3)


def test_files_that_vanish_are_listed_once_more_then_left_out(
    filled: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A listed file gone before it is read (compaction) means a stale listing: the ledger
    lists once more; a file that vanishes from every listing (a peer deleting its own
    files as fast as it writes them) is left out of the read, never an error."""
    led = open_ledger(filled, retry=policy(3))
    real = led.store.list
    ghost = ObjectInfo("swarm_id=sw/node_id=ghost/day=2026-03-01/r00000000-x.parquet", None)
    ghosts = {"left": 1}

    def listing(prefix: str = "", skip: str = "") -> list[ObjectInfo]:
        calls["n"] += 1
        found = real(prefix, skip)
        if ghosts["left"]:
            ghosts["left"] -= 1
            found.append(ghost)
        return found

    calls = {"n": 0}
    monkeypatch.setattr(led.store, "list", listing)
    assert led.query("SELECT count(*) FROM rollouts").item() == 7
    assert calls["n"] == 2  # the stale listing, then one more
    assert led.refresh().vanished == 0

    ghosts["left"], calls["n"] = 99, 0
    assert led.refresh().vanished == 1  # still gone on the second listing: left out
    assert led.query("SELECT count(*) FROM rollouts").item() == 7
    assert calls["n"] == 4  # two listings per read, no retry loop


def test_a_write_is_retried_under_the_same_policy(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    led = open_ledger(str(tmp_path / "ledger"), retry=policy(3))
    put = Flaky(led.store.put_new, 2, StorageError("put failed: 503 Slow Down"))
    monkeypatch.setattr(led.store, "put_new", put)
    (key,) = led.publish(round_rows("a", 0, [[1, 0]]))
    assert put.calls == 3 and led.store.exists(key)

    dead = Flaky(led.store.put_new, None, StorageError("put failed: 503 Slow Down"))
    monkeypatch.setattr(led.store, "put_new", dead)
    with pytest.raises(StorageError, match="failed after 3 attempts: put failed"):
        led.publish(round_rows("a", 1, [[1, 0]]))
    assert dead.calls == 3
