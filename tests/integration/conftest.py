"""Fixtures of the integration tests that more than one module shares."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.mlflow_store import copy_new_stores_from


@pytest.fixture(autouse=True, scope="session")
def _new_mlflow_stores_copied(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """MLflow's schema migrated once a session, not once a test (tests/mlflow_store.py)."""
    undo = copy_new_stores_from(tmp_path_factory.mktemp("mlflow-template") / "mlflow.db")
    yield
    undo()


@pytest.fixture(scope="session")
def prefect_harness() -> Iterator[None]:
    """Prefect's test harness (a temporary database and server), started once a session:
    each start costs seconds of server boot."""
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=300):
        yield
