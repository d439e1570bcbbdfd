"""A finished round's figures: every metric by its MLflow name (``round_metrics``), and the
one line printed after each round (``describe``)."""

from __future__ import annotations

import time
from typing import Any

from flows.node.runtime import NodeRuntime
from flows.node.state import RoundState, require
from sapo_core.assembly import TrainingSet
from sapo_core.claims import CLAIM_OUTCOMES
from sapo_core.encoding import SKIP_REASONS
from sapo_core.grpo.offpolicy import Drift


def round_metrics(
    node: NodeRuntime, state: RoundState, *, now: float | None = None
) -> dict[str, float]:
    """Every figure of a finished round, by its MLflow name: rewards, training, timings.

    `seconds_<step>` for each step that ran and `seconds_orchestration` for the rest of
    the round's wall time so far (Prefect's task bookkeeping, the flow's own work)."""
    report = require(state.report, state, "metrics", "train")
    generated = require(state.generated, state, "metrics", "generate")
    metrics: dict[str, float] = {
        # The names of docs/running.md's "Rewards, by name". Own: the mean over everything the node
        # generated (and published, as its claim) this round: the policy's own accuracy.
        "own_reward": generated.own_reward,
        # Training: the mean over the training set (own and peers' groups kept for the
        # update), both scored by this node's verifier.
        "training_reward": report.training_reward,
        **node.learner.totals.as_metrics(),
        "zero_variance_fraction": report.zero_variance_fraction,
        "external_groups_used": float(report.external_groups_used),
        "groups_trained": float(report.groups_trained),
        "flagged_rows": float(report.flagged_rows),
        "generation_tokens_per_s": generated.tokens / max(generated.seconds, 1e-9),
        "policy_version": float(node.learner.policy_version),
        "ledger_unreachable": float(state.notes.ledger_down),
        "peers_excluded": float(report.peers_excluded),
        # The most of the update's loss weight any one peer held (bounded by the cut of
        # its groups to this node's group size: sapo_core.peers.within_group_size).
        "peer_loss_share_max": max(report.peer_loss_shares.values(), default=0.0),
        "peer_rows_dropped": float(state.notes.peer_rows_dropped),
        "backlog_files": float(len(node.backlog)),
    }
    # Completions of the training set left out, by reason (sapo_core.learner: a peer's
    # text longer than this node's limit in its own tokens, or empty); always logged.
    for reason in SKIP_REASONS:
        metrics[f"rows_skipped_{reason}"] = float(report.rows_skipped.get(reason, 0))
    # Peers' rows by what became of their generator's claim (sapo_core/claims.py).
    for outcome in CLAIM_OUTCOMES:
        metrics[f"claims_{outcome}"] = float(report.claims.get(outcome, 0))
    metrics.update(drift_metrics(report.peer_drift, node.learner.config.node_id))
    if report.training_reward_local is not None:
        metrics["training_reward_local"] = report.training_reward_local
    if report.training_reward_external is not None:
        metrics["training_reward_external"] = report.training_reward_external
    metrics.update(report.update)  # the update's figures, named where they are computed
    metrics.update(state.evaluation)
    for step, seconds in state.seconds.items():
        metrics[f"seconds_{step}"] = seconds
    wall = (time.perf_counter() if now is None else now) - state.started
    metrics["seconds_orchestration"] = max(wall - sum(state.seconds.values()), 0.0)
    return metrics


def drift_metrics(by_publisher: dict[str, Drift], own_id: str) -> dict[str, float]:
    """How far the generators of the rows trained were from this policy before the step
    (sapo_core/grpo/offpolicy.py): over all peers (``offpolicy_*_external``), over the
    node's own rows (``offpolicy_*_local``: generation against the trainer), and per peer
    (``peer_kl/<peer>``, ``peer_ess/<peer>``). Absent where no row carried a claim."""
    out: dict[str, float] = {}
    peers = {p: d for p, d in by_publisher.items() if p != own_id and d.tokens}
    parts = {"external": sum(peers.values(), Drift()), "local": by_publisher.get(own_id)}
    for side, drift in parts.items():
        if drift is not None and drift.tokens:
            out[f"offpolicy_kl_{side}"] = drift.kl
            out[f"offpolicy_ess_{side}"] = drift.ess_fraction
            out[f"offpolicy_capped_{side}"] = drift.capped_fraction
    for peer, drift in peers.items():
        out[f"peer_kl/{peer}"] = drift.kl
        out[f"peer_ess/{peer}"] = drift.ess_fraction
    return out


SAMPLE_GROUPS = 2
"""Groups of each origin (own, peers') a round's table of sample completions shows."""
SAMPLE_TEXT = 2000
"""Characters of a question or completion the table keeps (a peer's may be long)."""


def sample_completions(chosen: TrainingSet, round_: int) -> list[dict[str, Any]]:
    """A small table of what the node trained on this round, for MLflow's UI (what the model
    writes, not only scalars): the first SAMPLE_GROUPS own groups and peers' groups of the
    training set, one row per completion, with this node's reward for it."""
    rows = []
    for origin in ("local", "external"):
        groups = [g for g in chosen.selected if g.group.source == origin][:SAMPLE_GROUPS]
        for scored in groups:
            for rollout, reward in zip(scored.rollouts, scored.rewards, strict=True):
                rows.append(
                    {
                        "round": round_,
                        "origin": "own" if origin == "local" else "peer",
                        "publisher": rollout.node_id,
                        "task": rollout.question.task,
                        "question": rollout.question.question[:SAMPLE_TEXT],
                        "completion": rollout.completion[:SAMPLE_TEXT],
                        "reward": reward,
                        "trained": chosen.is_trained(scored),  # carried a gradient
                    }
                )
    return rows


def describe(metrics: dict[str, Any], node_id: str, round_: int) -> str:
    """The one-line summary printed after each round."""

    def share(name: str) -> str:
        value = metrics.get(name)
        return "-" if value is None else f"{value:.3f}"

    return (
        f"{node_id} round {round_}: own_reward {metrics['own_reward']:.3f} "
        f"(cumulative {metrics['cumulative_own_reward']:.2f}), "
        f"training_reward {metrics['training_reward']:.3f} "
        f"(local {share('training_reward_local')}, external {share('training_reward_external')}, "
        f"{plural(int(metrics['external_groups_used']), 'peer group')}), "
        f"{sum(v for k, v in metrics.items() if k.startswith('seconds_')):.1f}s"
    )


def is_round_summary(line: str, node_id: str) -> bool:
    """Whether ``line`` is ``node_id``'s summary of a round (`describe`'s line)."""
    return line.startswith(f"{node_id} round ") and ": own_reward " in line


def plural(count: int, noun: str) -> str:
    return f"{count} {noun}{'' if count == 1 else 's'}"
