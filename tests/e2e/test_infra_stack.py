"""`sapo infra up|status|down`: PostgreSQL, an S3 server, Prefect on PostgreSQL and MLflow
on PostgreSQL with artifacts in the bucket, from packages on 127.0.0.1, each checked through
its own API, and nothing left running after `down`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from flows import stack as stack_module
from tests.e2e.test_swarm import swarm_file, tiny_model  # noqa: F401  (fixture)
from tests.factories import round_rows

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


def _sapo(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "flows.cli", *args],
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
        timeout=600,
    )


def _exports(text: str) -> dict[str, str]:
    pairs = [line.removeprefix("export ").split("=", 1) for line in text.splitlines()]
    return {p[0]: p[1] for p in pairs if len(p) == 2 and p[0].isupper()}


def test_the_stack_comes_up_serves_and_goes_down(tmp_path: Path, tiny_model: Path) -> None:  # noqa: F811
    home = tmp_path / "stack"
    started = _sapo("infra", "up", "--home", str(home), "--free-ports")
    assert started.returncode == 0, started.stderr
    try:
        env = _exports(started.stdout)
        stack = stack_module.Stack.load(home)
        assert env == stack.client_env()
        status = _sapo("infra", "status", "--home", str(home), "--json")
        assert status.returncode == 0 and json.loads(status.stdout) == {
            "prefect": True,
            "mlflow": True,
            "s3": True,
            "postgres": True,
        }
        _check_services(stack, env)
        _check_deployments(stack, env, swarm_file(tmp_path, tiny_model, node_count=3))
    finally:
        stopped = _sapo("infra", "down", "--home", str(home))
    assert stopped.returncode == 0, stopped.stderr
    assert set(stopped.stdout.split(": ", 1)[1].strip().split(", ")) == {
        "mlflow",
        "prefect",
        "s3",
        "postgres",
    }
    for pid in stack.pids.values():
        assert not stack_module._alive(pid)
    assert not Path(stack.pg_data).exists()
    assert _sapo("infra", "status", "--home", str(home)).returncode == 2  # no stack there


def _check_services(stack: stack_module.Stack, env: dict[str, str]) -> None:
    """Each service through its own API, the way nodes use them."""
    script = f"""
import json, os, duckdb, mlflow, s3fs
from prefect.client.orchestration import get_client
from prefect.client.schemas.actions import WorkPoolCreate
from ledger import Ledger
from tests.e2e.test_swarm import swarm_file, tiny_model  # noqa: F401  (fixture)
from tests.factories import round_rows

# Prefect: a work pool, created and read back through the API.
with get_client(sync_client=True) as client:
    client.create_work_pool(WorkPoolCreate(name="machines", type="process"))
    pool = client.read_work_pool("machines").name
# MLflow: a run with a metric and an artifact, which lands in the bucket.
mlflow.set_experiment("stack-check")
with mlflow.start_run() as run:
    mlflow.log_metric("reward_mean", 0.5)
    mlflow.log_text("hello", "note.txt")
fs = s3fs.S3FileSystem(client_kwargs={{"endpoint_url": os.environ["AWS_ENDPOINT_URL"]}})
artifacts = [p for p in fs.find("{stack.env["MLFLOW_BUCKET"]}") if p.endswith("note.txt")]
metric = mlflow.get_run(run.info.run_id).data.metrics["reward_mean"]
# The ledger in the same bucket, read back by plain DuckDB.
led = Ledger("{stack.ledger_url}")
led.publish(round_rows("a", 0, [[1, 0]]))
con = duckdb.connect()
led.store.configure_duckdb(con)
rows = con.execute(
    "SELECT count(*) FROM read_parquet('{stack.ledger_url}/**/*.parquet', hive_partitioning=true)"
).fetchone()[0]
print(json.dumps({{"pool": pool, "artifacts": artifacts, "metric": metric, "rows": rows}}))
"""
    done = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        env={**os.environ, **env},
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["pool"] == "machines"
    assert seen["metric"] == 0.5 and len(seen["artifacts"]) == 1
    assert seen["rows"] == len(round_rows("a", 0, [[1, 0]]))
    # Prefect and MLflow keep their state in PostgreSQL, not in SQLite files.
    for database, table in (("prefect", "work_pool"), ("mlflow", "runs")):
        count = subprocess.run(
            ["psql", stack.database_url(database), "-tAc", f"SELECT count(*) FROM {table}"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert count.returncode == 0, count.stderr
        assert int(count.stdout.strip()) >= 1


def _check_deployments(stack: stack_module.Stack, env: dict[str, str], swarm: Path) -> None:
    """`sapo deploy --work-pool` registers one deployment per node on a process pool (made
    if missing): the flow by module path (workers import it, no checkout needed), one run at
    a time, node-0 pinned to its machine's queue."""
    import httpx

    registered = _sapo(
        "deploy", "-c", str(swarm), "--work-pool", "machines", "--interval", "3600",
        "--pin", "node-0=machine-a", env=env,
    )  # fmt: skip
    assert registered.returncode == 0, registered.stderr[-2000:]
    assert "registered 3 deployments with work pool 'machines'" in registered.stdout
    api = stack.prefect_api_url
    deployments = httpx.post(f"{api}/deployments/filter", json={}, timeout=30).json()
    by_name = {d["name"]: d for d in deployments}
    assert set(by_name) == {f"e2e-swarm-node-{i}" for i in range(3)}
    for name, d in by_name.items():
        assert d["entrypoint"] == "flows.round.node_flow"
        assert d["work_pool_name"] == "machines"
        assert d["work_queue_name"] == ("machine-a" if name.endswith("node-0") else "default")
        assert d["parameters"]["node_id"] == name.removeprefix("e2e-swarm-")
        # One run at a time (Prefect 3 keeps it as the deployment's concurrency limit object).
        limit = d.get("concurrency_limit") or (d.get("global_concurrency_limit") or {}).get("limit")
        assert limit == 1
        assert d["schedules"][0]["schedule"]["interval"] == 3600
    pool = httpx.get(f"{api}/work_pools/machines", timeout=30).json()
    assert pool["type"] == "process"
    bad = _sapo("deploy", "-c", str(swarm), "--work-pool", "machines", "--interval", "60",
                "--pin", "node-9=x", env=env)  # fmt: skip
    assert bad.returncode == 2 and "pinned nodes not in the swarm: node-9" in bad.stderr
