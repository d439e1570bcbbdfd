"""Configuration of one node's algorithm: tasks, prompt, reward, generation, GRPO, node.

One validated model per concern, bounds declared on the fields, unknown keys rejected.
This module imports no torch, so tools that only read configs or the ledger stay light.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal, Self

import yaml
from pydantic import BaseModel, ConfigDict, Field, model_validator

# The paper's nine reasoning-gym specialties, drawn uniformly with replacement.
PAPER_SPECIALTIES = (
    "base_conversion",
    "basic_arithmetic",
    "arc_1d",
    "bf",
    "propositional_logic",
    "fraction_simplification",
    "decimal_arithmetic",
    "calendar_arithmetic",
    "binary_matrix",
)

BUNDLED_MODEL = "bundled:smollm2-135m-instruct"

# The system prompt reasoning-gym ships as its default, so scores are comparable with its tools.
DEFAULT_SYSTEM_PROMPT = (
    "Given a problem, your task is to answer the question by thinking step-by-step in a clear "
    "and specific manner.\nOnce you have thought about the reasoning process, provide the "
    "answer in the following format:\n<answer>answer here</answer>\nDo not explain your "
    "reasoning inside the answer tags, provide only the final answer. When an example is "
    "provided, you should strictly follow the format of the output/answer in that example."
)


class Strict(BaseModel):
    """Base of every config model: unknown keys are an error, never silently ignored."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    @classmethod
    def from_yaml(cls, path: str | Path) -> Self:
        """Load from a YAML file; unknown keys and out-of-bounds values raise."""
        data = yaml.safe_load(Path(path).read_text()) or {}
        return cls.model_validate(data)


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


class VLLMConfig(Strict):
    """The vLLM engine (``generation.backend: vllm``), in its own environment."""

    python: str | None = Field(
        None,
        description="The vLLM environment's Python; default: the one `sapo vllm install` "
        "makes ($SAPO_CACHE/vllm/bin/python, ~/.cache/sapo/vllm by default).",
    )
    dtype: Literal["bfloat16", "float16", "float32"] = Field(
        "bfloat16", description="The engine's weights and activations."
    )
    max_model_len: int = Field(
        2048, ge=64, le=131_072, description="Longest prompt plus completion, in tokens."
    )
    kv_cache_mb: int | None = Field(
        None,
        ge=16,
        description="The KV cache on a CPU, in MB. Default: what one generation call holds "
        "(batch_size sequences of max_model_len tokens), never vLLM's own default (most of "
        "the machine's memory).",
    )
    gpu_memory_utilization: float = Field(
        0.3,
        gt=0.0,
        le=0.95,
        description="On a GPU: the share of its memory the engine may take (weights and KV "
        "cache); the rest is the training's (the engine shares the device with it).",
    )
    enforce_eager: bool = Field(
        True, description="No graph capture or compilation (slower steps, a fast start)."
    )
    reply_timeout_s: float = Field(
        1800.0, gt=0.0, description="Longest a call of the engine may take before it is killed."
    )
    # merged by default: on vLLM's CPU build a round took half the time (36.8 s against
    # 72.0 s: generation at 153 against 56 tokens/s, for 2.2 s of sync against 0.1 s;
    # benchmarks/generation_backends.py --backends vllm-lora,vllm-merged). On GPUs, where
    # vLLM's LoRA kernels are fast, `lora` may win; not measured.
    adapter_sync: Literal["lora", "merged"] = Field(
        "merged",
        description="How a LoRA node's policy reaches the engine: `merged`, the adapter "
        "folded into a copy of the weights, written whole each update; `lora`, the engine "
        "serves the base with the adapter (megabytes written per update, slower decoding).",
    )


class GenerationConfig(Strict):
    """Sampling of completions."""

    backend: Literal["transformers", "vllm"] = "transformers"
    completions_per_question: int = Field(8, ge=2, le=256, description="L: group size.")
    temperature: float = Field(1.0, gt=0.0, le=2.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    max_new_tokens: int = Field(256, ge=1, le=32_768)
    batch_size: int = Field(32, ge=1, description="Sequences per generation call.")
    vllm: VLLMConfig = Field(default_factory=VLLMConfig)  # type: ignore[arg-type]


class ComputeConfig(Strict):
    """Where the policy runs, and in what number format its matmuls run."""

    device: Literal["auto", "cpu", "cuda"] = Field(
        "auto", description="auto: the first CUDA device when one is present, else the CPU."
    )
    precision: Literal["auto", "fp32", "bf16"] = Field(
        "auto",
        description="Matmuls in bf16 (autocast) or fp32; weights and optimizer state stay "
        "fp32 either way. auto: bf16 on a CUDA device that supports it, else fp32 (CPUs "
        "without native bf16 run it slower). Under bf16 the behaviour log-probs are "
        "recomputed by the training forward before each update, so the ratio starts at 1.",
    )
    generation_precision: Literal["auto", "fp32", "bf16"] = Field(
        "auto",
        description="The format completions are sampled in. bf16: generation runs a bf16 "
        "copy of the weights, made afresh each round (decoding reads every weight per token, "
        "so halving their bytes nearly halves its time where bf16 is native); the update "
        "then takes behaviour log-probs from its own fp32 forward, at no extra cost. auto: "
        "bf16 where the device computes it natively (CUDA with bf16, CPUs with AVX512-BF16 "
        "or AMX) or where `precision` is bf16, else fp32.",
    )


class AdapterConfig(Strict):
    """Train a LoRA adapter (through `peft`) instead of every weight.

    The base weights stay frozen; only the adapter's matrices and their Adam moments are
    trained and checkpointed. With beta > 0 the KL reference is the base with the adapter
    switched off, so no second copy of the model is kept.
    """

    kind: Literal["none", "lora"] = Field(
        "none", description="none: full fine-tuning; lora: a LoRA adapter on the base."
    )
    # Rank 8 by default: its checkpoint (adapter and Adam moments) is 33 MB on the bundled
    # model against 63 MB at rank 16, for a reward within one seed's noise
    # (benchmarks/adapters.py, table in benchmarks/README.md).
    rank: int = Field(8, ge=1, le=1024, description="LoRA rank r.")
    alpha: int = Field(16, ge=1, description="LoRA scaling numerator (scale alpha / r).")
    dropout: float = Field(0.0, ge=0.0, lt=1.0, description="Dropout on the adapter's input.")
    target_modules: list[str] | None = Field(
        None,
        description="Module names to adapt; default per family (attention and MLP "
        "projections: q,k,v,o,gate,up,down).",
    )
    base_precision: Literal["auto", "fp32", "bf16"] = Field(
        "auto",
        description="The frozen base's weights. bf16 halves their bytes (the adapter, its "
        "gradients and Adam moments stay fp32) and runs the base's matmuls in bf16. auto: "
        "bf16 where the device computes it natively (CUDA with bf16, CPUs with AVX512-BF16 "
        "or AMX), else fp32. Only with an adapter: full fine-tuning keeps fp32 weights.",
    )

    @model_validator(mode="after")
    def _bf16_base_needs_an_adapter(self) -> Self:
        if self.base_precision == "bf16" and not self.enabled:
            raise ValueError(
                "grpo.adapter.base_precision bf16 needs an adapter (kind: lora): full "
                "fine-tuning trains every weight and keeps them fp32"
            )
        return self

    @property
    def enabled(self) -> bool:
        return self.kind != "none"

    def label(self) -> str | None:
        """What a manifest, an MLflow tag and a report say the node trained: `lora-r8`;
        None for full fine-tuning."""
        return f"{self.kind}-r{self.rank}" if self.enabled else None


class GRPOConfig(Strict):
    """The policy update."""

    adapter: AdapterConfig = Field(
        default_factory=AdapterConfig,  # type: ignore[arg-type]
        description="LoRA adapter instead of full fine-tuning.",
    )

    loss_type: Literal["grpo", "bnpo", "dr_grpo", "dapo"] = Field(
        "grpo", description="Loss normalisation, as in TRL's GRPO trainer."
    )
    scale_rewards: Literal["group", "batch", "none"] = Field(
        "group", description="Divide advantages by the group's std, the batch's std, or not."
    )
    eps_low: float = Field(0.2, ge=0.0, lt=1.0, description="Lower clip: ratio >= 1 - eps_low.")
    eps_high: float = Field(0.28, ge=0.0, description="Upper clip: ratio <= 1 + eps_high.")
    beta: float = Field(0.0, ge=0.0, description="KL weight to the initial policy (paper: 0).")
    learning_rate: float = Field(
        1e-5, gt=0.0, le=1.0, description="Adam step size (paper: 1e-3; Gensyn: 1e-5)."
    )
    weight_decay: float = Field(0.0, ge=0.0)
    max_grad_norm: float | None = Field(1.0, gt=0.0, description="Clip gradients; null: off.")
    iterations: int = Field(
        1, ge=1, le=16, description="Optimizer steps per batch; >1 makes ratio and clip act."
    )
    micro_batch_size: int = Field(
        64,
        ge=1,
        description="Completions per forward/backward at most; gradients accumulate across "
        "micro-batches.",
    )
    micro_batch_tokens: Annotated[int, Field(ge=1)] | Literal["auto"] | None = Field(
        "auto",
        description="Cap the tokens of one forward/backward pass (prompts once, completions "
        "packed after them, padded to the longest): activation memory grows with them. auto: "
        "planned for the device (sapo_core/grpo/plan.py: 768 on a CPU, from the free memory "
        "and the model's shape on a GPU); null: completions only.",
    )
    gradient_checkpointing: bool | Literal["auto"] = Field(
        "auto",
        description="Keep only each layer's input during the forward and recompute the rest "
        "in the backward: about a 25th of the activation memory per token, for a second "
        "forward pass. auto: on a CPU; on a GPU only when the free memory without it holds "
        "too small a pass (sapo_core/grpo/plan.py).",
    )
    optimizer: Literal["auto", "adamw", "adamw_8bit"] = Field(
        "auto",
        description="adamw: torch's AdamW, fp32 moments (8 bytes a trained parameter); "
        "adamw_8bit: bitsandbytes' AdamW8bit, block-wise 8-bit moments (2 bytes; "
        "pip install 'sapo-swarm[gpu]'). auto: adamw, except on a GPU whose memory full "
        "fine-tuning with fp32 moments would take more than half of "
        "(sapo_core/grpo/optimizer.py).",
    )
    device_memory_gib: float | None = Field(
        None,
        gt=0.0,
        description="Device memory the update plans for, in GiB (GPU): its passes and the "
        "auto optimizer are chosen as on a card of this size. null: the device's own. Set it "
        "to leave room for another process on the GPU.",
    )
    drop_zero_variance: bool = Field(
        True, description="Leave out groups whose completions all got the same reward."
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
    local_groups: int = Field(8, ge=0, le=1024, description="I: own groups trained on per round.")
    external_groups: int = Field(
        0, ge=0, le=1024, description="J: peers' groups trained on per round (0: no sharing)."
    )
    questions_per_round: int | None = Field(
        None,
        ge=1,
        description="Questions generated (and published) per round; default I + J, so every "
        "configuration spends the same generation compute.",
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
        from sapo_core.policy import bundled

        try:
            bundled.lookup(self.model)
        except bundled.BundledModelError as exc:
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
