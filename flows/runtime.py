"""One node's runtime and the plain functions behind each step of its round.

A round: generate -> publish -> sample -> reward -> update (then track and checkpoint).
The Prefect flow in flows/round.py calls these one per task; they are tested without
Prefect. State that is too large to pass between tasks (the model, the round's groups)
stays here, in the node's process; tasks pass round numbers, keys and group ids.
"""

from __future__ import annotations

import functools
import logging
import os
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from flows import checkpoint
from flows.config import SwarmConfig
from flows.progress import NodeProgress
from flows.tracking import Tracker, flatten, sharing_tags
from ledger import Ledger
from sapo_core.assembly import TrainingSet
from sapo_core.learner import Generated, Learner, RoundReport
from sapo_core.rollouts import Group, Rollout, group_rollouts

log = logging.getLogger(__name__)
R = TypeVar("R")


def step(name: str) -> Callable[[Callable[..., R]], Callable[..., R]]:
    """A step of the round: reported to the progress display and timed into the round."""

    def wrap(method: Callable[..., R]) -> Callable[..., R]:
        @functools.wraps(method)
        def timed(self: NodeRuntime, round_: int) -> R:
            self.progress.emit("step", round=round_, step=name)
            started = time.perf_counter()
            result = method(self, round_)
            self.state(round_).seconds[name] = time.perf_counter() - started
            return result

        return timed

    return wrap


@dataclass
class RoundState:
    """What one round carries from step to step inside the node's process."""

    generated: Generated | None = None
    external: list[Group] = field(default_factory=list)
    chosen: TrainingSet | None = None
    flagged: int = 0
    report: RoundReport | None = None
    seconds: dict[str, float] = field(default_factory=dict)


class NodeRuntime:
    """A node of a swarm: its learner, the ledger, its MLflow run and its checkpoints."""

    def __init__(
        self,
        swarm: SwarmConfig,
        node_id: str,
        *,
        parent_run_id: str | None = None,
        progress: NodeProgress | None = None,
    ) -> None:
        started = time.perf_counter()
        self.progress = progress or NodeProgress(node_id, None)
        self.swarm = swarm
        self.spec = swarm.node_spec(node_id)
        self.config = self.spec.node
        self.workdir = swarm.workdir_path()
        saved = checkpoint.latest(self.workdir, node_id)
        policy = None
        if saved is not None:
            from sapo_core.policy.loading import Policy, load_policy

            loaded = load_policy(str(saved.path))
            policy = Policy(loaded.model, loaded.tokenizer, model_id=self.config.model)
        self.learner = Learner(self.config, policy=policy, id_prefix=f"{swarm.swarm_id}.")
        self.next_round = 0
        self.cumulative_reward = 0.0
        if saved is not None:
            checkpoint.restore_into(self.learner, saved)
            self.next_round = saved.next_round
            self.cumulative_reward = saved.cumulative_reward
            log.info("%s resumes at round %d from %s", node_id, self.next_round, saved.path)
        self.ledger = Ledger.from_config(swarm.ledger_config())
        self.tracker: Tracker | None = None
        self.run_id: str | None = None
        if swarm.tracking.enabled:
            self._open_run(parent_run_id)
        self.rounds: dict[int, RoundState] = {}
        self.last_checkpoint_s = 0.0
        self.startup_s = time.perf_counter() - started

    @property
    def node_id(self) -> str:
        return self.config.node_id

    def _open_run(self, parent_run_id: str | None) -> None:
        from flows.tracking import open_swarm_tracker

        swarm = self.swarm
        self.tracker = open_swarm_tracker(swarm)
        policy = str(self.spec.sampling.get("kind", "paper"))
        tags = {"sapo.swarm_id": swarm.swarm_id, "sapo.node_id": self.node_id}
        params = flatten("", self.config.model_dump(mode="json"))
        params.update(flatten("sampling", self.spec.sampling))
        params["ledger.url"] = swarm.ledger_config().url
        self.run_id = self.tracker.run(self.node_id, tags, params, parent_id=parent_run_id)
        extra = sharing_tags(self.config.local_groups, self.config.external_groups, policy)
        self.tracker.set_tags(self.run_id, {**extra, "sapo.model": self.config.model})

    def state(self, round_: int) -> RoundState:
        return self.rounds.setdefault(round_, RoundState())

    # -- the steps ------------------------------------------------------------------------

    @step("generate")
    def generate(self, round_: int) -> int:
        """Sample this round's groups; returns the number of completions made."""
        generated = self.learner.generate(round_, self.progress.generation)
        self.state(round_).generated = generated
        return sum(len(g.rollouts) for g in generated.groups)

    @step("publish")
    def publish(self, round_: int) -> list[str]:
        """Write the round's groups to the ledger (a retry writes nothing); returns keys."""
        generated = self.state(round_).generated
        if generated is None:
            raise RuntimeError(f"round {round_}: publish before generate")
        rows = [
            r.to_record() | {"swarm_id": self.swarm.swarm_id}
            for g in generated.groups
            for r in g.rollouts
        ]
        return self.ledger.publish(rows)

    @step("sample")
    def sample(self, round_: int) -> list[str]:
        """Draw J peers' groups with the node's policy; returns their group ids."""
        state = self.state(round_)
        state.external = []
        if self.config.external_groups > 0:
            seed = self.config.seed * 1_000_003 + round_
            self._wait_for_peers(seed)
            frame = self.ledger.sample(
                self.node_id,
                self.config.external_groups,
                self.spec.sampling,
                seed=seed,
                swarm_id=self.swarm.swarm_id,
                record_round=round_,
            )
            rows = [Rollout.from_record(row) for row in frame.iter_rows(named=True)]
            state.external = group_rollouts(rows, "external")
        return [g.group_id for g in state.external]

    def _wait_for_peers(self, seed: int) -> None:
        """Up to peer_wait_s for J qualifying peer groups to exist (a bounded warm-up)."""
        deadline = time.monotonic() + self.swarm.peer_wait_s
        while time.monotonic() < deadline:
            found = self.ledger.sample_group_ids(
                self.node_id,
                self.config.external_groups,
                self.spec.sampling,
                seed=seed,
                swarm_id=self.swarm.swarm_id,
            )
            if len(found) >= self.config.external_groups:
                return
            time.sleep(0.5)

    @step("reward")
    def reward(self, round_: int) -> dict[str, float]:
        """Score own and peers' groups with this node's verifier; assemble I + J."""
        state = self.state(round_)
        if state.generated is None:
            raise RuntimeError(f"round {round_}: reward before generate")
        state.chosen, state.flagged = self.learner.select(
            round_, state.generated.groups, state.external
        )
        return {
            "groups": float(len(state.chosen.selected)),
            "flagged_rows": float(state.flagged),
        }

    @step("update")
    def update(self, round_: int) -> dict[str, float]:
        """The GRPO step; returns the round's public figures."""
        state = self.state(round_)
        if state.chosen is None:
            raise RuntimeError(f"round {round_}: update before reward")
        state.report = self.learner.update(round_, state.chosen, state.flagged)
        self.cumulative_reward += sum(state.chosen.rewards())
        return {
            "reward_mean": state.report.reward_mean,
            "cumulative_reward": self.cumulative_reward,
        }

    def track(self, round_: int, orchestration_s: float = 0.0) -> dict[str, float]:
        """Log the round's metrics to the node's MLflow run; returns them."""
        started = time.perf_counter()
        state = self.state(round_)
        report, generated = state.report, state.generated
        if report is None or generated is None:
            raise RuntimeError(f"round {round_}: track before update")
        metrics: dict[str, float] = {
            "reward_mean": report.reward_mean,
            "cumulative_reward": self.cumulative_reward,
            "zero_variance_fraction": report.zero_variance_fraction,
            "external_groups_used": float(report.external_groups_used),
            "groups_trained": float(report.groups_trained),
            "flagged_rows": float(report.flagged_rows),
            # The mean over everything the node generated (and published) this round: the
            # policy's own accuracy, what the ledger's per-publisher SQL recomputes.
            "generated_reward_mean": generated.reward_mean,
            "generation_tokens_per_s": generated.tokens / max(generated.seconds, 1e-9),
            "policy_version": float(self.learner.policy_version),
        }
        if report.local_reward_mean is not None:
            metrics["local_reward_mean"] = report.local_reward_mean
        if report.external_reward_mean is not None:
            metrics["external_reward_mean"] = report.external_reward_mean
        for key in ("loss", "clip_fraction", "ratio_mean", "kl", "grad_norm", "tokens_per_s"):
            if key in report.update:
                name = "update_tokens_per_s" if key == "tokens_per_s" else key
                metrics[name] = report.update[key]
        for step, seconds in state.seconds.items():
            metrics[f"seconds_{step}"] = seconds
        if orchestration_s:
            metrics["seconds_orchestration"] = orchestration_s
        if self.tracker is not None and self.run_id is not None:
            self.tracker.log_metrics(self.run_id, metrics, step=round_)
        metrics["seconds_track"] = time.perf_counter() - started
        return metrics

    def checkpoint(self, round_: int, *, force: bool = False) -> str | None:
        """Checkpoint after a finished round every K rounds (or when forced)."""
        done = round_ + 1
        self.rounds.pop(round_, None)
        self.last_checkpoint_s = 0.0
        if not force and done % self.swarm.checkpoint_every != 0:
            return None
        started = time.perf_counter()
        saved = checkpoint.save(
            self.workdir, self.node_id, self.learner, done, self.cumulative_reward
        )
        self.next_round = done
        self.last_checkpoint_s = time.perf_counter() - started
        return str(saved.path)

    def finish(self, *, log_model: bool) -> None:
        """Close the node's run; log its final model (the newest checkpoint)."""
        if self.tracker is None or self.run_id is None:
            return
        saved = checkpoint.latest(self.workdir, self.node_id)
        if log_model and saved is not None:
            # Only the model: the optimizer state would triple what every run stores.
            with tempfile.TemporaryDirectory(dir=saved.path.parent) as staging:
                for path in checkpoint.model_files(saved.path):
                    os.link(path, Path(staging) / path.name)  # same disk: no copy
                self.tracker.log_artifacts(self.run_id, staging, "model")
        self.tracker.finish(self.run_id)

    def close(self) -> None:
        self.ledger.close()


def describe(metrics: dict[str, Any], node_id: str, round_: int) -> str:
    """The one-line summary printed after each round."""
    ext = metrics.get("external_reward_mean")
    return (
        f"{node_id} round {round_}: reward {metrics['reward_mean']:.3f} "
        f"(local {metrics.get('local_reward_mean', float('nan')):.3f}, "
        f"external {'-' if ext is None else f'{ext:.3f}'}, "
        f"{int(metrics['external_groups_used'])} peer groups), "
        f"cumulative {metrics['cumulative_reward']:.1f}, "
        f"{sum(v for k, v in metrics.items() if k.startswith('seconds_')):.1f}s"
    )
