"""The shared-prompt log-prob path: speed code, behind the update's plan.

It computes what `sapo_core/grpo/logprobs.py`'s plain forward computes (tested equal there:
tests/core/test_logprob_paths.py), faster and in less memory, and the update takes it only
where the plan chooses it (`UpdatePlan.shared_prompt`, sapo_core/grpo/plan.py: a family known
to allow it, unless `grpo.plan: plain`). A segment's prompt runs once and its completions
follow it in one packed sequence, under a block mask that lets each see the prompt and
itself; gradients from every completion flow back through that one prompt pass, so the
result equals running each (prompt, completion) pair separately. It also never materialises
the [tokens, vocab] logits or a dense gradient for the vocabulary matrices:

- the output head and the log-softmax run chunk by chunk (`token_logprobs`), keeping only
  each token's log-normaliser, and recompute a chunk's logits in the backward pass;
- the head's and the embedding's gradients are added into `weight.grad` where they belong
  (rows for the embedding) instead of through dense [vocab, hidden] temporaries.

What it saves against the plain path, on 2 CPU cores: benchmarks/README.md (issue 59's
section: the plain path and the plan).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from sapo_core.grpo.segments import Segment, padded

# Rows of logits [chunk, vocab] alive at once in `token_logprobs`: 128 x 49k fp32 is 25 MB.
LOGIT_CHUNK = 128


def _add_to_grad(weight: Tensor, update: Any) -> None:
    """Accumulate into weight.grad in place; `update(grad)` adds this pass's share."""
    if weight.grad is None:
        weight.grad = torch.zeros_like(weight)
    update(weight.grad)


class _EmbeddingRows(torch.autograd.Function):
    """weight[ids], whose backward adds into weight.grad's rows.

    torch's embedding backward builds a dense [vocab, hidden] gradient (zeroed, filled, then
    added to .grad): a third of a second per micro-batch for a 49k vocabulary on 2 cores.
    """

    @staticmethod
    def forward(ctx: Any, weight: Tensor, ids: Tensor) -> Tensor:
        ctx.weight = weight
        ctx.save_for_backward(ids)
        return weight.index_select(0, ids.reshape(-1)).view(*ids.shape, weight.size(1))

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[None, None]:
        (ids,) = ctx.saved_tensors
        rows = grad.reshape(-1, grad.size(-1))
        _add_to_grad(ctx.weight, lambda g: g.index_add_(0, ids.reshape(-1), rows))
        return None, None


def _scaled_logits(hidden: Tensor, weight: Tensor, temperature: float) -> Tensor:
    """hidden @ weight.T / temperature in the weight's format (fp32 even under autocast, so
    forward and backward agree), as a new float32 tensor the caller may modify."""
    with torch.autocast(device_type=hidden.device.type, enabled=False):
        logits = (hidden.to(weight.dtype) @ weight.T).float()
    return logits if temperature == 1.0 else logits.div_(temperature)


class _TokenLogprobs(torch.autograd.Function):
    """log_softmax(hidden @ weight.T / temperature)[target], row by row, in chunks."""

    @staticmethod
    def forward(
        ctx: Any, hidden: Tensor, weight: Tensor, targets: Tensor, temperature: float
    ) -> Tensor:
        out = torch.empty(hidden.size(0), dtype=torch.float32, device=hidden.device)  # [N]
        norms = torch.empty_like(out)  # log-normaliser of each row
        for start in range(0, hidden.size(0), LOGIT_CHUNK):
            end = start + LOGIT_CHUNK
            logits = _scaled_logits(hidden[start:end], weight, temperature)  # [c, V]
            norms[start:end] = torch.logsumexp(logits, -1)
            out[start:end] = logits.gather(1, targets[start:end, None]).squeeze(1)
        ctx.weight, ctx.temperature = weight, temperature
        ctx.save_for_backward(hidden, targets, norms)
        return out - norms

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, None, None, None]:
        hidden, targets, norms = ctx.saved_tensors
        weight, temperature = ctx.weight, ctx.temperature
        grad_hidden = torch.empty_like(hidden) if ctx.needs_input_grad[0] else None
        for start in range(0, hidden.size(0), LOGIT_CHUNK):
            end = start + LOGIT_CHUNK
            h, g = hidden[start:end], grad[start:end, None].float()  # [c, H], [c, 1]
            # d(logit_target - logsumexp) / d logits = onehot - softmax, then the 1/T.
            dlogits = _scaled_logits(h, weight, temperature)  # [c, V], in place from here
            dlogits = dlogits.sub_(norms[start:end, None]).exp_().mul_(-g)
            dlogits.scatter_add_(1, targets[start:end, None], g)
            if temperature != 1.0:
                dlogits.div_(temperature)
            dlogits = dlogits.to(weight.dtype)
            if grad_hidden is not None:
                grad_hidden[start:end] = dlogits @ weight  # cast to hidden's format
            if weight.requires_grad:
                _add_to_grad(weight, lambda w, d=dlogits, h=h: w.addmm_(d.T, h))
        return grad_hidden, None, None, None


def token_logprobs(hidden: Tensor, head: Tensor, targets: Tensor, temperature: float) -> Tensor:
    """log p(target) [N] under logits hidden [N, H] @ head.T / temperature, in chunks."""
    result: Tensor = _TokenLogprobs.apply(hidden, head, targets, temperature)
    return result


def embedding_rows(weight: Tensor, ids: Tensor) -> Tensor:
    """weight[ids] [*ids.shape, H], its gradient added row by row into weight.grad."""
    result: Tensor = _EmbeddingRows.apply(weight, ids)
    return result


@dataclass
class _Packed:
    """Segments laid out as packed sequences [R, L]: a prompt, then each completion."""

    ids: Tensor  # [R, L]
    positions: Tensor  # [R, L]: a completion continues from its prompt's end
    blocks: Tensor  # [R, L]: -1 prompt, j completion j of the row, -2 padding
    predictors: list[int]  # flat index (row * L + column) predicting each completion token
    targets: list[int]  # the token it predicts
    cells: tuple[list[int], list[int]]  # where it goes in the [B, T] output

    def attention_mask(self, additive: torch.dtype | None, window: int | None = None) -> Tensor:
        """[R, 1, L, L]: a position sees earlier positions of its prompt and of its own
        completion (padding sees the prompt and padding, and is never read). Boolean (True:
        seen) for SDPA; with `additive`, 0 or that dtype's minimum, for eager attention.
        With `window`, a sliding-window layer's: only keys fewer than `window` positions
        back (positions, not columns: those are the unpacked sequence's indices)."""
        column = torch.arange(self.ids.size(1))
        seen = (column[None, :] <= column[:, None])[None]  # [1, L, L] causal
        key, query = self.blocks[:, None, :], self.blocks[:, :, None]  # [R, 1, L], [R, L, 1]
        seen = seen & ((key == -1) | (key == query))  # [R, L, L]
        if window is not None:
            back = self.positions[:, :, None] - self.positions[:, None, :]  # [R, L, L]
            seen = seen & (back < window)
        seen = seen[:, None]  # [R, 1, L, L]
        if additive is None:
            return seen
        return torch.zeros(seen.shape, dtype=additive).masked_fill_(
            ~seen, torch.finfo(additive).min
        )


def _pack(segments: Sequence[Segment], pad_id: int) -> _Packed:
    rows = [
        list(seg.prompt_ids) + [t for ids in seg.completion_ids for t in ids] for seg in segments
    ]
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    positions = torch.zeros_like(ids)
    blocks = torch.full_like(ids, -2)
    predictors: list[int] = []
    targets: list[int] = []
    cells: tuple[list[int], list[int]] = ([], [])
    out_row = 0
    for r, seg in enumerate(segments):
        prompt = len(seg.prompt_ids)
        ids[r, : len(rows[r])] = torch.tensor(rows[r])
        positions[r, :prompt] = torch.arange(prompt)
        blocks[r, :prompt] = -1
        start = prompt
        for j, completion in enumerate(seg.completion_ids):
            end = start + len(completion)
            positions[r, start:end] = torch.arange(prompt, prompt + len(completion))
            blocks[r, start:end] = j
            # token 0 is predicted by the prompt's last position, token t by position t - 1
            before = [r * width + prompt - 1] + [r * width + c for c in range(start, end - 1)]
            predictors += before
            targets += completion
            cells[0].extend([out_row] * len(completion))
            cells[1].extend(range(len(completion)))
            start, out_row = end, out_row + 1
    return _Packed(ids, positions, blocks, predictors, targets, cells)


def _masks(config: Any, packed: _Packed, dtype: torch.dtype, device: Any) -> Any:
    """The packed block mask as the decoder takes it: one tensor, or, for a family that
    mixes sliding-window and full layers (Gemma 3), a mask per layer type."""
    additive = dtype if config._attn_implementation == "eager" else None
    full = packed.attention_mask(additive).to(device)
    layer_types = getattr(config, "layer_types", None) or ()
    if "sliding_attention" not in layer_types:
        return full
    window = packed.attention_mask(additive, window=config.sliding_window).to(device)
    return {"full_attention": full, "sliding_attention": window}


def shared_prompt_logprobs(
    model: Any, segments: Sequence[Segment], temperature: float, pad_id: int
) -> tuple[Tensor, Tensor]:
    """`completion_logprobs` with each segment run as one packed sequence.

    A segment's prompt comes once, followed by all its completions; a block mask lets each
    completion see the prompt and itself only, and its positions continue from the prompt's
    end, so every token's log-prob equals that of its own (prompt, completion) pair, and
    gradients from every completion flow back through the one prompt. Nothing is padded
    but whole sequences to the longest in the micro-batch.

    Runs the embedding, the decoder and the vocabulary head itself, so it is exact only for
    models whose logits are the head's output unchanged (see `supports_shared_prompt`); the
    head runs only where a position predicts a completion token.
    """
    packed = _pack(segments, pad_id)
    body = model.get_decoder()  # the transformer without its vocabulary head
    embedding = model.get_input_embeddings()
    device = embedding.weight.device
    inputs = embedding_rows(embedding.weight, packed.ids.to(device))
    scale = getattr(embedding, "embed_scale", None)  # Gemma scales by sqrt(hidden) inside
    if scale is not None:
        inputs = inputs * scale.to(inputs.dtype)
    hidden = body(
        inputs_embeds=inputs,
        attention_mask=_masks(model.config, packed, embedding.weight.dtype, device),
        position_ids=packed.positions.to(device),
        use_cache=False,
    ).last_hidden_state  # [R, L, H]
    picked = token_logprobs(
        hidden.reshape(-1, hidden.size(-1))[torch.tensor(packed.predictors, device=device)],
        model.get_output_embeddings().weight,
        torch.tensor(packed.targets, device=device),
        temperature,
    )  # [N]
    rows = [ids for seg in segments for ids in seg.completion_ids]
    width = max(len(ids) for ids in rows)
    logprobs = torch.zeros(len(rows), width, dtype=torch.float32, device=device)  # [B, T]
    cells = (torch.tensor(packed.cells[0]), torch.tensor(packed.cells[1]))
    logprobs = logprobs.index_put(tuple(c.to(device) for c in cells), picked.float())
    mask = padded([[1.0] * len(ids) for ids in rows], width, 0.0, torch.float32)
    return logprobs, mask.to(device)


# Families whose causal-LM forward is decoder -> output head with nothing after the head,
# checked by reading their modeling code; a family not listed takes the plain path.
SHARED_PROMPT_MODEL_TYPES = frozenset(
    {"llama", "mistral", "qwen2", "qwen3", "smollm3", "gemma3_text"}
)
"""gemma3_text: its embedding scales by sqrt(hidden) (applied here as its module does) and
its sliding-window layers get their own mask; a soft-capped config still takes the plain
path (LOGIT_POSTPROCESSING)."""
# Attention implementations that take the packed sequences' 4D block mask as given.
PACKED_ATTENTION = frozenset({"sdpa", "eager"})
# Config fields through which some families change logits after the head (Gemma2/3 soft-cap,
# Cohere scales, Granite divides), with the value that changes nothing.
LOGIT_POSTPROCESSING: dict[str, float | None] = {
    "final_logit_softcapping": None,
    "logit_scale": 1.0,
    "logits_scaling": 1.0,
}


def supports_shared_prompt(model: Any) -> bool:
    """Whether `shared_prompt_logprobs` reproduces this model's own forward.

    The fast path runs the embedding, the decoder and the output head itself, so any step
    the model's forward takes after the head would be silently skipped: only allow-listed
    families, with those three reachable, a head without bias and no logit post-processing
    configured, and an attention that takes a custom mask (SDPA or eager), qualify.
    """
    config = getattr(model, "config", None)
    if getattr(config, "model_type", None) not in SHARED_PROMPT_MODEL_TYPES:
        return False
    if getattr(config, "_attn_implementation", None) not in PACKED_ATTENTION:
        return False
    needed = ("get_decoder", "get_input_embeddings", "get_output_embeddings")
    if not all(hasattr(model, name) for name in needed):
        return False
    if getattr(model.get_output_embeddings(), "bias", None) is not None:
        return False
    return all(
        getattr(config, name, neutral) in (None, neutral)
        for name, neutral in LOGIT_POSTPROCESSING.items()
    )
