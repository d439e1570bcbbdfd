"""Load a policy and its tokenizer from a Hugging Face id, a local directory or the bundle."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from sapo_core.config import BUNDLED_MODEL


@dataclass
class Policy:
    """A causal LM with its tokenizer; `model_id` is what the ledger records."""

    model: Any
    tokenizer: Any
    model_id: str


def resolve(model: str) -> str:
    """The path or hub id transformers should load for a configured model name."""
    if model == BUNDLED_MODEL:
        from sapo_core.policy import bundled

        return str(bundled.model_dir())
    return model


def load_tokenizer(model: str) -> Any:
    """The tokenizer alone (the bundled one does not need the weights converted)."""
    from transformers import AutoTokenizer

    if model == BUNDLED_MODEL:
        from sapo_core.policy import bundled

        path = str(bundled.tokenizer_dir())
    else:
        path = resolve(model)
    tokenizer = AutoTokenizer.from_pretrained(path)
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def load_model(model: str) -> Any:
    """The network alone, in fp32 for training (bf16 is slower on CPUs without native bf16)."""
    import torch
    from transformers import AutoModelForCausalLM

    local_only = os.environ.get("HF_HUB_OFFLINE") == "1"
    network = AutoModelForCausalLM.from_pretrained(
        resolve(model), dtype=torch.float32, local_files_only=local_only
    )
    network.generation_config.pad_token_id = network.generation_config.eos_token_id
    return network


def load_policy(model: str, *, threads: int | None = None) -> Policy:
    """The network and its tokenizer; `threads` sets torch's intra-op thread count first."""
    import torch

    if threads:
        torch.set_num_threads(threads)
    return Policy(model=load_model(model), tokenizer=load_tokenizer(model), model_id=model)
