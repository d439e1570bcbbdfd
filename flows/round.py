"""Prefect flows: one node's round (generate -> publish -> sample -> reward -> update), and
a node that runs rounds until its budget is spent.

Each task is a thin call of a NodeRuntime method (tested without Prefect in flows/runtime.py);
tasks pass a node id and a round number and return keys, ids and small dicts. Only the
storage tasks (publish, sample) retry, with backoff: generation and updates are not I/O and
a retry would not help them.
"""

from __future__ import annotations

import time
from typing import Any

from prefect import flow, task
from prefect.cache_policies import NONE

from flows.runtime import NodeRuntime, describe
from flows.progress import NodeProgress

# The runtimes of this process, by node id: tasks find the model and the round's groups here.
_RUNTIMES: dict[str, NodeRuntime] = {}
STORAGE_RETRIES = {"retries": 3, "retry_delay_seconds": [1, 4, 10]}


def runtime(node_id: str) -> NodeRuntime:
    try:
        return _RUNTIMES[node_id]
    except KeyError:
        raise RuntimeError(f"node {node_id!r} has no runtime in this process") from None


@task(name="generate", cache_policy=NONE)
def generate_task(node_id: str, round_: int) -> int:
    return runtime(node_id).generate(round_)


@task(name="publish", cache_policy=NONE, **STORAGE_RETRIES)  # type: ignore[call-overload]
def publish_task(node_id: str, round_: int) -> list[str]:
    return runtime(node_id).publish(round_)


@task(name="sample", cache_policy=NONE, **STORAGE_RETRIES)  # type: ignore[call-overload]
def sample_task(node_id: str, round_: int) -> list[str]:
    return runtime(node_id).sample(round_)


@task(name="reward", cache_policy=NONE)
def reward_task(node_id: str, round_: int) -> dict[str, float]:
    return runtime(node_id).reward(round_)


@task(name="update", cache_policy=NONE)
def update_task(node_id: str, round_: int) -> dict[str, float]:
    return runtime(node_id).update(round_)


@task(name="track", cache_policy=NONE)
def track_task(node_id: str, round_: int) -> dict[str, float]:
    return runtime(node_id).track(round_)


@task(name="checkpoint", cache_policy=NONE)
def checkpoint_task(node_id: str, round_: int, force: bool = False) -> str | None:
    return runtime(node_id).checkpoint(round_, force=force)


@flow(name="sapo-round", flow_run_name="{node_id}-round-{round_}")
def round_flow(node_id: str, round_: int, last: bool = False) -> dict[str, float]:
    """One round of one node, the paper's steps in order."""
    generate_task(node_id, round_)
    publish_task(node_id, round_)
    sample_task(node_id, round_)
    reward_task(node_id, round_)
    update_task(node_id, round_)
    metrics = track_task(node_id, round_)
    checkpoint_task(node_id, round_, force=last)
    return metrics


@flow(name="sapo-node", flow_run_name="{node_id}")
def node_flow(
    node_id: str,
    swarm_file: str | None = None,
    overrides: list[str] | None = None,
    swarm_text: str | None = None,
    until_round: int | None = None,
    more_rounds: int | None = None,
    parent_run_id: str | None = None,
) -> dict[str, Any]:
    """Run a node's rounds: up to `until_round` in total (default: the swarm's rounds), or
    `more_rounds` past its checkpoint (what a scheduled deployment runs each time).
    A deployment passes the resolved swarm file as `swarm_text`, so workers on other
    machines need no copy of it."""
    from flows.config import load_swarm

    swarm = load_swarm(swarm_file, overrides or [], text=swarm_text)
    progress = NodeProgress.for_process(node_id)
    rt = NodeRuntime(swarm, node_id, parent_run_id=parent_run_id, progress=progress)
    _RUNTIMES[node_id] = rt
    try:
        start = rt.next_round
        stop = start + more_rounds if more_rounds is not None else (until_round or swarm.rounds)
        history = []
        for round_ in range(start, stop):
            began = time.perf_counter()
            progress.emit("round", round=round_, stop=stop)
            metrics = round_flow(node_id, round_, last=round_ == stop - 1)
            wall = time.perf_counter() - began
            metrics["seconds_checkpoint"] = rt.last_checkpoint_s
            steps = sum(v for k, v in metrics.items() if k.startswith("seconds_"))
            late = {
                "seconds_orchestration": max(wall - steps, 0.0),
                "seconds_checkpoint": rt.last_checkpoint_s,
            }
            if rt.tracker is not None and rt.run_id is not None:
                rt.tracker.log_metrics(rt.run_id, late, step=round_)
            metrics.update(late)
            progress.emit("done", round=round_)
            print(describe(metrics, node_id, round_), flush=True)
            history.append(metrics)
        rt.finish(log_model=swarm.tracking.log_models and stop > start)
        return {"node_id": node_id, "rounds": list(range(start, stop)), "metrics": history}
    finally:
        _RUNTIMES.pop(node_id, None)
        rt.close()
        progress.close()
