"""One node's algorithm, without storage or orchestration: it owns the node's state.

A round is two calls, the same wherever it runs (the swarm's flow, examples/one_round.py,
the benchmarks): `Learner.generate` samples and scores the round's own groups, and, once
the caller has published them and drawn peers' groups, `Learner.train_round` judges the
peers' rows, updates the node's reputation of them, assembles I + J, takes the GRPO step
and adds the round's rewards to the totals. Its parts (`select`, `encode`, `update`) are
public for a reader who wants to see each.

Everything a resumed node needs is `Learner.state_dict()` beside the weights, restored by
`Learner.from_checkpoint` in one call (sapo_core/node_state.py says what it holds).
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import logging
import statistics
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from sapo_core.assembly import TrainingSet, assemble, choose_local
from sapo_core.claims import TokenizerFacts
from sapo_core.config import GenerationConfig, NodeConfig
from sapo_core.encoding import RowEncoder
from sapo_core.evaluation import TaskScore, heldout_questions, score_by_task
from sapo_core.grpo.optimizer import load_state, make_optimizer
from sapo_core.grpo.plan import UpdatePlan, plan_for
from sapo_core.grpo.segments import Segment
from sapo_core.grpo.update import UpdateResult, grpo_update, reference_logprobs
from sapo_core.node_state import RewardTotals, rng_state, set_rng_state
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
from sapo_core.prompts import PromptFormat, prompt_ids, resolve_format, stop_texts
from sapo_core.reputation import Reputation
from sapo_core.rewards import ScoredGroup, own_verdicts, scored_own
from sapo_core.rollouts import Group, Rollout, group_id_of, rollout_id_of
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
        self.totals = RewardTotals()
        self.reputation = Reputation.empty(config.reputation)
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
        cls,
        config: NodeConfig,
        model_dir: str | Path,
        state: Mapping[str, Any] | None = None,
        *,
        id_prefix: str = "",
    ) -> Learner:
        """The learner that saved a checkpoint: its model directory's weights and its
        `state_dict` (None: the weights alone, a fresh optimizer and state).

        The policy is the checkpoint's trained weights, still recorded as `config.model` in
        the ledger; with beta > 0 the KL reference is `config.model`'s initial weights, never
        the checkpoint's.
        """
        learner = cls._from_model_dir(config, model_dir, id_prefix)
        if state is not None:
            learner.load_state_dict(state)
        return learner

    @classmethod
    def _from_model_dir(cls, config: NodeConfig, model_dir: str | Path, id_prefix: str) -> Learner:
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
            group_id = group_id_of(self.id_prefix, cfg.node_id, round_, k)
            rollouts = [
                Rollout(
                    rollout_id=rollout_id_of(group_id, j),
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

    def close(self) -> None:
        """Stop what the backend started (vLLM's worker); the learner stays usable."""
        self.backend.close()

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

    @functools.cached_property
    def encoder(self) -> RowEncoder:
        """How this node turns scored groups into the update's segments
        (sapo_core/encoding.py)."""
        return RowEncoder(
            self.config,
            self.policy.tokenizer,
            self.policy.model_id,
            self.token_facts,
            self.prompt_ids,
            exact_own=self.policy.exact_behaviour and self.backend.exact_logprobs,
        )

    def encode(self, groups: Sequence[ScoredGroup]) -> tuple[list[Segment], Counter[str]]:
        """The groups as the update trains them, each encoded with this node's tokenizer
        and template, its advantages attached; and the completions left out, by reason
        (sapo_core/encoding.py)."""
        pairs, skipped, _ = self.encoder.encode(groups)
        return [seg for _, seg in pairs], skipped

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
        pairs, skipped, claims = self.encoder.encode(chosen.trained)
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
            self.backend.weights_changed()  # vLLM keeps its own copy of the weights
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

    def train_round(
        self, round_: int, generated: Generated, peers: Sequence[Group] = ()
    ) -> RoundReport:
        """The round after generation, as every caller runs it (the swarm's flow, the
        one-page example, the benchmarks): score I own groups and J peers' groups with this
        node's verifier, add what the peers' rows showed to its reputation of them,
        assemble I + J, take the GRPO update, and add the round's rewards to the totals.

        Each call counts its round once: a round retried after a stop starts from the state
        of the checkpoint it resumes (`load_state_dict`), which holds none of its verdicts."""
        began = time.perf_counter()
        chosen, flagged = self.select(round_, generated.groups, peers)
        self.reputation.update(chosen.peer_evidence)
        selected_s = time.perf_counter() - began
        report = self.update(round_, chosen, flagged)
        self.totals.add(own_reward=generated.own_reward, training_reward=report.training_reward)
        return dataclasses.replace(
            report,
            chosen=chosen,
            select_s=selected_s,
            peers_excluded=len(self.reputation.excluded()),
        )

    # -- state ------------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """Everything a resumed node needs besides its weights (a checkpoint keeps those as
        a model directory, servable as is): the optimizer's state, the RNG streams, the
        policy version, reward totals and reputation (sapo_core/node_state.py). Small
        values are copies; the optimizer's tensors are its own, unchanged until the next
        update."""
        return {
            "policy_version": self.policy_version,
            "totals": self.totals.as_metrics(),
            "reputation": self.reputation.to_json(),
            "optimizer": self.optimizer.state_dict(),
            "rng": rng_state(),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore what `state_dict` gave: the learner is then the one that saved it."""
        load_state(self.optimizer, state["optimizer"])
        set_rng_state(state["rng"])
        self.policy_version = int(state["policy_version"])
        self.totals = RewardTotals.from_state(dict(state.get("totals", {})))
        self.reputation = Reputation.from_json(state.get("reputation", {}), self.config.reputation)
