"""Scheduled deployments: one Prefect deployment of the node flow per node of a swarm file.

Two ways to run them:
- work pool (several machines): `sapo deploy -c FILE --work-pool sapo` registers the
  deployments with the Prefect server at PREFECT_API_URL; on each machine
  `prefect worker start --pool sapo` picks up scheduled runs. Workers need this package
  installed and access to the ledger and the tracking store; the swarm file travels as a
  parameter.
- serve (one machine): `sapo deploy -c FILE --serve` registers the same deployments and
  runs their schedules in this process until stopped.

Each scheduled run runs `rounds_per_run` rounds past the node's checkpoint, so a schedule
advances the node step by step and a missed run loses nothing.
"""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any

from flows.config import SwarmConfig, swarm_yaml

SOURCE_ROOT = Path(__file__).resolve().parents[1]
ENTRYPOINT = "flows/round.py:node_flow"


def deployment_parameters(config: SwarmConfig, node_id: str, rounds_per_run: int) -> dict[str, Any]:
    """The node flow's parameters: the resolved swarm travels with them (workers need no
    copy of the file)."""
    return {"node_id": node_id, "swarm_text": swarm_yaml(config), "more_rounds": rounds_per_run}


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
    from flows.round import node_flow

    made = per_node(config, cron=cron, interval_s=interval_s, rounds_per_run=rounds_per_run)
    return [node_flow.to_deployment(**kwargs) for kwargs in made]


def register_with_pool(
    config: SwarmConfig,
    *,
    work_pool: str,
    cron: str | None,
    interval_s: float | None,
    rounds_per_run: int,
) -> list[str]:
    """Register the deployments with a work pool on the Prefect server; returns their ids."""
    from flows.round import node_flow

    made = per_node(config, cron=cron, interval_s=interval_s, rounds_per_run=rounds_per_run)
    ids = []
    for kwargs in made:
        flow = node_flow.from_source(source=str(SOURCE_ROOT), entrypoint=ENTRYPOINT)
        deployment_id = flow.deploy(  # type: ignore[union-attr]
            work_pool_name=work_pool, build=False, push=False, print_next_steps=False, **kwargs
        )
        ids.append(str(deployment_id))
    return ids
