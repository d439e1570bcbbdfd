"""A node's lifecycle, decided in one place: whether it may resume (from which checkpoint,
with which configuration), which rounds a run of it runs, how a run finishes (a final
evaluation, its model logged, the node marked finished) and whether a swarm is complete.

A process that runs a node asks once, `decide`, which reads the node's newest checkpoint
once and returns a `Start`: the rounds to run from it, or the line a finished node says, or
a refusal. `sapo node` decides and hands its `Start` to the flow; a deployment's run
(flows/node/round.py `node_flow`) decides itself. A launcher that checked its nodes' resume
(`sapo swarm`) tells the processes it starts which checkpoint it checked (`CHECKED_ENV`):
one that still finds it its newest does not check again. So a deployed run refuses a changed
configuration as the CLI does, and no process repeats its parent's checks.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from flows.config import DEFAULT_POLICY, NodeSpec, SwarmConfig
from flows.env import CHECKED_ENV, FORCE_ENV
from flows.node import checkpoint, home
from flows.tracking import flatten
from ledger.policies.user_sql import recorded
from sapo_core.config import NodeConfig


class ResumeRefused(RuntimeError):
    """A node's checkpoint cannot be resumed as asked (its configuration changed, or it
    kept only its final model)."""


# -- what a checkpoint keeps of the configuration, and what changed since ----------------


def node_config(spec: NodeSpec) -> dict[str, str]:
    """The node's whole configuration as flat keys: its MLflow params, and what a
    checkpoint keeps so that a resume can say what changed."""
    params = flatten("", spec.node.model_dump(mode="json"))
    params.update(flatten("sampling", recorded(spec.sampling.model_dump(mode="json"))))
    return params


def resume_differences(spec: NodeSpec, saved: checkpoint.Checkpoint | None) -> list[str]:
    """How the node's configuration differs from that of ``saved``, its newest checkpoint
    (empty: none, no checkpoint, or one from before configurations were saved). The number
    of rounds is the swarm's, not the node's: changing it is how a swarm is continued."""
    if saved is None or saved.config is None:
        return []
    # A setting added to sapo since the checkpoint was made, left at its default, is no
    # change of the user's (the reputation thresholds, say); nor is a default that became
    # `auto` where the checkpoint holds the old default (auto plans it so on a CPU).
    # Nor is a parameter of a newly chosen sampling policy left at that policy's default:
    # `sampling.kind: paper -> reward_filtered` is the change, not each of its settings.
    defaults = flatten("", NodeConfig.model_validate({}).model_dump(mode="json"))
    policy = type(spec.sampling).model_construct()  # its defaults (a user's SQL has none)
    defaults.update(flatten("sampling", recorded(policy.model_dump(mode="json"))))
    defaults["sampling.kind"] = DEFAULT_POLICY  # a checkpoint from before policies were kept
    current = {
        k: saved.config[k] if SUPERSEDED_DEFAULTS.get(k) == (saved.config.get(k), v) else v
        for k, v in node_config(spec).items()
        if k in saved.config or defaults.get(k) != v
    }
    return checkpoint.config_differences(saved.config, current)


SUPERSEDED_DEFAULTS = {
    "grpo.micro_batch_tokens": ("768", "auto"),
    "grpo.gradient_checkpointing": ("True", "auto"),
}
"""Settings whose default was a value and is now `auto`: (the old default, `auto`)."""


def not_resumable(node_id: str, saved: checkpoint.Checkpoint, also: Sequence[str] = ()) -> str:
    """Why a node (and the nodes ``also`` in the same state) that kept only its final
    model cannot train on, and what to do."""
    kept = checkpoint.kept_model(saved).replace("its final model", f"{node_id}'s", 1)
    who = ", ".join([node_id, *also])
    return (
        f"{who} finished round {saved.next_round - 1} keeping only the final model "
        f"(--keep final-model or nothing; {kept}), so the swarm cannot "
        "train on: "
        "start afresh with another --workdir (with --keep resume, or checkpoint_keep: "
        "resume in the file, to be able to continue it later)"
    )


@dataclass(frozen=True)
class ResumeCheck:
    """Whether nodes may resume: the refusal (None: they may) and, where ``force`` let
    changed nodes through, what changed for each (to be said, not silently taken)."""

    refusal: str | None = None
    forced: list[str] = field(default_factory=list)


def forced_by_environment() -> bool:
    return os.environ.get(FORCE_ENV, "").lower() in ("1", "true", "yes")


def newest_checkpoints(
    swarm: SwarmConfig, node_ids: Sequence[str]
) -> dict[str, checkpoint.Checkpoint | None]:
    """Each node's newest checkpoint (None: it has none), read once for a start's checks."""
    return {node_id: home.newest(swarm, node_id) for node_id in node_ids}


def check_resume(
    swarm: SwarmConfig,
    node_ids: Sequence[str],
    force: bool,
    more_rounds: int | None = None,
    saved: Mapping[str, checkpoint.Checkpoint | None] | None = None,
    ledger_checked: bool = False,
) -> ResumeCheck:
    """Whether ``node_ids`` may resume from their checkpoints (``saved``: each node's newest,
    read here when not given): never when a node kept only its final model and is asked for
    more rounds; not when a node's configuration changed since its checkpoint (the number of
    rounds aside) unless ``force``, listing what changed for each; never from a folder that
    served another ledger (`ledger_problem`; ``ledger_checked``: the caller asked it already,
    so the store is not asked twice)."""
    newest = dict(saved) if saved is not None else newest_checkpoints(swarm, node_ids)
    if not ledger_checked:
        for node_id in node_ids:
            saved_one = newest[node_id]
            foreign = None if saved_one is None else ledger_problem(swarm, node_id, saved_one)
            if foreign is not None:
                return ResumeCheck(foreign)
    blocked = []  # finished with only their final models, but asked for more rounds
    for node_id in node_ids:
        saved_one = newest[node_id]
        asked = saved_one is not None and (
            more_rounds or not reached_the_end(saved_one.next_round, swarm.rounds)
        )
        if saved_one is not None and not saved_one.resumable and asked:
            blocked.append((node_id, saved_one))
    if blocked:
        (first, first_saved), *rest = blocked
        return ResumeCheck(not_resumable(first, first_saved, [node_id for node_id, _ in rest]))

    changed: dict[str, str] = {}  # what changed -> the nodes it changed for
    for node_id in node_ids:
        found = resume_differences(swarm.node(node_id), newest[node_id])
        if found:
            more = f"; and {len(found) - 5} more" if len(found) > 5 else ""
            listed = "; ".join(found[:5]) + more
            changed[listed] = f"{changed[listed]}, {node_id}" if listed in changed else node_id
    if not changed:
        return ResumeCheck()
    if force:
        return ResumeCheck(
            forced=[
                f"{nodes} resume with a changed configuration: {listed}"
                for listed, nodes in changed.items()
            ]
        )
    what = " | ".join(f"{nodes}: {listed}" for listed, nodes in changed.items())
    return ResumeCheck(
        f"checkpoints made with another configuration ({what}). Rerun with --force "
        f"(or {FORCE_ENV}=1) to resume with this one, or use another --workdir to start afresh"
    )


# -- one decision per process ------------------------------------------------------------


@dataclass(frozen=True)
class Start:
    """What a process may do with one node, decided once (`decide`).

    It runs ``first``..``stop - 1`` from ``saved`` (None: a fresh node) when ``said`` and
    ``refusal`` are None; ``said``: the node has nothing left to run, the line it says;
    ``refusal``: it may not resume as asked, in one line. ``forced``: what ``force`` let
    through, to be said. ``checked_by_launcher``: the launcher checked this checkpoint (its
    resume, models and ledger) for the process."""

    node_id: str
    saved: checkpoint.Checkpoint | None
    first: int
    stop: int
    said: str | None = None
    refusal: str | None = None
    forced: tuple[str, ...] = ()
    checked_by_launcher: bool = False

    @property
    def rounds(self) -> range:
        return range(self.first, self.stop)


def checked_marker(saved: checkpoint.Checkpoint | None) -> str:
    """How a launcher names the checkpoint it checked (`CHECKED_ENV`)."""
    return "fresh" if saved is None else str(saved.next_round)


def decide(
    swarm: SwarmConfig,
    node_id: str,
    *,
    force: bool = False,
    until_round: int | None = None,
    more_rounds: int | None = None,
) -> Start:
    """What this process may do with ``node_id``: the node's newest checkpoint, read once;
    nothing to do when it has run, scored and logged all it is asked for (a scheduled run
    after the last round, a node that kept only its final model); a refusal when it may not
    resume (`check_resume`: ``force``, or $SAPO_RESUME_FORCE, lets a changed configuration
    through); else the rounds to run (`rounds_to_run`: up to ``until_round``, default the
    swarm's rounds, or ``more_rounds`` past the checkpoint)."""
    saved = home.newest(swarm, node_id)  # under `checkpoint_home`, the home's when newer
    end = until_round or swarm.rounds
    first = 0 if saved is None else saved.next_round
    rounds = rounds_to_run(first, end, until_round, more_rounds)
    # The launcher that started this process checked this checkpoint, its ledger included.
    checked = os.environ.get(CHECKED_ENV) == checked_marker(saved)
    if saved is not None and not checked:
        foreign = ledger_problem(swarm, node_id, saved)
        if foreign is not None:
            return Start(node_id, saved, first, first, refusal=foreign)
    if saved is not None and nothing_left(swarm, node_id, saved, end, until_round, more_rounds):
        return Start(node_id, saved, first, first, said=finished_line(node_id, saved))
    if checked:
        return Start(node_id, saved, rounds.start, rounds.stop, checked_by_launcher=True)
    force = force or forced_by_environment()
    check = check_resume(
        swarm, [node_id], force, more_rounds, {node_id: saved}, ledger_checked=True
    )
    return Start(
        node_id, saved, rounds.start, rounds.stop, refusal=check.refusal, forced=tuple(check.forced)
    )


# -- which rounds a run runs, and how it finishes ------------------------------------------


def ledger_problem(swarm: SwarmConfig, node_id: str, saved: checkpoint.Checkpoint) -> str | None:
    """Why a node's folder (its checkpoint ``saved``) does not belong to the swarm's ledger,
    or None. A node registers its key in the ledger before its first round, so a ledger
    without it is not the one the folder served: purged (`sapo infra down --purge`) or
    replaced. Without this check a worker's old folder told a new ledger "finished", or
    resumed a node at round 5 against an empty ledger. Not decided while the ledger does not
    answer (the node rides out the outage as ever) or while the node holds rows it has not
    published yet (its backlog: the ledger may never have seen it)."""
    from ledger.identity import key_object_key
    from ledger.storage import open_store

    folder = checkpoint.node_dir(swarm.workdir, node_id)
    if any((folder / "backlog").glob("r*")):
        return None
    try:
        store = open_store(swarm.ledger.url, swarm.ledger.storage_options)
        known = store.exists(key_object_key(swarm.swarm_id, node_id))
    except Exception:  # unreachable, or refused: the round's own calls will say so
        return None
    if known:
        return None
    return (
        f"{node_id}'s folder {folder} holds {saved.next_round} rounds of swarm "
        f"{swarm.swarm_id}, but the ledger at {swarm.ledger.url} has never seen {node_id} (no "
        "key of it): it is not the ledger this folder served (purged or replaced). Move the "
        f"folder aside (or give the worker another SAPO_WORKDIR) to start {node_id} afresh "
        "on this ledger, or point ledger.url at the one it served"
    )


def rounds_to_run(start: int, end: int, until_round: int | None, more_rounds: int | None) -> range:
    """The rounds a node flow runs from checkpoint `start`: up to `end`, or `more_rounds`
    of them; with both `more_rounds` and `until_round`, no further than `end` (a scheduled
    deployment's run after the swarm's last round runs none)."""
    if more_rounds is None:
        return range(start, end)
    if until_round is None:  # `sapo node --more-rounds`: may go past the swarm's rounds
        return range(start, start + more_rounds)
    return range(start, min(start + more_rounds, end))


def nothing_left(
    swarm: SwarmConfig,
    node_id: str,
    saved: checkpoint.Checkpoint,
    end: int,
    until_round: int | None,
    more_rounds: int | None,
) -> bool:
    """Whether a run of a node at checkpoint `saved` has nothing to run, score or log (a
    scheduled run after the last round then ends without loading the model). A node that
    kept only its final model could not be opened to train anyway: its optimizer state
    is gone."""
    if rounds_to_run(saved.next_round, end, until_round, more_rounds):
        return False
    return not saved.resumable or checkpoint.finished_rounds(swarm.workdir, node_id) >= end


def finished_line(node_id: str, saved: checkpoint.Checkpoint) -> str:
    """What a node with nothing left to run says, in `sapo node` and in its flow alike: the
    rounds it ran and, once it kept only its final model, where that model is."""
    line = f"{node_id} has finished its {saved.next_round} rounds"
    return line if saved.resumable else f"{line}; {checkpoint.kept_model(saved)}"


def reached_the_end(next_round: int, rounds: int) -> bool:
    """Whether a node whose next round is `next_round` has run all of its swarm's rounds:
    then its policy is scored once more (the final evaluation, unless recorded already),
    it keeps what `checkpoint_keep` says, and it may be marked finished. The one test of
    "the last round" (issue 59 found it written five ways)."""
    return next_round >= rounds


def logs_its_model(
    *,
    log_models: bool,
    next_round: int,
    rounds: int,
    until_round: int | None,
    ran_rounds: bool,
    model_missing: Callable[[], bool],
) -> bool:
    """Whether a run logs the node's model as it closes: when models are logged and the node
    reached its last round (or a run without a bound went past it), not after every
    scheduled run of a few rounds; by the run that ran rounds, or by a later one when the
    one that reached the end did not log it (it stopped before, or the upload failed).
    ``model_missing`` is asked only when that decides (it asks MLflow)."""
    reached = reached_the_end(next_round, rounds) or until_round is None
    return log_models and reached and (ran_rounds or model_missing())


def finished(next_round: int, rounds: int, tracking_incomplete: Callable[[], bool]) -> bool:
    """Whether the node is marked finished (later runs asked for no more rounds stop at
    once): all rounds run and MLflow holds what it is due (the model, where one is due,
    and every round's metrics; asked only then)."""
    return reached_the_end(next_round, rounds) and not tracking_incomplete()


# -- a swarm ----------------------------------------------------------------------------


def late_nodes(
    swarm: SwarmConfig, saved: Mapping[str, checkpoint.Checkpoint | None]
) -> tuple[list[str], list[str]] | None:
    """(the nodes that finished, the new ones) when a swarm whose nodes have all finished
    is asked to start new ones (`--nodes 3` on a finished 2-node swarm): they would train
    alone against a ledger that no longer changes, and the swarm's model be registered
    again. None otherwise. ``saved``: each node's newest checkpoint (None: a new node)."""
    done = [
        n for n, c in saved.items() if c is not None and reached_the_end(c.next_round, swarm.rounds)
    ]
    new = [n for n, c in saved.items() if c is None]
    if not done or not new or len(done) + len(new) < len(saved):
        return None
    return done, new


def is_complete(
    swarm: SwarmConfig, saved: Mapping[str, checkpoint.Checkpoint | None] | None = None
) -> bool:
    """Whether every node of the swarm has checkpointed its last round and, when evaluation
    is on, recorded its final evaluation (a node killed between the two is not done).
    ``saved``: the nodes' newest checkpoints, where the caller read them already."""
    newest = (
        saved if saved is not None else newest_checkpoints(swarm, [s.node_id for s in swarm.nodes])
    )
    for spec in swarm.nodes:
        found = newest.get(spec.node_id)
        if found is None or not reached_the_end(found.next_round, swarm.rounds):
            return False
    wanted = {s.node_id for s in swarm.nodes if s.node.evaluation.due(swarm.rounds, swarm.rounds)}
    if not wanted:
        return True
    from ledger import Ledger

    with Ledger(swarm.ledger) as ledger:
        done = ledger.evaluated_nodes(swarm.swarm_id, swarm.rounds)
    return wanted <= done
