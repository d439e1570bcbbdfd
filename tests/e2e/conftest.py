"""Fixtures of the whole-swarm tests."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from flows.services.prefect_server import local_prefect_server


@pytest.fixture
def prefect_api(tmp_path: Path) -> Iterator[str]:
    """One Prefect server on loopback for a test's node processes (as a user's stack or a
    worker has one), stopped after the test. Without it each node process starts Prefect's
    ephemeral server, 10-20 s of the 2 cores a start: tests whose subject is not that default
    path (tests/e2e/test_swarm.py runs it) point their nodes here."""
    with local_prefect_server(tmp_path / "prefect") as api:
        yield api
