"""Questions from reasoning-gym, reproducible from (task, task_config, task_seed, task_index).

Any node regenerates a peer's question, ground truth and verifier metadata from those four
fields, so nothing a peer ships about a question has to be trusted.
"""

from __future__ import annotations

import functools
import hashlib
import json
import random
from dataclasses import dataclass
from typing import Any

from sapo_core.config import TaskConfig

# reasoning-gym items depend on (seed, index) only, not on the dataset's size; the size just
# has to exceed the index. Cached datasets are built this large once.
_DATASET_SIZE = 2**31 - 1


def stream_seed(seed: int, purpose: str) -> int:
    """The reasoning-gym dataset seed of one question stream.

    reasoning-gym builds item i of a dataset from Random(seed + i), so streams seeded 0, 1,
    2, ... are the same questions shifted by one index: neighbouring nodes would share most
    of their questions, and a held-out set seeded nearby would be trained on. Hashing the
    seed with the stream's purpose spreads streams over 2**31 seeds, where two ranges of a
    few thousand items meet with probability ~1e-5.
    """
    digest = hashlib.sha256(f"sapo/{purpose}/{seed}".encode()).digest()
    return int.from_bytes(digest[:4], "big") >> 1  # [0, 2**31)


class TaskError(ValueError):
    """A question cannot be regenerated from its fields (unknown task, bad config, bad index)."""


@dataclass(frozen=True)
class Question:
    """One question with everything needed to regenerate and verify it."""

    task: str
    task_config: str  # canonical JSON
    task_seed: int
    task_index: int
    question: str
    answer: str | None
    metadata: str  # JSON

    @property
    def key(self) -> tuple[str, str, int, int]:
        return (self.task, self.task_config, self.task_seed, self.task_index)


def canonical_config(config: dict[str, Any]) -> str:
    """The one JSON spelling of a task config, so equal configs compare equal as text."""
    return json.dumps(config, sort_keys=True, separators=(",", ":"))


@functools.lru_cache(maxsize=256)
def dataset(task: str, task_config: str, task_seed: int) -> Any:
    """The reasoning-gym dataset behind a question (cached: building some costs ~ms)."""
    import reasoning_gym  # heavy import (~1.5 s), kept off module import

    try:
        config = json.loads(task_config)
        if not isinstance(config, dict):
            raise TaskError(f"task_config is not a JSON object: {task_config[:80]!r}")
        return reasoning_gym.create_dataset(task, seed=task_seed, size=_DATASET_SIZE, **config)
    except TaskError:
        raise
    except Exception as exc:  # reasoning-gym raises many kinds for bad names and configs
        raise TaskError(f"cannot build task {task!r} with config {task_config!r}: {exc}") from exc


def entry(task: str, task_config: str, task_seed: int, task_index: int) -> dict[str, Any]:
    """The reasoning-gym entry {question, answer, metadata} at one index."""
    if not 0 <= task_index < _DATASET_SIZE:
        raise TaskError(f"task_index {task_index} out of range")
    data = dataset(task, task_config, task_seed)
    try:
        return dict(data[task_index])
    except Exception as exc:
        raise TaskError(f"cannot generate {task}[{task_index}]: {exc}") from exc


def regenerate(task: str, task_config: str, task_seed: int, task_index: int) -> Question:
    """Rebuild a question from its four defining fields."""
    item = entry(task, task_config, task_seed, task_index)
    answer = item.get("answer")
    return Question(
        task=task,
        task_config=task_config,
        task_seed=task_seed,
        task_index=task_index,
        question=str(item["question"]),
        answer=None if answer is None else str(answer),
        metadata=json.dumps(item.get("metadata", {}), sort_keys=True, default=str),
    )


class TaskSource:
    """A node's question stream: each round draws tasks by weight, one fresh question each.

    Question k of round r has task_index r * per_round + k under the node's dataset seed
    (`stream_seed(seed, "train")`), so questions never repeat within a node and a restarted
    node draws the same ones again.
    """

    def __init__(self, config: TaskConfig, seed: int) -> None:
        self.specs = config.specs
        self.seed = seed
        self.dataset_seed = stream_seed(seed, "train")
        self._configs = [canonical_config(s.config) for s in self.specs]
        self._weights = [s.weight for s in self.specs]

    def draw(self, round_: int, count: int) -> list[Question]:
        """The questions of one round (deterministic in seed and round)."""
        rng = random.Random(f"tasks/{self.seed}/{round_}")
        picks = rng.choices(range(len(self.specs)), weights=self._weights, k=count)
        return [
            regenerate(self.specs[i].name, self._configs[i], self.dataset_seed, round_ * count + k)
            for k, i in enumerate(picks)
        ]
