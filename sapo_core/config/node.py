"""A node's whole algorithm configuration, and how it weighs its peers' evidence."""

from __future__ import annotations

from typing import Literal, Self

from pydantic import Field, model_validator

from sapo_core.config.base import BUNDLED_MODEL, Strict
from sapo_core.config.bundled import BundledModelError, lookup
from sapo_core.config.questions import EvaluationConfig, PromptConfig, RewardConfig, TaskConfig
from sapo_core.config.training import ComputeConfig, GenerationConfig, GRPOConfig

MAX_GROUPS_PER_ROUND = 1024
"""Most own (I) or peers' (J) groups a node trains on in a round (ledger.schema declares the
same bound for the manifests it keeps; a test holds the two equal)."""


class ReputationConfig(Strict):
    """What a node's verifier must see of a peer before it trusts or excludes it
    (sapo_core/reputation.py). Only rows it judged count: a row of a task it does not
    train, or left when its verification budget ran out, says nothing about the peer."""

    min_rows: int = Field(
        16,
        ge=1,
        le=100_000,
        description="Judged rows a peer needs before it is known: known peers' groups are "
        "drawn before the unknown-peer budget (sampling's max_unknown_share) applies to the "
        "rest.",
    )
    exclude_after_rows: int = Field(
        8,
        ge=1,
        le=100_000,
        description="Judged rows a peer needs before it can be excluded (two groups of 4): "
        "failures are caught quickly, one unlucky group is not enough.",
    )
    max_bad_share: float = Field(
        0.5,
        gt=0.0,
        lt=1.0,
        description="Excluded above this share of bad rows (failed, plus half the "
        "misclaimed), recent rows weighing most; at 0.5 misclaims alone never exclude (an "
        "honest peer with another verifier setting misclaims every row).",
    )
    known_max_bad_share: float = Field(
        0.25,
        ge=0.0,
        lt=1.0,
        description="Known only at or under this bad share: a peer whose claimed rewards keep "
        "differing from this node's (misclaims weigh half) is never excluded for it, but its "
        "claims steer the draw (which filters on them), so it stays within the unknown-peer "
        "budget.",
    )
    half_life_rows: float = Field(
        16.0,
        gt=0.0,
        description="Judged rows after which a row's verdict weighs half: a good past "
        "does not buy a bad present (a peer's last ~2 x half_life rows decide).",
    )


class NodeConfig(Strict):
    """Everything one node needs to run its rounds, apart from storage and tracking."""

    node_id: str = Field(
        "node-0", min_length=1, description="Checked as an id where a swarm file loads."
    )
    model: str = Field(
        BUNDLED_MODEL,
        description="Hugging Face id, local directory, or a bundled model that runs offline "
        "(`bundled:smollm2-135m-instruct`, `bundled:gemma3-270m`; sapo_core/policy/bundled.py).",
    )
    local_groups: int = Field(
        8, ge=0, le=MAX_GROUPS_PER_ROUND, description="I: own groups trained on per round."
    )
    external_groups: int = Field(
        0,
        ge=0,
        le=MAX_GROUPS_PER_ROUND,
        description="J: peers' groups trained on per round (0: no sharing).",
    )
    questions_per_round: int | None = Field(
        None,
        ge=1,
        description="Questions generated (and published) per round; default I + J, so every "
        "configuration spends the same generation compute.",
    )
    local_selection: Literal["drawn", "informative_first"] = Field(
        "drawn",
        description="Which I of the questions_per_round own groups a node trains on: drawn "
        "(at random, seeded), or informative_first (those whose completions' rewards differ "
        "first; with questions_per_round above I, a node alone buys informative groups with "
        "generation: the compute-matched control of docs/compute-matched-cpu.md).",
    )
    seed: int = Field(
        0,
        ge=0,
        le=2**42,  # a round's seed (seed * 1_000_003 + round) stays within what logs record
        description="Seeds questions, sampling and initial state.",
    )
    tasks: TaskConfig = Field(default_factory=TaskConfig)
    prompt: PromptConfig = Field(default_factory=PromptConfig)  # type: ignore[arg-type]
    reward: RewardConfig = Field(default_factory=RewardConfig)  # type: ignore[arg-type]
    generation: GenerationConfig = Field(default_factory=GenerationConfig)  # type: ignore[arg-type]
    grpo: GRPOConfig = Field(default_factory=GRPOConfig)  # type: ignore[arg-type]
    evaluation: EvaluationConfig = Field(default_factory=EvaluationConfig)  # type: ignore[arg-type]
    compute: ComputeConfig = Field(default_factory=ComputeConfig)  # type: ignore[arg-type]
    reputation: ReputationConfig = Field(default_factory=ReputationConfig)  # type: ignore[arg-type]

    @model_validator(mode="after")
    def _batch_is_consistent(self) -> Self:
        try:
            lookup(self.model)
        except BundledModelError as exc:
            raise ValueError(str(exc)) from None
        if self.local_groups + self.external_groups == 0:
            raise ValueError("local_groups + external_groups (I + J) must be at least 1")
        if self.questions_per_round is not None and self.questions_per_round < self.local_groups:
            raise ValueError(
                f"questions_per_round ({self.questions_per_round}) is below local_groups "
                f"({self.local_groups}): a node cannot train on more own groups than it made"
            )
        return self

    @property
    def questions(self) -> int:
        """Questions this node generates each round."""
        return self.questions_per_round or (self.local_groups + self.external_groups)
