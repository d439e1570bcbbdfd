"""Scheduled deployments: one Prefect deployment of the node flow per node of a swarm file.

Two ways to run them:
- work pool (several machines): `sapo deploy -c FILE --work-pool sapo` registers the
  deployments with the Prefect server at PREFECT_API_URL (`--pin NODE=QUEUE` pins a node to
  the machine whose worker polls that queue); on each machine
  `prefect worker start --pool sapo [--work-queue QUEUE]` picks up scheduled runs. Workers
  need this package installed (the entrypoint is a module path) and access to the ledger and
  the tracking store; the swarm file travels as a parameter.
- serve (one machine): `sapo deploy -c FILE --serve` registers the same deployments and
  runs their schedules in this process until stopped. Schedules need a Prefect server (the
  ephemeral mode creates no scheduled runs); without PREFECT_API_URL it starts one on
  127.0.0.1 for as long as it serves (`local_prefect_server`).

Each scheduled run runs `rounds_per_run` rounds past the node's checkpoint, up to the
swarm's rounds, so a schedule advances the node step by step and a missed run loses nothing;
a run whose process dies is marked Crashed when its heartbeats stop
(`ensure_crash_detection`), one that hangs while it beats is ended by its watchdog
(flows/node/watchdog.py), and the next one resumes the node.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from datetime import timedelta
from pathlib import Path
from typing import Any

from flows.config import SwarmConfig, swarm_yaml


def deployment_parameters(config: SwarmConfig, node_id: str, rounds_per_run: int) -> dict[str, Any]:
    """The node flow's parameters: the resolved swarm travels with them (workers need no
    copy of the file). Each run adds `rounds_per_run` rounds up to the swarm's last; runs
    after it do nothing."""
    return {
        "node_id": node_id,
        "swarm_text": swarm_yaml(config),
        "more_rounds": rounds_per_run,
        "until_round": config.rounds,
    }


def schedule_kwargs(cron: str | None, interval_s: float | None) -> dict[str, Any]:
    if (cron is None) == (interval_s is None):
        raise ValueError("give exactly one of a cron expression or an interval")
    return {"cron": cron} if cron else {"interval": timedelta(seconds=float(interval_s or 0))}


def per_node(
    config: SwarmConfig,
    *,
    cron: str | None,
    interval_s: float | None,
    rounds_per_run: int,
) -> list[dict[str, Any]]:
    """What every node's deployment is made of, however it is registered."""
    schedule = schedule_kwargs(cron, interval_s)
    out = []
    for spec in config.nodes:
        node_id = spec.node_id
        sharing = f"sharing-{spec.node.local_groups}-{spec.node.external_groups}"
        out.append(
            {
                "name": f"{config.swarm_id}-{node_id}",
                "parameters": deployment_parameters(config, node_id, rounds_per_run),
                "tags": ["sapo", config.swarm_id, sharing],
                "concurrency_limit": 1,  # one run of a node at a time: rounds stay ordered
                **schedule,
            }
        )
    return out


def deployments(
    config: SwarmConfig,
    *,
    cron: str | None,
    interval_s: float | None,
    rounds_per_run: int,
) -> list[Any]:
    """One RunnerDeployment per node (not yet registered)."""
    from flows.node.round import node_flow

    made = per_node(config, cron=cron, interval_s=interval_s, rounds_per_run=rounds_per_run)
    return [node_flow.to_deployment(**kwargs) for kwargs in made]


def register_with_pool(
    config: SwarmConfig,
    *,
    work_pool: str,
    cron: str | None,
    interval_s: float | None,
    rounds_per_run: int,
    queues: dict[str, str] | None = None,
) -> list[str]:
    """Register the deployments with a process work pool on the Prefect server (created if
    missing); returns their ids.

    The entrypoint is the flow's module path (``flows.node.round.node_flow``), which every
    machine with sapo installed imports: workers need no copy of this checkout. ``queues``
    pins nodes to machines: node id -> the work queue a machine's worker polls
    (``prefect worker start --pool P --work-queue Q``); other nodes go to the default queue.
    """
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import WorkPoolCreate
    from prefect.deployments.runner import EntrypointType
    from prefect.exceptions import ObjectAlreadyExists

    from flows.node.round import node_flow

    unknown = sorted(set(queues or {}) - {spec.node_id for spec in config.nodes})
    if unknown:
        raise ValueError(f"pinned nodes not in the swarm: {', '.join(unknown)}")
    with get_client(sync_client=True) as client:
        with suppress(ObjectAlreadyExists):
            client.create_work_pool(WorkPoolCreate(name=work_pool, type="process"))
        ensure_crash_detection(client)
    made = per_node(config, cron=cron, interval_s=interval_s, rounds_per_run=rounds_per_run)
    ids = []
    for kwargs in made:
        node_id = kwargs["parameters"]["node_id"]
        # to_deployment + apply registers it as `flow.deploy` would, without Prefect's
        # tables and advice printed for each node.
        deployment: Any = node_flow.to_deployment(  # sync here: a RunnerDeployment
            work_pool_name=work_pool,
            work_queue_name=(queues or {}).get(node_id),
            entrypoint_type=EntrypointType.MODULE_PATH,
            # Every run beats often enough for `ensure_crash_detection`, whatever the
            # worker's own settings (RUN_ENV).
            job_variables={"env": RUN_ENV},
            **kwargs,
        )
        ids.append(str(deployment.apply()))
    return ids


HEARTBEAT_S = 30
"""Seconds between a deployed node run's heartbeats (Prefect's minimum; its default is 180)."""
HEARTBEAT_ENV = {"PREFECT_FLOWS_HEARTBEAT_FREQUENCY": str(HEARTBEAT_S)}
"""What makes a node run beat that often: a work pool's job variable, a server's env."""
RUN_ENV = {**HEARTBEAT_ENV, "PYTHONSAFEPATH": "1"}
"""A deployed run's environment: it beats, and imports the installed packages whatever
folder the worker runs it in (a `ledger/` data folder there would shadow the package)."""
MISSED_HEARTBEATS = 3
CRASH_DETECTION = "sapo: crash node runs whose process is gone"


def ensure_crash_detection(client: Any) -> None:
    """The server's automation that marks a sapo run Crashed when its heartbeats stop (its
    process or machine is gone), once per server. Without it such a run stays Running and
    holds its node's one-run slot until Prefect's lease on the slot expires (5 minutes);
    Crashed frees it at once, and the node's next scheduled run resumes from its checkpoint.
    Only runs tagged `sapo` (every node deployment's) are watched: they beat every
    HEARTBEAT_S seconds, other flows of the server at their own pace."""
    from prefect.client.schemas.objects import StateType
    from prefect.events.actions import ChangeFlowRunState
    from prefect.events.schemas.automations import AutomationCore, EventTrigger, Posture

    if client.read_automations_by_name(CRASH_DETECTION):
        return
    ended = ("Completed", "Failed", "Cancelled", "Crashed")
    trigger = EventTrigger(
        posture=Posture.Proactive,
        match={"prefect.resource.id": "prefect.flow-run.*"},
        match_related={"prefect.resource.role": "tag", "prefect.resource.id": "prefect.tag.sapo"},
        after={"prefect.flow-run.heartbeat"},
        expect={"prefect.flow-run.heartbeat", *(f"prefect.flow-run.{e}" for e in ended)},
        for_each={"prefect.resource.id"},
        threshold=1,
        within=timedelta(seconds=HEARTBEAT_S * MISSED_HEARTBEATS),
    )
    action = ChangeFlowRunState(
        name="Crashed",
        force=False,
        state=StateType.CRASHED,
        message=f"no heartbeat for {HEARTBEAT_S * MISSED_HEARTBEATS} s: its process is gone",
    )
    client.create_automation(
        AutomationCore(name=CRASH_DETECTION, trigger=trigger, actions=[action])
    )


SERVER_START_S = 180.0


@contextmanager
def local_prefect_server(home: Path) -> Iterator[str]:
    """A Prefect server on 127.0.0.1 (a free port, its database under ``home``), for as
    long as the block runs; yields its API URL. It stays in this process's group, so a
    Ctrl-C or a stop of the group stops it with the deployments it serves."""
    from flows.services.stack import free_port, wait_for_http

    home.mkdir(parents=True, exist_ok=True)
    port = free_port()
    api = f"http://127.0.0.1:{port}/api"
    env = {**os.environ, "PREFECT_HOME": str(home), "PREFECT_API_URL": api}
    cmd = [sys.executable, "-P", "-m", "prefect", "server", "start", "--host", "127.0.0.1"]
    with open(home / "server.log", "ab") as log:
        server = subprocess.Popen(
            [*cmd, "--port", str(port)], env=env, stdout=log, stderr=subprocess.STDOUT
        )
    try:
        if not wait_for_http(f"{api}/health", lambda: server.poll() is None, SERVER_START_S):
            raise RuntimeError(
                f"the local Prefect server did not start (see {home / 'server.log'})"
            )
        yield api
    finally:
        server.terminate()
        try:
            server.wait(timeout=15)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
