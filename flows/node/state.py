"""What one round of a node carries from step to step (inside the node's process: the
model's output is too large to pass between Prefect tasks)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TypeVar

from sapo_core.learner import Generated, RoundReport
from sapo_core.rollouts import Group

T = TypeVar("T")


@dataclass
class RoundNotes:
    """What the round saw on the way, for its metrics: nothing later steps act on."""

    ledger_down: bool = False  # the ledger did not answer: groups kept in the backlog, J = 0
    peer_rows_dropped: int = 0  # drawn peers' rows that could not be converted


@dataclass
class RoundState:
    """What one round carries from step to step: what each step made for the next (the
    model's output, the drawn groups, the training set, the update's report), and the
    round's notes and timings for its metrics."""

    round: int
    started: float = field(default_factory=time.perf_counter)
    last: bool = False  # the run's last round: its checkpoint is forced
    # Made by the steps, in order: generate, sample, train, checkpoint (evaluate first, when
    # due).
    evaluation: dict[str, float] = field(default_factory=dict)  # held-out metrics, if due
    generated: Generated | None = None
    external: list[Group] = field(default_factory=list)
    report: RoundReport | None = None  # the learner's round: its training set, its update
    checkpoint: str | None = None
    notes: RoundNotes = field(default_factory=RoundNotes)
    seconds: dict[str, float] = field(default_factory=dict)  # per step


def require(value: T | None, state: RoundState, step: str, before: str) -> T:
    """``value``, which step ``before`` sets; a clear error if it did not run."""
    if value is None:
        raise RuntimeError(f"round {state.round}: {step} before {before}")
    return value
