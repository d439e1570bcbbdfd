"""The rollout as the core sees it: one completion of one question, plus what trains on it.

`to_record` / `from_record` speak the ledger's column names, so flows can hand rows between
the two packages without either importing the other.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from sapo_core.tasks import Question

Source = Literal["local", "external"]


def group_id_of(prefix: str, node_id: str, round_: int, question: int) -> str:
    """The id of a node's group: ``<prefix><node>.r<round>.q<k>`` (the prefix is the
    swarm's, ``<swarm>.``, in a swarm): written here once, for the learner that names its
    groups and the config that bounds the longest id."""
    return f"{prefix}{node_id}.r{round_}.q{question}"


def rollout_id_of(group_id: str, completion: int) -> str:
    """The id of completion ``completion`` of a group: ``<group id>.c<j>``."""
    return f"{group_id}.c{completion}"


@dataclass(frozen=True)
class Rollout:
    """One completion. ``logprobs`` (the behaviour log-probs GRPO's ratio divides by) are
    known only for own rows; ``token_ids``, ``claimed_logprobs`` (of the distribution the
    generator sampled from, top-p applied) and ``tokenizer`` (its fingerprint) are the
    generator's claim, published with the row and judged by a receiver (sapo_core/claims.py).
    """

    rollout_id: str
    group_id: str
    node_id: str
    model_id: str
    node_round: int
    policy_version: int
    question: Question
    completion: str
    completion_tokens: int
    reward: float | None = None  # the publisher's claim; receivers recompute it
    token_ids: tuple[int, ...] | None = field(default=None, repr=False)
    logprobs: tuple[float, ...] | None = field(default=None, repr=False)
    claimed_logprobs: tuple[float, ...] | None = field(default=None, repr=False)
    tokenizer: str | None = None

    def to_record(self) -> dict[str, Any]:
        """The ledger's columns (swarm id, timestamps and schema version are the writer's)."""
        q = self.question
        return {
            "rollout_id": self.rollout_id,
            "group_id": self.group_id,
            "node_id": self.node_id,
            "model_id": self.model_id,
            "node_round": self.node_round,
            "policy_version": self.policy_version,
            "task": q.task,
            "task_config": q.task_config,
            "task_seed": q.task_seed,
            "task_index": q.task_index,
            "question": q.question,
            "answer": q.answer,
            "metadata": q.metadata,
            "completion": self.completion,
            "completion_tokens": self.completion_tokens,
            "reward": self.reward,
            **self._claim(),
        }

    def _claim(self) -> dict[str, Any]:
        """The generator's claim as the ledger's columns, or all NULL when it is not whole
        (readers refuse a row whose claim is malformed, and would lose its text with it)."""
        ids, logprobs = self.token_ids, self.claimed_logprobs
        whole = (
            ids is not None
            and logprobs is not None
            and self.tokenizer is not None
            and len(ids) == len(logprobs) == self.completion_tokens
            and all(math.isfinite(x) and x <= 0.0 for x in logprobs)
            and all(i >= 0 for i in ids)
        )
        if not whole:
            return {"token_ids": None, "token_logprobs": None, "tokenizer": None}
        return {
            "token_ids": list(ids or ()),
            "token_logprobs": list(logprobs or ()),
            "tokenizer": self.tokenizer,
        }

    @classmethod
    def from_record(cls, row: Mapping[str, Any]) -> Rollout:
        """A peer's row as read from the ledger (its claims are verified later, not here)."""
        question = Question(
            task=str(row["task"]),
            task_config=str(row["task_config"]),
            task_seed=int(row["task_seed"]),
            task_index=int(row["task_index"]),
            question=str(row["question"]),
            answer=None if row.get("answer") is None else str(row["answer"]),
            metadata=str(row.get("metadata") or "{}"),
        )
        reward = row.get("reward")
        return cls(
            rollout_id=str(row["rollout_id"]),
            group_id=str(row["group_id"]),
            node_id=str(row["node_id"]),
            model_id=str(row["model_id"]),
            node_round=int(row["node_round"]),
            policy_version=int(row["policy_version"]),
            question=question,
            completion=str(row["completion"]),
            completion_tokens=int(row["completion_tokens"]),
            reward=None if reward is None else float(reward),
            token_ids=_numbers(row.get("token_ids"), int),
            claimed_logprobs=_numbers(row.get("token_logprobs"), float),
            tokenizer=None if row.get("tokenizer") is None else str(row["tokenizer"]),
        )


def _numbers(values: Any, kind: type) -> tuple[Any, ...] | None:
    """A claimed list as a tuple of ``kind`` (None stays None)."""
    return None if values is None else tuple(kind(v) for v in values)


RECORD_FIELDS: tuple[str, ...] = (
    "rollout_id",
    "group_id",
    "node_id",
    "model_id",
    "node_round",
    "policy_version",
    "task",
    "task_config",
    "task_seed",
    "task_index",
    "question",
    "answer",
    "metadata",
    "completion",
    "completion_tokens",
    "reward",
    "token_ids",
    "token_logprobs",
    "tokenizer",
)
"""The columns ``from_record`` reads: a caller converts these alone, so that no other value
of a peer's row (a timestamp out of any calendar's range, say) is ever converted."""


def from_records(rows: Iterable[Mapping[str, Any]]) -> tuple[list[Rollout], int]:
    """Peers' rows as rollouts, and how many could not be converted (dropped, never a
    crash: the ledger range-checks rows, this is the last line)."""
    kept: list[Rollout] = []
    dropped = 0
    for row in rows:
        try:
            kept.append(Rollout.from_record(row))
        except (KeyError, TypeError, ValueError, OverflowError):
            dropped += 1
    return kept, dropped


@dataclass(frozen=True)
class Group:
    """The completions of one question, from this node or a peer."""

    group_id: str
    source: Source
    rollouts: tuple[Rollout, ...]

    @property
    def question(self) -> Question:
        return self.rollouts[0].question


def group_rollouts(rollouts: Sequence[Rollout], source: Source) -> list[Group]:
    """Rows grouped by their explicit group id, in first-seen order."""
    by_id: dict[str, list[Rollout]] = {}
    for r in rollouts:
        by_id.setdefault(r.group_id, []).append(r)
    return [Group(gid, source, tuple(rows)) for gid, rows in by_id.items()]
