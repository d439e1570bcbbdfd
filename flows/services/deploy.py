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
  127.0.0.1 for as long as it serves (flows/services/prefect_server.py).

Each scheduled run runs `rounds_per_run` rounds past the node's checkpoint, up to the
swarm's rounds, so a schedule advances the node step by step and a missed run loses nothing;
a run whose process dies is marked Crashed when its heartbeats stop
(`ensure_crash_detection`), one that hangs while it beats is ended by its watchdog
(flows/node/watchdog.py), and the next one resumes the node.

A deployment behaves like a job that finishes: one run of a node at a time, and a run due
while the last one still runs is cancelled rather than queued behind it (`ONE_AT_A_TIME`),
so runs never pile up when the interval is shorter than a round; and the run that finds
its node finished pauses the node's schedule (flows/node/schedule.py), which deletes the
runs Prefect had scheduled ahead. Deploying again (with more rounds) resumes it.
"""

from __future__ import annotations

from contextlib import suppress
from datetime import timedelta
from pathlib import Path
from typing import Any

from flows.config import SwarmConfig, swarm_yaml
from flows.services.prefect_server import SERVED_API
from flows.services.prefect_server import local_prefect_server as local_prefect_server  # moved


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
                "concurrency_limit": one_run_at_a_time(),
                **schedule,
            }
        )
    return out


def one_run_at_a_time() -> Any:
    """One run of a node at a time, so its rounds stay ordered; a run that comes due while
    the node's last one runs is cancelled, not queued: with an interval shorter than a round,
    queued runs piled up (`AwaitingConcurrencySlot`) and later ones overtook earlier ones."""
    from prefect.client.schemas.objects import ConcurrencyLimitConfig, ConcurrencyLimitStrategy

    return ConcurrencyLimitConfig(limit=1, collision_strategy=ConcurrencyLimitStrategy.CANCEL_NEW)


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


def local_server_home(config: SwarmConfig) -> Path:
    """Where `sapo deploy --serve` keeps the Prefect server it starts for a swarm."""
    return config.workdir / "prefect" / "server"


def served_api(config: SwarmConfig) -> str | None:
    """The API of the Prefect server that `sapo deploy --serve` runs for this swarm now."""
    path = local_server_home(config) / SERVED_API
    return path.read_text().strip() if path.is_file() else None


# -- how far a deployed swarm is ------------------------------------------------------------


def swarm_finished(config: SwarmConfig) -> bool:
    """Whether every node of the swarm has finished its rounds here (`finished.json`)."""
    from flows.node import checkpoint

    return all(
        checkpoint.finished_rounds(config.workdir, spec.node_id) >= config.rounds
        for spec in config.nodes
    )


def _names(config: SwarmConfig) -> dict[str, str]:
    """Deployment name -> node id, as `per_node` names them."""
    return {f"{config.swarm_id}-{spec.node_id}": spec.node_id for spec in config.nodes}


def _runs(client: Any, deployment_ids: list[Any], states: list[Any] | None = None) -> list[Any]:
    from prefect.client.schemas.filters import (
        DeploymentFilter,
        DeploymentFilterId,
        FlowRunFilter,
        FlowRunFilterState,
        FlowRunFilterStateType,
    )
    from prefect.client.schemas.sorting import FlowRunSort

    runs = FlowRunFilter(state=FlowRunFilterState(type=FlowRunFilterStateType(any_=states)))
    return list(
        client.read_flow_runs(
            flow_run_filter=runs if states else None,
            deployment_filter=DeploymentFilter(id=DeploymentFilterId(any_=deployment_ids)),
            sort=FlowRunSort.EXPECTED_START_TIME_DESC,
            limit=200,
        )
    )


def _deployments(client: Any, config: SwarmConfig) -> dict[str, Any]:
    """The swarm's deployments on the server, by node id."""
    from prefect.client.schemas.filters import DeploymentFilter, DeploymentFilterName

    names = _names(config)
    found = client.read_deployments(
        deployment_filter=DeploymentFilter(name=DeploymentFilterName(any_=list(names)))
    )
    return {names[d.name]: d for d in found if d.name in names}


IN_FLIGHT = ("PENDING", "RUNNING", "CANCELLING")


def runs_in_flight(config: SwarmConfig) -> int:
    """How many runs of the swarm's deployments are pending or running."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.objects import StateType

    with get_client(sync_client=True) as client:
        ids = [d.id for d in _deployments(client, config).values()]
        if not ids:
            return 0
        return len(_runs(client, ids, [StateType(s) for s in IN_FLIGHT]))


def progress(config: SwarmConfig) -> Any:
    """One row per node of the swarm: its deployment, whether its schedule runs, the rounds
    its rows in the ledger show (the ledger is shared: any machine sees them), its last run
    and its next. A node that is not deployed says so."""
    import polars as pl
    from prefect.client.orchestration import get_client

    from ledger import Ledger

    with Ledger(config.ledger) as ledger:
        published = ledger.query(
            "SELECT node_id, max(node_round) + 1 AS rounds FROM rollouts WHERE swarm_id = $swarm "
            "GROUP BY node_id",
            {"swarm": config.swarm_id},
        )
    rounds = dict(zip(published["node_id"].to_list(), published["rounds"].to_list(), strict=True))
    rows = []
    with get_client(sync_client=True) as client:
        deployed = _deployments(client, config)
        for spec in config.nodes:
            node_id = spec.node_id
            done = int(rounds.get(node_id, 0))
            row: dict[str, object] = {"node_id": node_id, "rounds": f"{done}/{config.rounds}"}
            deployment = deployed.get(node_id)
            if deployment is None:
                rows.append({**row, "deployment": "(not deployed)"})
                continue
            is_paused = paused(deployment)
            runs = _runs(client, [deployment.id])
            ahead = [r for r in runs if _state_of(r) == "SCHEDULED"]
            # The last run that ran: a run that came due while another ran was cancelled
            # (`one_run_at_a_time`); how many were is `skipped`, a sign that the interval
            # is shorter than a round.
            skipped = [r for r in runs if _state_of(r) == "CANCELLED"]
            ran = [r for r in runs if r not in ahead and r not in skipped and _began(r)]
            last = max(ran, key=_began) if ran else None
            rows.append(
                {
                    **row,
                    "deployment": deployment.name,
                    "schedule": "paused" if is_paused else "active",
                    "last_run": _when(_began(last)) if last else "",
                    "last_state": last.state_name or "" if last else "",
                    "next_run": _when(ahead[-1].expected_start_time) if ahead else "",
                    "skipped": len(skipped),
                    "state": _state(is_paused, done >= config.rounds, last),
                }
            )
    return pl.DataFrame(rows, infer_schema_length=None)


def paused(deployment: Any) -> bool:
    """Paused as a finished node pauses itself (the deployment's flag), or by hand with
    Prefect's `deployment schedule pause`, which leaves that flag and turns the schedule off."""
    schedules = deployment.schedules or []
    return bool(deployment.paused) or (bool(schedules) and not any(s.active for s in schedules))


def _state_of(run: Any) -> str:
    return run.state_type.value if run.state_type is not None else ""


def _began(run: Any) -> Any:
    return run.start_time or run.expected_start_time


def _when(moment: Any) -> str:
    return moment.strftime("%Y-%m-%d %H:%M:%S") if moment is not None else ""


def _state(paused: bool, all_rounds: bool, last: Any) -> str:
    """finished, running, waiting (for its next scheduled run), or paused (by hand)."""
    if last is not None and _state_of(last) in IN_FLIGHT:
        return "running"
    if all_rounds and paused:
        return "finished"
    return "paused" if paused else "waiting"
