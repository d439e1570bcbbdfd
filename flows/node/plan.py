"""What a run of a node does, decided from its checkpoint, its swarm and its arguments:
which rounds it runs, and how it finishes (a final evaluation, its model logged, the node
marked finished). Plain functions: the node flow (flows/node/round.py) asks, tests check."""

from __future__ import annotations

from collections.abc import Callable

from flows.config import SwarmConfig
from flows.node import checkpoint


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


def reached_the_end(next_round: int, rounds: int) -> bool:
    """Whether a node whose next round is `next_round` has run all of its swarm's rounds:
    then its policy is scored once more (the final evaluation, unless recorded already)."""
    return next_round >= rounds


def logs_its_model(
    *,
    log_models: bool,
    next_round: int,
    rounds: int,
    until_round: int | None,
    ran_rounds: bool,
    model_missing: Callable[[], bool],
) -> bool:
    """Whether a run logs the node's model as it closes: when models are logged and the node
    reached its last round (or a run without a bound went past it), not after every
    scheduled run of a few rounds; by the run that ran rounds, or by a later one when the
    one that reached the end did not log it (it stopped before, or the upload failed).
    ``model_missing`` is asked only when that decides (it asks MLflow)."""
    reached = reached_the_end(next_round, rounds) or until_round is None
    return log_models and reached and (ran_rounds or model_missing())


def finished(next_round: int, rounds: int, model_missing: Callable[[], bool]) -> bool:
    """Whether the node is marked finished (later runs asked for no more rounds stop at
    once): all rounds run and, where a model is due in MLflow, its model there (asked only
    then)."""
    return reached_the_end(next_round, rounds) and not model_missing()
