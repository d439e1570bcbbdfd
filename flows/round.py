"""Prefect flows: one node's round ([evaluate ->] generate -> publish -> sample -> reward ->
update, then checkpoint and track), and a node that runs rounds until its budget is spent.

Each task is a one-line call of a step in flows/steps.py (tested there without Prefect).
The node's runtime and the round's state live in this process (the model, the round's
groups) and are handed to the tasks as arguments; flow runs record only the node id and
the round, and find the runtime in the context `node_flow` opens (`running`).

No task retries: storage failures are retried in one layer, where they happen, by the
ledger's retry policy (ledger/retrying.py says which layer owns which failure);
generation and updates are not I/O and a retry would not help them.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

from prefect import flow, task
from prefect.cache_policies import NONE
from prefect.utilities.annotations import quote

from flows import checkpoint, steps
from flows.config import WORKDIR_ENV, SwarmConfig, load_swarm
from flows.env import apply_offline_defaults
from flows.progress import NodeProgress
from flows.runtime import NodeRuntime, open_node
from flows.steps import RoundState
from flows.watchdog import watching

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


@task(name="evaluate", cache_policy=NONE)
def evaluate_task(node: NodeRuntime, state: RoundState) -> dict[str, float]:
    return steps.evaluate(node, state)


@task(name="final-evaluation", cache_policy=NONE)
def final_evaluation_task(node: NodeRuntime) -> dict[str, float]:
    return steps.final_evaluation(node)


@task(name="generate", cache_policy=NONE)
def generate_task(node: NodeRuntime, state: RoundState) -> int:
    return steps.generate(node, state)


@task(name="publish", cache_policy=NONE)
def publish_task(node: NodeRuntime, state: RoundState) -> list[str]:
    return steps.publish(node, state)


@task(name="sample", cache_policy=NONE)
def sample_task(node: NodeRuntime, state: RoundState) -> list[str]:
    return steps.sample(node, state)


@task(name="reward", cache_policy=NONE)
def reward_task(node: NodeRuntime, state: RoundState) -> dict[str, float]:
    return steps.reward(node, state)


@task(name="update", cache_policy=NONE)
def update_task(node: NodeRuntime, state: RoundState) -> dict[str, float]:
    steps.checkpoint_wait(node, state)
    return steps.update(node, state)


@task(name="checkpoint", cache_policy=NONE)
def checkpoint_task(node: NodeRuntime, state: RoundState, force: bool = False) -> str | None:
    return steps.checkpoint(node, state, force=force)


@task(name="track", cache_policy=NONE)
def track_task(node: NodeRuntime, state: RoundState) -> dict[str, float]:
    return steps.track(node, state)


@flow(name="sapo-round", flow_run_name="{node_id}-round-{round_}")
def round_flow(
    node_id: str, round_: int, last: bool = False, started_at: float | None = None
) -> dict[str, float]:
    """One round of one node, the paper's steps in order. `started_at` (perf_counter
    seconds) is when the caller began the round, so that the time Prefect takes to create
    this flow run counts as the round's orchestration."""
    runtime = running_node(node_id)
    state = RoundState(round_, started=time.perf_counter() if started_at is None else started_at)
    # quote(): Prefect would otherwise walk every object inside (the round's rollouts) on
    # each task call, looking for futures; there are none, and the tasks get the objects.
    node: Any = quote(runtime)
    this: Any = quote(state)
    evaluation, rounds = runtime.spec.node.evaluation, runtime.swarm.rounds
    if evaluation.due(round_, rounds):
        evaluate_task(node, this)
    generate_task(node, this)
    publish_task(node, this)
    sample_task(node, this)
    reward_task(node, this)
    update_task(node, this)
    checkpoint_task(node, this, force=last)
    return track_task(node, this)


def rounds_to_run(start: int, end: int, until_round: int | None, more_rounds: int | None) -> range:
    """The rounds a node flow runs from checkpoint `start`: up to `end`, or `more_rounds`
    of them; with both `more_rounds` and `until_round`, no further than `end` (a scheduled
    deployment's run after the swarm's last round runs none)."""
    if more_rounds is None:
        return range(start, end)
    if until_round is None:  # `sapo node --more-rounds`: may go past the swarm's rounds
        return range(start, start + more_rounds)
    return range(start, min(start + more_rounds, end))


def nothing_left(
    swarm: SwarmConfig,
    node_id: str,
    saved: checkpoint.Checkpoint,
    end: int,
    until_round: int | None,
    more_rounds: int | None,
) -> bool:
    """Whether a run of a node at checkpoint `saved` has nothing to run, score or log (a
    scheduled run after the last round then ends without loading the model). A node that
    kept only its final model could not be opened to train anyway: its optimizer state
    is gone."""
    if rounds_to_run(saved.next_round, end, until_round, more_rounds):
        return False
    return not saved.resumable or checkpoint.finished_rounds(swarm.workdir, node_id) >= end


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
) -> dict[str, Any]:
    """Run a node's rounds: up to `until_round` in total (default: the swarm's rounds), or
    `more_rounds` past its checkpoint, and then no further than `until_round` when both
    are given (what a scheduled deployment runs each time: its runs after the swarm's last
    round do nothing).

    The swarm comes resolved (`swarm`, what `sapo node` passes: Prefect records it as the
    run's parameter), or as a file or its text (`swarm_text`: what a deployment passes, so
    workers on other machines need no copy of the file). Then $SAPO_WORKDIR, where the
    worker's machine sets it, is where the node keeps its checkpoints, key and index."""
    apply_offline_defaults()  # a worker's flow run starts here, not in the sapo command
    if swarm is None:
        swarm = load_swarm(
            swarm_file, overrides or [], text=swarm_text, workdir=os.environ.get(WORKDIR_ENV)
        )
    saved = checkpoint.latest(swarm.workdir, node_id)
    end = until_round or swarm.rounds
    if saved is not None and nothing_left(swarm, node_id, saved, end, until_round, more_rounds):
        print(f"{node_id} has finished its {saved.next_round} rounds", flush=True)
        return {"node_id": node_id, "rounds": [], "metrics": []}
    progress = NodeProgress.for_process(node_id)
    # A run that stops making progress while its process lives (and beats) is ended, so
    # that the node's next run can go (flows/watchdog.py).
    with watching(swarm.stall_timeout_s, grace={"sample": swarm.peer_wait_s}) as dog:
        progress.watch(dog.saw)
        node = open_node(swarm, node_id, parent_run_id=parent_run_id, progress=progress)
        try:
            rounds = rounds_to_run(node.next_round, end, until_round, more_rounds)
            start, stop = rounds.start, rounds.stop
            history = []
            with running(node):
                for round_ in rounds:
                    progress.emit("round", round=round_, stop=stop)
                    last = round_ == stop - 1
                    metrics = round_flow(node_id, round_, last, started_at=time.perf_counter())
                    progress.emit("done", round=round_)
                    print(steps.describe(metrics, node_id, round_), flush=True)
                    history.append(metrics)
                dog.entering("the final evaluation")
                if node.next_round >= swarm.rounds and not steps.evaluated(node, swarm.rounds):
                    # After the last checkpoint, so the score is that checkpoint's; a node
                    # killed before it is scored by the next run, whose loop is then empty.
                    quoted: Any = quote(node)
                    final_evaluation_task(quoted)
            # The model is logged when the node reaches its last round (or went past it),
            # not after every scheduled run of a few rounds; and by a later run when the one
            # that reached it did not (it stopped before, or the upload failed).
            dog.entering("closing the node's run (logging its model)")
            reached = node.next_round >= swarm.rounds or until_round is None
            wanted = swarm.tracking.log_models and reached
            node.finish(log_model=wanted and (stop > start or node.final_model_missing()))
            if node.next_round >= swarm.rounds and not node.final_model_missing():
                checkpoint.mark_finished(swarm.workdir, node_id, node.next_round)
            return {"node_id": node_id, "rounds": list(range(start, stop)), "metrics": history}
        finally:
            node.close()
            progress.close()
