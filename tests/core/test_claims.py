"""A peer's claim about how it sampled a row (sapo_core/claims.py): honest claims are used,
hostile ones are dropped with a counted reason and the row trains on its text."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from sapo_core.claims import (
    ACCEPTED,
    INVALID_LOGPROB,
    LENGTH_MISMATCH,
    NO_CLAIM,
    NOT_THE_TEXT,
    OTHER_TOKENIZER,
    OUTSIDE_VOCAB,
    SPECIAL_TOKEN,
    TOO_LONG,
    judge_claim,
    tokenizer_fingerprint,
)
from sapo_core.config import GenerationConfig, GRPOConfig, NodeConfig, OffPolicyConfig
from sapo_core.learner import Learner
from sapo_core.prompts import text_ids
from sapo_core.rollouts import Group, Rollout
from tests.core.test_peer_text import TASKS, _rollout

TEXT = "3 + 4 = 7, so <answer>7</answer>"


def _node(tiny_model_dir: Any, correction: str = "token_truncate") -> NodeConfig:
    return NodeConfig(
        node_id="me",
        model=str(tiny_model_dir),
        tasks=TASKS,
        generation=GenerationConfig(completions_per_question=2, max_new_tokens=64),
        grpo=GRPOConfig(
            drop_zero_variance=False, off_policy=OffPolicyConfig(correction=correction)
        ),
        local_groups=1,
        external_groups=1,
    )


def _claimed(me: Learner, k: int, text: str = TEXT, **changes: Any) -> Rollout:
    """A peer's row of ``text`` with an honest claim (its ids, a stop, log-probs), changed."""
    ids = (*text_ids(me.policy.tokenizer, text), *sorted(me.token_facts.stop_ids)[:1])
    row = _rollout(
        me,
        "peer",
        k,
        text,
        token_ids=ids,
        claimed_logprobs=tuple(-0.25 - 0.01 * i for i in range(len(ids))),
        tokenizer=me.token_facts.fingerprint,
    )
    return dataclasses.replace(row, completion_tokens=len(ids), **changes)


@pytest.fixture(scope="module")
def me(tiny_model_dir: Any, tiny_policy: Any) -> Learner:
    return Learner(_node(tiny_model_dir), tiny_policy)


def _judge(me: Learner, row: Rollout) -> str:
    return judge_claim(row, me.token_facts, max_new_tokens=me.config.generation.max_new_tokens)


def test_an_honest_claim_is_accepted_and_the_fingerprint_is_stable(me: Learner) -> None:
    assert _judge(me, _claimed(me, 0)) == ACCEPTED
    fingerprint = me.token_facts.fingerprint
    assert len(fingerprint) == 16 and int(fingerprint, 16) >= 0
    import copy

    assert tokenizer_fingerprint(copy.deepcopy(me.policy.tokenizer)) == fingerprint


def _hostile(me: Learner) -> dict[str, Rollout]:
    honest = _claimed(me, 0)
    ids, n = honest.token_ids or (), honest.completion_tokens
    special = sorted(me.token_facts.special_ids - me.token_facts.stop_ids)
    return {
        "no claim": dataclasses.replace(honest, token_ids=None, claimed_logprobs=None),
        "another tokenizer": dataclasses.replace(honest, tokenizer="f" * 16),
        "fewer log-probs": dataclasses.replace(
            honest, claimed_logprobs=(honest.claimed_logprobs or ())[:-1]
        ),
        "completion_tokens unlike the ids": dataclasses.replace(honest, completion_tokens=n + 1),
        "longer than max_new_tokens": _claimed(me, 1, TEXT * 20),
        "a positive log-prob": dataclasses.replace(honest, claimed_logprobs=(0.5,) * n),
        "a NaN log-prob": dataclasses.replace(
            honest, claimed_logprobs=(float("nan"),) + (-1.0,) * (n - 1)
        ),
        "an infinite log-prob": dataclasses.replace(honest, claimed_logprobs=(-float("inf"),) * n),
        "an id outside the vocabulary": dataclasses.replace(
            honest, token_ids=(len(me.policy.tokenizer) + 5, *ids[1:])
        ),
        "a negative id": dataclasses.replace(honest, token_ids=(-1, *ids[1:])),
        "a special token inside": dataclasses.replace(
            honest, token_ids=(*ids[:2], special[0], *ids[3:])
        )
        if special
        else dataclasses.replace(honest, token_ids=(*ids[:2], ids[-1], *ids[3:])),
        "ids of another text": dataclasses.replace(honest, token_ids=(ids[1], ids[0], *ids[2:])),
    }


EXPECTED = {
    "no claim": NO_CLAIM,
    "another tokenizer": OTHER_TOKENIZER,
    "fewer log-probs": LENGTH_MISMATCH,
    "completion_tokens unlike the ids": LENGTH_MISMATCH,
    "longer than max_new_tokens": TOO_LONG,
    "a positive log-prob": INVALID_LOGPROB,
    "a NaN log-prob": INVALID_LOGPROB,
    "an infinite log-prob": INVALID_LOGPROB,
    "an id outside the vocabulary": OUTSIDE_VOCAB,
    "a negative id": OUTSIDE_VOCAB,
    "a special token inside": SPECIAL_TOKEN,
    "ids of another text": NOT_THE_TEXT,
}


@pytest.mark.parametrize("case", list(EXPECTED))
def test_a_hostile_claim_is_rejected_with_its_reason(me: Learner, case: str) -> None:
    assert _judge(me, _hostile(me)[case]) == EXPECTED[case]


def test_minus_100_on_every_token_is_a_claim_the_cap_bounds_not_a_rejection(me: Learner) -> None:
    honest = _claimed(me, 0)
    lying = dataclasses.replace(honest, claimed_logprobs=(-100.0,) * honest.completion_tokens)
    assert _judge(me, lying) == ACCEPTED  # tests/core/test_offpolicy.py: weight <= cap


def test_a_corrected_learner_trains_an_accepted_claim_on_its_ids_and_counts_the_rest(
    me: Learner,
) -> None:
    honest = _claimed(me, 0)
    forged = _hostile(me)["ids of another text"]
    forged = dataclasses.replace(forged, rollout_id="peer.r0.q0.c1", completion=TEXT + " ")
    chosen, _ = me.select(0, [], [Group("peer.r0.q0", "external", (honest, forged))])
    pairs, skipped, claims = me.encoder.encode(chosen.trained)
    [(_, segment)] = pairs
    assert claims == {ACCEPTED: 1, NOT_THE_TEXT: 1} and not skipped
    # the accepted row: the generator's ids, stop token included, and its log-probs
    assert tuple(segment.completion_ids[0]) == honest.token_ids
    assert segment.sampler_logprobs[0] == pytest.approx(list(honest.claimed_logprobs or ()))
    # the rejected one: its text re-encoded as text, no claim carried
    assert segment.completion_ids[1] == text_ids(me.policy.tokenizer, TEXT + " ")
    assert segment.sampler_logprobs[1] is None
    report = me.update(0, chosen)
    assert report.claims == {ACCEPTED: 1, NOT_THE_TEXT: 1}
    drift = report.peer_drift["peer"]
    assert drift.tokens == honest.completion_tokens and drift.kl != 0.0
    assert report.drift["peer.r0.q0"] == drift


def test_without_a_correction_a_peers_text_is_re_encoded_as_the_paper_does(
    tiny_model_dir: Any, tiny_policy: Any
) -> None:
    paper = Learner(_node(tiny_model_dir, correction="none"), tiny_policy)
    honest, other = _claimed(paper, 0), _claimed(paper, 1, "<answer>8</answer>")
    chosen, _ = paper.select(0, [], [Group("peer.r0.q0", "external", (honest, other))])
    [(_, segment)], _, claims = paper.encoder.encode(chosen.trained)
    ids = text_ids(paper.policy.tokenizer, TEXT)
    assert segment.completion_ids[0] == ids and claims == {ACCEPTED: 2}
    # the claim still measures drift over the tokens the text re-encodes to
    assert segment.sampler_logprobs[0] == pytest.approx(
        list(honest.claimed_logprobs or ())[: len(ids)]
    )


def test_a_claim_that_is_not_whole_is_published_as_none_so_the_row_survives(me: Learner) -> None:
    honest = _claimed(me, 0)
    assert honest.to_record()["token_ids"] == list(honest.token_ids or ())
    for broken in (
        dataclasses.replace(honest, tokenizer=None),
        dataclasses.replace(honest, claimed_logprobs=(honest.claimed_logprobs or ())[:-1]),
        dataclasses.replace(honest, claimed_logprobs=(float("nan"),) * honest.completion_tokens),
    ):
        record = broken.to_record()
        assert (record["token_ids"], record["token_logprobs"], record["tokenizer"]) == (None,) * 3
        assert record["completion"] == TEXT
