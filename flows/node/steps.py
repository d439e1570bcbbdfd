"""The steps of a node's round as plain functions: generate -> publish -> sample -> train
(the learner's round: reward, then update), then checkpoint and track.

Each step takes the node's runtime and the round's `RoundState` (what one step hands the
next inside the node's process: the model's output is too large to pass between Prefect
tasks) and returns something small: a count, keys, group ids. The Prefect tasks in
flows/node/round.py are one-line calls of these; tests call them directly, without Prefect.
A round's metrics are built in one place, `round_metrics`, from the state the steps left.
"""

from __future__ import annotations

import functools
import logging
import os
import signal
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Concatenate, ParamSpec, TypeVar

import polars as pl

from flows.node import checkpoint as checkpoints
from flows.node.backlog import log_writer, riding_out
from flows.node.lifecycle import node_config
from flows.node.metrics import round_metrics, sample_completions
from flows.node.runtime import NodeRuntime
from flows.node.state import RoundState, require
from ledger import DrawRequest, StorageError
from ledger.draws import round_draw_key
from sapo_core.assembly import TrainingRecord
from sapo_core.evaluation import EvaluationRecord, evaluation_records, overall_accuracy
from sapo_core.learner import round_seed
from sapo_core.rollouts import RECORD_FIELDS, Group, from_records, group_rollouts

log = logging.getLogger(__name__)

P = ParamSpec("P")
R = TypeVar("R")
PEER_POLL_S = 0.5


KILL_AT_ENV = "SAPO_TEST_KILL_AT"
"""Fault injection for tests: ``<step>:<round>`` makes a node SIGKILL itself on entering that
step of that round (tests/e2e/test_kill.py kills each step in turn, then resumes)."""


def fault_point(step: str, round_: int) -> None:
    if os.environ.get(KILL_AT_ENV) == f"{step}:{round_}":
        os.kill(os.getpid(), signal.SIGKILL)


def timed(
    name: str,
) -> Callable[
    [Callable[Concatenate[NodeRuntime, RoundState, P], R]],
    Callable[Concatenate[NodeRuntime, RoundState, P], R],
]:
    """A step: announced to the progress display and timed into the round's state."""

    def wrap(
        step: Callable[Concatenate[NodeRuntime, RoundState, P], R],
    ) -> Callable[Concatenate[NodeRuntime, RoundState, P], R]:
        @functools.wraps(step)
        def run(node: NodeRuntime, state: RoundState, *args: P.args, **kwargs: P.kwargs) -> R:
            fault_point(name, state.round)
            node.progress.emit("step", round=state.round, step=name)
            began = time.perf_counter()
            try:
                return step(node, state, *args, **kwargs)
            finally:
                state.seconds[name] = time.perf_counter() - began

        return run

    return wrap


@timed("evaluate")
def evaluate(node: NodeRuntime, state: RoundState) -> dict[str, float]:
    """Score the policy at the start of the round on the held-out set, when due."""
    state.evaluation = evaluation_metrics(node, state.round)
    return state.evaluation


def evaluation_metrics(node: NodeRuntime, round_: int) -> dict[str, float]:
    """Evaluate (if due at `round_`), record the scores in the ledger; the metrics to log."""
    config = node.spec.node.evaluation
    if not config.due(round_, node.swarm.rounds):
        return {}
    scores = node.learner.evaluate()
    rows = evaluation_records(scores, node.learner.policy_version, config.seed)
    write_node_log(node, "evaluation", round_, rows)
    metrics = {f"eval_accuracy/{s.task}": s.accuracy for s in scores}
    metrics["eval_accuracy"] = overall_accuracy(scores)
    return metrics


def evaluated(node: NodeRuntime, round_: int) -> bool:
    """Whether the node's evaluation at `round_` is recorded (True when none is due)."""
    if not node.spec.node.evaluation.due(round_, node.swarm.rounds):
        return True
    if any(p.name == f"r{round_:08d}-evaluation.json" for p in node.backlog.files()):
        return True  # recorded, waiting for the ledger
    with riding_out() as down:
        return node.node_id in node.ledger.evaluated_nodes(node.swarm.swarm_id, round_)
    log.warning("ledger unreachable (%s): evaluating round %d again", down.error, round_)
    return False


def final_evaluation(node: NodeRuntime) -> dict[str, float]:
    """The policy after the last round (logged at step = rounds), when evaluation is on;
    then what is left of the backlog is written, if the ledger answers."""
    metrics = evaluation_metrics(node, node.swarm.rounds)
    with riding_out() as down:
        node.backlog.flush(node.ledger)
    if down:
        log.warning(
            "ledger unreachable (%s): %d files stay in the backlog", down.error, len(node.backlog)
        )
    if metrics:
        node.log_metrics(metrics, step=node.swarm.rounds)
    return metrics


@timed("generate")
def generate(node: NodeRuntime, state: RoundState) -> int:
    """Sample this round's groups; returns the number of completions made."""
    state.generated = node.learner.generate(state.round, node.progress.generation)
    return sum(len(g.rollouts) for g in state.generated.groups)


@timed("publish")
def publish(node: NodeRuntime, state: RoundState) -> list[str]:
    """Write the backlog, then the round's groups, to the ledger (a retry writes nothing);
    returns keys. An unreachable ledger keeps the round's groups in the backlog (none
    returned): the node trains on, and they are written when the ledger answers again."""
    generated = require(state.generated, state, "publish", "generate")
    rows = [
        r.to_record() | {"swarm_id": node.swarm.swarm_id}
        for g in generated.groups
        for r in g.rollouts
    ]
    with riding_out() as down:
        node.backlog.flush(node.ledger)
        keys = node.ledger.publish(rows)
    if down:
        state.notes.ledger_down = True
        node.backlog.add_rows(state.round, rows)
        return []
    _compact_own(node)
    return keys


def _compact_own(node: NodeRuntime) -> None:
    """Keep the node's partitions to few files as it publishes; a failure is the next
    round's to retry, never this round's end."""
    at_files = node.swarm.ledger.compact_at_files
    try:
        report = node.ledger.compact_own(node.swarm.swarm_id, node.spec.node_id, at_files)
    except StorageError as exc:
        log.warning("compaction of %s's partitions failed: %s", node.spec.node_id, exc)
        return
    if report.files_in:
        log.info("merged %d files into %d", report.files_in, report.files_out)


@timed("sample")
def sample(node: NodeRuntime, state: RoundState) -> list[str]:
    """Draw J peers' groups with the node's policy; returns their group ids. An unreachable
    ledger leaves the round with J = 0."""
    state.external = []
    if node.spec.node.external_groups > 0:
        frame = draw_peers(node, state.round)
        if frame is None:
            state.notes.ledger_down = True
            return []
        state.external, state.notes.peer_rows_dropped = peer_groups(frame)
    return [g.group_id for g in state.external]


def draw_peers(node: NodeRuntime, round_: int) -> pl.DataFrame | None:
    """The node's draw for ``round_`` as the ledger returned it, after a bounded wait for
    enough peers' groups, and recorded there (which groups it drew, with which policy and
    seed); None when the ledger did not answer."""
    request = draw_request(node, round_)
    with riding_out() as down:
        # A retry of a round whose draw is logged trains on what it drew (and logged).
        frame = node.ledger.logged_draw(node.swarm.swarm_id, node.node_id, round_)
        if frame is None:
            wait_for_peers(node, request)
            frame = node.ledger.draw(request)
            node.ledger.write_sample(
                node.swarm.swarm_id,
                node.node_id,
                round_,
                frame,
                policy=node.spec.sampling.kind,
                seed=request.seed,
            )
    if down:
        log.warning("ledger unreachable (%s): round %d trains with J = 0", down.error, round_)
        return None
    return frame


def draw_request(node: NodeRuntime, round_: int) -> DrawRequest:
    """What the node's draw of peers' groups for ``round_`` asks of the ledger: the one
    request its warm-up wait and its draw both use."""
    config = node.spec.node
    reputation = node.learner.reputation  # through the last round trained
    swarm_id = node.swarm.swarm_id
    return DrawRequest(
        node_id=node.node_id,
        n_groups=config.external_groups,
        policy=node.spec.sampling,
        seed=round_seed(config.seed, round_),
        # Where a peer's group falls is keyed by the node's secret: no peer can compute it
        # (ledger/draws.py). The seed stays in the sample log, as before.
        draw_key=round_draw_key(node.draw_secret, swarm_id, node.node_id, round_)
        if node.draw_secret
        else None,
        # Of each group the rows the node trains on: at most its own group size, chosen by
        # that key, none it published itself.
        rows_per_group=config.generation.completions_per_question,
        swarm_id=swarm_id,
        exclude_nodes=reputation.excluded(),
        # Until it knows anyone, a node treats every peer alike (no Sybil ordering).
        known_nodes=reputation.known() or None,
        # Within the unknown-peer budget, peers it is coming to know first.
        standing=reputation.standing(),
        for_round=round_,
        # Groups this node's verifier cannot judge would take a slot and teach nothing.
        tasks=node.learner.judged_tasks,
    )


def peer_groups(frame: pl.DataFrame) -> tuple[list[Group], int]:
    """The drawn rows as groups, and how many rows could not be converted. Only the columns
    a rollout holds are converted (polars panics on a timestamp beyond its calendar, a
    ``BaseException``); a row that still cannot be converted is dropped and counted, so no
    row can stop a round."""
    fields = [c for c in RECORD_FIELDS if c in frame.columns]
    try:
        records = frame.select(fields).iter_rows(named=True)
        rows, dropped = from_records(records)
    except Exception as exc:  # a frame polars cannot convert at all: train without it
        log.warning("peers' rows could not be read (%s): J = 0 this round", exc)
        return [], frame.height
    if dropped:
        log.warning("dropped %d peers' rows that could not be read", dropped)
    return group_rollouts(rows, "external"), dropped


def wait_for_peers(node: NodeRuntime, request: DrawRequest) -> None:
    """Up to peer_wait_s for J qualifying peer groups to exist (a bounded warm-up), as the
    draw (``draw_request``) would find them: excluded peers' groups do not count."""
    deadline = time.monotonic() + node.swarm.peer_wait_s
    while time.monotonic() < deadline:
        if len(node.ledger.draw_group_ids(request)) >= request.n_groups:
            return
        time.sleep(PEER_POLL_S)


def train(node: NodeRuntime, state: RoundState) -> dict[str, float]:
    """The learner's round after the draw (`Learner.train_round`: judge the peers' rows,
    update the reputation, assemble I + J, the GRPO step, the totals), once the previous
    round's checkpoint is written; then the training log, which groups it trained on (for
    the sharing diagnostics). Timed as its two parts: ``reward`` (judging and assembling)
    and ``update``."""
    generated = require(state.generated, state, "train", "generate")
    checkpoint_wait(node, state)  # never step while a write reads the weights (see below)
    fault_point("train", state.round)
    node.progress.emit("step", round=state.round, step="train")
    began = time.perf_counter()
    report = node.learner.train_round(state.round, generated, state.external)
    state.report = report
    chosen = require(report.chosen, state, "train", "train_round")
    write_node_log(node, "training", state.round, chosen.records(report.loss_shares, report.drift))
    state.seconds["reward"] = report.select_s
    state.seconds["update"] = time.perf_counter() - began - report.select_s
    return node.learner.totals.as_metrics()


def write_node_log(
    node: NodeRuntime,
    kind: str,
    round_: int,
    rows: Sequence[TrainingRecord] | Sequence[EvaluationRecord],
) -> None:
    """Write a training or evaluation log; to the backlog while the ledger is unreachable."""
    with riding_out() as down:
        log_writer(node.ledger, kind)(node.swarm.swarm_id, node.node_id, round_, rows)
    if down:
        node.backlog.add_log(kind, node.swarm.swarm_id, node.node_id, round_, rows)


def checkpoint_due(done: int, every: int, *, force: bool) -> bool:
    """Whether a node that finished `done` rounds checkpoints now (every K rounds, or forced
    at the end of a run)."""
    return force or done % every == 0


@timed("checkpoint")
def checkpoint(node: NodeRuntime, state: RoundState, *, force: bool = False) -> str | None:
    """Checkpoint after the round every K rounds (or when forced, or the run's last round);
    returns its path.

    The write runs in the background while the next round generates (the next update
    waits for it); a forced one, at the end of a run, is complete when this returns."""
    done = state.round + 1
    force = force or state.last
    if not checkpoint_due(done, node.swarm.checkpoint_every, force=force):
        return None
    pending = checkpoints.capture(
        node.workdir, node.node_id, node.learner, done, node_config(node.spec)
    )
    node.writer.start(pending)
    if force:
        node.wait_for_checkpoint()
    state.checkpoint = str(pending.checkpoint.path)
    return state.checkpoint


@timed("checkpoint_wait")
def checkpoint_wait(node: NodeRuntime, state: RoundState) -> None:
    """Wait for the previous round's checkpoint, written while this round generated: the
    update must not change the weights and optimizer state while a write reads them."""
    node.wait_for_checkpoint()


def track(node: NodeRuntime, state: RoundState) -> dict[str, float]:
    """The round's metrics, logged to the node's MLflow run (when tracking is on)."""
    fault_point("track", state.round)
    metrics = round_metrics(node, state)
    node.log_metrics(metrics, step=state.round)
    if node.run is not None:
        report = require(state.report, state, "track", "train")
        chosen = require(report.chosen, state, "track", "train_round")
        node.run.tracker.log_table(
            node.run.run_id,
            sample_completions(chosen, state.round),
            f"completions/round-{state.round:04d}.json",
        )
    return metrics


def evaluation_due(node: NodeRuntime, state: RoundState) -> bool:
    return node.spec.node.evaluation.due(state.round, node.swarm.rounds)


def always(node: NodeRuntime, state: RoundState) -> bool:
    return True


@dataclass(frozen=True)
class Step:
    name: str
    run: Callable[[NodeRuntime, RoundState], Any]
    due: Callable[[NodeRuntime, RoundState], bool] = always


ROUND: tuple[Step, ...] = (
    Step("evaluate", evaluate, due=evaluation_due),
    Step("generate", generate),
    Step("publish", publish),
    Step("sample", sample),
    Step("train", train),
    Step("checkpoint", checkpoint),
    Step("track", track),
)
"""A round, in order: the paper's steps (evaluate first when due: the policy at the start of
the round), then the checkpoint and the round's metrics. The one place the order is written."""

StepCall = Callable[[Step, NodeRuntime, RoundState], Any]


def call_directly(step: Step, node: NodeRuntime, state: RoundState) -> Any:
    return step.run(node, state)


def run_round(
    node: NodeRuntime, state: RoundState, call: StepCall = call_directly
) -> dict[str, float]:
    """Run ``ROUND``'s steps that are due, each through ``call`` (a Prefect task in
    flows/node/round.py; directly in tests); the round's metrics (``track``'s)."""
    metrics: dict[str, float] = {}
    for step in ROUND:
        if step.due(node, state):
            metrics = call(step, node, state)
    return metrics
