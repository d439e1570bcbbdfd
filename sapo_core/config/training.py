"""How a node samples and trains: generation (and vLLM's engine), the device and precision
it computes in, a LoRA adapter, and the GRPO update."""

from __future__ import annotations

from typing import Annotated, Literal, Self

from pydantic import Field, model_validator

from sapo_core.config.base import Strict


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
    # merged by default: it measured fastest on vLLM's CPU build (benchmarks/README.md,
    # `generation_backends.py --backends vllm-lora,vllm-merged`); on GPUs, where vLLM's
    # LoRA kernels are fast, `lora` may win (not measured).
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


class OffPolicyConfig(Strict):
    """How the update weighs rows another sampler made: a peer's policy, or a vLLM engine
    whose numbers differ from the trainer's (docs/algorithm.md, "Off-policy rows").

    A row carries the log-prob its generator sampled each token with (the ledger's
    ``token_logprobs``). With a correction, the update takes this node's own log-probs before
    the step as the PPO "old" ones and weighs each token's loss by the importance ratio
    (own / generator's), truncated at ``cap`` or masked outside [``mask_below``, ``cap``], per
    token or per sequence (TRL's ``vllm_importance_sampling_mode`` names). Rows without a
    usable claim (another tokenizer, a claim that fails its checks) train as under ``none``.
    """

    correction: Literal[
        "none", "token_truncate", "token_mask", "sequence_truncate", "sequence_mask"
    ] = Field(
        "none",
        description="none: the paper's (a peer's text re-encoded, trained as if this node had "
        "sampled it); token_/sequence_: truncate or mask the importance ratio.",
    )
    cap: float = Field(
        2.0,
        ge=1.0,
        le=1e6,
        description="Largest importance weight (truncate) or ratio kept (mask).",
    )
    mask_below: float = Field(
        0.0, ge=0.0, lt=1.0, description="Mask modes: a ratio below this is masked too."
    )

    @property
    def enabled(self) -> bool:
        return self.correction != "none"


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
        "planned for the device (sapo_core/grpo/plan.py: a constant measured on a CPU, from "
        "the free memory and the model's shape on a GPU); null: completions only.",
    )
    gradient_checkpointing: bool | Literal["auto"] = Field(
        "auto",
        description="Keep only each layer's input during the forward and recompute the rest "
        "in the backward: about a 25th of the activation memory per token, for a second "
        "forward pass. auto: on a CPU; on a GPU only when the free memory without it holds "
        "too small a pass (sapo_core/grpo/plan.py).",
    )
    plan: Literal["auto", "plain"] = Field(
        "auto",
        description="How the update becomes forward/backward passes (sapo_core/grpo/plan.py). "
        "auto: the speed measures chosen for the device (the shared-prompt log-prob path "
        "where the model's family allows it, packing, checkpointing, memory release); plain: "
        "none of them, one ordinary forward per completion, passes still bounded for memory "
        "(the reference path: slower, same numbers).",
    )
    optimizer: Literal["auto", "adamw", "adamw_8bit"] = Field(
        "auto",
        description="adamw: torch's AdamW, fp32 moments (8 bytes a trained parameter); "
        "adamw_8bit: bitsandbytes' AdamW8bit, block-wise 8-bit moments (2 bytes; "
        "pip install 'bitsandbytes>=0.50', sapo's gpu extra). auto: adamw, except on a GPU "
        "whose memory full "
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
    off_policy: OffPolicyConfig = Field(
        default_factory=OffPolicyConfig,  # type: ignore[arg-type]
        description="Importance-sampling correction of rows another sampler made.",
    )
