"""The node's own verifier: every row, local or a peer's, is scored here and only here.

Ground truth is re-derived from the row's task fields; a row whose shipped question or
answer differs from the re-derived one is flagged and never trained on. Publishers' claimed
rewards are ignored.

The node's own questions (and held-out ones) are rebuilt in this process: their configs are
its own, and generating them cost the same. A peer's are rebuilt only for tasks the node runs,
within per-field bounds (`ConfigBounds`), and in a worker process under a hard time and memory
budget (`sapo_core.rebuild`): what a legal config costs to build is not bounded by its numbers.
"""

from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from sapo_core import rebuild
from sapo_core.config import RewardConfig, TaskConfig
from sapo_core.prompts import extract_answer, is_well_formed
from sapo_core.rebuild import UNJUDGED, Rebuilder, score_answer
from sapo_core.rollouts import Group, Rollout
from sapo_core.tasks import Question, TaskError, canonical_config, dataset, entry

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Verdict:
    """A row's reward under this node's verifier, or why it cannot be trained on."""

    reward: float | None
    problem: str | None = None


@dataclass(frozen=True)
class ScoredGroup:
    """A group's usable rows with this node's rewards (same order)."""

    group: Group
    rollouts: tuple[Rollout, ...]
    rewards: tuple[float, ...]

    @property
    def zero_variance(self) -> bool:
        return len(set(self.rewards)) <= 1

    @property
    def mean_reward(self) -> float:
        return sum(self.rewards) / len(self.rewards)


MAX_CONFIG_DEPTH = 4
MAX_CONFIG_ITEMS = 64


FIELD_FLOOR = 10.0
"""The least bound of a field the node sets itself: own values of 0 or 1 (flags, minima)
would otherwise refuse any other setting."""


@dataclass(frozen=True)
class ConfigBounds:
    """Which task configs this node builds for a peer: only of tasks it trains or is evaluated
    on, its own configs, or any whose numbers stay within per-field bounds. A field the node
    sets in its own config of the task may be up to 10x its own largest value (at least
    ``FIELD_FLOOR``); any other field up to ``default`` (``RewardConfig.max_config_number``).

    A task outside those is refused whatever its config: the node has no use for its rows,
    and its generator is code the node has never run. (What a config costs is bounded by
    the rebuild worker, not here: see `sapo_core.rebuild`.)
    """

    own: Mapping[str, frozenset[str]] = field(default_factory=dict)
    """Per task the node trains or is evaluated on, the canonical JSON of its own configs
    (always accepted)."""
    largest: Mapping[str, Mapping[str, float]] = field(default_factory=dict)
    """Per task and field path, the largest number the node's own configs hold there."""
    default: float = 1000.0

    @classmethod
    def of(cls, own: Mapping[str, Sequence[Mapping[str, Any]]], default: float) -> ConfigBounds:
        texts = {t: frozenset(canonical_config(dict(c)) for c in cs) for t, cs in own.items()}
        largest: dict[str, dict[str, float]] = {}
        for task, configs in own.items():
            fields = largest.setdefault(task, {})
            for config in configs:
                for path, number in _numbers(config):
                    fields[path] = max(fields.get(path, 0.0), abs(number))
        return cls(texts, largest, default)

    @classmethod
    def for_node(
        cls, tasks: TaskConfig, evaluated: TaskConfig | None, default: float
    ) -> ConfigBounds:
        """A node's bounds: the tasks it trains on and those it is evaluated on (a specialist
        learns the tasks it does not practise from peers' groups of them)."""
        own: dict[str, list[Mapping[str, Any]]] = {}
        for spec in (*tasks.specs, *(evaluated.specs if evaluated else ())):
            own.setdefault(spec.name, []).append(spec.config)
        return cls.of(own, default)

    def bound(self, task: str, path: str) -> float:
        own = self.largest.get(task, {}).get(path)
        return self.default if own is None else max(10 * own, FIELD_FLOOR)

    def problem(self, task: str, task_config: str) -> str | None:
        """Why this node refuses to build ``task`` with ``task_config``, or None."""
        if task not in self.own:
            return f"task {task} is not one this node trains or is evaluated on"
        if task_config in self.own[task]:
            return None
        try:
            config = json.loads(task_config)
        except ValueError:
            return "task_config is not JSON"
        except RecursionError:  # "[[[[..." thousands deep, within the length bound
            return "task_config nested too deeply to parse"
        if not isinstance(config, dict):
            return "task_config is not a JSON object"
        if _depth(config) > MAX_CONFIG_DEPTH:
            return f"task_config nested deeper than {MAX_CONFIG_DEPTH}"
        if any(isinstance(v, list) and len(v) > MAX_CONFIG_ITEMS for _, v in _values(config)):
            return f"task_config holds a list longer than {MAX_CONFIG_ITEMS}"
        for path, number in _numbers(config):
            bound = self.bound(task, path)
            if abs(number) > bound:
                return (
                    f"task_config {path} = {number:g} beyond this node's bound {bound:g} for {task}"
                )
        return None


def _values(value: Any) -> Iterator[tuple[str, Any]]:
    """Every value in a parsed JSON value, with its path (``a.b``; list items ``a[]``)."""
    stack: list[tuple[str, Any]] = [("", value)]
    while stack:
        path, item = stack.pop()
        yield path, item
        if isinstance(item, dict):
            stack.extend((f"{path}.{k}" if path else str(k), v) for k, v in item.items())
        elif isinstance(item, list):
            stack.extend((f"{path}[]", v) for v in item)


def _numbers(value: Any) -> Iterator[tuple[str, float]]:
    """Every number in a parsed JSON value, with its path; integers too large for a float,
    NaN and infinities come out as ``inf`` (beyond any bound)."""
    for path, item in _values(value):
        if isinstance(item, int | float) and not isinstance(item, bool):
            try:
                number = float(item)
            except OverflowError:
                number = math.inf
            yield path, (number if math.isfinite(number) else math.inf)


def _depth(value: Any) -> int:
    deepest, stack = 0, [(value, 0)]
    while stack:
        item, depth = stack.pop()
        deepest = max(deepest, depth)
        if isinstance(item, dict):
            stack.extend((v, depth + 1) for v in item.values())
        elif isinstance(item, list):
            stack.extend((v, depth + 1) for v in item)
    return deepest


def verify(rollout: Rollout, config: RewardConfig) -> Verdict:
    """Score one of this node's own rows with its verifier against ground truth it
    re-derived itself, in this process (a peer's rows go through `score_group` with the
    node's bounds, which rebuilds them in the bounded worker)."""
    return verify_answer(rollout.question, rollout.completion, config)


def regenerated_truth(q: Question) -> tuple[dict[str, Any], Any] | Verdict:
    """(ground-truth entry, dataset) of ``q`` rebuilt in this process from its four task
    fields (unbounded: the node's own questions only), or the Verdict that flags it."""
    try:
        return entry(q.task, q.task_config, q.task_seed, q.task_index), dataset(
            q.task, q.task_config, q.task_seed
        )
    except TaskError as exc:
        return Verdict(None, f"unverifiable: {exc}")


def verify_answer(
    q: Question,
    completion: str,
    config: RewardConfig,
    truth: tuple[dict[str, Any], Any] | Verdict | None = None,
) -> Verdict:
    """Score a completion of question ``q``; the question is re-derived in this process from
    its four task fields (or given as ``truth``, from ``regenerated_truth``), and the
    question text and answer ``q`` claims must match the rebuilt ones."""
    rebuilt = truth if truth is not None else regenerated_truth(q)
    if isinstance(rebuilt, Verdict):
        return rebuilt
    truth_entry, data = rebuilt
    if str(truth_entry["question"]) != q.question:
        return Verdict(None, "question differs from the regenerated one")
    gold = truth_entry.get("answer")
    if (None if gold is None else str(gold)) != q.answer:
        return Verdict(None, "answer differs from the regenerated ground truth")
    correct = score_answer(data, truth_entry, extract_answer(completion, config.extraction))
    return _reward(correct, completion, config)


def _reward(correct: float, completion: str, config: RewardConfig) -> Verdict:
    """The row's reward from its answer's correctness and, if weighted, its format."""
    if config.format_weight == 0.0:
        return Verdict(correct)
    formatted = config.format_weight * float(is_well_formed(completion))
    return Verdict((correct + formatted) / (1.0 + config.format_weight))


def score_group(
    group: Group,
    config: RewardConfig,
    bounds: ConfigBounds | None = None,
    rebuilder: Rebuilder | None = None,
    time_left_s: float | None = None,
    clock: Any = time.monotonic,
) -> tuple[ScoredGroup | None, list[str]]:
    """Verify every row, rebuilding each question once; drop flagged rows, and the group if
    fewer than two remain.

    With ``bounds`` the group is a peer's: its config must pass them, its rows must all
    answer the group's one question, and that question is rebuilt and its answers scored
    by ``rebuilder`` (the process's shared one by default) within
    ``config.rebuild_timeout_s``, or ``time_left_s`` if less; rows whose answer is read after
    ``time_left_s`` (by ``clock``) are left unjudged. Without, in this process.
    """
    if bounds is not None:
        worker = rebuilder or rebuild.shared(config.rebuild_timeout_s, config.rebuild_memory_mb)
        verdicts = _peer_verdicts(group, config, bounds, worker, time_left_s, clock)
    else:
        verdicts = own_verdicts(group.rollouts, config)
    return _scored(group, verdicts)


def _scored(group: Group, verdicts: Sequence[Verdict]) -> tuple[ScoredGroup | None, list[str]]:
    """The group's rows that have a reward, with it; each flagged row's reason; None for a
    group left with fewer than two rows (no advantage to compute)."""
    kept: list[Rollout] = []
    rewards: list[float] = []
    problems: list[str] = []
    for rollout, verdict in zip(group.rollouts, verdicts, strict=True):
        if verdict.reward is None:
            problems.append(f"{rollout.rollout_id}: {verdict.problem}")
        else:
            kept.append(rollout)
            rewards.append(verdict.reward)
    if len(kept) < 2:
        return None, problems
    return ScoredGroup(group, tuple(kept), tuple(rewards)), problems


def own_verdicts(rollouts: Sequence[Rollout], config: RewardConfig) -> list[Verdict]:
    """Each of this node's own rows' verdict, its question rebuilt in this process (once
    per question)."""
    truths: dict[tuple[str, str, int, int], tuple[dict[str, Any], Any] | Verdict] = {}
    verdicts = []
    for rollout in rollouts:
        q = rollout.question
        if q.key not in truths:
            truths[q.key] = regenerated_truth(q)
        verdicts.append(verify_answer(q, rollout.completion, config, truth=truths[q.key]))
    return verdicts


def _peer_verdicts(
    group: Group,
    config: RewardConfig,
    bounds: ConfigBounds,
    rebuilder: Rebuilder,
    time_left_s: float | None,
    clock: Any = time.monotonic,
) -> list[Verdict]:
    """Each row's verdict, the group's one question rebuilt and every distinct answer scored
    in one call of the bounded worker; rows of another question are refused, so a group
    costs at most one rebuild. Answers are read row by row within ``time_left_s``: rows
    left when it is spent are unjudged (reading is linear in the text, see
    sapo_core.prompts.tagged_answer, so this binds only on a slow machine)."""
    if not group.rollouts:
        return []
    q = group.question
    problem = bounds.problem(q.task, q.task_config)
    if problem:
        # A task this node has no use for (an honest specialist's, say) is no fault.
        why = f"{UNJUDGED if q.task not in bounds.own else 'refused: '}{problem}"
        return [Verdict(None, why)] * len(group.rollouts)
    deadline = None if time_left_s is None else clock() + time_left_s
    spent = [Verdict(None, f"{UNJUDGED}verification budget spent within the group")]
    answers: list[str | None] = []
    for row in group.rollouts:
        if deadline is not None and clock() >= deadline:
            return spent * len(group.rollouts)
        answers.append(extract_answer(row.completion, config.extraction))
    left = None if deadline is None else deadline - clock()
    if left is not None and left <= 0:
        return spent * len(group.rollouts)
    distinct = list(dict.fromkeys(answers))
    rebuilt = rebuilder.check(q, distinct, left)
    if isinstance(rebuilt, str):
        return [Verdict(None, rebuilt)] * len(group.rollouts)
    score = dict(zip(distinct, rebuilt.scores, strict=True))
    verdicts = []
    for rollout, answer in zip(group.rollouts, answers, strict=True):
        if rollout.question.key != q.key:
            verdicts.append(Verdict(None, "refused: row's question is not its group's"))
        elif mismatch := rebuilt.problem(rollout.question):
            verdicts.append(Verdict(None, mismatch))
        else:
            verdicts.append(_reward(score[answer], rollout.completion, config))
    return verdicts


def scored_own(groups: Sequence[Group]) -> tuple[list[ScoredGroup], list[str]]:
    """The node's own groups scored by the rewards their rows carry: the verdicts its
    verifier gave them when they were made (`own_verdicts`, in this process, under this
    config), so own rows are verified once a round. A row without one is flagged; a group
    left with fewer than two rows is dropped, as `score_group` does."""
    scored: list[ScoredGroup] = []
    problems: list[str] = []
    for group in groups:
        carried = [Verdict(r.reward, None if r.reward is not None else "unverifiable")
                   for r in group.rollouts]  # fmt: skip
        result, found = _scored(group, carried)
        problems.extend(found)
        if result is not None:
            scored.append(result)
    return scored, problems


def score_groups(
    groups: Sequence[Group],
    config: RewardConfig,
    bounds: ConfigBounds | None = None,
    clock: Any = time.monotonic,
    rebuilder: Rebuilder | None = None,
) -> tuple[list[ScoredGroup], list[str]]:
    """Score many groups within ``config.verify_budget_s``; returns the usable ones and every
    flagged row's reason (groups left when the budget is spent are flagged whole).

    With ``bounds`` (peers' groups) each group's rebuild is also stopped at what is left of
    the budget, so no group overruns it by more than a worker's restart."""
    scored: list[ScoredGroup] = []
    problems: list[str] = []
    deadline = clock() + config.verify_budget_s
    for group in groups:
        now = clock()
        if now > deadline:
            spent = f"{UNJUDGED}verification budget of {config.verify_budget_s:g} s spent"
            problems.extend(f"{r.rollout_id}: {spent}" for r in group.rollouts)
            continue
        result, found = score_group(group, config, bounds, rebuilder, deadline - now, clock)
        problems.extend(found)
        if result is not None:
            scored.append(result)
    if problems:
        log.warning("flagged %d rows; first: %s", len(problems), problems[0])
    return scored, problems
