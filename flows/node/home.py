"""A node's home beyond its machine (issue 60): what lets a node whose machine is lost for
good continue on another.

A node's state is its newest checkpoint (weights, optimizer and RNG state, state.json with
its round, totals and reputation) and its signing key (its identity in the ledger: the
first key a node registers is the only one its peers accept). Under `checkpoint_home`,
each checkpoint, once written, is copied to

    <url>/<swarm_id>/<node_id>/round-NNNNNN/   (the checkpoint's files, state.json last)
    <url>/<swarm_id>/<node_id>/node.pem         (the key, copied once)

and a node about to start takes the home's checkpoint (and key, if it has none) when it is
newer than its machine's. What is not in the home is rebuilt or lost: the reader index is
rebuilt from the ledger; rows a lost machine had not yet published (its backlog, only while
the ledger was unreachable) and metrics MLflow had not taken are lost with it.
"""

from __future__ import annotations

import json
import logging
import shutil
import tempfile
from pathlib import Path
from typing import Any

from flows.config import HomeConfig, SwarmConfig
from flows.node import checkpoint
from ledger.retrying import first_line

log = logging.getLogger(__name__)

KEY = "node.pem"


class HomeUnreachable(RuntimeError):
    """The home did not answer when a node was about to start: starting from this
    machine's state could start it afresh, so it does not start (the next run tries again)."""


def key_path(swarm: SwarmConfig, node_id: str) -> Path:
    """Where this machine keeps the node's signing key."""
    return swarm.workdir / "keys" / swarm.swarm_id / f"{node_id}.pem"


def newest(swarm: SwarmConfig, node_id: str) -> checkpoint.Checkpoint | None:
    """The node's newest checkpoint on this machine, once that is the newest anywhere:
    under `checkpoint_home`, the home's is taken first when newer (`pull`). This machine's
    checkpoints are read once, unless one came from the home."""
    local = checkpoint.latest(swarm.workdir, node_id)
    home = swarm.checkpoint_home
    if home is None:
        return local
    try:
        pulled = pull(home, swarm.swarm_id, node_id, swarm.workdir, key_path(swarm, node_id), local)
    except Exception as exc:  # each store raises its own kinds (botocore's, OSError, ...)
        raise HomeUnreachable(
            f"{node_id}: its checkpoint home {home.url} did not answer: {first_line(exc)}"
        ) from exc
    return checkpoint.latest(swarm.workdir, node_id) if pulled else local


def keeper(swarm: SwarmConfig, node_id: str) -> checkpoint.AfterWrite | None:
    """What copies each checkpoint of the node home once written (None: no home). A copy
    that fails costs a warning: the node goes on, and the next checkpoint tries again."""
    home = swarm.checkpoint_home
    if home is None:
        return None
    key = key_path(swarm, node_id)

    def keep(saved: checkpoint.Checkpoint) -> None:
        try:
            push(home, swarm.swarm_id, node_id, saved.path, key)
        except Exception as exc:
            log.warning("%s: checkpoint not copied to %s: %s", node_id, home.url, first_line(exc))

    return keep


def _store(home: HomeConfig, swarm_id: str, node_id: str) -> tuple[Any, str]:
    import fsspec

    fs, root = fsspec.core.url_to_fs(home.url, **home.storage_options)
    return fs, f"{root.rstrip('/')}/{swarm_id}/{node_id}"


def _rounds(fs: Any, folder: str) -> list[tuple[int, str]]:
    """The home's complete checkpoints (state.json present), oldest first."""
    try:
        names = fs.ls(folder, detail=False, refresh=True)
    except FileNotFoundError:
        return []
    found = []
    for name in names:
        base = str(name).rstrip("/").rsplit("/", 1)[-1]
        if base.startswith("round-") and fs.exists(f"{name}/{checkpoint.STATE}"):
            found.append((int(base.removeprefix("round-")), str(name)))
    return sorted(found)


def push(home: HomeConfig, swarm_id: str, node_id: str, saved: Path, key: Path) -> None:
    """Copy the checkpoint at ``saved`` (and the key, the first time) to the home, then
    remove the home's older checkpoints."""
    fs, folder = _store(home, swarm_id, node_id)
    target = f"{folder}/{saved.name}"
    files = sorted(p for p in saved.iterdir() if p.is_file() and p.name != checkpoint.STATE)
    for path in [*files, saved / checkpoint.STATE]:  # state.json last: it says "complete"
        fs.put_file(str(path), f"{target}/{path.name}")
    if key.is_file() and not fs.exists(f"{folder}/{KEY}"):
        fs.put_file(str(key), f"{folder}/{KEY}")
    for _, old in _rounds(fs, folder)[:-1]:
        fs.rm(old, recursive=True)
    log.info("%s: checkpoint %s copied to its home %s", node_id, saved.name, home.url)


def pull(
    home: HomeConfig,
    swarm_id: str,
    node_id: str,
    workdir: Path,
    key: Path,
    local: checkpoint.Checkpoint | None,
) -> bool:
    """Bring the home's newest checkpoint to this machine when it is newer than ``local``
    (the newest here), and the key when this machine has none; whether a checkpoint came."""
    fs, folder = _store(home, swarm_id, node_id)
    if not key.exists() and fs.exists(f"{folder}/{KEY}"):
        key.parent.mkdir(parents=True, exist_ok=True)
        fs.get_file(f"{folder}/{KEY}", str(key))
    rounds = _rounds(fs, folder)
    if not rounds:
        return False
    newest, source = rounds[-1]
    if local is not None and local.next_round >= newest:
        return False
    root = checkpoint.node_dir(workdir, node_id) / "checkpoints"
    root.mkdir(parents=True, exist_ok=True)
    # Fetched aside and renamed into place: a half-fetched checkpoint is never the newest
    # (`checkpoint.write` removes .tmp- folders).
    tmp = Path(tempfile.mkdtemp(dir=root, prefix=".tmp-"))
    for name in fs.ls(source, detail=False, refresh=True):
        fs.get_file(str(name), str(tmp / str(name).rstrip("/").rsplit("/", 1)[-1]))
    json.loads((tmp / checkpoint.STATE).read_text())  # complete, and readable
    target = root / f"round-{newest:06d}"
    if target.exists():
        shutil.rmtree(target)
    tmp.rename(target)
    log.info("%s resumes from its home: %s (round %d)", node_id, home.url, newest)
    return True
