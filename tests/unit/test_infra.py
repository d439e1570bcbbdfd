"""The compose stack for real users: it parses, and its services, ports and volumes are what
infra/README.md says. (No Docker engine runs here; the swarm config it ships is exercised
against the S3 server fixture in tests/e2e.)"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from flows.config import load_swarm
from ledger.storage.settings import S3Settings

INFRA = Path(__file__).resolve().parents[2] / "infra"


def compose() -> dict:  # type: ignore[type-arg]
    return yaml.safe_load((INFRA / "docker-compose.yml").read_text())


def test_services_ports_and_volumes() -> None:
    spec = compose()
    services = spec["services"]
    assert set(services) == {"minio", "create-buckets", "postgres", "prefect", "mlflow"}
    ports = {n: sorted(p.split(":")[0] for p in s.get("ports", [])) for n, s in services.items()}
    assert ports["minio"] == ["9000", "9001"]
    assert ports["prefect"] == ["4200"] and ports["mlflow"] == ["5000"]
    assert set(spec["volumes"]) == {"minio-data", "postgres-data"}
    assert "minio-data:/data" in services["minio"]["volumes"]


def test_prefect_and_mlflow_use_postgres_and_the_bucket() -> None:
    services = compose()["services"]
    prefect_db = services["prefect"]["environment"]["PREFECT_API_DATABASE_CONNECTION_URL"]
    assert prefect_db.startswith("postgresql+asyncpg://")
    command = services["mlflow"]["command"]
    assert "--backend-store-uri postgresql://" in command
    assert "--artifacts-destination s3://${MLFLOW_BUCKET}" in command
    assert services["mlflow"]["environment"]["MLFLOW_S3_ENDPOINT_URL"] == "http://minio:9000"
    assert "CREATE DATABASE mlflow" in (INFRA / "postgres-init.sql").read_text()


def test_every_variable_has_an_example() -> None:
    text = (INFRA / "docker-compose.yml").read_text()
    used = set(re.findall(r"\$\{([A-Z_]+)(?::-[^}]*)?\}", text))
    defaulted = set(re.findall(r"\$\{([A-Z_]+):-", text))
    assert {"MINIO_ROOT_PASSWORD", "POSTGRES_PASSWORD", "MLFLOW_BUCKET"} <= used
    example = dict(
        line.split("=", 1)
        for line in (INFRA / ".env.example").read_text().splitlines()
        if line and not line.startswith("#")
    )
    assert used - defaulted <= set(example), used - defaulted - set(example)


def test_the_infra_swarm_file_takes_the_services_from_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """One file for every machine: the bucket's endpoint, the tracking server and the Prefect
    server are what the machine exports (what `sapo infra up` prints), not addresses pinned
    in the file, which would win over the variables and send a worker to its own localhost
    (issue 47's review: `sapo deploy -c infra/swarm.yaml` as docs/running.md runs it)."""
    services = {
        "AWS_ENDPOINT_URL": "http://10.0.0.5:9000",
        "MLFLOW_TRACKING_URI": "http://10.0.0.5:5000",
        "PREFECT_API_URL": "http://10.0.0.5:4200/api",
    }
    for name, value in services.items():
        monkeypatch.setenv(name, value)
    swarm = load_swarm(INFRA / "swarm.yaml")
    assert swarm.ledger.url == "s3://sapo-ledger/ledger"
    endpoint = S3Settings.resolve(swarm.ledger.storage_options).endpoint_url
    assert endpoint == services["AWS_ENDPOINT_URL"]
    assert swarm.tracking_uri() == services["MLFLOW_TRACKING_URI"]
    assert swarm.prefect_api_url() == services["PREFECT_API_URL"]
    assert len(swarm.nodes) == 3


def test_the_compose_walkthrough_exports_every_service_the_swarm_file_needs() -> None:
    readme = (INFRA / "README.md").read_text()
    block = readme[readme.index("docker compose -f infra/docker-compose.yml") :]
    block = block[: block.index("```")]
    exported = dict(re.findall(r"\b([A-Z][A-Z0-9_]+)=(\S+)", block))
    assert exported["AWS_ENDPOINT_URL"] == "http://127.0.0.1:9000"  # the compose file's ports
    assert exported["MLFLOW_TRACKING_URI"] == "http://127.0.0.1:5000"
    assert exported["PREFECT_API_URL"] == "http://127.0.0.1:4200/api"


def test_restart_takes_prefect_or_mlflow_and_says_so_in_one_line(tmp_path: Path) -> None:
    """`sapo infra restart` (issue 60): the services whose state is in PostgreSQL; anything
    else, or a home with no stack, is one line and exit 2 (the restart itself runs in
    tests/e2e/test_hosts_stack.py)."""
    from typer.testing import CliRunner

    from flows.cli import app

    runner = CliRunner()
    wrong = runner.invoke(app, ["infra", "restart", "s3", "--home", str(tmp_path)])
    assert wrong.exit_code == 2
    assert wrong.output.strip().endswith("only prefect and mlflow restart alone, not 's3'")
    none = runner.invoke(app, ["infra", "restart", "mlflow", "--home", str(tmp_path)])
    assert none.exit_code == 2 and "no stack at" in none.output and "infra up" in none.output
