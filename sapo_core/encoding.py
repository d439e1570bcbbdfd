"""The training set as the update sees it: each group's rows as token ids of this node's
tokenizer, with their advantages and, where known, the log-probs they were sampled with.

Own rows keep the tokens they were sampled as. A peer's row whose claim holds
(sapo_core/claims.py) trains on its generator's ids under the off-policy correction;
otherwise its text is re-encoded as text, as the paper does. A row that cannot be trained
(empty, or longer in this node's tokens than its own ``max_new_tokens``) is skipped and
counted by reason.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from sapo_core.claims import ACCEPTED, TokenizerFacts, judge_claim
from sapo_core.config import NodeConfig
from sapo_core.grpo.advantages import dense_group_ids, group_advantages
from sapo_core.grpo.segments import Segment
from sapo_core.prompts import text_ids
from sapo_core.rewards import ScoredGroup
from sapo_core.rollouts import Rollout
from sapo_core.tasks import Question

TOO_LONG = "too_long"
"""A completion longer, in this node's tokens, than its own max_new_tokens."""
EMPTY = "empty"
SKIP_REASONS = (TOO_LONG, EMPTY)

Encoded = tuple[list[tuple[ScoredGroup, Segment]], Counter[str], Counter[str]]
"""Each group with at least one row trained, beside its segment; the rows skipped, by
reason; what became of the claims of rows this process did not sample, by outcome."""


def unusable(completion: Sequence[int], limit: int) -> str | None:
    """Why a completion's tokens cannot be trained on, or None."""
    if not completion:
        return EMPTY
    return TOO_LONG if len(completion) > limit else None


@dataclass(frozen=True)
class RowEncoder:
    """How one node turns scored groups into the update's segments."""

    config: NodeConfig
    tokenizer: Any
    model_id: str
    facts: TokenizerFacts
    prompt_ids: Callable[[Question], list[int]]
    exact_own: bool = True
    """Whether own rows' generation log-probs are the training forward's (fp32, no vLLM):
    then they are the update's old log-probs; otherwise the update recomputes them."""

    def encode(self, groups: Sequence[ScoredGroup]) -> Encoded:
        cfg = self.config
        rewards = torch.tensor([r for g in groups for r in g.rewards])
        ids = dense_group_ids([g.group.group_id for g in groups for _ in g.rewards])
        advantages = group_advantages(rewards, ids, cfg.grpo.scale_rewards).tolist()
        out, i = [], 0
        skipped: Counter[str] = Counter()
        claims: Counter[str] = Counter()
        for g in groups:
            seg = Segment(self.prompt_ids(g.group.question), [], [], [], label=g.group.group_id)
            for rollout in g.rollouts:
                completion, behaviour, sampler, outcome = self.completion_tokens(rollout)
                reason = unusable(completion, cfg.generation.max_new_tokens)
                if reason is None:
                    seg.completion_ids.append(completion)
                    seg.behaviour_logprobs.append(behaviour)
                    seg.sampler_logprobs.append(sampler)
                    seg.advantages.append(advantages[i])
                    if outcome is not None:
                        claims[outcome] += 1
                else:
                    skipped[reason] += 1
                i += 1
            if len(seg):
                out.append((g, seg))
        return out, skipped, claims

    def completion_tokens(
        self, rollout: Rollout
    ) -> tuple[list[int], list[float] | None, list[float] | None, str | None]:
        """(the tokens trained, their behaviour log-probs, the generator's, what became of
        a peer's claim (None for own rows)).

        A peer's row whose claim is not used is re-encoded as text (a `<|im_end|>` in it
        is its characters' tokens, never the end of a turn), and carries the generator's
        log-probs for the drift figures only where the re-encoding gives the claimed ids.
        """
        cfg = self.config
        own = rollout.node_id == cfg.node_id and rollout.model_id == self.model_id
        if own and rollout.token_ids is not None and rollout.logprobs is not None:
            # Under reduced precision generation's log-probs are not the training forward's:
            # the update recomputes them (as it does for peers' rows), so the ratio starts at 1.
            claimed = rollout.claimed_logprobs or rollout.logprobs
            behaviour = list(rollout.logprobs) if self.exact_own else None
            return list(rollout.token_ids), behaviour, list(claimed), None
        prefill = cfg.prompt.prefill
        outcome = judge_claim(
            rollout, self.facts, max_new_tokens=cfg.generation.max_new_tokens, prefill=prefill
        )
        claim_ids, claimed = rollout.token_ids or (), rollout.claimed_logprobs or ()
        accepted = outcome == ACCEPTED
        if accepted and cfg.grpo.off_policy.enabled:
            return list(claim_ids), None, list(claimed), outcome
        # Less our prefill: our prompt already ends with it.
        ids = text_ids(self.tokenizer, rollout.completion.removeprefix(prefill))
        sampler = None
        if accepted and list(claim_ids[: len(ids)]) == ids:
            sampler = list(claimed[: len(ids)])
        return ids, None, sampler, outcome
