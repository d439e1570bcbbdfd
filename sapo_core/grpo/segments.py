"""Training rows as segments (one prompt, its completions) and their packing into micro-batches."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor


@dataclass
class Segment:
    """One prompt and the completions trained against it (usually one group)."""

    prompt_ids: list[int]
    completion_ids: list[list[int]]
    advantages: list[float]
    behaviour_logprobs: list[list[float] | None]  # None: not known (a peer's row)
    ref_logprobs: list[list[float]] | None = field(default=None, repr=False)
    # The generator's log-prob of each token, where a row carries a claim this node accepted
    # (sapo_core/grpo/offpolicy.py); empty, or None per row: unknown.
    sampler_logprobs: list[list[float] | None] = field(default_factory=list, repr=False)
    label: str = ""  # what the update's drift figures are keyed by (the group's id)

    def __len__(self) -> int:
        return len(self.completion_ids)


def row_tokens(seg: Segment) -> int:
    """Length of a segment packed as one sequence: its prompt, then every completion."""
    return len(seg.prompt_ids) + sum(len(ids) for ids in seg.completion_ids)


def _subset(seg: Segment, rows: Sequence[int]) -> Segment:
    ref = None if seg.ref_logprobs is None else [seg.ref_logprobs[i] for i in rows]
    return Segment(
        seg.prompt_ids,
        [seg.completion_ids[i] for i in rows],
        [seg.advantages[i] for i in rows],
        [seg.behaviour_logprobs[i] for i in rows],
        ref,
        [seg.sampler_logprobs[i] for i in rows] if seg.sampler_logprobs else [],
        seg.label,
    )


def _pieces(seg: Segment, max_rows: int, max_tokens: int | None) -> list[Segment]:
    """A segment as few packed sequences as fit: all of it, or its completions shared out
    (longest first, each to the first piece with room) among copies of its prompt."""
    if len(seg) <= max_rows and (max_tokens is None or row_tokens(seg) <= max_tokens):
        return [seg]
    prompt = len(seg.prompt_ids)
    pieces: list[list[int]] = []
    sizes: list[int] = []
    for i in sorted(range(len(seg)), key=lambda i: (-len(seg.completion_ids[i]), i)):
        length = len(seg.completion_ids[i])
        for k, rows in enumerate(pieces):
            if len(rows) < max_rows and (max_tokens is None or sizes[k] + length <= max_tokens):
                rows.append(i)
                sizes[k] += length
                break
        else:  # a completion that fits nowhere opens a piece, alone if it exceeds the cap
            pieces.append([i])
            sizes.append(prompt + length)
    return [_subset(seg, sorted(rows)) for rows in pieces]


def split_segments(
    segments: Sequence[Segment],
    micro_batch_size: int,
    micro_batch_tokens: int | None = None,
    max_packed_tokens: int | None = None,
    overhead_tokens: int = 0,
) -> list[list[Segment]]:
    """Pack segments into micro-batches of at most micro_batch_size completions.

    Each segment is trained as one packed sequence, its prompt followed by its completions
    (a block mask keeps each completion to the prompt and itself), so a prompt runs once
    and no completion is padded. A micro-batch is such sequences side by side, padded to
    the longest. With micro_batch_tokens it also stays within that many tokens (sequences
    x the longest): activation memory grows with them, so the cap bounds a step's memory
    whatever the answers' lengths. A segment too large for one micro-batch, or longer than
    `max_packed_tokens`, is split, its prompt repeated in each piece; a completion that
    alone exceeds the cap trains alone. (The caps and the overhead are the update plan's,
    measured per device: sapo_core/grpo/plan.py.)

    Sequences are placed longest first; one joins the current micro-batch unless the
    padding it needs would cost more than a micro-batch's fixed cost (``overhead_tokens``:
    tokens of forward and backward that one more pass costs beyond its own). (Sorting all
    completions by length, as before, scattered every group over the micro-batches and
    repeated its prompt in each: on a long system prompt that doubled the update's compute.)
    """
    caps = [cap for cap in (micro_batch_tokens, max_packed_tokens) if cap is not None]
    longest = min(caps) if caps else None
    pieces = [
        piece for seg in segments if len(seg) for piece in _pieces(seg, micro_batch_size, longest)
    ]
    pieces.sort(key=lambda piece: -row_tokens(piece))  # stable: segment order among equals
    batches: list[list[Segment]] = []
    for piece in pieces:
        batch = batches[-1] if batches else None
        if batch is not None:
            width = row_tokens(batch[0])
            fits = (
                sum(len(p) for p in batch) + len(piece) <= micro_batch_size
                and width - row_tokens(piece) <= overhead_tokens
                and (micro_batch_tokens is None or (len(batch) + 1) * width <= micro_batch_tokens)
            )
            if fits:
                batch.append(piece)
                continue
        batches.append([piece])
    return batches


def padded(rows: Sequence[Sequence[float]], width: int, value: float, dtype: Any) -> Tensor:
    """Rows [len(rows), width], each filled from the left and padded with value."""
    out = torch.full((len(rows), width), value, dtype=dtype)
    for i, row in enumerate(rows):
        out[i, : len(row)] = torch.tensor(list(row), dtype=dtype)
    return out
