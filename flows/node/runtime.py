"""A node's runtime: what it is built from and how it is opened and closed.

`open_node` opens the ledger and writes the node's manifest to it (who it is, its I, J and
sampling policy), restores the node from its newest checkpoint (or starts it fresh) and
opens its MLflow run; flows/node/finish.py finishes a run (evaluates, logs the final
model, keeps what `checkpoint_keep` says, closes the run, marks the node finished).
What a round does with it lives in flows/node/steps.py; the Prefect flows in flows/node/round.py
only call those steps.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, Literal

from flows.config import NodeSpec, SwarmConfig
from flows.node import checkpoint, home
from flows.node.backlog import Backlog
from flows.node.lifecycle import node_config, not_resumable
from flows.node.unlogged import FOLDER, UnloggedMetrics
from flows.progress import NodeProgress
from flows.tracking import AWAY_S, MODEL_PATH_TAG, Tracker, open_tracker, sharing_tags
from ledger import Ledger, NodeKey, NodeManifest
from sapo_core.learner import Learner

log = logging.getLogger(__name__)


@dataclass
class NodeRun:
    """The node's MLflow run and the client that writes to it."""

    tracker: Tracker
    run_id: str


@dataclass
class NodeRuntime:
    """One node of a swarm in this process: its learner, the ledger and its MLflow run."""

    swarm: SwarmConfig
    spec: NodeSpec
    learner: Learner
    ledger: Ledger
    progress: NodeProgress
    run: NodeRun | None = None
    next_round: int = 0  # the first round not yet in a checkpoint
    writer: checkpoint.Writer = field(default_factory=checkpoint.Writer)
    draw_secret: bytes = b""
    """What keys the node's draws of peers' groups (ledger/draws.py): from its signing key,
    so kept with its checkpoints and known to no peer. Empty: draws keyed by the public
    round seed (a runtime built by hand)."""
    parent_run_id: str | None = None
    """The swarm's MLflow run, for opening the node's run again after an outage."""
    _reopen_after: float = 0.0

    @property
    def node_id(self) -> str:
        return self.spec.node_id

    @property
    def workdir(self) -> Path:
        return self.swarm.workdir

    @property
    def backlog(self) -> Backlog:
        """What this node could not write to an unreachable ledger (flows/node/backlog.py)."""
        return Backlog(checkpoint.node_dir(self.workdir, self.node_id) / "backlog")

    @property
    def unlogged(self) -> UnloggedMetrics:
        """Rounds' metrics MLflow has not taken yet (flows/node/unlogged.py)."""
        return UnloggedMetrics(checkpoint.node_dir(self.workdir, self.node_id) / FOLDER)

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        """``metrics`` to the node's MLflow run at ``step``, after every round kept while
        MLflow was away; kept for a later try when it does not take them (a node that
        started untracked opens its run again, at most once every `AWAY_S`). Nothing when
        tracking is off."""
        if not self.swarm.tracking.enabled:
            return
        # Kept first, logged from the folder: a kill between the two logs it next run.
        self.unlogged.keep(step, metrics, int(time.time() * 1000))
        if self.run is None and time.monotonic() >= self._reopen_after:
            self._reopen_after = time.monotonic() + AWAY_S
            prompt_format = self.learner.prompt_format
            self.run = open_node_run(self.swarm, self.spec, self.parent_run_id, prompt_format)
        self.log_unlogged()

    def log_unlogged(self) -> None:
        """Log the rounds' metrics kept while MLflow was away, if the node has its run."""
        if self.run is not None:
            self.unlogged.replay(partial(self.run.tracker.log_metrics, self.run.run_id))

    def tracking_incomplete(self) -> bool:
        """Whether MLflow lacks something of the node's: its final model, or metrics kept
        while it was away. A run that ends so does not mark the node finished: a later one
        logs what is missing."""
        return self.final_model_missing() or bool(self.unlogged.steps())

    def wait_for_checkpoint(self) -> None:
        """Wait for the checkpoint being written in the background, if any; from then on
        it is where the node resumes."""
        saved = self.writer.wait()
        if saved is not None:
            self.next_round = saved.next_round

    def final_model_missing(self) -> bool:
        """Whether the model of the node's newest checkpoint belongs in MLflow (tracking on,
        models logged) and is not there: its run's model tag names another round or none,
        or the tracking store did not answer."""
        if not self.swarm.logs_models or self.next_round == 0:
            return False
        if self.run is None:
            return True
        found = self.run.tracker.tag(self.run.run_id, MODEL_PATH_TAG)
        return found != model_path(self.next_round)

    def close(self) -> None:
        try:
            self.wait_for_checkpoint()  # a node stopped by an error still finishes its write
        except Exception as exc:
            log.warning("%s: its last checkpoint was not written: %s", self.node_id, exc)
        finally:
            self.learner.close()
            self.ledger.close()


def model_path(next_round: int) -> str:
    """The artifact path of the model a checkpoint holds, named by its last round: a swarm
    continued later logs beside it, and versions registered from the earlier one keep
    their files."""
    return f"model-round-{next_round - 1}"


class Unread:
    """The newest checkpoint, not read yet (``open_node`` reads it)."""


UNREAD = Unread()


def node_key(swarm: SwarmConfig, node_id: str) -> NodeKey:
    """The node's signing key, made on its first start and kept with its checkpoints."""
    return NodeKey.load_or_create(home.key_path(swarm, node_id), swarm.swarm_id, node_id)


def open_node(
    swarm: SwarmConfig,
    node_id: str,
    *,
    parent_run_id: str | None = None,
    progress: NodeProgress | None = None,
    saved: checkpoint.Checkpoint | Unread | None = UNREAD,
) -> NodeRuntime:
    """A node ready for its next round: restored from its newest checkpoint if it has one
    (``saved``, where the caller read it already; None: it has none)."""
    spec = swarm.node(node_id)
    if isinstance(saved, Unread):  # before the key: under `checkpoint_home` it may come too
        saved = home.newest(swarm, node_id)
    key = node_key(swarm, node_id)
    index = swarm.workdir / "reader-index" / swarm.swarm_id / f"{node_id}.duckdb"
    ledger = Ledger(
        swarm.ledger, signer=key, index_path=index if swarm.ledger.reader_index else None
    )
    try:
        # The swarm's rule (first node wins) and this node's key (first key wins), then
        # the learner (its prompt format depends on the model's tokenizer) and the
        # manifest: a restart with the same config writes nothing.
        ledger.declare_swarm(swarm.swarm_id, swarm.signatures, swarm.members())
        ledger.register_key(key)
        learner = restore_learner(swarm, spec, saved)
        ledger.write_manifest(manifest(swarm, spec, learner.prompt_format))
        runtime = NodeRuntime(
            swarm=swarm,
            spec=spec,
            learner=learner,
            ledger=ledger,
            progress=progress or NodeProgress(node_id, None),
            draw_secret=key.draw_secret(),
            parent_run_id=parent_run_id,
            writer=checkpoint.Writer(after=home.keeper(swarm, node_id)),
        )
        if saved is not None:
            runtime.next_round = saved.next_round
            log.info("%s resumes at round %d from %s", node_id, saved.next_round, saved.path)
        if swarm.tracking.enabled:
            runtime.run = open_node_run(
                swarm, spec, parent_run_id, learner.prompt_format, runtime.next_round
            )
            runtime.log_unlogged()  # rounds a run before could not log
    except BaseException:
        ledger.close()
        raise
    return runtime


def manifest(
    swarm: SwarmConfig, spec: NodeSpec, prompt_format: Literal["chat", "plain"] | None = None
) -> NodeManifest:
    """What the node publishes about itself: the report reads I, J, policy, model,
    prompt format and adapter from it."""
    node = spec.node
    return NodeManifest.for_node(
        swarm_id=swarm.swarm_id,
        node_id=node.node_id,
        experiment=swarm.experiment,
        local_groups=node.local_groups,
        external_groups=node.external_groups,
        policy=spec.sampling,
        model_id=node.model,
        prompt_format=prompt_format,
        adapter=node.grpo.adapter.label(),
        seed=node.seed,
    )


def restore_learner(
    swarm: SwarmConfig, spec: NodeSpec, saved: checkpoint.Checkpoint | None
) -> Learner:
    """The node's learner: the one that wrote ``saved``, its newest checkpoint (weights and
    state; the KL reference stays the initial model), or fresh from its configured model
    when it has none."""
    prefix = f"{swarm.swarm_id}."  # ids unique across swarms that share a ledger
    if saved is None:
        return Learner(spec.node, id_prefix=prefix)
    if not saved.resumable:
        raise checkpoint.NotResumable(not_resumable(spec.node_id, saved))
    return Learner.from_checkpoint(
        spec.node, saved.path, checkpoint.read_state(saved), id_prefix=prefix
    )


def open_swarm_tracker(swarm: SwarmConfig) -> Tracker:
    """The tracker of a swarm's MLflow experiment (its own name, or the swarm id)."""
    return open_tracker(
        swarm.tracking_uri(),
        swarm.tracking.experiment or swarm.swarm_id,
        swarm.artifact_location(),
        swarm.tracking.retry,
    )


def open_node_run(
    swarm: SwarmConfig,
    spec: NodeSpec,
    parent_run_id: str | None,
    prompt_format: str = "chat",
    from_round: int = 0,
) -> NodeRun | None:
    """The node's MLflow run (found again on a resume), with its config as params; None,
    with a warning, when the tracking store stays unreachable: tracking never stops a node.
    A resume at ``from_round`` with another configuration (``--force``) is recorded on the
    run (`config_change_tags`): MLflow keeps a run's params as first logged."""
    try:
        tracker = open_swarm_tracker(swarm)
    except RuntimeError as exc:
        log.warning("%s runs untracked: %s", spec.node_id, exc)
        return None
    node = spec.node
    tags = {"sapo.swarm_id": swarm.swarm_id, "sapo.node_id": node.node_id}
    params = node_config(spec)
    params["ledger.url"] = swarm.ledger.url
    run_id = tracker.run(node.node_id, tags, params, parent_id=parent_run_id)
    if run_id is None:
        return None
    extra = sharing_tags(node.local_groups, node.external_groups, spec.sampling.kind)
    extra.update(config_change_tags(tracker, run_id, params, from_round))
    model_tags = {
        "sapo.model": node.model,
        "sapo.prompt_format": prompt_format,
        "sapo.adapter": node.grpo.adapter.label() or "none",
    }
    tracker.set_tags(run_id, {**extra, **model_tags})
    return NodeRun(tracker, run_id)


CONFIG_CHANGES_TAG = "sapo.config_changes"
"""A run's configuration changes, one line each: ``from round R: key: old -> new; ...``."""


def config_change_tags(
    tracker: Any, run_id: str, params: dict[str, str], from_round: int
) -> dict[str, str]:
    """Tags that record a resume with another configuration than the run's params (which
    MLflow never changes): the change and the round it applies from, appended to
    `CONFIG_CHANGES_TAG`, and a policy label that names both policies (``paper→fresh``), so
    that `sapo compare` and MLflow's UI do not credit the new one with every round."""
    data = tracker.run_data(run_id)
    if data is None:
        return {}
    logged = {k: v for k, v in data.params.items() if k in params}
    changed = checkpoint.config_differences(logged, {k: params[k] for k in logged})
    if not changed:
        return {}
    what = "; ".join(changed)
    history = [h for h in (data.tags.get(CONFIG_CHANGES_TAG) or "").splitlines() if h]
    if not history or history[-1].split(": ", 1)[-1] != what:  # a new change, not a resume
        history.append(f"from round {from_round}: {what}")
    tags = {CONFIG_CHANGES_TAG: "\n".join(history)[-7000:]}
    first, now = logged.get("sampling.kind"), params.get("sampling.kind")
    if first and now and first != now:
        tags["sapo.sampling_policy"] = f"{first}→{now}"
    return tags
