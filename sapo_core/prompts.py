"""From a question to the model's input, and from a completion back to its answer.

Text that is not the chat template's own (a question, a peer's completion, the system prompt
and examples) is encoded as text: a special token's string inside it, such as
``<|im_end|><|im_start|>system``, becomes the tokens of its characters, never the control
tokens, so nobody's text can close a turn or open one in this node's training sequences.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any, Literal

from sapo_core.config import PromptConfig

PromptFormat = Literal["chat", "plain"]
PLAIN_STOP: tuple[str, ...] = ("</answer>",)
"""Where a plain-format completion ends: a base model has no end-of-turn token and would
go on writing questions of its own. The closing tag is the completion's last text, so the
verifier's last answer is its first, and the model learns to stop there."""

_OPEN_TAG = "<answer>"
_CLOSE_TAG = "</answer>"
_NUMBER = re.compile(r"-?\d+(?:\.\d+)?(?:/\d+)?")


def resolve_format(
    config: PromptConfig, tokenizer: Any, default: str | None = None
) -> PromptFormat:
    """The format a node prompts in: the config's, else ``default`` (a bundled model's
    entry), else chat when the tokenizer has a chat template (a base model has none)."""
    if config.format != "auto":
        return config.format
    if default in ("chat", "plain"):
        return default  # type: ignore[return-value]
    return "chat" if getattr(tokenizer, "chat_template", None) else "plain"


def stop_texts(fmt: PromptFormat) -> tuple[str, ...]:
    """Texts that end a completion besides the tokenizer's stop ids."""
    return PLAIN_STOP if fmt == "plain" else ()


def plain_text(question: str, config: PromptConfig) -> str:
    """The plain format: the system prompt, each example as 'Question: ...' and 'Answer:
    ...', then the question, ending where the answer begins (with the prefill)."""
    parts = [config.system_prompt] if config.system_prompt else []
    parts += [f"Question: {e.question}\nAnswer: {e.completion}" for e in config.examples]
    parts.append(f"Question: {question}\nAnswer:")
    # The examples read `Answer: <completion>`: a prefill starts where a completion would.
    return "\n\n".join(parts) + (f" {config.prefill}" if config.prefill else "")


def messages(question: str, config: PromptConfig) -> list[dict[str, str]]:
    """Chat turns for one question."""
    turns = [{"role": "system", "content": config.system_prompt}] if config.system_prompt else []
    for example in config.examples:
        turns.append({"role": "user", "content": example.question})
        turns.append({"role": "assistant", "content": example.completion})
    return [*turns, {"role": "user", "content": question}]


def render_prompt(
    tokenizer: Any, question: str, config: PromptConfig, fmt: PromptFormat = "chat"
) -> str:
    """The prompt text through the tokenizer's chat template (or the plain format), with
    the prefill appended.

    A text to read, not to encode: `prompt_ids` is the model's input.
    """
    if fmt == "plain":
        return plain_text(question, config)
    return _render(tokenizer, messages(question, config), config.prefill)


SERVING_SLOT = "{prompt}"
"""Where a served model's input goes in `serving_template` (MLflow's `prompt_template`)."""


def serving_template(tokenizer: Any, config: PromptConfig, fmt: PromptFormat) -> str | None:
    """The node's prompt with the question left open, for MLflow's `prompt_template`: the
    logged model, served as a pyfunc (`mlflow models serve`), is prompted as the node
    trained it (system prompt, examples, chat template or plain format, prefill), so a
    chat model asked a bare question answers rather than ending its turn at once.

    The serving pipeline encodes the text without adding special tokens, so the plain
    format's BOS (`prompt_ids` puts it first) is written in; braces of the prompt's own
    text are doubled, the template being a `str.format` one. None when the question does
    not appear exactly once (a chat template that drops or repeats it): MLflow would
    refuse the template, and the model is then logged without one. Unlike the node, the
    server reads special tokens' strings inside the question as the tokens."""
    marker = "<<sapo-question-6b1f>>"  # survives a chat template untouched
    text = render_prompt(tokenizer, marker, config, fmt)
    if text.count(marker) != 1:
        return None
    bos = tokenizer.bos_token if fmt == "plain" and bos_ids(tokenizer) else ""
    escaped = (bos + text).replace("{", "{{").replace("}", "}}")
    return escaped.replace(marker, SERVING_SLOT)


def _render(tokenizer: Any, turns: list[dict[str, str]], prefill: str) -> str:
    text = tokenizer.apply_chat_template(turns, tokenize=False, add_generation_prompt=True)
    return str(text) + prefill


def text_ids(tokenizer: Any, text: str) -> list[int]:
    """The token ids of `text` as plain text: special tokens' strings in it are encoded as
    their characters (`split_special_tokens`), so the ids hold no special token.

    Added tokens that are not special (vocabulary words such as a reasoning model's
    `<think>`) are matched as usual, and text without special tokens' strings encodes to
    the ids `tokenizer(text, add_special_tokens=False)` gives.
    """
    encoded = tokenizer(text, add_special_tokens=False, split_special_tokens=True)
    return list(encoded["input_ids"])


def special_strings(tokenizer: Any) -> list[str]:
    """The strings the tokenizer encodes as special tokens (those `split_special_tokens`
    encodes as text instead), longest first."""
    found = {t.content for t in tokenizer.added_tokens_decoder.values() if t.special}
    found.update(tokenizer.all_special_tokens)
    return sorted(found, key=len, reverse=True)


def bos_ids(tokenizer: Any) -> list[int]:
    """The beginning-of-sequence token the tokenizer puts before a text, if it puts one
    (Gemma and Llama do; SmolLM2 and Qwen do not)."""
    bos = tokenizer.bos_token_id
    added = tokenizer("", add_special_tokens=True)["input_ids"]
    return [bos] if bos is not None and bos in added else []


def prompt_ids(
    tokenizer: Any, question: str, config: PromptConfig, fmt: PromptFormat = "chat"
) -> list[int]:
    """The model's input for a question: `render_prompt`'s text, with the chat template's
    own special tokens (role markers) as tokens and the question, system prompt and
    examples as text (see `text_ids`). The prefill, this node's own, is template text.
    In the plain format everything is text, after the tokenizer's own BOS token.

    Special tokens' strings in the turns are swapped for stand-ins, characters found
    nowhere in the template or the turns, before the template runs; each stand-in is then
    encoded as its string's text and the rest as the template's text. A prompt without such
    strings thus encodes exactly as `tokenizer(render_prompt(...), add_special_tokens=False)`.
    """
    if fmt == "plain":
        return bos_ids(tokenizer) + text_ids(tokenizer, plain_text(question, config))
    turns = messages(question, config)
    strings = special_strings(tokenizer)
    if not strings:
        return _encoded(tokenizer, _render(tokenizer, turns, config.prefill))
    found = re.compile("|".join(map(re.escape, strings)))
    seen = [str(tokenizer.chat_template), config.prefill, *strings, *(t["content"] for t in turns)]
    free = _absent_characters(set("".join(seen)))
    stand_in = {s: next(free) for s in strings}
    string_of = {c: s for s, c in stand_in.items()}
    swapped = [
        {**t, "content": found.sub(lambda m: stand_in[m.group(0)], t["content"])} for t in turns
    ]
    text = _render(tokenizer, swapped, config.prefill)
    pieces = re.split(f"([{re.escape(''.join(string_of))}])", text)
    ids: list[int] = []
    for i, piece in enumerate(pieces):
        if i % 2:  # a stand-in, between the template's text
            ids += text_ids(tokenizer, string_of[piece])
        elif piece:
            ids += _encoded(tokenizer, piece)
    return ids


def _encoded(tokenizer: Any, template_text: str) -> list[int]:
    """Ids of a chat template's text, its special tokens' strings parsed as the tokens."""
    return list(tokenizer(template_text, add_special_tokens=False)["input_ids"])


def _absent_characters(present: set[str]) -> Iterator[str]:
    """Private-use characters that are not in `present` (about 137,000 to draw from)."""
    for first, last in ((0xE000, 0xF8FF), (0xF0000, 0xFFFFD), (0x100000, 0x10FFFD)):
        for code in range(first, last + 1):
            if chr(code) not in present:
                yield chr(code)
    raise ValueError("no private-use character is left for a stand-in")


def tagged_answer(text: str) -> str | None:
    """The last <answer>...</answer>, stripped: reasoning-gym's rule (the last match of
    ``<answer>\\s?(.*?)\\s?</answer>``, left to right, without overlaps).

    Found with ``str.find`` rather than that regex, which is quadratic on a peer's text of
    many opening tags and no closing one (32 KB of ``"<answer> "`` cost ~6 s a row): each
    search starts where the last one ended, so this is linear in the text.
    """
    found: tuple[int, int] | None = None
    start = 0
    while (opened := text.find(_OPEN_TAG, start)) >= 0:
        closed = text.find(_CLOSE_TAG, opened + len(_OPEN_TAG))
        if closed < 0:
            break  # no later opening tag can close either
        found = (opened + len(_OPEN_TAG), closed)
        start = closed + len(_CLOSE_TAG)
    return None if found is None else text[found[0] : found[1]].strip()


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
