"""Node checkpoints: the learner's weights and `state_dict()`, written atomically.

Layout: <workdir>/nodes/<node_id>/checkpoints/round-<NNNNNN>/ holding the model directory
files, optimizer.pt, rng.pt and state.json (the round counter, policy version, reward
totals and reputation; written last: a directory without it is an interrupted write and is
ignored). A checkpoint is written to a temporary directory and
renamed into place before older ones are removed, so keeping only the newest is safe; with
the 135M model one checkpoint is ~1.6 GB (fp32 weights plus Adam's two moments).

A node that finishes under ``checkpoint_keep: final-model`` keeps only its final model
(`keep_final_model`): the training state goes, and so do the weights when the model was
logged to MLflow (state.json then names where it is). Under ``nothing`` the weights go in
any case. Such a checkpoint cannot be resumed.
"""

from __future__ import annotations

import json
import shutil
import tempfile
import threading
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from flows.node.files import write_atomically
from sapo_core.node_state import RewardTotals

if TYPE_CHECKING:
    from sapo_core.policy.loading import Policy

STATE = "state.json"
KEEP = 1
OPTIMIZER = "optimizer.pt"
RNG = "rng.pt"
TRAINING_STATE = (OPTIMIZER, RNG)


class NotResumable(RuntimeError):
    """A checkpoint that kept only the final model was asked to continue training."""


@dataclass(frozen=True)
class Checkpoint:
    path: Path
    next_round: int
    policy_version: int
    totals: RewardTotals = field(default_factory=RewardTotals)
    config: dict[str, str] | None = None
    """The node's configuration when it was saved (flat keys); None in older checkpoints."""
    resumable: bool = True
    """False once `keep_final_model` dropped the training state."""
    final_model: str | None = None
    """Where the final model went when it is no longer in the directory (an MLflow URI)."""
    reputation: dict[str, Any] | None = None
    """The learner's reputation of its peers; None in checkpoints from before it held it."""


def node_dir(workdir: Path, node_id: str) -> Path:
    return workdir / "nodes" / node_id


FINISHED = "finished.json"


def mark_finished(workdir: Path, node_id: str, rounds: int) -> None:
    """Record that the node finished `rounds` rounds completely: scored, and its model in
    MLflow when models are logged. Later runs asked for no more rounds stop at once."""
    write_atomically(node_dir(workdir, node_id) / FINISHED, json.dumps({"rounds": rounds}))


def finished_rounds(workdir: Path, node_id: str) -> int:
    """The rounds the node finished completely (0: none recorded)."""
    path = node_dir(workdir, node_id) / FINISHED
    try:
        return int(json.loads(path.read_text())["rounds"])
    except (OSError, ValueError, KeyError, TypeError):
        return 0


def latest(workdir: Path, node_id: str) -> Checkpoint | None:
    """The newest complete checkpoint of a node, or None."""
    root = node_dir(workdir, node_id) / "checkpoints"
    found = []
    for path in root.glob("round-*"):
        state = path / STATE
        if state.is_file():
            data = json.loads(state.read_text())
            found.append(
                Checkpoint(
                    path,
                    int(data["next_round"]),
                    int(data["policy_version"]),
                    RewardTotals.from_state(data),
                    data.get("config"),
                    bool(data.get("resumable", True)),
                    data.get("final_model"),
                    data.get("reputation"),
                )
            )
    return max(found, key=lambda c: c.next_round, default=None)


class Learned(Protocol):
    """What a checkpoint reads of a learner (sapo_core.learner.Learner): its policy's
    model and tokenizer, and its `state_dict()`."""

    @property
    def policy(self) -> Policy: ...

    def state_dict(self) -> dict[str, Any]: ...


@dataclass(frozen=True)
class Pending:
    """A checkpoint asked for: the learner's `state_dict()` taken then (its small values
    copied, so the node goes on counting), and the policy whose weights a background write
    reads (nothing changes them, or the optimizer's tensors, until the next update)."""

    root: Path
    policy: Policy
    state: dict[str, Any]
    checkpoint: Checkpoint


def capture(
    workdir: Path,
    node_id: str,
    learner: Learned,
    next_round: int,
    config: dict[str, str] | None = None,
) -> Pending:
    """A checkpoint after `next_round - 1` finished, with the node's ``config`` (what a
    resume is compared against), ready to `write` now or in a `Writer`'s thread."""
    state = learner.state_dict()
    totals = RewardTotals.from_state(state["totals"])
    root = node_dir(workdir, node_id) / "checkpoints"
    made = Checkpoint(
        root / f"round-{next_round:06d}",
        next_round,
        state["policy_version"],
        totals,
        config,
        reputation=state["reputation"],
    )
    return Pending(root, learner.policy, state, made)


def write(pending: Pending) -> Checkpoint:
    """Write a captured checkpoint (aside, then renamed into place); prune old ones."""
    import torch

    root, made, state = pending.root, pending.checkpoint, pending.state
    root.mkdir(parents=True, exist_ok=True)
    for stale in root.glob(".tmp-*"):  # a save interrupted by a kill or a full disk
        shutil.rmtree(stale, ignore_errors=True)
    target = pending.checkpoint.path
    tmp = Path(tempfile.mkdtemp(dir=root, prefix=".tmp-"))
    pending.policy.model.save_pretrained(str(tmp))
    pending.policy.tokenizer.save_pretrained(str(tmp))
    torch.save(state["optimizer"], tmp / OPTIMIZER)
    torch.save(state["rng"], tmp / RNG)
    small = {
        "next_round": made.next_round,
        "policy_version": made.policy_version,
        **made.totals.as_metrics(),
        "reputation": made.reputation,
        "config": made.config,
    }
    (tmp / STATE).write_text(json.dumps(small))  # last: a folder without it is partial
    if target.exists():
        shutil.rmtree(target)
    tmp.rename(target)
    for old in sorted(root.glob("round-*"))[:-KEEP]:
        shutil.rmtree(old, ignore_errors=True)
    return pending.checkpoint


AfterWrite = Callable[[Checkpoint], None]
"""What a `Writer` does with each checkpoint once written (flows/node/home.py copies it)."""


class Writer:
    """A node's checkpoints written in the background, off the round's critical path.

    `start` captures what could change (RNG states, counters) and returns; a thread then
    writes the weights and optimizer state, which only the next update changes: callers
    `wait` before it (and before reading the newest checkpoint); ``after`` is then given
    each checkpoint written, in the same thread. One write at a time; a
    write that fails raises from `wait`; a process killed mid-write leaves the previous
    checkpoint complete (the new one is a .tmp- folder, removed by the next save)."""

    def __init__(self, after: AfterWrite | None = None) -> None:
        self._after = after
        self._thread: threading.Thread | None = None
        self._result: Checkpoint | None = None
        self._error: BaseException | None = None

    def start(self, pending: Pending) -> Checkpoint:
        """Begin writing `pending` (what `capture` made just now); returns the checkpoint it
        will be once `wait` says it is done."""
        self.wait()

        def run() -> None:
            try:
                self._result = write(pending)
                if self._after is not None:
                    self._after(self._result)
            except BaseException as exc:  # handed to the caller by wait()
                self._error = exc

        self._thread = threading.Thread(
            target=run, name=f"checkpoint-{pending.checkpoint.path.name}", daemon=True
        )
        self._thread.start()
        return pending.checkpoint

    def wait(self) -> Checkpoint | None:
        """Block until the write in progress ends; the checkpoint it wrote (None when none
        was in progress). Raises what the write raised."""
        thread, self._thread = self._thread, None
        if thread is None:
            return None
        thread.join()
        error, self._error = self._error, None
        result, self._result = self._result, None
        if error is not None:
            raise error
        return result


def model_files(checkpoint: Path) -> list[Path]:
    """The files of a checkpoint that make up the model (weights, config, tokenizer)."""
    rest = (*TRAINING_STATE, STATE)
    return sorted(p for p in checkpoint.iterdir() if p.is_file() and p.name not in rest)


def kept_model(saved: Checkpoint) -> str:
    """Where a finished node's final model is, in words: in MLflow, in its checkpoint
    directory, or nowhere (`checkpoint_keep: nothing` without MLflow)."""
    if saved.final_model:
        return f"its final model is at {saved.final_model}"
    if model_files(saved.path):
        return f"its final model is at {saved.path}"
    return "its final model was not kept"


def keep_final_model(
    saved: Checkpoint, logged_at: str | None, *, weights: bool = True
) -> Checkpoint:
    """Drop what only a resume needs (optimizer and RNG state, ~2/3 of a checkpoint), and
    the model files too when ``logged_at`` says the model is kept elsewhere or ``weights``
    is false (`checkpoint_keep: nothing`). state.json is
    rewritten first (atomically), so a kill midway leaves a checkpoint that says what it
    lacks, never one that claims files it no longer has."""
    data = json.loads((saved.path / STATE).read_text())
    data.update(resumable=False, final_model=logged_at)
    write_atomically(saved.path / STATE, json.dumps(data))
    gone = [saved.path / name for name in TRAINING_STATE]
    if logged_at is not None or not weights:
        gone += model_files(saved.path)
    for path in gone:
        path.unlink(missing_ok=True)
    return replace(saved, resumable=False, final_model=logged_at)


LEGACY_REPUTATION = "reputation.json"
"""Where nodes before the learner held their reputation kept it, beside the checkpoints."""


def read_state(saved: Checkpoint) -> dict[str, Any]:
    """The learner's `state_dict()` as ``saved`` holds it, for `Learner.from_checkpoint`."""
    return {
        "policy_version": saved.policy_version,
        "totals": saved.totals.as_metrics(),
        # state.json was read by `latest`; one written before the learner held it has none
        "reputation": saved.reputation
        if saved.reputation is not None
        else _legacy_reputation(saved),
        "optimizer": _tensors(saved.path / OPTIMIZER),
        "rng": _tensors(saved.path / RNG),
    }


def _tensors(path: Path) -> Any:
    """A training-state file's tensors and plain values, and nothing else (torch's
    weights_only): a checkpoint home that another party could write must not run code here
    through a pickle."""
    import pickle

    import torch

    try:
        return torch.load(path, weights_only=True)
    except pickle.UnpicklingError as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise NotResumable(
            f"{path} holds more than tensors and plain values; refused to load it ({first})"
        ) from exc


def _legacy_reputation(saved: Checkpoint) -> dict[str, Any]:
    """The reputation a node of an older release kept in its own file, as of the round
    ``saved`` resumes (the file kept the state before each round past its checkpoint)."""
    path = saved.path.parent.parent / LEGACY_REPUTATION
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(data, dict):
        return {}
    before = data.get("before")
    through = data.get("through_round")
    if isinstance(through, int) and through >= saved.next_round and isinstance(before, dict):
        return before.get(str(saved.next_round), data)
    return data


def config_differences(saved: dict[str, str], current: dict[str, str]) -> list[str]:
    """What changed between a checkpoint's configuration and the current one, one
    ``key: saved -> now`` per key, sorted."""
    keys = sorted(set(saved) | set(current))
    return [
        f"{k}: {saved.get(k, '(unset)')} -> {current.get(k, '(unset)')}"
        for k in keys
        if saved.get(k) != current.get(k)
    ]
