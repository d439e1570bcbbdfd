"""A local swarm: N node processes on one machine, no barrier between them.

The launcher resolves the swarm file (with overrides) into <workdir>/swarm.yaml, opens the
swarm's parent MLflow run, starts `sapo node` once per node, streams their output with a
node prefix, and waits. Nodes meet only through the ledger: a fast node never waits for a
slow one, and a node that finds no peers yet trains on its own groups.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import IO, TYPE_CHECKING

from flows.config import SwarmConfig, swarm_yaml
from flows.env import CHECKED_ENV, LAUNCHED_ENV, apply_offline_defaults
from flows.node.checkpoint import Checkpoint
from flows.node.files import write_atomically
from flows.node.lifecycle import checked_marker
from flows.node.metrics import is_round_summary
from flows.progress import PROGRESS_ENV, SwarmProgress
from flows.swarm.stopping import NodeStopper, SwarmStopped, stopped_lines
from ledger.schema import sharing_label

if TYPE_CHECKING:
    from flows.tracking import Tracker

PARENT_RUN_ENV = "SAPO_PARENT_RUN_ID"


def write_resolved(config: SwarmConfig, target: Path | None = None) -> Path:
    """Write the resolved swarm (default <workdir>/swarm.yaml) for node processes to load."""
    target = target or config.workdir / "swarm.yaml"
    write_atomically(target, swarm_yaml(config))
    return target


def open_parent_run(
    config: SwarmConfig, parent_run_id: str | None = None
) -> tuple[Tracker, str] | None:
    """The swarm's parent MLflow run (found again on a resume) and the client that made it;
    nested under `parent_run_id` (an experiment's run) when given."""
    if not config.tracking.enabled:
        return None
    from flows.node.runtime import open_swarm_tracker

    tracker = open_swarm_tracker(config)
    params = {
        "swarm_id": config.swarm_id,
        "nodes": str(len(config.nodes)),
        "rounds": str(config.rounds),
        "ledger.url": config.ledger.url,
    }
    sharing = sorted(
        {sharing_label(s.node.local_groups, s.node.external_groups) for s in config.nodes}
    )
    tags = {"sapo.swarm_id": config.swarm_id, "sapo.role": "swarm"}
    run_id = tracker.run(config.swarm_id, tags, params, parent_id=parent_run_id)
    if run_id is None:
        return None  # a warning was logged; the nodes still run (and track what they can)
    tracker.set_tags(run_id, {"sapo.sharing": ",".join(sharing)})
    return tracker, run_id


def node_env(
    config: SwarmConfig,
    node_id: str,
    parent_run_id: str | None,
    checked: Mapping[str, Checkpoint | None] | None = None,
) -> dict[str, str]:
    """A node process's environment; ``checked``: the checkpoints at which the launcher
    checked its nodes' resume, models and ledger (the process need not check again)."""
    env = dict(os.environ)
    env.pop(CHECKED_ENV, None)  # a launcher's own, never inherited by its nodes
    env[LAUNCHED_ENV] = "1"
    if checked is not None and node_id in checked:
        env[CHECKED_ENV] = checked_marker(checked[node_id])
    apply_offline_defaults(env)  # quiet, offline nodes, whoever started the launcher
    # Share the cores instead of every node using all of them: oversubscribed BLAS threads
    # thrash (three nodes x two threads on two cores ran rounds 2-3x slower).
    cores = os.cpu_count() or 1
    env.setdefault("OMP_NUM_THREADS", str(max(1, cores // len(config.nodes))))
    if parent_run_id:
        env[PARENT_RUN_ENV] = parent_run_id
    if config.prefect.api_url:
        env["PREFECT_API_URL"] = config.prefect.api_url
    elif not env.get("PREFECT_API_URL"):
        # Each node process runs Prefect's ephemeral mode with its own database: one shared
        # SQLite file (the launcher's included) would lock under concurrent nodes.
        env["PREFECT_HOME"] = str(config.workdir / "prefect" / node_id)
        Path(env["PREFECT_HOME"]).mkdir(parents=True, exist_ok=True)  # SQLite needs the folder
    env[PROGRESS_ENV] = "lines"  # the launcher draws the bars
    # Several nodes starting their ephemeral servers at once on a small machine need longer
    # than Prefect's default 20 s.
    env.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "300")
    return env


def _pump(
    stream: IO[str],
    node_id: str,
    display: SwarmProgress,
    out: Callable[[str], None],
    stopping: threading.Event,
) -> None:
    for line in stream:
        # Once the swarm stops, a dying node's noise is not shown; the summary of a round it
        # finished still is (it may reach the pipe as the stop comes): the record is whole.
        if not stopping.is_set() or is_round_summary(line, node_id):
            display.feed(node_id, line.rstrip(), out)


def prepare_models(config: SwarmConfig, out: Callable[[str], None] = print) -> None:
    """Fetch and convert each bundled model the nodes name once, before they start (else
    each node would convert it)."""
    from sapo_core.policy import bundled

    for name in sorted({s.node.model for s in config.nodes}):
        found = bundled.lookup(name)
        if found is not None:
            out(f"bundled model {found.id}: {bundled.model_dir(found)} ({found.licence})")


def run_swarm(
    config: SwarmConfig,
    resolved: Path,
    *,
    out: Callable[[str], None] = print,
    show_progress: bool | None = None,
    parent_run_id: str | None = None,
    checked: Mapping[str, Checkpoint | None] | None = None,
) -> int:
    """Start every node, stream their output, wait; returns the number of nodes that failed.

    Progress bars are drawn on a terminal (or when `show_progress` is true). ``checked``:
    each node's newest checkpoint, where the caller checked their resume, models and ledger
    (`sapo swarm`): the node processes do not check them again."""
    prepare_models(config, out)
    opened = open_parent_run(config, parent_run_id)
    parent = opened[1] if opened else None
    try:
        with SwarmProgress(enabled=show_progress) as display:
            failed = _run_nodes(config, resolved, parent, display, out, checked)
    except SwarmStopped:
        if opened is not None:
            # The parent and every node run the stop cut short: stopped, not running on in
            # MLflow (a node stopped by SIGTERM closes nothing itself); nothing registered.
            stop_runs(opened[0], opened[1])
        raise
    if opened is not None:
        tracker, run_id = opened
        _register(config, tracker, run_id, out)
        tracker.finish(run_id, "FINISHED" if failed == 0 else "FAILED")
    return failed


def stop_runs(tracker: Tracker, parent: str) -> None:
    """Mark a stopped swarm's parent run and its node runs still RUNNING as KILLED."""
    for child in tracker.children(parent):
        if child.info.status == "RUNNING":
            tracker.finish(child.info.run_id, "KILLED")
    tracker.finish(parent, "KILLED")


def _register(
    config: SwarmConfig, tracker: Tracker, parent: str, out: Callable[[str], None]
) -> None:
    """Register the best node's model (by cumulative own reward) in MLflow's model registry."""
    tracking = config.tracking
    if not config.logs_models or tracking.registered_model is None:
        return
    from flows.tracking import register_best

    name = tracking.registered_model or f"{config.swarm_id}-policy"
    found = register_best(tracker, parent, name)
    if found is not None:
        node_id, _, version = found
        out(f"registered {node_id}'s model as {name!r} version {version}")


def _start_node(
    config: SwarmConfig,
    resolved: Path,
    parent: str | None,
    node_id: str,
    display: SwarmProgress,
    out: Callable[[str], None],
    stopping: threading.Event,
    checked: Mapping[str, Checkpoint | None] | None,
) -> tuple[subprocess.Popen[str], threading.Thread]:
    """One node process (in its own process group, with the Prefect server it starts; see
    flows/swarm/stopping.py) and the thread that streams its output."""
    cmd = [
        sys.executable,
        "-P",
        "-m",
        "flows.cli",
        "node",
        "-c",
        str(resolved),
        "--node-id",
        node_id,
    ]
    proc = subprocess.Popen(
        cmd,
        env=node_env(config, node_id, parent, checked),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        bufsize=1,
        start_new_session=True,
    )
    share_priority(proc.pid)
    assert proc.stdout is not None
    thread = threading.Thread(
        target=_pump, args=(proc.stdout, node_id, display, out, stopping), daemon=True
    )
    thread.start()
    return proc, thread


def share_priority(pid: int) -> None:
    """Give the session that process ``pid`` leads the launcher's niceness. A node leads a
    session of its own (its process group is what a stop signals), and under Linux's
    ``sched_autogroup`` each session is one scheduling group, across which nice counts for
    nothing: `nice -n 19 sapo experiment` beside a person's work would still take a full
    share per node (measured on 2 cores: an update that took 2.3 s once the sweep's node
    groups were niced took 48 to 60 s beside the same sweep under `nice -n 19` alone).
    Nothing to do at niceness 0, or where there is no autogroup."""
    niceness = os.nice(0)
    if niceness <= 0:
        return
    with contextlib.suppress(OSError):  # no autogroup here (another kernel, a container)
        Path(f"/proc/{pid}/autogroup").write_text(str(niceness))


def _run_nodes(
    config: SwarmConfig,
    resolved: Path,
    parent: str | None,
    display: SwarmProgress,
    out: Callable[[str], None],
    checked: Mapping[str, Checkpoint | None] | None,
) -> int:
    procs: list[tuple[str, subprocess.Popen[str]]] = []
    threads = []
    # Handlers first: a stop that comes while nodes start stops those started, and no more.
    stopper = NodeStopper()
    failed = 0
    try:
        with stopper.installed():
            for spec in config.nodes:
                if stopper.received is not None:
                    break
                proc, thread = _start_node(
                    config, resolved, parent, spec.node_id, display, out, stopper.stopping, checked
                )
                stopper.procs.append(proc)
                procs.append((spec.node_id, proc))
                threads.append(thread)
            for node_id, proc in procs:
                if proc.wait() != 0 and stopper.received is None:
                    failed += 1
                    out(f"[{node_id}] exited with status {proc.returncode}")
    finally:
        stopper.reap()
    for thread in threads:
        thread.join(timeout=5)
    if stopper.received is not None:
        lines = stopped_lines(config.workdir, [node_id for node_id, _ in procs])
        raise SwarmStopped(stopper.received.name, lines)
    return failed


def disk_usage(root: Path) -> dict[str, int]:
    """Bytes under each top-level entry of ``root`` (a file linked twice counts once)."""
    seen: set[tuple[int, int]] = set()
    usage: dict[str, int] = {}
    for top in sorted(root.iterdir()) if root.is_dir() else []:
        total = 0
        paths = [top] if top.is_file() else [p for p in top.rglob("*") if p.is_file()]
        for path in paths:
            info = path.lstat()
            if (info.st_dev, info.st_ino) not in seen:
                seen.add((info.st_dev, info.st_ino))
                total += info.st_size
        usage[top.name] = total
    return usage


def disk_line(root: Path) -> str:
    """What a swarm's working directory holds, largest first: for the end of a run."""
    usage = disk_usage(root)
    parts = ", ".join(
        f"{name} {size / 1e9:.2f}" for name, size in sorted(usage.items(), key=lambda x: -x[1])
    )
    return f"disk: {root} holds {sum(usage.values()) / 1e9:.2f} GB ({parts})"
