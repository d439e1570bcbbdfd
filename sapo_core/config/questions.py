"""What a node asks and how it scores an answer: its task mix, its prompt, its verifier's
reward, and its held-out evaluation."""

from __future__ import annotations

from typing import Any, Literal, Self

from pydantic import Field, model_validator

from sapo_core.config.base import DEFAULT_SYSTEM_PROMPT, PAPER_SPECIALTIES, Strict


class TaskSpec(Strict):
    """One reasoning-gym dataset in a node's mix."""

    name: str = Field(min_length=1, description="reasoning-gym dataset name.")
    config: dict[str, Any] = Field(
        default_factory=dict, description="Keyword arguments of the dataset (its difficulty)."
    )
    weight: float = Field(1.0, gt=0.0, description="Relative probability of drawing this task.")


class TaskConfig(Strict):
    """Where a node's questions come from."""

    specs: tuple[TaskSpec, ...] = Field(
        default=tuple(TaskSpec(name=n, weight=1.0) for n in PAPER_SPECIALTIES),
        min_length=1,
        description="Task mix; each question draws one spec by weight, with replacement.",
    )

    @model_validator(mode="after")
    def _known_tasks(self) -> Self:
        names = [s.name for s in self.specs]
        if len(set(names)) != len(names):
            raise ValueError(f"a task is listed twice in the mix: {names}")
        return self


class Example(Strict):
    """A worked example shown before the question, as a user turn and the assistant's reply."""

    question: str = Field(min_length=1, max_length=2000)
    completion: str = Field(min_length=1, max_length=2000)


class PromptConfig(Strict):
    """How a question becomes the model's input."""

    system_prompt: str = Field(DEFAULT_SYSTEM_PROMPT, description="System turn; '' for none.")
    prefill: str = Field(
        "",
        max_length=64,
        description="Text that opens the assistant turn (e.g. '<answer>'); it is part of the "
        "prompt, never trained on. Small models rarely emit answer tags unless prefilled.",
    )
    examples: tuple[Example, ...] = Field(
        (),
        max_length=8,
        description="Few-shot turns before the question: how an answer looks, without giving "
        "away the format in the assistant's own turn (as a prefill would).",
    )
    format: Literal["auto", "chat", "plain"] = Field(
        "auto",
        description="chat: the tokenizer's chat template; plain: text a base model continues "
        "(system prompt, then 'Question: ...' / 'Answer: ...' for each example and the "
        "question), generation stopping at '</answer>'; auto: what a bundled model's entry "
        "says, else chat when the tokenizer has a chat template. The format used is recorded "
        "in the node's manifest.",
    )


class RewardConfig(Strict):
    """The node's own verifier."""

    extraction: Literal["strict", "lenient", "last_number"] = Field(
        "strict",
        description="strict: the last <answer>...</answer> (reasoning-gym, the paper); "
        "lenient: also an unclosed final <answer> up to the line end; last_number: the tagged "
        "answer if any, else the last number in the completion.",
    )
    format_weight: float = Field(
        0.0,
        ge=0.0,
        le=1.0,
        description="Reward added for a well-formed <answer>...</answer> (the paper: 0). "
        "The total is rescaled into [0, 1].",
    )
    max_config_number: float = Field(
        1000.0,
        gt=0.0,
        description="Largest number a peer's task_config may hold in a field this node does "
        "not set itself (a field it sets may reach 10x its own value); others are refused "
        "before the dataset is built (a legal config can cost minutes).",
    )
    verify_budget_s: float = Field(
        120.0,
        gt=0.0,
        description="Seconds the verifier may spend on one round's groups; groups left when "
        "it is spent are flagged, not trained on.",
    )
    rebuild_timeout_s: float = Field(
        2.0,
        gt=0.0,
        le=600.0,
        description="Seconds one peer question may take to rebuild and score (in a worker "
        "process, killed past it; the group is flagged). An honest rebuild takes about a "
        "millisecond (benchmarks/node_attacks.py); a legal config can take longer than any "
        "round.",
    )
    rebuild_memory_mb: int = Field(
        1024,
        ge=64,
        le=65_536,
        description="Memory (MB of address space) one peer question's rebuild may add to the "
        "worker process; past it the rebuild fails and the group is flagged.",
    )


class EvaluationConfig(Strict):
    """Held-out evaluation: fixed questions, never trained on, scored every `every` rounds.

    Questions come from the held-out stream of `seed` (sapo_core.tasks.stream_seed), apart
    from every node's training stream, so the set is the same for every node and every
    configuration of an experiment and never trained on.
    Completions are sampled at the node's temperature with a fixed seed: the score is the
    policy's expected accuracy, comparable with the training reward, and replayable.
    """

    every: int = Field(0, ge=0, description="Evaluate every K rounds (and after the last); 0: off.")
    questions_per_task: int = Field(8, ge=1, le=1024)
    completions: int = Field(2, ge=1, le=64, description="Sampled answers per question.")
    seed: int = Field(
        1_000_003, ge=0, description="Seeds the held-out questions and their sampling."
    )
    tasks: TaskConfig | None = Field(
        None, description="Tasks evaluated; default: the node's own (specialists: set all)."
    )

    def due(self, round_: int, rounds: int) -> bool:
        """Whether the policy at the start of `round_` is evaluated (round == rounds: the
        final policy, after the last update)."""
        return self.every > 0 and (round_ % self.every == 0 or round_ == rounds)
