"""From a question to the model's input, and from a completion back to its answer."""

from __future__ import annotations

import re
from typing import Any, Literal

from sapo_core.config import PromptConfig

_TAGGED = re.compile(r"<answer>\s?(.*?)\s?</answer>", re.DOTALL)
_OPEN_TAG = "<answer>"
_NUMBER = re.compile(r"-?\d+(?:\.\d+)?(?:/\d+)?")


def messages(question: str, config: PromptConfig) -> list[dict[str, str]]:
    """Chat turns for one question."""
    turns = [{"role": "system", "content": config.system_prompt}] if config.system_prompt else []
    for example in config.examples:
        turns.append({"role": "user", "content": example.question})
        turns.append({"role": "assistant", "content": example.completion})
    return [*turns, {"role": "user", "content": question}]


def render_prompt(tokenizer: Any, question: str, config: PromptConfig) -> str:
    """The prompt text through the tokenizer's chat template, with the prefill appended."""
    text = tokenizer.apply_chat_template(
        messages(question, config), tokenize=False, add_generation_prompt=True
    )
    return str(text) + config.prefill


def tagged_answer(text: str) -> str | None:
    """The last <answer>...</answer>, stripped (reasoning-gym's rule)."""
    matches = _TAGGED.findall(text)
    return matches[-1].strip() if matches else None


def extract_answer(
    text: str, mode: Literal["strict", "lenient", "last_number"] = "strict"
) -> str | None:
    """The answer a completion gives, under the node's extraction rule (see RewardConfig)."""
    answer = tagged_answer(text)
    if answer is not None or mode == "strict":
        return answer
    if mode == "lenient":
        start = text.rfind(_OPEN_TAG)
        if start < 0:
            return None
        rest = text[start + len(_OPEN_TAG) :].strip()
        return rest.splitlines()[0].strip() if rest else None
    numbers = _NUMBER.findall(text)
    return numbers[-1] if numbers else None


def is_well_formed(text: str) -> bool:
    """One closed answer tag with something inside: what a format reward pays for."""
    return bool(tagged_answer(text))
