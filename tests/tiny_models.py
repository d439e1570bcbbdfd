"""Tiny random causal LMs built offline for tests, with one of three tokenizers:

- ``smollm2``: the bundled SmolLM2 tokenizer (49,152 tokens, a ChatML chat template);
- ``gemma3``: the bundled Gemma 3 tokenizer (262,144 tokens, a BOS token, no chat template
  in the base model's file: such a node prompts in the plain format);
- ``trained``: a small byte-level BPE trained here on arithmetic text (a few hundred tokens),
  with a chat template of its own markers: a family no other tokenizer shares.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

Family = Literal["llama", "qwen2", "qwen3", "mistral", "smollm3", "gemma3"]
TokenizerName = Literal["smollm2", "gemma3", "trained"]

TRAINED_CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}<|end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)


def trained_tokenizer(vocab_size: int = 600) -> Any:
    """A byte-level BPE trained on arithmetic questions and answers, in a second."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    specials = ["<pad>", "<s>", "<|end|>", "<|system|>", "<|user|>", "<|assistant|>"]
    corpus = [
        f"What is {a} + {b}? {a} + {b} = {a + b}. <answer>{a + b}</answer> Question: Answer:"
        for a in range(0, 60, 3)
        for b in range(0, 60, 7)
    ]
    core = Tokenizer(models.BPE())
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    core.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    core.train_from_iterator(corpus, trainer)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=core,
        bos_token="<s>",
        eos_token="<|end|>",
        pad_token="<pad>",
        additional_special_tokens=specials[3:],
    )
    tokenizer.chat_template = TRAINED_CHAT_TEMPLATE
    return tokenizer


def load_tokenizer_named(name: TokenizerName) -> Any:
    from transformers import AutoTokenizer

    if name == "trained":
        return trained_tokenizer()
    from sapo_core.policy import bundled

    entry = bundled.BUNDLED["smollm2-135m-instruct" if name == "smollm2" else "gemma3-270m"]
    return AutoTokenizer.from_pretrained(str(bundled.tokenizer_dir(entry)))


def build_tiny_model(
    target: Path,
    *,
    seed: int = 0,
    layers: int = 2,
    hidden: int = 64,
    family: Family = "llama",
    tokenizer: TokenizerName = "smollm2",
    tied: bool = True,
) -> Path:
    """Save a random model of a family (a few layers, small hidden size) and a tokenizer;
    its output head shares the embeddings unless ``tied`` is false."""
    import torch
    from transformers import (
        Gemma3ForCausalLM,
        Gemma3TextConfig,
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

    tok = load_tokenizer_named(tokenizer)
    config_class, model_class = {
        "llama": (LlamaConfig, LlamaForCausalLM),
        "qwen2": (Qwen2Config, Qwen2ForCausalLM),
        "qwen3": (Qwen3Config, Qwen3ForCausalLM),
        "mistral": (MistralConfig, MistralForCausalLM),
        "smollm3": (SmolLM3Config, SmolLM3ForCausalLM),
        "gemma3": (Gemma3TextConfig, Gemma3ForCausalLM),
    }[family]
    extra: dict[str, Any] = {}
    if family == "gemma3":
        # A window of 4 positions, so that short test sequences cross it, and both kinds of
        # layer (Gemma 3 mixes sliding-window and full attention).
        extra = {
            "head_dim": hidden // 4,
            "sliding_window": 4,
            "layer_types": ["sliding_attention", "full_attention"][:layers]
            + ["sliding_attention"] * max(0, layers - 2),
        }
    config = config_class(
        vocab_size=len(tok),
        hidden_size=hidden,
        intermediate_size=hidden * 2,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=2048,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        tie_word_embeddings=tied,
        **extra,
    )
    torch.manual_seed(seed)
    model = model_class(config)
    target.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(target))
    tok.save_pretrained(str(target))
    return target
