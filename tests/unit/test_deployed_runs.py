"""What a deployed node's run resolves: its rounds, its folder and its tracking store."""

from __future__ import annotations

import pytest
import yaml

from flows.config import load_swarm
from flows.round import rounds_to_run


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
