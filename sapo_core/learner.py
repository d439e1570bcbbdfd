"""One node's algorithm for a round, without storage or orchestration.

A round after generation is two calls, the same wherever it runs: `Learner.select` scores
the node's I own groups (the verdicts `Learner.generate` gave them) and its J peers' groups
(verified here) and assembles the training set; `Learner.update` computes the advantages
and takes the GRPO step. Flows call them as two steps (flows/node/steps.py: `reward`,
`update`), with the ledger's I/O around them; `Learner.train` is the two back to back, for
callers with nothing in between (examples/one_round.py, benchmarks).
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import logging
import statistics
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from sapo_core.assembly import TrainingSet, assemble, choose_local
from sapo_core.claims import ACCEPTED, TokenizerFacts, judge_claim
from sapo_core.config import GenerationConfig, NodeConfig
from sapo_core.evaluation import TaskScore, heldout_questions, score_by_task
from sapo_core.grpo.advantages import dense_group_ids, group_advantages
from sapo_core.grpo.optimizer import make_optimizer
from sapo_core.grpo.plan import UpdatePlan, plan_for
from sapo_core.grpo.segments import Segment
from sapo_core.grpo.update import UpdateResult, grpo_update, reference_logprobs
from sapo_core.peers import judge_peers, judged_tasks
from sapo_core.policy import adapter
from sapo_core.policy.backend import GenerationBackend, ProgressCallback
from sapo_core.policy.loading import (
    ModelSource,
    Policy,
    load_model,
    load_policy,
    resolve_model,
)
from sapo_core.prompts import PromptFormat, prompt_ids, resolve_format, stop_texts, text_ids
from sapo_core.rewards import ScoredGroup, own_verdicts, scored_own
from sapo_core.rollouts import Group, Rollout
from sapo_core.round_report import RoundReport, by_publisher, loss_shares, peer_shares
from sapo_core.tasks import Question, TaskSource

log = logging.getLogger(__name__)


def make_backend(
    generation: GenerationConfig, policy: Policy, stop_texts: tuple[str, ...] = ()
) -> GenerationBackend:
    """The generation backend a config names; `stop_texts` end a completion besides the
    tokenizer's stop ids (the plain prompt format's closing tag)."""
    if generation.backend == "vllm":
        from sapo_core.policy.vllm_backend import VLLMBackend

        return VLLMBackend(policy, generation, stop_texts=stop_texts)
    from sapo_core.policy.hf_backend import TransformersBackend

    return TransformersBackend(policy, stop_texts=stop_texts)


@dataclass
class Generated:
    """The round's own groups and what making them cost."""

    groups: list[Group]
    seconds: float
    tokens: int

    @property
    def own_reward(self) -> float:
        """Mean reward over every completion made (this node's verifier, and what it
        publishes as its claim): the policy's own accuracy."""
        rewards = [r.reward for g in self.groups for r in g.rollouts if r.reward is not None]
        return _mean(rewards) or 0.0


TOO_LONG = "too_long"
"""A completion longer, in this node's tokens, than its own max_new_tokens."""
EMPTY = "empty"


def _unusable(completion: Sequence[int], limit: int) -> str | None:
    """Why a completion's tokens cannot be trained on, or None."""
    if not completion:
        return EMPTY
    return TOO_LONG if len(completion) > limit else None


def round_seed(node_seed: int, round_: int) -> int:
    """A node's seed for one round (its sampling, and its draw of peers' groups): replayable,
    different per node and round."""
    return node_seed * 1_000_003 + round_


def _mean(values: Sequence[float]) -> float | None:
    return statistics.fmean(values) if values else None


class Learner:
    """A node's policy, optimizer and question stream.

    With grpo.beta > 0 the KL term anchors the policy to its initial weights, those
    `config.model` names, for the whole run, resumes included: `reference` when given,
    else a copy of the policy when the learner loads `config.model` itself, else
    `config.model` loaded afresh. A caller that passes its own policy (a checkpoint's
    weights, say) thus never makes it the reference unless it passes it as `reference`.
    """

    def __init__(
        self,
        config: NodeConfig,
        policy: Policy | None = None,
        backend: GenerationBackend | None = None,
        id_prefix: str = "",
        *,
        reference: Any | None = None,
        model_source: ModelSource | None = None,
    ) -> None:
        self.config = config
        # Ids must be unique wherever groups meet: a swarm prefixes its id, so two swarms
        # (a sweep's configurations) can share one ledger with the same node names.
        self.id_prefix = id_prefix
        torch.manual_seed(config.seed)
        lora = config.grpo.adapter
        # The configured model, resolved once (by the caller, where it loaded the policy from
        # it): its weights, tokenizer and prompt format.
        self.model_source = model_source or resolve_model(config.model)
        self.policy = policy or load_policy(self.model_source, compute=config.compute, adapter=lora)
        if lora.enabled and not adapter.is_adapted(self.policy.model):
            # Attached after the seed, so a fresh adapter's A matrices are replayable.
            self.policy.model = adapter.attach(self.policy.model, lora)
        self.prompt_format: PromptFormat = resolve_format(
            config.prompt, self.policy.tokenizer, self.model_source.prompt_format
        )
        self.backend = backend or make_backend(
            config.generation, self.policy, stop_texts(self.prompt_format)
        )
        self.optimizer = make_optimizer(self.policy.model, config.grpo)
        self.policy_version = 0
        self.ref_model: Any = None
        # With an adapter the reference is the base itself, the adapter switched off.
        if config.grpo.beta > 0 and not lora.enabled:
            if reference is None:
                initial = policy is None  # then self.policy is config.model's weights
                reference = (
                    copy.deepcopy(self.policy.model)
                    if initial
                    else load_model(self.model_source).to(self.policy.device)
                )
            self.ref_model = reference.eval().requires_grad_(False)
        self.tasks = TaskSource(config.tasks, config.seed)

    @classmethod
    def from_checkpoint(
        cls, config: NodeConfig, model_dir: str | Path, *, id_prefix: str = ""
    ) -> Learner:
        """A learner that resumes from a checkpoint's model directory.

        The policy is the checkpoint's trained weights, still recorded as `config.model` in
        the ledger; with beta > 0 the KL reference is `config.model`'s initial weights, never
        the checkpoint's. Optimizer state, RNG and policy_version are the caller's to restore.
        """
        source = resolve_model(config.model)
        if config.grpo.adapter.enabled:
            # The checkpoint holds the adapter alone: the base is config.model's, as before.
            loaded = load_policy(source, compute=config.compute, adapter=config.grpo.adapter)
            loaded.model = adapter.load(loaded.model, str(model_dir))
            return cls(config, loaded, id_prefix=id_prefix, model_source=source)
        loaded = load_policy(str(model_dir), compute=config.compute)
        policy = dataclasses.replace(loaded, model_id=config.model)
        # The reference (beta > 0): config.model's initial weights, from the same source.
        return cls(config, policy, id_prefix=id_prefix, model_source=source)

    # -- generate ---------------------------------------------------------------------------

    def prompt_ids(self, question: Question) -> list[int]:
        """The question's prompt as generation and the update see it: the question's text
        (a peer's as much as our own) encoded as text, the template's tokens as tokens."""
        return prompt_ids(
            self.policy.tokenizer, question.question, self.config.prompt, self.prompt_format
        )

    def generate(self, round_: int, on_progress: ProgressCallback | None = None) -> Generated:
        """Sample L completions for each of the round's questions; score them locally."""
        cfg = self.config
        started = time.perf_counter()
        questions = self.tasks.draw(round_, cfg.questions)
        prompts = [self.prompt_ids(q) for q in questions]
        seed = round_seed(cfg.seed, round_)
        sampled = self.backend.generate(prompts, cfg.generation, seed, on_progress)
        groups = []
        for k, (question, completions) in enumerate(zip(questions, sampled, strict=True)):
            group_id = f"{self.id_prefix}{cfg.node_id}.r{round_}.q{k}"
            rollouts = [
                Rollout(
                    rollout_id=f"{group_id}.c{j}",
                    group_id=group_id,
                    node_id=cfg.node_id,
                    model_id=self.policy.model_id,
                    node_round=round_,
                    policy_version=self.policy_version,
                    question=question,
                    completion=cfg.prompt.prefill + c.text,
                    completion_tokens=len(c.token_ids),
                    token_ids=c.token_ids,
                    logprobs=c.logprobs,
                    claimed_logprobs=c.sampler_logprobs,
                    tokenizer=self.token_facts.fingerprint,
                )
                for j, c in enumerate(completions)
            ]
            # This node's verdicts, once: what it trains on, and what it publishes as its
            # claim (peers never trust it; they verify for themselves).
            verdicts = own_verdicts(rollouts, cfg.reward)
            scored = (
                dataclasses.replace(r, reward=v.reward)
                for r, v in zip(rollouts, verdicts, strict=True)
            )
            groups.append(Group(group_id, "local", tuple(scored)))
        tokens = sum(len(c.token_ids) for cs in sampled for c in cs)
        return Generated(groups, time.perf_counter() - started, tokens)

    @functools.cached_property
    def token_facts(self) -> TokenizerFacts:
        """This node's tokenizer as claims are judged against it (sapo_core/claims.py)."""
        from sapo_core.policy.hf_backend import stop_token_ids

        tokenizer = self.policy.tokenizer
        return TokenizerFacts.of(tokenizer, stop_token_ids(tokenizer, self.policy.model))

    def _weights_changed(self) -> None:
        """Tell a backend that keeps its own copy of the weights (vLLM) that they moved."""
        changed = getattr(self.backend, "weights_changed", None)
        if changed is not None:
            changed()

    def close(self) -> None:
        """Stop what the backend started (vLLM's worker); the learner stays usable."""
        close = getattr(self.backend, "close", None)
        if close is not None:
            close()

    def evaluate(self) -> list[TaskScore]:
        """Score the current policy on the held-out set (same questions and seed each time)."""
        cfg = self.config
        questions = heldout_questions(cfg.evaluation, cfg.tasks)
        prompts = [self.prompt_ids(q) for q in questions]
        # completions_per_question >= 2 holds for training groups only; one answer per
        # question is a valid evaluation, so the copy skips validation on purpose.
        sampling = cfg.generation.model_copy(
            update={"completions_per_question": cfg.evaluation.completions}
        )
        sampled = self.backend.generate(prompts, sampling, cfg.evaluation.seed)
        texts = [[cfg.prompt.prefill + c.text for c in cs] for cs in sampled]
        return score_by_task(questions, texts, cfg.reward)

    # -- train ------------------------------------------------------------------------------

    @property
    def judged_tasks(self) -> list[str]:
        """The tasks whose peer groups this node's verifier judges (sapo_core.peers)."""
        return judged_tasks(self.config)

    def select(
        self, round_: int, local: Sequence[Group], external: Sequence[Group]
    ) -> tuple[TrainingSet, int]:
        """Score I own and J peers' groups with this node's verifier and merge them."""
        cfg = self.config
        seed = f"{cfg.seed}/{round_}/local"
        first = cfg.local_selection == "informative_first"
        own = choose_local(local, cfg.local_groups, seed, informative_first=first)  # I
        scored, flagged_own = scored_own(own)  # the verdicts `generate` gave them
        peers = judge_peers(external, cfg, round_)  # J, verified here
        chosen = assemble(scored, peers.scored, drop_zero_variance=cfg.grpo.drop_zero_variance)
        chosen = dataclasses.replace(chosen, peer_evidence=peers.evidence)
        return chosen, len(flagged_own) + len(peers.problems)

    def encode(self, groups: Sequence[ScoredGroup]) -> tuple[list[Segment], Counter[str]]:
        """The groups as the update trains them, each re-encoded with this node's tokenizer
        and template, its advantages attached; and the peers' completions left out, by
        reason: one that this node's
        tokenizer makes longer than its own `max_new_tokens`, or empty, is skipped (cut, it
        would train on text without the answer its reward was for)."""
        pairs, skipped, _ = self._encode_groups(groups)
        return [seg for _, seg in pairs], skipped

    def _encode_groups(
        self, groups: Sequence[ScoredGroup]
    ) -> tuple[list[tuple[ScoredGroup, Segment]], Counter[str], Counter[str]]:
        """Each group with at least one row trained, beside its segment; the rows skipped;
        what became of peers' rows' claims."""
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
                completion, behaviour, sampler, outcome = self._completion_tokens(rollout)
                reason = _unusable(completion, cfg.generation.max_new_tokens)
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

    def _completion_tokens(
        self, rollout: Rollout
    ) -> tuple[list[int], list[float] | None, list[float] | None, str | None]:
        """(the tokens trained, their behaviour log-probs, the generator's, what became of
        a peer's claim (None for own rows)).

        Own rows keep their sampled tokens and log-probs. A peer's row whose claim holds
        (sapo_core/claims.py) trains on its generator's ids under a correction; otherwise
        its text is re-encoded as text (a `<|im_end|>` in it is its characters' tokens,
        never the end of a turn), and carries the generator's log-probs for the drift
        figures only where the re-encoding gives the claimed ids.
        """
        cfg = self.config
        own = rollout.node_id == cfg.node_id and rollout.model_id == self.policy.model_id
        if own and rollout.token_ids is not None and rollout.logprobs is not None:
            # Under reduced precision generation's log-probs are not the training forward's:
            # the update recomputes them (as it does for peers' rows), so the ratio starts at 1.
            exact = self.policy.exact_behaviour and getattr(self.backend, "exact_logprobs", True)
            claimed = rollout.claimed_logprobs or rollout.logprobs
            behaviour = list(rollout.logprobs) if exact else None
            return list(rollout.token_ids), behaviour, list(claimed), None
        facts = self.token_facts
        prefill = cfg.prompt.prefill
        outcome = judge_claim(
            rollout, facts, max_new_tokens=cfg.generation.max_new_tokens, prefill=prefill
        )
        claim_ids, claimed = rollout.token_ids or (), rollout.claimed_logprobs or ()
        accepted = outcome == ACCEPTED
        if accepted and cfg.grpo.off_policy.enabled:
            return list(claim_ids), None, list(claimed), outcome
        # Less our prefill: our prompt already ends with it.
        ids = text_ids(self.policy.tokenizer, rollout.completion.removeprefix(prefill))
        sampler = None
        if accepted and list(claim_ids[: len(ids)]) == ids:
            sampler = list(claimed[: len(ids)])
        return ids, None, sampler, outcome

    def _reference_logprobs(
        self,
        segments: list[Segment],
        temperature: float,
        pad_id: int,
        plan: UpdatePlan | None = None,
    ) -> None:
        """Each segment's log-probs under the KL reference: the initial weights, or with an
        adapter the base with the adapter off; in ``plan``'s passes (default: planned here)."""
        # The passes of the update's plan: a pass without gradients holds less than one with.
        plan = plan or plan_for(self.policy.model, self.config.grpo, self.optimizer)
        if self.ref_model is not None:
            reference_logprobs(self.ref_model, segments, temperature, pad_id, plan)
            return
        model = self.policy.model
        training = model.training
        with adapter.base_only(model):
            model.eval()  # no adapter dropout; nothing else differs
            reference_logprobs(model, segments, temperature, pad_id, plan)
        model.train(training)

    def update(self, round_: int, chosen: TrainingSet, flagged: int = 0) -> RoundReport:
        """Take the GRPO step on an assembled training set; returns the round's figures."""
        cfg = self.config
        pairs, skipped, claims = self._encode_groups(chosen.trained)
        segments = [seg for _, seg in pairs]
        shares = loss_shares(pairs, cfg.grpo.loss_type)
        pad_id = int(self.policy.tokenizer.pad_token_id)
        temperature = cfg.generation.temperature
        with self.policy.precision():
            # Planned once, under the precision in force, for the reference pass and the update.
            plan = plan_for(self.policy.model, cfg.grpo, self.optimizer) if segments else None
            if cfg.grpo.beta > 0 and segments:
                self._reference_logprobs(segments, temperature, pad_id, plan)
            result = (
                grpo_update(
                    self.policy.model,
                    self.optimizer,
                    segments,
                    cfg.grpo,
                    temperature=temperature,
                    pad_id=pad_id,
                    max_completion_length=cfg.generation.max_new_tokens,
                    plan=plan,
                )
                if segments
                else UpdateResult({}, 0.0, 0)
            )
        if segments:
            self.policy_version += cfg.grpo.iterations
            self._weights_changed()
        return RoundReport(
            round=round_,
            training_reward=_mean(chosen.rewards()) or 0.0,
            training_reward_local=_mean(chosen.rewards("local")),
            training_reward_external=_mean(chosen.rewards("external")),
            zero_variance_fraction=chosen.zero_variance_fraction,
            external_groups_used=chosen.external_used,
            groups_trained=len(segments),
            flagged_rows=flagged,
            update_s=result.seconds,
            update=result.metrics,
            rows_skipped=dict(skipped),
            loss_shares=shares,
            peer_loss_shares=peer_shares(pairs, shares),
            claims=dict(claims),
            drift=result.drift,
            peer_drift=by_publisher(pairs, result.drift),
        )

    def train(
        self, round_: int, local: Sequence[Group], external: Sequence[Group] = ()
    ) -> RoundReport:
        """Score, assemble I + J and take the GRPO update."""
        chosen, flagged = self.select(round_, local, external)
        return self.update(round_, chosen, flagged)
