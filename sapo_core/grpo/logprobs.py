"""Log-probabilities of completion tokens under the policy: what the loss needs.

The plain path below is the definition: one ordinary forward over each row's prompt and
completion, read off at the completion's tokens. It is what `grpo.plan: plain` runs, and
the reference the speed code is tested against. Where the update's plan chooses it
(`UpdatePlan.shared_prompt`, sapo_core/grpo/plan.py), the same numbers come from the
shared-prompt path instead (sapo_core/grpo/shared_prompt.py): one packed pass per prompt and
its completions, faster and in less memory, for the families known to allow it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from sapo_core.grpo.segments import Segment, padded
from sapo_core.moved import moved_names

# The speed code lived here until issue 59 moved it out; its old imports say where it went.
__getattr__ = moved_names(
    __name__,
    dict.fromkeys(
        (
            "shared_prompt_logprobs", "supports_shared_prompt", "token_logprobs",
            "embedding_rows", "LOGIT_CHUNK", "SHARED_PROMPT_MODEL_TYPES", "PACKED_ATTENTION",
            "LOGIT_POSTPROCESSING",
        ),
        "moved to sapo_core.grpo.shared_prompt",
    ),
)  # fmt: skip


def plain_logprobs(
    model: Any, segments: Sequence[Segment], temperature: float, pad_id: int
) -> tuple[Tensor, Tensor]:
    """`completion_logprobs` from one ordinary forward over each row's prompt + completion.

    The reference the shared-prompt path is tested against, and the path for families
    whose forward post-processes logits. Rows are right-padded, so each starts at position
    0 as a model assumes without position ids. It runs every prompt once per completion,
    and its logits cover positions from the shortest prompt's last token on ([B, S, V]), so
    it costs more than the shared-prompt path.
    """
    rows = [(seg.prompt_ids, ids) for seg in segments for ids in seg.completion_ids]
    prompt_lens = torch.tensor([len(p) for p, _ in rows])  # [B]
    sequences = [list(p) + list(c) for p, c in rows]
    length = max(len(s) for s in sequences)
    input_ids = padded(sequences, length, pad_id, torch.long)  # [B, L]
    attention = padded([[1] * len(s) for s in sequences], length, 0, torch.long)  # [B, L]
    first = int(prompt_lens.min()) - 1  # the earliest position that predicts a completion token
    # Positions as an index, not a count: a count slices the hidden states (a strided
    # view), which a CPU output head multiplies far more slowly (hf_backend.last_position).
    kept = torch.arange(first, length, device=input_ids.device)
    logits = model(input_ids=input_ids, attention_mask=attention, logits_to_keep=kept).logits
    # [B, S, V], S = L - first: positions first .. L - 1
    completions = [c for _, c in rows]
    width = max(len(c) for c in completions)
    ids = padded(completions, width, pad_id, torch.long)  # [B, T]
    mask = padded([[1] * len(c) for c in completions], width, 0, torch.long)  # [B, T]
    # Completion token t of row b is predicted at position prompt_len_b - 1 + t.
    column = (prompt_lens - 1 - first).unsqueeze(1) + torch.arange(width)  # [B, T]
    column = column.clamp(max=logits.size(1) - 1)  # padding columns: any valid index
    predicting = logits[torch.arange(len(rows)).unsqueeze(1), column]  # [B, T, V]
    logp = torch.log_softmax(predicting.float() / temperature, -1)  # [B, T, V]
    picked = logp.gather(-1, ids.unsqueeze(-1)).squeeze(-1)  # [B, T]
    return picked.masked_fill(mask == 0, 0.0), mask.float()


def completion_logprobs(
    model: Any,
    segments: Sequence[Segment],
    temperature: float,
    pad_id: int,
    shared_prompt: bool | None = None,
) -> tuple[Tensor, Tensor]:
    """Log-probs [B, T] of each completion token under logits / temperature, and its mask.

    Rows are the segments' completions in order (0 beyond a row's length). The plain
    forward, or the shared-prompt path where ``shared_prompt`` (the plan's choice; None:
    wherever the model's family allows it) says so.
    """
    from sapo_core.grpo import shared_prompt as fast

    if shared_prompt is None:
        shared_prompt = fast.supports_shared_prompt(model)
    if shared_prompt:
        return fast.shared_prompt_logprobs(model, segments, temperature, pad_id)
    return plain_logprobs(model, segments, temperature, pad_id)
