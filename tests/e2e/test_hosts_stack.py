"""Issue 60: the deployed swarm on a network of hosts, configured as docs/running.md ("Many
machines") tells a user. The stack (`sapo infra up --host`) on a services host; `sapo deploy`
and every check from an operator host (a process there: `operate`); a Prefect worker on each
of two worker hosts pulling its pinned nodes' scheduled rounds. No host reaches another
through loopback (tests/netns.py).

While the three nodes run their two rounds, the faults a stack meets, each recovered with
nothing lost (every node's rows once in the ledger, every round trained once, every round's
metrics in MLflow) and each recovery timed:
- machine-b lost in node-2's first round (cut off, its worker and run killed), back later;
- the Prefect server restarted (`sapo infra restart prefect`) while rounds run;
- the MLflow server down (killed) until a round has ended without it, then restarted;
- machine-b lost for good in node-2's second round: node-2 pinned to machine-a (`sapo deploy`
  again), where it continues from its home (`checkpoint_home`, flows/node/home.py).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from flows.services import stack as stack_module
from tests.conftest import stop_process_group
from tests.e2e.interrupting import processes_mentioning
from tests.e2e.test_deploy import _wait
from tests.e2e.test_infra_stack import (
    MACHINES,
    POOL,
    _check_compare,
    _check_crashed,
    _check_ledger,
    _check_mlflow,
    _check_prefect,
    _exports,
    _models_logged,
    _running,
    _sapo,
    _stop_processes_mentioning,
)
from tests.e2e.test_swarm import swarm_file, tiny_model  # noqa: F401  (fixture)
from tests.netns import Host, Network, refusal

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.slow,
    pytest.mark.skipif(refusal() is not None, reason=str(refusal())),
]


def _on(host: Host, *args: str, env: dict[str, str] | None = None) -> str:
    """`sapo ARGS` on ``host``; its output (the test fails with its stderr otherwise)."""
    done = subprocess.run(
        host.command([sys.executable, "-m", "flows.cli", *args]),
        capture_output=True, text=True, timeout=600, env={**os.environ, **(env or {})},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def _start_worker(host: Host, home: Path, env: dict[str, str]) -> subprocess.Popen[bytes]:
    """`prefect worker start` as docs/running.md has a worker machine run it."""
    home.mkdir(exist_ok=True)  # a machine that comes back keeps its folder
    with open(home / "worker.log", "ab") as log:
        return host.start(
            [sys.executable, "-m", "prefect", "worker", "start", "--pool", POOL,
             "--work-queue", host.name, "--name", host.name],
            cwd=home,
            env={
                **os.environ, **env,
                "SAPO_WORKDIR": str(home / "work"),
                "PREFECT_HOME": str(home / "prefect"),
                "PREFECT_WORKER_QUERY_SECONDS": "2",
            },
            stdout=log, stderr=subprocess.STDOUT,
        )  # fmt: skip


def _rounds(started: stack_module.Stack, state: str) -> set[str]:
    """The names of the rounds (`sapo-round` flow runs, ``node-2-round-0``) in ``state``."""
    found = httpx.post(
        f"{started.prefect_api_url}/flow_runs/filter",
        json={"flows": {"name": {"any_": ["sapo-round"]}},
              "flow_runs": {"state": {"type": {"any_": [state]}}}},
        timeout=30,
    ).json()  # fmt: skip
    return {r["name"] for r in found}


def _completed_rounds(started: stack_module.Stack) -> set[str]:
    return _rounds(started, "COMPLETED")


@pytest.mark.timeout(1500)  # rounds have 900 s to land, and the services to stop after
def test_a_deployed_swarm_on_hosts_rides_out_lost_machines_and_restarted_services(
    tmp_path: Path,
    tiny_model: Path,  # noqa: F811
) -> None:
    names = ["services", "operator", *MACHINES]
    with Network(names) as net:
        services, operator = net["services"], net["operator"]
        home = tmp_path / "stack"
        up = _on(
            services, "infra", "up", "--home", str(home), "--host", services.address,
            "--free-ports", env={"PREFECT_SERVER_SERVICES_SCHEDULER_LOOP_SECONDS": "5"},
        )  # fmt: skip
        env = _exports(up)
        assert services.address in env["PREFECT_API_URL"] and "127.0.0.1" not in up
        # The operator: a process on its host, as a person's shell on their machine.
        args = {"tag": net.tag, "names": names, "home": str(home), "tmp": str(tmp_path),
                "model": str(tiny_model), "env": env}  # fmt: skip
        try:
            done = subprocess.run(
                operator.command([sys.executable, "-c", OPERATE, json.dumps(args)]),
                capture_output=True, text=True, timeout=1400, cwd=ROOT,
            )  # fmt: skip
            assert done.returncode == 0, done.stderr[-6000:]
            times = json.loads(done.stdout.splitlines()[-1])
        finally:
            stopped = _on(services, "infra", "down", "--home", str(home), "--purge")
        assert "prefect" in stopped and "mlflow" in stopped
        assert processes_mentioning(str(home)) == []
    print("recovery:", ", ".join(f"{k} {v:.0f} s" for k, v in times.items()))


ROOT = Path(__file__).resolve().parents[2]
OPERATE = (
    "import json, sys; from tests.e2e.test_hosts_stack import operate; "
    "print(json.dumps(operate(**json.loads(sys.argv[1]))))"
)


def operate(
    tag: str, names: list[str], home: str, tmp: str, model: str, env: dict[str, str]
) -> dict[str, float]:
    """What the operator host does (run there by the test): deploy, run the faults, check;
    the recovery times."""
    net = Network.attach(tag, names)
    return _run_the_swarm(net, stack_module.Stack.load(home), env, Path(tmp), Path(model))


def _run_the_swarm(
    net: Network, started: stack_module.Stack, env: dict[str, str], tmp_path: Path, model: Path
) -> dict[str, float]:
    deployer = tmp_path / "deployer"
    deployer.mkdir()
    swarm = swarm_file(
        deployer, model, swarm_id="pool-swarm", node_count=3, rounds=2,
        peer_wait_s=0, ledger={"url": started.ledger_url},
        checkpoint_home={"url": f"s3://{started.env['SAPO_BUCKET']}/homes"},
    )  # fmt: skip
    pins = [f"--pin={node}={machine}" for machine, nodes in MACHINES.items() for node in nodes]
    registered = _sapo(
        "deploy", "-c", str(swarm), "--work-pool", POOL, "--interval", "20", *pins, env=env
    )
    assert registered.returncode == 0, registered.stderr[-2000:]
    workers = {m: _start_worker(net[m], tmp_path / m, env) for m in MACHINES}
    times: dict[str, float] = {}
    try:
        _wait(lambda: _running(started, "node-2-round-0"), 600, "node-2's first round")
        lost = time.monotonic()
        net.cut("machine-b")
        _stop_processes_mentioning([str(tmp_path / "machine-b")], (signal.SIGKILL,))
        workers["machine-b"].wait()
        # While machine-b is away, the Prefect server restarts under machine-a's rounds.
        restarting = time.monotonic()
        _on(net["services"], "infra", "restart", "prefect", "--home", started.home)
        times["prefect restart"] = time.monotonic() - restarting
        net.heal("machine-b")
        workers["machine-b"] = _start_worker(net["machine-b"], tmp_path / "machine-b", env)
        _wait(lambda: "node-2-round-0" in _completed_rounds(started), 600, "node-2 round 0")
        times["machine-b lost to node-2's round done"] = time.monotonic() - lost
        # MLflow down until a round begun without it has ended; meanwhile machine-b is lost
        # for good in node-2's second round, and node-2 is pinned to machine-a, where it
        # continues from its home (`checkpoint_home`: its checkpoint and key in the bucket).
        before = _completed_rounds(started) | _rounds(started, "RUNNING")
        os.killpg(started.pids["mlflow"], signal.SIGKILL)
        down = time.monotonic()
        _wait(lambda: _running(started, "node-2-round-1"), 300, "node-2's second round")
        gone = time.monotonic()
        net.cut("machine-b")
        _stop_processes_mentioning([str(tmp_path / "machine-b")], (signal.SIGKILL,))
        workers.pop("machine-b").wait()
        moved = [p.replace("node-2=machine-b", "node-2=machine-a") for p in pins]
        redeployed = _sapo(
            "deploy", "-c", str(swarm), "--work-pool", POOL, "--interval", "20", *moved, env=env
        )
        assert redeployed.returncode == 0, redeployed.stderr[-2000:]
        _wait(lambda: _completed_rounds(started) - before, 600, "a round without MLflow")
        _on(net["services"], "infra", "restart", "mlflow", "--home", started.home)
        times["mlflow down"] = time.monotonic() - down
        nodes = [node for pinned in MACHINES.values() for node in pinned]
        back = time.monotonic()
        _wait(lambda: _models_logged(started, workers) == set(nodes), 900, "3 nodes' 2 rounds")
        times["mlflow back to every model logged"] = time.monotonic() - back
        times["machine-b lost for good to node-2 done on machine-a"] = time.monotonic() - gone
        _check_crashed(started, crashed=2)  # node-2's run on machine-b, twice
        _check_prefect(started, nodes)
        _check_mlflow(started, nodes)
        _check_ledger(started, nodes)
        _check_compare(started, env)
        _check_metrics_kept_were_logged(tmp_path)
    finally:
        for worker in workers.values():
            stop_process_group(worker)
        _stop_processes_mentioning([str(tmp_path / machine) for machine in MACHINES])
    # Each machine holds the state of the nodes it ran: machine-a node-2's too, since it
    # took over (machine-b's copy is what was left when it was lost).
    ran = {"machine-a": ["node-0", "node-1", "node-2"], "machine-b": ["node-2"]}
    for machine, nodes_there in ran.items():
        found = sorted(p.name for p in (tmp_path / machine / "work" / "nodes").iterdir())
        assert found == nodes_there
        assert processes_mentioning(str(tmp_path / machine)) == []
    assert not (deployer / "work").exists()  # nothing ran on the deployer's machine
    return times


def _check_metrics_kept_were_logged(tmp_path: Path) -> None:
    """Some node kept a round's metrics while MLflow was down (its worker's log says so),
    and every node's folder of kept metrics is empty now: all went to MLflow."""
    logs = "".join((tmp_path / m / "worker.log").read_text(errors="replace") for m in MACHINES)
    assert "log metrics failed" in logs or "runs untracked" in logs
    kept: list[Any] = [
        p for m in MACHINES for p in (tmp_path / m / "work" / "nodes").glob("*/unlogged-metrics/*")
    ]
    assert kept == []
