"""`sapo infra up|status|down`: PostgreSQL, an S3 server, Prefect on PostgreSQL and MLflow
on PostgreSQL with artifacts in the bucket, from packages on 127.0.0.1, each checked through
its own API; deployments registered on a work pool; nothing is left running after `down`.
Three nodes running their scheduled rounds on two worker machines: tests/e2e/test_hosts_stack.py
(on a network of hosts), with the checks defined here."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from flows.services import deploy, stack_data
from flows.services import stack as stack_module
from tests.e2e.interrupting import processes_mentioning
from tests.e2e.test_deploy import _wait
from tests.e2e.test_swarm import swarm_file, tiny_model  # noqa: F401  (fixture)
from tests.factories import round_rows

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

SERVICES = {"mlflow", "prefect", "s3", "postgres"}


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


@pytest.fixture(scope="module")
def stack(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[stack_module.Stack, dict[str, str]]]:
    """The stack, up through the CLI for this module's tests (a test may bring it down and
    up again: the stack is read from its home at the end); `down --purge` at the end must
    stop every service it started and leave nothing behind, its data included."""
    home = tmp_path_factory.mktemp("stack")
    started = _up(home)
    try:
        yield stack_module.Stack.load(home), _exports(started)
    finally:
        last = stack_module.Stack.load(home)
        stopped = _sapo("infra", "down", "--home", str(home), "--purge")
    assert stopped.returncode == 0, stopped.stderr
    assert set(stopped.stdout.splitlines()[0].split(": ", 1)[1].split(", ")) == SERVICES
    for pid in last.pids.values():
        assert not stack_module._alive(pid)
    assert not Path(last.pg_data).exists() and not (home / stack_data.OBJECTS).exists()
    assert _sapo("infra", "status", "--home", str(home)).returncode == 2  # no stack there
    assert processes_mentioning(str(home)) == []


def _up(home: Path) -> str:
    """`sapo infra up` at ``home``; what it printed. The scheduler looks for new deployments
    every 5 s instead of 60: the tests' schedules start sooner, nothing else changes."""
    started = _sapo(
        "infra", "up", "--home", str(home), "--free-ports",
        env={"PREFECT_SERVER_SERVICES_SCHEDULER_LOOP_SECONDS": "5"},
    )  # fmt: skip
    assert started.returncode == 0, started.stderr
    return started.stdout


def test_each_service_answers_through_its_own_api(
    stack: tuple[stack_module.Stack, dict[str, str]],
    tmp_path: Path,
    tiny_model: Path,  # noqa: F811
) -> None:
    started, env = stack
    assert env == started.client_env()
    status = _sapo("infra", "status", "--home", started.home, "--json")
    assert status.returncode == 0 and json.loads(status.stdout) == dict.fromkeys(SERVICES, True)
    _check_services(started, env)
    _check_deployments(started, env, swarm_file(tmp_path, tiny_model, node_count=3))


def test_down_and_up_keep_what_the_stack_holds(
    stack: tuple[stack_module.Stack, dict[str, str]],
) -> None:
    """After the first test (a work pool and three deployments in Prefect; an MLflow run with
    a metric, an artifact in the bucket and a registered model version; a ledger round in the
    bucket), `sapo infra down` then `up` on the same home, on new ports, finds it all as it
    was (issue 61: `down` deleted the database and every object)."""
    started, env = stack
    before = _kept(env, started.ledger_url)
    assert before["rows"] > 0 and before["versions"] == ["1"] and before["metric"] == [0.5]
    assert before["files"] == ["note.txt"] and len(before["deployments"]) == 3
    stopped = _sapo("infra", "down", "--home", started.home)
    assert stopped.returncode == 0 and "its data is kept" in stopped.stdout, stopped.stderr
    again = _exports(_up(Path(started.home)))
    assert again["MLFLOW_TRACKING_URI"] != env["MLFLOW_TRACKING_URI"]  # new ports
    assert _kept(again, started.ledger_url) == before


def _kept(env: dict[str, str], ledger_url: str) -> dict[str, Any]:
    """What a user finds on the stack: ledger rows, the `stack-check` run's metric, the
    registered model's versions and the files of version 1, work pools and deployments."""
    script = f"""
import json, mlflow
from mlflow.tracking import MlflowClient
from prefect.client.orchestration import get_client
from ledger import Ledger

with Ledger.open("{ledger_url}") as led:
    rows = int(led.query("SELECT count(*) AS n FROM rollouts")["n"][0])
client = MlflowClient()
run = client.search_runs([client.get_experiment_by_name("stack-check").experiment_id])[0]
versions = sorted(v.version for v in client.search_model_versions("name = 'stack-check-model'"))
files = sorted(f.path for f in mlflow.artifacts.list_artifacts("models:/stack-check-model/1"))
with get_client(sync_client=True) as prefect:
    pools = sorted(p.name for p in prefect.read_work_pools())
    deployments = sorted(d.name for d in prefect.read_deployments())
print(json.dumps({{
    "rows": rows, "run": run.info.run_id, "versions": versions, "files": files,
    "metric": [m.value for m in client.get_metric_history(run.info.run_id, "reward_mean")],
    "pools": pools, "deployments": deployments,
}}))
"""
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True,
        env={**os.environ, **env}, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    seen: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return seen


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
    mlflow.log_text("hello", "model/note.txt")
registry = mlflow.tracking.MlflowClient()
registry.create_registered_model("stack-check-model")
registry.create_model_version(
    "stack-check-model", source=run.info.artifact_uri + "/model", run_id=run.info.run_id
)
fs = s3fs.S3FileSystem(client_kwargs={{"endpoint_url": os.environ["AWS_ENDPOINT_URL"]}})
artifacts = [p for p in fs.find("{stack.env["MLFLOW_BUCKET"]}") if p.endswith("note.txt")]
metric = mlflow.get_run(run.info.run_id).data.metrics["reward_mean"]
# The ledger in the same bucket, read back by plain DuckDB.
led = Ledger.open("{stack.ledger_url}")
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
    assert seen["metric"] == 0.5 and len(seen["artifacts"]) == 2
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
    registered = _sapo(
        "deploy", "-c", str(swarm), "--work-pool", "machines", "--interval", "3600",
        "--pin", "node-0=registry-check", env=env,
    )  # fmt: skip
    assert registered.returncode == 0, registered.stderr[-2000:]
    assert "registered 3 deployments with work pool 'machines'" in registered.stdout
    assert len(registered.stdout.splitlines()) == 1  # not Prefect's table per deployment
    api = stack.prefect_api_url
    deployments = httpx.post(f"{api}/deployments/filter", json={}, timeout=30).json()
    by_name = {d["name"]: d for d in deployments}
    assert set(by_name) == {f"e2e-swarm-node-{i}" for i in range(3)}
    for name, d in by_name.items():
        assert d["entrypoint"] == "flows.node.round.node_flow"
        # Nothing to fetch from the deployer's machine: no code path, no pull steps.
        assert d["path"] is None and not d["pull_steps"] and d["storage_document_id"] is None
        assert d["work_pool_name"] == "machines"
        assert d["work_queue_name"] == ("registry-check" if name.endswith("node-0") else "default")
        assert d["parameters"]["node_id"] == name.removeprefix("e2e-swarm-")
        # One run at a time (Prefect 3 keeps it as the deployment's concurrency limit object).
        limit = d.get("concurrency_limit") or (d.get("global_concurrency_limit") or {}).get("limit")
        assert limit == 1
        assert d["schedules"][0]["schedule"]["interval"] == 3600
        # It beats every 30 s, and imports the installed packages whatever the worker's folder.
        assert d["job_variables"]["env"] == {
            "PREFECT_FLOWS_HEARTBEAT_FREQUENCY": "30",
            "PYTHONSAFEPATH": "1",
        }
    pool = httpx.get(f"{api}/work_pools/machines", timeout=30).json()
    assert pool["type"] == "process"
    bad = _sapo("deploy", "-c", str(swarm), "--work-pool", "machines", "--interval", "60",
                "--pin", "node-9=x", env=env)  # fmt: skip
    assert bad.returncode == 2 and "pinned nodes not in the swarm: node-9" in bad.stderr


POOL = "swarm-pool"
MACHINES = {"machine-a": ["node-0", "node-1"], "machine-b": ["node-2"]}
"""Each worker machine (a host of tests/e2e/test_hosts_stack.py) and the nodes pinned to it.
The checks below are that test's: the deployed swarm runs there, on a network of hosts."""


def _models_logged(
    started: stack_module.Stack, workers: dict[str, subprocess.Popen[bytes]]
) -> set[str]:
    """The nodes whose MLflow run has its final model (logged after its last round)."""
    from mlflow.tracking import MlflowClient

    for machine, worker in workers.items():
        assert worker.poll() is None, f"the worker of {machine} exited"
    client = MlflowClient(started.mlflow_url)
    experiment = client.get_experiment_by_name("pool-swarm")
    if experiment is None:
        return set()
    runs = client.search_runs([experiment.experiment_id], "tags.`sapo.model_path` != ''")
    return {run.data.tags["sapo.node_id"] for run in runs}


def _running(started: stack_module.Stack, name: str) -> bool:
    found = httpx.post(
        f"{started.prefect_api_url}/flow_runs/filter",
        json={"flow_runs": {"name": {"any_": [name]}, "state": {"type": {"any_": ["RUNNING"]}}}},
        timeout=30,
    ).json()
    return bool(found)


def _check_crashed(started: stack_module.Stack, crashed: int = 1) -> None:
    """node-2's killed runs (``crashed``) were marked Crashed by `sapo deploy`'s automation
    (their heartbeats stopped), not left Running."""
    api = started.prefect_api_url
    deployment = httpx.get(f"{api}/deployments/name/sapo-node/pool-swarm-node-2", timeout=30).json()

    def runs() -> list[dict[str, Any]]:
        found: list[dict[str, Any]] = httpx.post(
            f"{api}/flow_runs/filter",
            json={"flow_runs": {"deployment_id": {"any_": [deployment["id"]]},
                                "state": {"type": {"any_": ["CRASHED", "RUNNING"]}}}},
            timeout=30,
        ).json()  # fmt: skip
        return found

    # The node's last run logs its model, then closes (its ledger index, its run): it may
    # still be Running when the model shows; a run left Running for good fails the wait.
    _wait(lambda: all(r["state_type"] != "RUNNING" for r in runs()), 120, "node-2's runs end")
    found = runs()
    assert [r["state_type"] for r in found] == ["CRASHED"] * crashed, found
    assert all("no heartbeat" in r["state"]["message"] for r in found)
    automations = httpx.post(f"{api}/automations/filter", json={}, timeout=30).json()
    assert [a["name"] for a in automations] == [deploy.CRASH_DETECTION]  # one, however often


def _check_prefect(started: stack_module.Stack, nodes: list[str]) -> None:
    """Prefect's API: every node's two rounds are completed `sapo-round` flow runs, inside
    runs of the node's deployment that its schedule created."""
    api = started.prefect_api_url
    rounds = httpx.post(
        f"{api}/flow_runs/filter",
        json={"flows": {"name": {"any_": ["sapo-round"]}},
              "flow_runs": {"state": {"type": {"any_": ["COMPLETED"]}}}},
        timeout=30,
    ).json()  # fmt: skip
    assert sorted(r["name"] for r in rounds) == [f"{n}-round-{i}" for n in nodes for i in range(2)]
    deployments = {
        d["id"]: d["name"]
        for d in httpx.post(f"{api}/deployments/filter", json={}, timeout=30).json()
    }
    # The node runs that held each round (scheduled runs are many: ask for these by id).
    task_runs = [
        httpx.get(f"{api}/task_runs/{r['parent_task_run_id']}", timeout=30).json() for r in rounds
    ]
    ids = [t["flow_run_id"] for t in task_runs]
    parents = {
        r["id"]: r
        for r in httpx.post(
            f"{api}/flow_runs/filter", json={"flow_runs": {"id": {"any_": ids}}}, timeout=30
        ).json()
    }
    for r, parent_id in zip(rounds, ids, strict=True):
        node_run = parents[parent_id]
        assert node_run["auto_scheduled"], "the round ran in a run its schedule created"
        node = r["name"].rsplit("-round-", 1)[0]
        assert deployments[node_run["deployment_id"]] == f"pool-swarm-{node}"


def _check_mlflow(started: stack_module.Stack, nodes: list[str]) -> None:
    """The MLflow server: one run per node with its per-round rewards, and its model's
    files in the bucket (served through the server's artifact proxy)."""
    import s3fs
    from mlflow.tracking import MlflowClient

    client = MlflowClient(started.mlflow_url)
    experiment = client.get_experiment_by_name("pool-swarm")
    assert experiment is not None
    runs = client.search_runs([experiment.experiment_id])
    assert sorted(r.data.tags["sapo.node_id"] for r in runs) == nodes  # one run per node
    fs = s3fs.S3FileSystem(
        key=started.env["MINIO_ROOT_USER"],
        secret=started.env["MINIO_ROOT_PASSWORD"],
        client_kwargs={"endpoint_url": started.s3_endpoint},
    )
    bucket = started.env["MLFLOW_BUCKET"]
    for run in runs:
        for key in ("own_reward", "cumulative_own_reward"):
            history = client.get_metric_history(run.info.run_id, key)
            assert sorted(m.step for m in history) == [0, 1], key
        own = sorted(client.get_metric_history(run.info.run_id, "own_reward"), key=lambda m: m.step)
        total = client.get_metric_history(run.info.run_id, "cumulative_own_reward")
        assert max(m.value for m in total) == pytest.approx(sum(m.value for m in own))
        assert run.info.artifact_uri.startswith("mlflow-artifacts:")
        model = run.data.tags["sapo.model_path"]
        files = fs.find(f"{bucket}/artifacts/{experiment.experiment_id}/{run.info.run_id}")
        assert model == "model-round-1" and any(f.endswith(f"{model}/MLmodel") for f in files)
        assert any(f.endswith(".safetensors") for f in files), files
        # Only the run that ended the last round logged a model, not every scheduled run.
        assert not [f for f in files if "/model-round-0/" in f]


def _check_ledger(started: stack_module.Stack, nodes: list[str]) -> None:
    """Plain DuckDB (its own S3 secret, no sapo code) reads every node's rows from the
    bucket: 2 rounds of 4 questions (I + J, all published) of 3 completions each."""
    import duckdb

    from ledger.duck import httpfs_extension_path

    con = duckdb.connect()
    con.execute(f"LOAD '{httpfs_extension_path()}'")
    endpoint = started.s3_endpoint.removeprefix("http://")
    con.execute(
        f"CREATE SECRET (TYPE s3, KEY_ID '{started.env['MINIO_ROOT_USER']}', "
        f"SECRET '{started.env['MINIO_ROOT_PASSWORD']}', ENDPOINT '{endpoint}', "
        "URL_STYLE 'path', USE_SSL false, REGION 'us-east-1')"
    )
    files = f"{started.ledger_url}/**/*.parquet"
    rows = con.execute(
        f"SELECT node_id, node_round, count(*) FROM read_parquet('{files}',"
        " hive_partitioning = true, union_by_name = true) WHERE swarm_id = 'pool-swarm'"
        " GROUP BY ALL ORDER BY ALL"
    ).fetchall()
    assert rows == [(node, r, 4 * 3) for node in nodes for r in range(2)]


def _check_compare(started: stack_module.Stack, env: dict[str, str]) -> None:
    """`sapo compare` reads the server's runs and registers the best node's model, whose
    version's files are in the bucket."""
    from mlflow.tracking import MlflowClient

    compared = _sapo(
        "compare", "--experiment", "pool-swarm", "--register", "pool-policy", "-f", "csv", env=env
    )
    assert compared.returncode == 0, compared.stderr[-2000:]
    assert compared.stdout.count("pool-swarm,node-") == 3
    first = compared.stdout.splitlines()[1].split(",")  # one table, best node first
    best, best_run = first[2], first[-1]
    assert f"registered {best} of pool-swarm" in compared.stderr
    (version,) = MlflowClient(started.mlflow_url).search_model_versions("name = 'pool-policy'")
    assert version.version == "1" and version.run_id == best_run
    assert version.source.startswith("mlflow-artifacts:") and "model-round-1" in version.source


def _stop_processes_mentioning(
    texts: list[str], signals: tuple[signal.Signals, ...] = (signal.SIGTERM, signal.SIGKILL)
) -> None:
    for sig in signals:
        pids = [
            int(entry.name)
            for entry in Path("/proc").iterdir()
            if entry.name.isdigit() and _mentions(entry, texts)
        ]
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        deadline = time.monotonic() + 15
        while (
            pids
            and time.monotonic() < deadline
            and any(_mentions(Path(f"/proc/{p}"), texts) for p in pids)
        ):
            time.sleep(0.3)


def _mentions(entry: Path, texts: list[str]) -> bool:
    if entry.name == str(os.getpid()):
        return False
    try:
        environ = (entry / "environ").read_bytes().decode(errors="replace")
        state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z" and any(text in environ for text in texts)
