"""LoRA adapters through `peft`: train a few megabytes on top of frozen base weights.

A node with `grpo.adapter.kind: lora` wraps its base network in a `peft` model: the base
weights are frozen, only the adapter's low-rank matrices train (and only they carry Adam
moments), and switching the adapter off gives back the base exactly, which is the KL
reference when beta > 0 (no second copy of the model). The wrapped model is the policy
everywhere downstream: generation, both log-prob paths (the fast path reaches the
decoder through it, with the adapted projections inside) and checkpoints (which hold the
adapter alone).
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator
from typing import Any

from sapo_core.config import AdapterConfig

# peft asks transformers for a renamed attribute; the warning would repeat in every node's
# output and says nothing a user can act on.
warnings.filterwarnings(
    "ignore", message="`is_gradient_checkpointing` is deprecated", category=FutureWarning
)

# Per family: the projections LoRA adapts by default, attention and MLP alike (LoRA on
# every linear layer of the block learns closest to full fine-tuning; QLoRA, Dettmers 2023).
DECODER_PROJECTIONS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
DEFAULT_TARGETS: dict[str, list[str]] = {
    "llama": DECODER_PROJECTIONS,
    "mistral": DECODER_PROJECTIONS,
    "qwen2": DECODER_PROJECTIONS,
    "qwen3": DECODER_PROJECTIONS,
    "smollm3": DECODER_PROJECTIONS,
    "gemma3_text": DECODER_PROJECTIONS,
    "gemma3": DECODER_PROJECTIONS,
    "gpt2": ["c_attn", "c_proj", "c_fc"],
}


class AdapterError(ValueError):
    """An adapter that cannot be attached as configured."""


def target_modules(model: Any, config: AdapterConfig) -> list[str]:
    """The configured targets, else the family's defaults; an error names the choices."""
    if config.target_modules:
        return list(config.target_modules)
    family = getattr(getattr(model, "config", None), "model_type", None)
    if family not in DEFAULT_TARGETS:
        raise AdapterError(
            f"no default LoRA targets for model type {family!r}: set "
            f"grpo.adapter.target_modules (known families: {', '.join(sorted(DEFAULT_TARGETS))})"
        )
    return DEFAULT_TARGETS[family]


def attach(model: Any, config: AdapterConfig) -> Any:
    """``model`` wrapped with a fresh LoRA adapter (B = 0: the same function as the base)."""
    from peft import LoraConfig, get_peft_model

    targets = target_modules(model, config)
    lora = LoraConfig(
        r=config.rank,
        lora_alpha=config.alpha,
        lora_dropout=config.dropout,
        target_modules=targets,
        bias="none",
        task_type="CAUSAL_LM",
    )
    try:
        return get_peft_model(model, lora)
    except ValueError as exc:  # peft: a target that matches no module
        raise AdapterError(f"LoRA targets {targets}: {exc}") from None


def load(model: Any, adapter_dir: str) -> Any:
    """``model`` with the trained adapter saved in ``adapter_dir`` (trainable again)."""
    from peft import PeftModel

    return PeftModel.from_pretrained(model, adapter_dir, is_trainable=True)


def base_directory(model: Any) -> str:
    """The local directory holding the adapted model's base weights: where it was loaded
    from (a path, a bundled model), or the Hub cache's snapshot of its id."""
    from pathlib import Path

    name = str(model.get_base_model().name_or_path)
    if (Path(name) / "config.json").is_file():
        return name
    from huggingface_hub import snapshot_download

    return str(snapshot_download(name, local_files_only=True))


def rank(model: Any) -> int:
    """The adapter's LoRA rank."""
    return int(model.peft_config["default"].r)


def is_adapted(model: Any) -> bool:
    from peft import PeftModel

    return isinstance(model, PeftModel)


@contextlib.contextmanager
def base_only(model: Any) -> Iterator[Any]:
    """The adapted model with its adapter switched off: the base weights, exactly."""
    with model.disable_adapter():
        yield model


def trainable_parameters(model: Any) -> tuple[int, int]:
    """(trainable, total) parameter counts."""
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    total = sum(p.numel() for p in model.parameters())
    return trainable, total


__all__ = [
    "DEFAULT_TARGETS",
    "AdapterError",
    "attach",
    "base_directory",
    "base_only",
    "is_adapted",
    "load",
    "rank",
    "target_modules",
    "trainable_parameters",
]
