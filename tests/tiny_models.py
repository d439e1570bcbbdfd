"""Tiny random causal LMs with the bundled tokenizer, built offline for tests."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

Family = Literal["llama", "qwen2", "qwen3", "mistral", "smollm3"]


def build_tiny_model(
    target: Path, *, seed: int = 0, layers: int = 2, hidden: int = 64, family: Family = "llama"
) -> Path:
    """Save a random model of a family (a few layers, small hidden size) and the tokenizer."""
    import torch
    from transformers import (
        AutoTokenizer,
        LlamaConfig,
        LlamaForCausalLM,
        MistralConfig,
        MistralForCausalLM,
        Qwen2Config,
        Qwen2ForCausalLM,
        Qwen3Config,
        Qwen3ForCausalLM,
        SmolLM3Config,
        SmolLM3ForCausalLM,
    )

    from sapo_core.policy import bundled

    tokenizer = AutoTokenizer.from_pretrained(str(bundled.tokenizer_dir()))
    config_class, model_class = {
        "llama": (LlamaConfig, LlamaForCausalLM),
        "qwen2": (Qwen2Config, Qwen2ForCausalLM),
        "qwen3": (Qwen3Config, Qwen3ForCausalLM),
        "mistral": (MistralConfig, MistralForCausalLM),
        "smollm3": (SmolLM3Config, SmolLM3ForCausalLM),
    }[family]
    config = config_class(
        vocab_size=len(tokenizer),
        hidden_size=hidden,
        intermediate_size=hidden * 2,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=2048,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=True,
    )
    torch.manual_seed(seed)
    model = model_class(config)
    target.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(target))
    tokenizer.save_pretrained(str(target))
    return target
