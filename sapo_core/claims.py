"""A row's claim about how it was sampled, judged before the update trusts it.

A row may carry the generator's token ids, the log-prob it sampled each with, and a
fingerprint of its tokenizer (the ledger's ``token_ids``, ``token_logprobs``,
``tokenizer``). A peer's claim is hostile input like the rest of its row. This node uses it
only where the fingerprint is its own tokenizer's and every check below holds; otherwise
it drops the claim, counts why, and trains on the row's text as the paper does (re-encoded,
weighed as if sampled here). Whatever log-probs a peer claims, the importance weight they
give a token is at most the correction's cap (sapo_core/grpo/offpolicy.py).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

from sapo_core.rollouts import Rollout

# Why a claim was not used; counted per row in a round's report (`claims_<reason>`).
NO_CLAIM: Final = "none"
"""The row carries no claim (written before schema 2, or by a writer that keeps none)."""
OTHER_TOKENIZER: Final = "other_tokenizer"
"""Another tokenizer's ids: a mixed-family swarm's peer. Not a lie; its text is trained."""
LENGTH_MISMATCH: Final = "length_mismatch"
TOO_LONG: Final = "too_long"
INVALID_LOGPROB: Final = "invalid_logprob"
OUTSIDE_VOCAB: Final = "outside_vocab"
SPECIAL_TOKEN: Final = "special_token"
NOT_THE_TEXT: Final = "not_the_text"
ACCEPTED: Final = "accepted"
CLAIM_OUTCOMES: Final = (
    ACCEPTED,
    NO_CLAIM,
    OTHER_TOKENIZER,
    LENGTH_MISMATCH,
    TOO_LONG,
    INVALID_LOGPROB,
    OUTSIDE_VOCAB,
    SPECIAL_TOKEN,
    NOT_THE_TEXT,
)

MAX_LOGPROB_MAGNITUDE: Final = 1e4
"""A log-prob below -1e4 is no sampler's (float32 softmax bottoms out near -104); -100 on
every token is accepted, and the cap bounds what it can do."""


def tokenizer_fingerprint(tokenizer: Any) -> str:
    """16 hex digits naming how ``tokenizer`` maps text to ids: its vocabulary, merges,
    normalisation and added tokens (a fast tokenizer's serialisation, less the padding and
    truncation settings code changes at run time), else its vocabulary and added tokens."""
    cached = getattr(tokenizer, "_sapo_fingerprint", None)
    if isinstance(cached, str):
        return cached
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None:
        spec = json.loads(backend.to_str())
        for key in ("padding", "truncation"):
            spec.pop(key, None)
    else:
        spec = {"vocab": tokenizer.get_vocab()}
    spec["special"] = sorted(getattr(tokenizer, "all_special_ids", []) or [])
    digest = hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:16]
    # A tokenizer that takes no new attributes is hashed each time.
    with contextlib.suppress(AttributeError):
        tokenizer._sapo_fingerprint = digest
    return digest


@dataclass(frozen=True)
class TokenizerFacts:
    """What judging a claim needs of this node's tokenizer."""

    fingerprint: str
    vocab_size: int
    special_ids: frozenset[int]
    stop_ids: frozenset[int]
    tokenizer: Any

    @classmethod
    def of(cls, tokenizer: Any, stop_ids: Sequence[int]) -> TokenizerFacts:
        return cls(
            tokenizer_fingerprint(tokenizer),
            len(tokenizer),
            frozenset(getattr(tokenizer, "all_special_ids", []) or []),
            frozenset(stop_ids),
            tokenizer,
        )


def judge_claim(
    rollout: Rollout, facts: TokenizerFacts, *, max_new_tokens: int, prefill: str = ""
) -> str:
    """``ACCEPTED``, or why the claim of ``rollout`` is not used.

    The ids must be this tokenizer's (fingerprint), as many as the log-probs and as the
    row's ``completion_tokens``, no more than ``max_new_tokens``; inside the vocabulary;
    no special token but a final stop; and they must decode to the completion the row
    publishes (less this node's prefill, which its prompt already ends with), so that the
    tokens trained are the text this node verified. Log-probs must be finite, <= 0 and
    above -1e4.
    """
    ids, logprobs = rollout.token_ids, rollout.claimed_logprobs
    if ids is None or logprobs is None or rollout.tokenizer is None:
        return NO_CLAIM
    if rollout.tokenizer != facts.fingerprint:
        return OTHER_TOKENIZER
    if len(ids) != len(logprobs) or len(ids) != rollout.completion_tokens or not ids:
        return LENGTH_MISMATCH
    if len(ids) > max_new_tokens:
        return TOO_LONG
    if not all(math.isfinite(x) and -MAX_LOGPROB_MAGNITUDE <= x <= 0.0 for x in logprobs):
        return INVALID_LOGPROB
    if not all(0 <= i < facts.vocab_size for i in ids):
        return OUTSIDE_VOCAB
    body = list(ids[:-1]) if ids[-1] in facts.stop_ids else list(ids)
    if any(i in facts.special_ids for i in body):
        return SPECIAL_TOKEN
    decoded = facts.tokenizer.decode(body, skip_special_tokens=False)
    return ACCEPTED if decoded == rollout.completion.removeprefix(prefill) else NOT_THE_TEXT
