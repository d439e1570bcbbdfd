"""MLflow calls retry under the tracker's RetryPolicy, then warn and give up: logging never
stops a node."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from flows.tracking import Tracker, attempt
from ledger.retrying import RetryPolicy

pytest.importorskip("mlflow")

FAST = RetryPolicy(attempts=3, initial_wait_s=0.0, max_wait_s=0.0, jitter_s=0.0)


class BusyClient:
    """An MlflowClient whose store is locked for the first ``failures`` calls of each kind."""

    def __init__(self, failures: int) -> None:
        self.failures = failures
        self.calls: dict[str, int] = {}

    def _call(self, name: str) -> None:
        self.calls[name] = self.calls.get(name, 0) + 1
        if self.calls[name] <= self.failures:
            raise RuntimeError("(sqlite3.OperationalError) database is locked\n[SQL: INSERT ...]")

    def log_batch(self, run_id: str, **kwargs: Any) -> None:
        self._call("log_batch")

    def log_artifacts(self, run_id: str, local_dir: str, path: str) -> None:
        self._call("log_artifacts")


def tracker(client: BusyClient) -> Tracker:
    made = Tracker.__new__(Tracker)
    made.client = client  # type: ignore[assignment]  # a stand-in for MlflowClient
    made.retry, made.uri, made.experiment_id = FAST, "test", "0"
    return made


def test_a_busy_store_is_retried_until_it_answers() -> None:
    client = BusyClient(failures=2)
    tracker(client).log_metrics("run", {"loss": 1.0}, step=0)
    assert client.calls["log_batch"] == 3


def test_a_dead_store_costs_attempts_calls_and_one_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    client = BusyClient(failures=99)
    with caplog.at_level(logging.WARNING, logger="flows.tracking"):
        tracker(client).set_tags("run", {"a": "b"})
        tracker(client).log_artifacts("run", "/nowhere", "model")
    assert client.calls == {"log_batch": 3, "log_artifacts": 2}  # artifacts: two tries at most
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warnings == [
        "tracking: set tags failed after 3 attempts: (sqlite3.OperationalError) database is locked",
        "tracking: log artifacts failed after 2 attempts: "
        "(sqlite3.OperationalError) database is locked",
    ]


def test_a_store_found_away_is_not_asked_again_for_a_while_but_metrics_are() -> None:
    """Issue 60: after a call failed every attempt, the tracker's other calls fail at once
    for `AWAY_S` (a round costs one call's retries, not every call's); logging metrics,
    once a round, still tries, and finds the store back."""
    client = BusyClient(failures=99)
    dead = tracker(client)
    dead.set_tags("run", {"a": "b"})
    dead.set_tags("run", {"a": "b"})  # skipped: no call
    dead.log_artifacts("run", "/nowhere", "model")  # skipped too
    assert client.calls == {"log_batch": 3}
    assert not dead.log_metrics("run", {"own_reward": 1.0}, step=0)  # tried: 3 more calls
    assert client.calls == {"log_batch": 6}
    client.failures = 0  # back
    assert dead.log_metrics("run", {"own_reward": 1.0}, step=0, timestamp_ms=5)
    assert client.calls == {"log_batch": 7}


def test_attempt_returns_the_value_or_none() -> None:
    assert attempt(lambda: 7, "seven", FAST) == 7
    assert attempt(lambda: 1 / 0, "divide", FAST) is None


def test_a_missing_mlflow_is_an_install_problem_raised_at_once() -> None:
    calls = []

    def open_store() -> None:
        calls.append(1)
        raise ModuleNotFoundError("No module named 'mlflow'")

    with pytest.raises(ModuleNotFoundError):
        attempt(open_store, "open tracking", FAST)
    assert len(calls) == 1
