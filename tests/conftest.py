"""Shared fixtures: ledgers on local disk and on a real S3 API over HTTP (moto's server)."""

from __future__ import annotations

import logging
import os
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest

from flows.env import apply_offline_defaults

apply_offline_defaults()
# moto and botocore need a region; bucket creation fails with a location constraint if it is
# passed as a client argument instead (see shared/ENVIRONMENT.md).
os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")
logging.getLogger("werkzeug").setLevel(logging.WARNING)  # moto's request log


@dataclass
class S3Server:
    endpoint_url: str
    key: str = "testing"
    secret: str = "testing"

    @property
    def storage_options(self) -> dict[str, Any]:
        return {"key": self.key, "secret": self.secret, "endpoint_url": self.endpoint_url}

    def client(self) -> Any:
        import boto3

        return boto3.client(
            "s3",
            endpoint_url=self.endpoint_url,
            aws_access_key_id=self.key,
            aws_secret_access_key=self.secret,
        )

    def new_bucket(self) -> str:
        name = "sapo-" + uuid.uuid4().hex[:12]
        self.client().create_bucket(Bucket=name)
        return name


@pytest.fixture(scope="session")
def s3_server() -> Iterator[S3Server]:
    """moto's S3 server on loopback only, stopped when the session ends."""
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    try:
        yield S3Server(endpoint_url=f"http://{host}:{port}")
    finally:
        server.stop()


@dataclass
class LedgerSite:
    """Where a test's ledger lives; ``open()`` gives an independent reader/writer."""

    url: str
    storage_options: dict[str, Any] = field(default_factory=dict)
    kind: str = "local"

    def open(self, **kwargs: Any) -> Any:
        from ledger import Ledger

        return Ledger(self.url, self.storage_options or None, **kwargs)


@pytest.fixture(params=["local", pytest.param("s3", marks=[pytest.mark.s3])])
def site(request: pytest.FixtureRequest, tmp_path: Any) -> LedgerSite:
    """The same contract, run on a local directory and on S3 over HTTP (one bucket a test)."""
    if request.param == "local":
        return LedgerSite(str(tmp_path / "ledger"))
    server: S3Server = request.getfixturevalue("s3_server")
    bucket = server.new_bucket()
    return LedgerSite(f"s3://{bucket}/ledger", server.storage_options, "s3")


@pytest.fixture
def local_site(tmp_path: Any) -> LedgerSite:
    return LedgerSite(str(tmp_path / "ledger"))


def rows_of(table: Any) -> list[dict[str, Any]]:
    return table.to_pylist()


MakeRound = Callable[..., Any]


@pytest.fixture
def make_round() -> MakeRound:
    from ledger.synthetic import synthetic_round

    return synthetic_round


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "/integration/" in str(item.path):
            item.add_marker(pytest.mark.integration)
