"""The GRPO update step: re-encode rows, fill in behaviour log-probs, accumulate, step.

Rows arrive as segments: one prompt (this node's template around the question) and the
completions trained against it. On model families known to allow it, a segment's prompt is
run once and its KV cache shared by its completions; gradients from every completion flow
back through that one prompt pass, so the result equals running each (prompt, completion)
pair separately, at a fraction of the compute when prompts are long and answers short.
Other families take the plain path: one ordinary forward over prompt + completion.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from sapo_core.config import GRPOConfig
from sapo_core.grpo.loss import micro_batch_weight, policy_loss


@dataclass
class Segment:
    """One prompt and the completions trained against it (usually one group)."""

    prompt_ids: list[int]
    completion_ids: list[list[int]]
    advantages: list[float]
    behaviour_logprobs: list[list[float] | None]  # None: not known (a peer's row)
    ref_logprobs: list[list[float]] | None = field(default=None, repr=False)

    def __len__(self) -> int:
        return len(self.completion_ids)


def split_segments(
    segments: Sequence[Segment], micro_batch_size: int, micro_batch_tokens: int | None = None
) -> list[list[Segment]]:
    """Pack completions into micro-batches of at most micro_batch_size rows, by length.

    With micro_batch_tokens, a micro-batch also stays under that many padded completion
    tokens (rows x longest row), so memory is bounded by tokens, not by the longest answers.

    Rows are sorted by completion length so each micro-batch pads to a length close to its
    rows' own (padding to a group's longest answer wasted more than half the compute when a
    few answers run to the token limit). Within a micro-batch, rows that share a prompt
    share one prompt pass.
    """
    rows = [
        (len(ids), n, seg, i)
        for n, seg in enumerate(segments)
        for i, ids in enumerate(seg.completion_ids)
    ]
    rows.sort(key=lambda row: (-row[0], row[1], row[3]))
    chunks: list[list[tuple[int, int, Segment, int]]] = []
    for row in rows:  # longest first, so a chunk's first row sets its padded width
        chunk = chunks[-1] if chunks else None
        fits = chunk is not None and len(chunk) < micro_batch_size
        if fits and chunk and micro_batch_tokens is not None:
            fits = (len(chunk) + 1) * chunk[0][0] <= micro_batch_tokens
        if fits and chunk is not None:
            chunk.append(row)
        else:
            chunks.append([row])
    batches: list[list[Segment]] = []
    for chunk in chunks:
        by_prompt: dict[int, Segment] = {}
        for _, n, seg, i in chunk:
            piece = by_prompt.setdefault(
                n, Segment(seg.prompt_ids, [], [], [], None if seg.ref_logprobs is None else [])
            )
            piece.completion_ids.append(seg.completion_ids[i])
            piece.advantages.append(seg.advantages[i])
            piece.behaviour_logprobs.append(seg.behaviour_logprobs[i])
            if piece.ref_logprobs is not None and seg.ref_logprobs is not None:
                piece.ref_logprobs.append(seg.ref_logprobs[i])
        batches.append(list(by_prompt.values()))
    return batches


def _padded(rows: Sequence[Sequence[float]], width: int, value: float, dtype: Any) -> Tensor:
    out = torch.full((len(rows), width), value, dtype=dtype)
    for i, row in enumerate(rows):
        out[i, : len(row)] = torch.tensor(list(row), dtype=dtype)
    return out


def shared_prompt_logprobs(
    model: Any, segments: Sequence[Segment], temperature: float, pad_id: int
) -> tuple[Tensor, Tensor]:
    """`completion_logprobs` with each prompt run once and its KV cache shared.

    Calls the decoder and the vocabulary head separately, so it is exact only for models
    whose logits are the head's output unchanged (see `supports_shared_prompt`). Logits are
    computed only where they predict completion tokens (never for prompt positions): the
    prompt pass keeps its last position only.
    """
    counts = torch.tensor([len(s) for s in segments])  # [U]
    prompt_len = max(len(s.prompt_ids) for s in segments)
    prompt_ids = torch.full((len(segments), prompt_len), pad_id, dtype=torch.long)  # [U, P]
    prompt_mask = torch.zeros_like(prompt_ids)
    for i, seg in enumerate(segments):  # left padding: every prompt ends at column P - 1
        prompt_ids[i, prompt_len - len(seg.prompt_ids) :] = torch.tensor(seg.prompt_ids)
        prompt_mask[i, prompt_len - len(seg.prompt_ids) :] = 1
    out = model(
        input_ids=prompt_ids,
        attention_mask=prompt_mask,
        position_ids=(prompt_mask.cumsum(-1) - 1).clamp(min=0),
        use_cache=True,
        logits_to_keep=1,
    )
    owner = torch.arange(len(segments)).repeat_interleave(counts)  # [B]
    cache = out.cache
    cache.batch_select_indices(owner)

    rows = [ids for seg in segments for ids in seg.completion_ids]
    width = max(len(r) for r in rows)
    ids = _padded(rows, width, pad_id, torch.long)  # [B, T]
    mask = _padded([[1] * len(r) for r in rows], width, 0, torch.long)  # [B, T]
    lengths = prompt_mask.sum(-1)[owner]  # [B]
    body = model.get_decoder()  # the transformer without its vocabulary head
    hidden = body(
        input_ids=ids,
        attention_mask=torch.cat([prompt_mask[owner], mask], 1),
        position_ids=lengths.unsqueeze(1) + torch.arange(width).unsqueeze(0),
        cache=cache,
        use_cache=True,
    ).last_hidden_state  # [B, T, H]
    # Position t predicts token t + 1; token 0 is predicted by the prompt's last position.
    # The vocabulary head runs only where a real token is predicted, never on padding:
    # its [N, V] logits are the largest tensor of the step.
    predicts = mask.clone()
    predicts[torch.arange(len(rows)), mask.sum(-1) - 1] = 0  # the last token predicts nothing
    targets = torch.roll(ids, -1, dims=1)[predicts.bool()]  # [N - B]
    head = model.get_output_embeddings()
    later = head(hidden[predicts.bool()]).float() / temperature  # [N - B, V]
    first = out.logits[:, -1, :][owner].float() / temperature  # [B, V]
    logprobs = torch.zeros(ids.shape, dtype=torch.float32)  # [B, T]
    logprobs[:, 0] = first.gather(1, ids[:, :1]).squeeze(1) - torch.logsumexp(first, -1)
    shifted = torch.zeros_like(predicts)
    shifted[:, 1:] = predicts[:, :-1]  # token t + 1 where position t predicts
    logprobs = logprobs.index_put(
        (shifted.bool().nonzero(as_tuple=True)),
        later.gather(1, targets.unsqueeze(1)).squeeze(1) - torch.logsumexp(later, -1),
    )
    return logprobs, mask.float()


# Families whose causal-LM forward is decoder -> output head with nothing after the head,
# checked by reading their modeling code; a family not listed takes the plain path.
SHARED_PROMPT_MODEL_TYPES = frozenset({"llama", "mistral", "qwen2", "qwen3", "smollm3"})
# Config fields through which some families change logits after the head (Gemma2/3 soft-cap,
# Cohere scales, Granite divides), with the value that changes nothing.
LOGIT_POSTPROCESSING: dict[str, float | None] = {
    "final_logit_softcapping": None,
    "logit_scale": 1.0,
    "logits_scaling": 1.0,
}


def supports_shared_prompt(model: Any) -> bool:
    """Whether `shared_prompt_logprobs` reproduces this model's own forward.

    The fast path runs the decoder and the output head itself, so any step the model's
    forward takes after the head would be silently skipped: only allow-listed families,
    with the decoder and head reachable and no logit post-processing configured, qualify.
    """
    config = getattr(model, "config", None)
    if getattr(config, "model_type", None) not in SHARED_PROMPT_MODEL_TYPES:
        return False
    if not (hasattr(model, "get_decoder") and hasattr(model, "get_output_embeddings")):
        return False
    return all(
        getattr(config, name, neutral) in (None, neutral)
        for name, neutral in LOGIT_POSTPROCESSING.items()
    )


def plain_logprobs(
    model: Any, segments: Sequence[Segment], temperature: float, pad_id: int
) -> tuple[Tensor, Tensor]:
    """`completion_logprobs` from one ordinary forward over each row's prompt + completion.

    The reference the fast path is tested against, and the path for families whose forward
    post-processes logits. Rows are right-padded, so each starts at position 0 as a model
    assumes without position ids. It runs every prompt once per completion, and its logits
    cover positions from the shortest prompt's last token on ([B, S, V]), so it costs more
    than the fast path.
    """
    rows = [(seg.prompt_ids, ids) for seg in segments for ids in seg.completion_ids]
    prompt_lens = torch.tensor([len(p) for p, _ in rows])  # [B]
    sequences = [list(p) + list(c) for p, c in rows]
    length = max(len(s) for s in sequences)
    input_ids = _padded(sequences, length, pad_id, torch.long)  # [B, L]
    attention = _padded([[1] * len(s) for s in sequences], length, 0, torch.long)  # [B, L]
    first = int(prompt_lens.min()) - 1  # the earliest position that predicts a completion token
    logits = model(
        input_ids=input_ids, attention_mask=attention, logits_to_keep=length - first
    ).logits  # [B, S, V], S = L - first: positions first .. L - 1
    completions = [c for _, c in rows]
    width = max(len(c) for c in completions)
    ids = _padded(completions, width, pad_id, torch.long)  # [B, T]
    mask = _padded([[1] * len(c) for c in completions], width, 0, torch.long)  # [B, T]
    # Completion token t of row b is predicted at position prompt_len_b - 1 + t.
    column = (prompt_lens - 1 - first).unsqueeze(1) + torch.arange(width)  # [B, T]
    column = column.clamp(max=logits.size(1) - 1)  # padding columns: any valid index
    predicting = logits[torch.arange(len(rows)).unsqueeze(1), column]  # [B, T, V]
    logp = torch.log_softmax(predicting.float() / temperature, -1)  # [B, T, V]
    picked = logp.gather(-1, ids.unsqueeze(-1)).squeeze(-1)  # [B, T]
    return picked.masked_fill(mask == 0, 0.0), mask.float()


def completion_logprobs(
    model: Any, segments: Sequence[Segment], temperature: float, pad_id: int
) -> tuple[Tensor, Tensor]:
    """Log-probs [B, T] of each completion token under logits / temperature, and its mask.

    Rows are the segments' completions in order (0 beyond a row's length). The shared-prompt
    fast path where `supports_shared_prompt` allows it, else the plain forward.
    """
    if supports_shared_prompt(model):
        return shared_prompt_logprobs(model, segments, temperature, pad_id)
    return plain_logprobs(model, segments, temperature, pad_id)


@dataclass
class UpdateResult:
    """What one update did, for tracking."""

    metrics: dict[str, float]
    seconds: float
    tokens: int


def _micro_batches_with_old(
    model: Any, batches: list[list[Segment]], temperature: float, pad_id: int
) -> Iterator[tuple[list[Segment], Tensor]]:
    """Behaviour log-probs [b, T] per micro-batch; unknown rows get this policy's, no grad."""
    for batch in batches:
        rows = [lp for seg in batch for lp in seg.behaviour_logprobs]
        if all(r is not None for r in rows):
            width = max(len(ids) for seg in batch for ids in seg.completion_ids)
            yield batch, _padded([r or [] for r in rows], width, 0.0, torch.float32)
            continue
        with torch.no_grad():
            current, _ = completion_logprobs(model, batch, temperature, pad_id)
        for i, row in enumerate(rows):
            if row is not None:
                current[i, : len(row)] = torch.tensor(row)
                current[i, len(row) :] = 0.0
        yield batch, current


def grpo_update(
    model: Any,
    optimizer: torch.optim.Optimizer,
    segments: Sequence[Segment],
    config: GRPOConfig,
    *,
    temperature: float,
    pad_id: int,
    max_completion_length: int,
) -> UpdateResult:
    """`config.iterations` optimizer steps on one batch; gradients accumulate over micro-batches.

    Behaviour log-probs are fixed before the first step (generation's for own rows, the
    current policy's for peers' rows), so from the second iteration on the ratio and the
    clip act as PPO intends.
    """
    started = time.perf_counter()
    if not segments:
        return UpdateResult({}, 0.0, 0)
    model.train()
    batches = split_segments(segments, config.micro_batch_size, config.micro_batch_tokens)
    prepared = list(_micro_batches_with_old(model, batches, temperature, pad_id))
    total_seqs = sum(len(s) for s in segments)
    total_tokens = float(sum(len(ids) for s in segments for ids in s.completion_ids))
    sums: dict[str, float] = {}
    for _ in range(config.iterations):
        optimizer.zero_grad(set_to_none=True)
        for batch, old in prepared:
            logprobs, mask = completion_logprobs(model, batch, temperature, pad_id)
            advantages = torch.tensor([a for seg in batch for a in seg.advantages])  # [b]
            ref = None
            if config.beta:
                ref_rows = [r for seg in batch for r in (seg.ref_logprobs or [])]
                ref = _padded(ref_rows, logprobs.size(1), 0.0, torch.float32)
            loss, metrics = policy_loss(
                logprobs,
                old,
                advantages,
                mask,
                loss_type=config.loss_type,
                eps_low=config.eps_low,
                eps_high=config.eps_high,
                beta=config.beta,
                ref_logprobs=ref,
                max_completion_length=max_completion_length,
            )
            weight = micro_batch_weight(
                config.loss_type,
                micro_sequences=logprobs.size(0),
                micro_tokens=float(mask.sum()),
                total_sequences=total_seqs,
                total_tokens=total_tokens,
                micro_batches=len(prepared),
            )
            (loss * weight).backward()
            share = float(mask.sum()) / (total_tokens * config.iterations)
            for key, value in metrics.items():
                if key != "tokens":
                    sums[key] = sums.get(key, 0.0) + value * share
        if config.max_grad_norm is not None:
            norm = torch.nn.utils.clip_grad_norm_(model.parameters(), config.max_grad_norm)
            sums["grad_norm"] = sums.get("grad_norm", 0.0) + float(norm) / config.iterations
        optimizer.step()
    seconds = time.perf_counter() - started
    sums["tokens_per_s"] = total_tokens * config.iterations / max(seconds, 1e-9)
    return UpdateResult(sums, seconds, int(total_tokens))


def make_optimizer(model: Any, config: GRPOConfig) -> torch.optim.Optimizer:
    """Adam (decoupled weight decay) over the trainable parameters."""
    params = [p for p in model.parameters() if p.requires_grad]
    return torch.optim.AdamW(params, lr=config.learning_rate, weight_decay=config.weight_decay)


def reference_logprobs(
    ref_model: Any, segments: Sequence[Segment], temperature: float, pad_id: int, chunk: int
) -> None:
    """Fill each segment's ref_logprobs from a frozen reference model (for beta > 0)."""
    for seg in segments:
        rows: list[list[float]] = []
        for piece in split_segments([seg], chunk):
            with torch.no_grad():
                logprobs, _ = completion_logprobs(ref_model, piece, temperature, pad_id)
            rows.extend(
                logprobs[i, : len(ids)].tolist() for i, ids in enumerate(piece[0].completion_ids)
            )
        seg.ref_logprobs = rows
