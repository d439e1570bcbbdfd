"""Prefect flows: one node's round ([evaluate ->] generate -> publish -> sample -> reward ->
update, then checkpoint and track), and a node that runs rounds until its budget is spent.

Each task is a step of flows/node/steps.py's ``ROUND`` (tested there without Prefect); how a
run starts is decided by flows/node/lifecycle.py, and how it finishes is flows/node/finish.py.
The node's runtime and the round's state live in this process (the model, the round's
groups) and are handed to the tasks as arguments; flow runs record only the node id and
the round, and find the runtime in the context `node_flow` opens (`running`).

No task retries: storage failures are retried in one layer, where they happen, by the
ledger's retry policy (ledger/retrying.py says which layer owns which failure);
generation and updates are not I/O and a retry would not help them.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

from prefect import flow, task
from prefect.cache_policies import NONE
from prefect.utilities.annotations import quote

from flows.config import WORKDIR_ENV, SwarmConfig, load_swarm
from flows.env import apply_offline_defaults
from flows.node import lifecycle, steps
from flows.node.finish import finish_run
from flows.node.metrics import describe
from flows.node.runtime import NodeRuntime, open_node
from flows.node.schedule import pause_own_deployment
from flows.node.state import RoundState
from flows.node.watchdog import watching
from flows.progress import NodeProgress
from flows.stops import stop_signal

log = logging.getLogger(__name__)

# The node a node flow runs, for its round flows (set only inside `running`).
_RUNNING: ContextVar[NodeRuntime] = ContextVar("sapo_running_node")


@contextmanager
def running(node: NodeRuntime) -> Iterator[NodeRuntime]:
    """Make `node` the runtime that round flows in this context operate on."""
    token = _RUNNING.set(node)
    try:
        yield node
    finally:
        _RUNNING.reset(token)


def running_node(node_id: str) -> NodeRuntime:
    node = _RUNNING.get(None)
    if node is None or node.node_id != node_id:
        raise RuntimeError(f"node {node_id!r} is not running in this context (see node_flow)")
    return node


def _as_task(step: steps.Step) -> Any:
    return task(name=step.name, cache_policy=NONE)(step.run)


TASKS: dict[str, Any] = {step.name: _as_task(step) for step in steps.ROUND}
"""A Prefect task per step of the round (flows/node/steps.py ``ROUND``), named as the step."""


@task(name="final-evaluation", cache_policy=NONE)
def final_evaluation_task(node: NodeRuntime) -> dict[str, float]:
    return steps.final_evaluation(node)


def _final_evaluation(node: NodeRuntime) -> None:
    quoted: Any = quote(node)  # as _as_task_run: Prefect need not walk the runtime
    final_evaluation_task(quoted)


def _as_task_run(step: steps.Step, node: NodeRuntime, state: RoundState) -> Any:
    # quote(): Prefect would otherwise walk every object inside (the round's rollouts) on
    # each task call, looking for futures; there are none, and the tasks get the objects.
    return TASKS[step.name](quote(node), quote(state))


@flow(name="sapo-round", flow_run_name="{node_id}-round-{round_}")
def round_flow(
    node_id: str, round_: int, last: bool = False, started_at: float | None = None
) -> dict[str, float]:
    """One round of one node: the steps of ``steps.ROUND`` in order, each a task. `last`:
    the run's last round (its checkpoint is forced). `started_at` (perf_counter seconds) is
    when the caller began the round, so that the time Prefect takes to create this flow run
    counts as the round's orchestration."""
    runtime = running_node(node_id)
    began = time.perf_counter() if started_at is None else started_at
    return steps.run_round(runtime, RoundState(round_, began, last=last), call=_as_task_run)


@flow(name="sapo-node", flow_run_name="{node_id}")
def node_flow(
    node_id: str,
    swarm_file: str | None = None,
    overrides: list[str] | None = None,
    swarm_text: str | None = None,
    until_round: int | None = None,
    more_rounds: int | None = None,
    parent_run_id: str | None = None,
    swarm: SwarmConfig | None = None,
    force: bool = False,
    start: lifecycle.Start | None = None,
) -> dict[str, Any]:
    """Run a node's rounds: up to `until_round` in total (default: the swarm's rounds), or
    `more_rounds` past its checkpoint, and then no further than `until_round` when both
    are given (what a scheduled deployment runs each time: its runs after the swarm's last
    round do nothing).

    The swarm comes resolved (`swarm`, what `sapo node` passes: Prefect records it as the
    run's parameter), or as a file or its text (`swarm_text`: what a deployment passes, so
    workers on other machines need no copy of the file). Then $SAPO_WORKDIR, where the
    worker's machine sets it, is where the node keeps its checkpoints, key and index.

    What the run does is decided once (flows/node/lifecycle.py `decide`): by `sapo node`,
    which passes its `start`, or here. A checkpoint made with another configuration is not
    resumed unless `force` (or $SAPO_RESUME_FORCE): the run fails saying what changed, as
    `sapo node` does."""
    apply_offline_defaults()  # a worker's flow run starts here, not in the sapo command
    if swarm is None:
        swarm = load_swarm(
            swarm_file, overrides or [], text=swarm_text, workdir=os.environ.get(WORKDIR_ENV)
        )
    if start is None:
        start = lifecycle.decide(
            swarm, node_id, force=force, until_round=until_round, more_rounds=more_rounds
        )
        for line in start.forced:
            log.warning("%s", line)
    if start.refusal:
        raise lifecycle.ResumeRefused(start.refusal)
    if start.said is not None:
        print(start.said, flush=True)
        pause_own_deployment(node_id)  # a deployment's run: its schedule has no more to do
        return {"node_id": node_id, "rounds": [], "metrics": []}
    progress = NodeProgress.for_process(node_id)
    # A run that stops making progress while its process lives (and beats) is ended, so
    # that the node's next run can go (flows/node/watchdog.py).
    with watching(swarm.stall_timeout_s, grace={"sample": swarm.peer_wait_s}) as dog:
        progress.watch(dog.saw)
        node = open_node(
            swarm, node_id, parent_run_id=parent_run_id, progress=progress, saved=start.saved
        )
        try:
            rounds = start.rounds
            first, stop = rounds.start, rounds.stop
            history = []
            with running(node):
                for round_ in rounds:
                    progress.emit("round", round=round_, stop=stop)
                    last = round_ == stop - 1
                    metrics = round_flow(node_id, round_, last, started_at=time.perf_counter())
                    progress.emit("done", round=round_)
                    print(describe(metrics, node_id, round_), flush=True)
                    history.append(metrics)
            finished = finish_run(
                node,
                until_round=until_round,
                ran_rounds=stop > first,
                evaluate=_final_evaluation,
                entering=dog.entering,
            )
            if finished:
                pause_own_deployment(node_id)
            return {"node_id": node_id, "rounds": list(rounds), "metrics": history}
        except BaseException as stopped:
            if node.run is not None:  # its MLflow run says how it ended, never "running"
                # Ctrl-C, or the SIGTERM of a stopping launcher (Prefect raises it as
                # TerminationSignal), also mid-query (DuckDB's RuntimeError, raised from
                # it): stopped, not failed.
                interrupted = stop_signal(stopped) is not None
                node.run.tracker.finish(node.run.run_id, "KILLED" if interrupted else "FAILED")
            raise
        finally:
            node.close()
            progress.close()
