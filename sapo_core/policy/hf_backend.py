"""Generation with transformers: a plain sampling loop over the KV cache.

A hand-written loop rather than `model.generate` because GRPO needs the behaviour log-prob
of every sampled token, and asking `generate` for per-step logits keeps [B, V] floats for
every step (about 800 MB for 32 x 128 tokens of a 49k vocabulary).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor

from sapo_core.config import GenerationConfig
from sapo_core.memory import release_free_memory, releases_memory
from sapo_core.policy.backend import Completion, ProgressCallback, Prompt, stop_window
from sapo_core.policy.compat import cache_argument, output_cache
from sapo_core.policy.loading import Policy

SAMPLING_BLOCK = 256  # tokens per block of the two-level inverse CDF (49,152 = 192 x 256)


def top_p_filter(probs: Tensor, top_p: float) -> Tensor:
    """Zero the tail of each row [B, V] beyond cumulative probability top_p (keeps >= 1)."""
    if top_p >= 1.0:
        return probs
    sorted_probs, order = probs.sort(dim=-1, descending=True)  # [B, V]
    before = sorted_probs.cumsum(-1) - sorted_probs  # mass strictly above each token
    sorted_probs = sorted_probs.masked_fill(before >= top_p, 0.0)
    return torch.zeros_like(probs).scatter_(-1, order, sorted_probs)


def sample_one(probs: Tensor, generator: torch.Generator) -> Tensor:
    """One draw [A] from each row of probs [A, V] (rows need not sum to 1), by inverse CDF.

    `torch.multinomial` draws a single sample with an exponential variate per vocabulary
    entry (6% of generation time at a 49k vocabulary); this takes one uniform per row. The
    inverse CDF runs in two levels, in float64 so that small probabilities keep their mass:
    over the masses of blocks of SAMPLING_BLOCK tokens (one summing pass over the row), then
    within the block drawn. A token of zero probability is never drawn.
    """
    rows, vocab = probs.shape
    tail = (-vocab) % SAMPLING_BLOCK
    blocks = torch.nn.functional.pad(probs, (0, tail)) if tail else probs
    blocks = blocks.view(rows, -1, SAMPLING_BLOCK)  # [A, nb, K]
    mass = blocks.sum(-1, dtype=torch.float64)  # [A, nb]
    cdf = mass.cumsum(-1)
    uniform = torch.rand(rows, 1, generator=generator, dtype=torch.float64, device=probs.device)
    target = uniform * cdf[:, -1:]  # [A, 1]
    block = _invert(cdf, target)  # [A]
    picked = torch.arange(rows, device=probs.device)
    before = cdf[picked, block] - mass[picked, block]
    inner = blocks[picked, block].double().cumsum(-1)  # [A, K]
    token = _invert(inner, (target.squeeze(1) - before).unsqueeze(1))
    return block * SAMPLING_BLOCK + token


def _invert(cdf: Tensor, target: Tensor) -> Tensor:
    """The first index whose cumulative mass [A, n] exceeds target [A, 1]; rounding that
    lands past the total picks the last entry with mass, never a massless one."""
    picked = torch.searchsorted(cdf, target, right=True).squeeze(1)
    last = (cdf < cdf[:, -1:]).sum(-1)
    return torch.minimum(picked, last)


def _offset_progress(
    callback: ProgressCallback | None, offset: int, total: int
) -> Callable[[int], None]:
    """One sampling call's progress (its rows done) as the whole request's (done, total)."""
    if callback is None:
        return lambda done: None
    return lambda done: callback(offset + done, total)


def last_position(input_ids: Tensor) -> Tensor:
    """`logits_to_keep` for the last position only, as an index: transformers then gathers
    the hidden states (a contiguous copy) where an int would slice them (a strided view).
    On a CPU, the output head over a strided [B, 1, H] view expands its weight per row
    before multiplying: 21 s and 10 GB for 32 prompts under Gemma 3's 262k-token head in
    bf16, against 0.05 s for the gathered copy."""
    return torch.tensor([input_ids.size(1) - 1], device=input_ids.device)


def stop_token_ids(tokenizer: Any, model: Any) -> list[int]:
    """The ids that end a completion: the tokenizer's eos and the generation config's.

    A generation config may list several (Qwen2.5 ends on <|im_end|> or <|endoftext|>, Llama 3
    on three ids), and a chat model's end-of-turn token is one of them; each may be an int,
    a list or unset.
    """
    generation_config = getattr(model, "generation_config", None)
    found: set[int] = set()
    for ids in (tokenizer.eos_token_id, getattr(generation_config, "eos_token_id", None)):
        listed = [ids] if isinstance(ids, int) else list(ids or [])
        found.update(i for i in listed if isinstance(i, int) and i >= 0)
    return sorted(found)


class TransformersBackend:
    """Batched temperature / top-p sampling with behaviour log-probs, on the policy's own
    weights (nothing to reload after an update, nothing to stop)."""

    exact_logprobs = True

    def __init__(self, policy: Policy, *, stop_texts: Sequence[str] = ()) -> None:
        self.policy = policy
        tokenizer = policy.tokenizer
        stops = stop_token_ids(tokenizer, policy.model)
        self.stop_ids = torch.tensor(stops, dtype=torch.long)  # [S]
        self.stop_set = set(stops)
        self.pad_id = int(tokenizer.pad_token_id)
        self.stop_texts = tuple(stop_texts)
        self.stop_window = stop_window(self.stop_texts)

    def weights_changed(self) -> None:
        pass

    def close(self) -> None:
        pass

    def generate(
        self,
        prompts: Sequence[Prompt],
        config: GenerationConfig,
        seed: int,
        on_progress: ProgressCallback | None = None,
    ) -> list[list[Completion]]:
        n = config.completions_per_question
        per_call = max(1, config.batch_size // n)  # questions per call: all n samples of each
        generator = torch.Generator(device=self.policy.device).manual_seed(seed)
        groups: list[list[Completion]] = []
        total = len(prompts) * n
        model = self.policy.sampler()
        was_training = model.training
        model.eval()
        try:
            for start in range(0, len(prompts), per_call):
                report = _offset_progress(on_progress, start * n, total)
                with self.policy.precision():
                    flat = self._sample(
                        model, prompts[start : start + per_call], n, config, generator, report
                    )
                groups.extend(flat[i * n : (i + 1) * n] for i in range(len(flat) // n))
        finally:
            model.train(was_training)  # whatever stopped the sampling
        del model  # a reduced copy's pages go back with the caches'
        if releases_memory(self.policy.device.type):
            release_free_memory()  # before the update needs its own (glibc's pages)
        return groups

    @torch.inference_mode()
    def _sample(
        self,
        model: Any,
        prompts: Sequence[Prompt],
        n: int,
        config: GenerationConfig,
        generator: torch.Generator,
        report: Callable[[int], None],
    ) -> list[Completion]:
        """Sample n completions of each prompt.

        Each prompt is encoded once and its KV cache copied n times (the prompt is most of
        the compute on short answers); rows that finished leave the batch, so the tail of a
        batch where one completion runs long costs one row per step, not the whole batch.
        """
        device = self.policy.device
        enc = {key: value.to(device) for key, value in self._left_padded(prompts).items()}
        stop_ids = self.stop_ids.to(device)
        attention = enc["attention_mask"].repeat_interleave(n, 0)  # [B, P]
        positions = (attention.cumsum(-1) - 1).clamp(min=0)[:, -1:]  # [B, 1]
        out = model(
            input_ids=enc["input_ids"],
            attention_mask=enc["attention_mask"],
            position_ids=(enc["attention_mask"].cumsum(-1) - 1).clamp(min=0),
            use_cache=True,
            logits_to_keep=last_position(enc["input_ids"]),
        )
        cache = output_cache(out)
        cache.batch_repeat_interleave(n)
        logits = out.logits[:, -1, :].repeat_interleave(n, 0)  # [B, V]
        batch = attention.size(0)
        shape = (batch, config.max_new_tokens)
        tokens = torch.full(shape, self.pad_id, dtype=torch.long, device=device)
        logprobs = torch.zeros(shape, device=device)
        # Under top-p the claim is the renormalised distribution's log-prob (it was sampled
        # from that), not the full vocabulary's.
        sampled = torch.zeros(shape, device=device) if config.top_p < 1.0 else None
        lengths = torch.full((batch,), config.max_new_tokens, dtype=torch.long, device=device)
        finished = torch.zeros(batch, dtype=torch.bool, device=device)
        alive = torch.arange(batch, device=device)  # original row of each row still in the batch
        for step in range(config.max_new_tokens):
            scaled = logits.float()  # [A, V]
            if config.temperature != 1.0:
                scaled = scaled / config.temperature
            logp = torch.log_softmax(scaled, -1)
            probs = top_p_filter(logp.exp(), config.top_p)
            nxt = sample_one(probs, generator)  # [A]
            tokens[alive, step] = nxt
            logprobs[alive, step] = logp.gather(1, nxt.unsqueeze(1)).squeeze(1)
            if sampled is not None:
                kept = probs.gather(1, nxt.unsqueeze(1)).squeeze(1) / probs.sum(-1)  # [A]
                sampled[alive, step] = kept.log()
            stopped = torch.isin(nxt, stop_ids)  # [A]
            if self.stop_texts:
                stopped |= self._ends_in_stop_text(tokens, alive, step)
            lengths[alive[stopped]] = step + 1
            finished[alive[stopped]] = True
            if step + 1 == config.max_new_tokens or bool(stopped.all()):
                report(batch)
                break
            if bool(stopped.any()):
                report(batch - alive.numel() + int(stopped.sum()))
                keep = (~stopped).nonzero().squeeze(1)
                cache.batch_select_indices(keep)
                alive, nxt = alive[keep], nxt[keep]
                attention, positions = attention[keep], positions[keep]
            attention = torch.cat([attention, torch.ones_like(attention[:, :1])], 1)
            positions = positions + 1
            out = model(
                input_ids=nxt.unsqueeze(1),
                attention_mask=attention,
                position_ids=positions,
                use_cache=True,
                logits_to_keep=1,
                **{cache_argument(): cache},
            )
            cache = output_cache(out)
            logits = out.logits[:, -1, :]
        return self._unpack(tokens, logprobs, lengths, finished, sampled)

    def _ends_in_stop_text(self, tokens: Tensor, alive: Tensor, step: int) -> Tensor:
        """Rows [A] whose text now holds a stop text: it can only have appeared with the
        token just sampled, so only the last few tokens' text is decoded."""
        start = max(0, step + 1 - self.stop_window)
        recent = tokens[alive, start : step + 1].tolist()
        texts = self.policy.tokenizer.batch_decode(recent, skip_special_tokens=True)
        hit = [any(stop in text for stop in self.stop_texts) for text in texts]
        return torch.tensor(hit, dtype=torch.bool, device=tokens.device)

    def _left_padded(self, prompts: Sequence[Prompt]) -> dict[str, Tensor]:
        """Input ids and attention mask [B, P] of the prompts, padded on the left."""
        tokenizer = self.policy.tokenizer
        rows = [
            tokenizer(p, add_special_tokens=False)["input_ids"] if isinstance(p, str) else list(p)
            for p in prompts
        ]
        width = max(map(len, rows), default=0)
        ids = torch.full((len(rows), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(rows), width), dtype=torch.long)
        for i, row in enumerate(rows):
            if row:
                ids[i, width - len(row) :] = torch.tensor(row, dtype=torch.long)
                mask[i, width - len(row) :] = 1
        return {"input_ids": ids, "attention_mask": mask}

    def _unpack(
        self,
        tokens: Tensor,
        logprobs: Tensor,
        lengths: Tensor,
        ended: Tensor,
        sampled: Tensor | None = None,
    ) -> list[Completion]:
        """Rows [T] cut at their length; the stop token (or the tokens of the stop text) is
        kept: the model learns to stop."""
        completions = []
        claims = sampled.tolist() if sampled is not None else [None] * tokens.size(0)
        for row, row_logprobs, length, finished, claim in zip(
            tokens.tolist(),
            logprobs.tolist(),
            lengths.tolist(),
            ended.tolist(),
            claims,
            strict=True,
        ):
            ids = row[:length]
            text = self.policy.tokenizer.decode(ids, skip_special_tokens=True)
            completions.append(
                Completion(
                    text,
                    tuple(ids),
                    tuple(row_logprobs[:length]),
                    finished,
                    None if claim is None else tuple(claim[:length]),
                )
            )
        return completions
