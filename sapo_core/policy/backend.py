"""The generation interface, and what every backend shares. Backends: the transformers
loop (hf_backend.py) and vLLM (vllm_backend.py)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from sapo_core.config import GenerationConfig


@dataclass(frozen=True)
class Completion:
    """One sampled completion: text, token ids and the behaviour log-prob of each token.

    Log-probs are of the sampled token under softmax(logits / temperature) over the whole
    vocabulary (top-p truncation excluded), the quantity GRPO's ratio divides by.
    ``sampled_logprobs`` are under the distribution actually sampled from (top-p applied and
    renormalised), what a row publishes as its claim; None: the same as ``logprobs``.
    """

    text: str
    token_ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    finished: bool  # ended with a stop token or stop text rather than the length limit
    sampled_logprobs: tuple[float, ...] | None = None

    @property
    def sampler_logprobs(self) -> tuple[float, ...]:
        return self.logprobs if self.sampled_logprobs is None else self.sampled_logprobs


# Called as completions finish: (completions done, completions asked for in this call).
ProgressCallback = Callable[[int, int], None]


Prompt = str | Sequence[int]
"""A prompt's token ids (`sapo_core.prompts.prompt_ids`: what a node trains on), or a text
whose special tokens' strings are parsed as the tokens (a chat template's rendering)."""


class GenerationBackend(Protocol):
    """Samples `config.completions_per_question` completions for each prompt.

    ``exact_logprobs``: whether its log-probs are the training forward's to the bit (the
    transformers loop in fp32), so the update may take them as its old log-probs.
    ``weights_changed`` is called after each update (a backend with its own copy of the
    weights reloads them); ``close`` stops what it started."""

    exact_logprobs: bool

    def weights_changed(self) -> None: ...

    def close(self) -> None: ...

    def generate(
        self,
        prompts: Sequence[Prompt],
        config: GenerationConfig,
        seed: int,
        on_progress: ProgressCallback | None = None,
    ) -> list[list[Completion]]: ...


def stop_window(stop_texts: Sequence[str]) -> int:
    """Tokens a stop text can span: each token decodes to at least one character but a
    byte-fallback piece, so a few more than its characters cover it."""
    return max((len(t) for t in stop_texts), default=0) + 4


def stop_text_end(tokenizer: Any, ids: Sequence[int], stop_texts: Sequence[str]) -> int | None:
    """How many of `ids` to keep so that the text ends with its first stop text (the
    token that completes it included), or None when no stop text occurs."""
    if not stop_texts:
        return None
    window = stop_window(stop_texts)
    for end in range(1, len(ids) + 1):
        text = tokenizer.decode(list(ids[max(0, end - window) : end]), skip_special_tokens=True)
        if any(stop in text for stop in stop_texts):
            return end
    return None
