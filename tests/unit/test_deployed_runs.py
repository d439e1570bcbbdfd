"""What a deployed node's run resolves: its rounds, its folder and its tracking store."""

from __future__ import annotations

import pytest
import yaml

from flows.config import load_swarm
from flows.node.lifecycle import finished, logs_its_model, reached_the_end, rounds_to_run


@pytest.mark.parametrize(
    ("start", "end", "until", "more", "expected"),
    [
        (0, 3, 3, None, range(0, 3)),  # `sapo swarm`, `sapo node`: up to the swarm's rounds
        (1, 3, 3, None, range(1, 3)),  # resumed from round 1's checkpoint
        (0, 3, 3, 1, range(0, 1)),  # a scheduled run adds one round...
        (2, 3, 3, 2, range(2, 3)),  # ...or fewer, up to the last...
        (3, 3, 3, 1, range(3, 3)),  # ...and none once the swarm is done
        (3, 3, None, 2, range(3, 5)),  # `sapo node --more-rounds 2` goes past it
    ],
)
def test_rounds_to_run(
    start: int, end: int, until: int | None, more: int | None, expected: range
) -> None:
    assert rounds_to_run(start, end, until, more) == expected


def test_the_end_of_a_swarm_is_its_last_round() -> None:
    assert not reached_the_end(2, 3) and reached_the_end(3, 3) and reached_the_end(5, 3)


@pytest.mark.parametrize(
    ("next_round", "until", "ran", "missing", "log_models", "expected"),
    [
        (3, 3, True, True, True, True),  # the run that reached the last round logs it
        (2, 3, True, True, True, False),  # a scheduled run of a few rounds before it: not yet
        (3, 3, False, False, True, False),  # a later run, the model logged: nothing to do
        (3, 3, False, True, True, True),  # a later run, the model missing (upload failed)
        (5, None, True, True, True, True),  # `--more-rounds` past the end: logs again
        (1, None, True, True, True, True),  # `sapo node --more-rounds` (no bound): logs
        (3, 3, True, True, False, False),  # models not logged at all
    ],
)
def test_when_a_run_logs_the_nodes_model(
    next_round: int, until: int | None, ran: bool, missing: bool, log_models: bool, expected: bool
) -> None:
    asked: list[bool] = []

    def model_missing() -> bool:
        asked.append(missing)  # an MLflow call: asked only when it decides
        return missing

    decision = logs_its_model(
        log_models=log_models,
        next_round=next_round,
        rounds=3,
        until_round=until,
        ran_rounds=ran,
        model_missing=model_missing,
    )
    assert decision is expected
    reached = next_round >= 3 or until is None
    assert bool(asked) == (log_models and reached and not ran)


def test_a_node_is_finished_when_its_rounds_ran_and_its_model_is_where_it_should_be() -> None:
    assert finished(3, 3, tracking_incomplete=lambda: False)
    assert not finished(3, 3, tracking_incomplete=lambda: True)  # the next run logs what is missing

    def never() -> bool:
        raise AssertionError("MLflow asked about a node that has rounds to run")

    assert not finished(2, 3, tracking_incomplete=never)


def test_the_tracking_store_is_the_files_else_the_environments_else_a_local_file(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    local = load_swarm(text=yaml.safe_dump({"workdir": "/tmp/sapo-t"}))
    assert local.tracking_uri() == "sqlite:////tmp/sapo-t/mlflow.db"
    assert local.artifact_location() == "file:///tmp/sapo-t/mlartifacts"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://127.0.0.1:5000")
    # A server keeps artifacts where it was told to (a bucket), not in a node's folder.
    assert local.tracking_uri() == "http://127.0.0.1:5000"
    assert local.artifact_location() is None
    named = load_swarm(
        text=yaml.safe_dump({"workdir": "/tmp/sapo-t", "tracking": {"uri": "sqlite:///x.db"}})
    )
    assert named.tracking_uri() == "sqlite:///x.db"
    assert named.artifact_location() == "file:///tmp/sapo-t/mlartifacts"


@pytest.mark.parametrize(
    ("flag", "actives", "expected"),
    [
        (False, [True], False),  # deployed, scheduled
        (True, [True], True),  # a finished node paused its deployment
        (False, [False], True),  # paused by hand: `prefect deployment schedule pause`
        (False, [True, False], False),  # one schedule of two still runs
        (False, [], False),  # no schedule: nothing to pause
    ],
)
def test_a_deployment_reads_paused_however_it_was_paused(
    flag: bool, actives: list[bool], expected: bool
) -> None:
    from datetime import timedelta
    from types import SimpleNamespace

    from prefect.client.schemas.objects import DeploymentSchedule
    from prefect.client.schemas.schedules import IntervalSchedule

    from flows.services.deploy import paused

    schedules = [
        DeploymentSchedule(schedule=IntervalSchedule(interval=timedelta(seconds=300)), active=a)
        for a in actives
    ]
    assert paused(SimpleNamespace(paused=flag, schedules=schedules)) is expected
