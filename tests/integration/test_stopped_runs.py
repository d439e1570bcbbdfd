"""A stopped node's MLflow run says it was stopped (issue 47: after Ctrl-C the node runs
stayed RUNNING in MLflow while nothing ran; a node the launcher stopped by SIGTERM marked its
own run FAILED)."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest
from prefect.exceptions import TerminationSignal

from flows.tracking import open_tracker
from tests.integration.test_round_steps import make_swarm


def test_a_stopped_swarm_marks_its_running_node_runs_killed(tmp_path: Path) -> None:
    from flows.swarm.launcher import stop_runs

    tracker = open_tracker(f"sqlite:///{tmp_path / 'mlflow.db'}", "stops", str(tmp_path / "a"))
    parent = tracker.run("swarm", {})
    assert parent is not None
    cut = tracker.run("node-0", {"sapo.node_id": "node-0"}, parent_id=parent)
    done = tracker.run("node-1", {"sapo.node_id": "node-1"}, parent_id=parent)
    assert cut is not None and done is not None
    tracker.finish(done)
    stop_runs(tracker, parent)
    status = {r: tracker.client.get_run(r).info.status for r in (parent, cut, done)}
    assert status == {parent: "KILLED", cut: "KILLED", done: "FINISHED"}


def mid_query() -> RuntimeError:
    """What DuckDB 1.5 raises for a Ctrl-C mid-query (tests/unit/test_stop_signal.py)."""
    error = RuntimeError("Query interrupted")
    error.__cause__ = KeyboardInterrupt()
    return error


@pytest.mark.parametrize(
    "stop",
    [
        KeyboardInterrupt(),  # Ctrl-C in `sapo node`
        TerminationSignal(signal.SIGTERM),  # a stopping launcher's SIGTERM, as Prefect raises it
        mid_query(),  # Ctrl-C in a DuckDB query: its RuntimeError, raised from the interrupt
    ],
    ids=["ctrl-c", "sigterm", "ctrl-c-mid-query"],
)
def test_a_node_interrupted_mid_round_marks_its_run_killed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, stop: BaseException
) -> None:
    import mlflow

    from flows.node import round as node_round

    def stopped(*args: object, **kwargs: object) -> None:
        raise stop  # as it arrives mid-round

    swarm = make_swarm(tmp_path, rounds=1, tracking={"enabled": True})
    monkeypatch.setattr(node_round, "round_flow", stopped)
    with pytest.raises(type(stop)):
        node_round.node_flow.fn("a", swarm=swarm)
    mlflow.set_tracking_uri(swarm.tracking_uri())
    (run,) = mlflow.search_runs(search_all_experiments=True, output_format="list")
    assert run.info.status == "KILLED"
