"""The generation interface. Backends: transformers (here); vLLM is not built yet (GPU only)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from sapo_core.config import GenerationConfig


@dataclass(frozen=True)
class Completion:
    """One sampled completion: text, token ids and the behaviour log-prob of each token.

    Log-probs are of the sampled token under softmax(logits / temperature) over the whole
    vocabulary (top-p truncation excluded), the quantity GRPO's ratio divides by.
    """

    text: str
    token_ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    finished: bool  # ended with the end-of-turn token rather than the length limit


# Called as completions finish: (completions done, completions asked for in this call).
ProgressCallback = Callable[[int, int], None]


Prompt = str | Sequence[int]
"""A prompt's token ids (`sapo_core.prompts.prompt_ids`: what a node trains on), or a text
whose special tokens' strings are parsed as the tokens (a chat template's rendering)."""


class GenerationBackend(Protocol):
    """Samples `config.completions_per_question` completions for each prompt."""

    def generate(
        self,
        prompts: Sequence[Prompt],
        config: GenerationConfig,
        seed: int,
        on_progress: ProgressCallback | None = None,
    ) -> list[list[Completion]]: ...
