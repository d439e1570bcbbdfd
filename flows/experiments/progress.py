"""A sweep's progress file: which runs started, finished, failed or were skipped, and when.

A sweep of many hours outlives sessions and machines; `<workdir>/progress.json` tells
whoever resumes it where it stands, and how long each run took (`wall_times`): the
interrupted attempts (a start with no end before the next start) are counted, not timed.
The file stays on its machine; each run's record keeps its wall time too (`run_walls`), so
a sweep resumed on a new machine still knows what its earlier runs took, and the machines
its attempts started on (`run_machines`): machines differ in what a seed computes.
"""

from __future__ import annotations

import functools
import json
import math
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from flows.node.files import write_atomically

if TYPE_CHECKING:  # the sweep's plan reads this module: no cycle at run time
    from flows.experiments.sweep import ExperimentConfig

ENDS = ("finished", "failed")


PROGRESS_FILE = "progress.json"


def progress_path(exp: ExperimentConfig) -> Path:
    """`<workdir>/progress.json`, or `progress-<experiment>.json` for a second experiment
    sharing the working directory (each file counts one experiment's runs)."""
    path = exp.workdir_path() / PROGRESS_FILE
    try:
        owner = json.loads(path.read_text()).get("experiment")
    except (OSError, ValueError, AttributeError):
        owner = None
    if owner in (None, exp.experiment):
        return path
    return path.with_name(f"progress-{exp.experiment}.json")


def record_progress(exp: ExperimentConfig, swarm_id: str, event: str, **facts: Any) -> Path:
    """Note in the experiment's progress file that a run started, finished or was skipped,
    with the time: whoever resumes a sweep of many hours sees where it stands, which runs
    took how long and which were interrupted (started again without a finish in between).
    A file that is not such a record (torn, foreign) is started over."""
    path = progress_path(exp)
    try:
        progress = json.loads(path.read_text())
    except (OSError, ValueError):
        progress = {}
    runs = progress.get("runs") if isinstance(progress, dict) else None
    if not isinstance(runs, dict) or not all(isinstance(e, dict) for e in runs.values()):
        progress = {"experiment": exp.experiment, "runs": {}}
    labels = exp.replicates()
    entry = progress["runs"].setdefault(swarm_id, {})
    if swarm_id in labels:
        entry["configuration"], entry["seed"] = labels[swarm_id]
    now = datetime.now(UTC).isoformat(timespec="seconds")
    if event == "started":
        facts = {"machine": machine(), **facts}
    entry.setdefault("events", []).append({"event": event, "at": now, **facts})
    entry["state"] = event
    done = sum(
        1
        for run_id, e in progress["runs"].items()
        if run_id in labels and e.get("state") in ("finished", "skipped")
    )
    progress["summary"] = f"{done} of {len(labels)} runs done; last update {now}"
    write_atomically(path, json.dumps(progress, indent=1, sort_keys=True) + "\n")
    return path


def read_progress(exp: ExperimentConfig) -> dict[str, Any]:
    """The experiment's progress file, or an empty one where there is none (or it is torn)."""
    try:
        progress = json.loads(progress_path(exp).read_text())
    except (OSError, ValueError):
        return {}
    return progress if isinstance(progress, dict) else {}


def run_state(exp: ExperimentConfig, swarm_id: str) -> str | None:
    """The last event of a run in the progress file (``started``, ``finished``, ...), or None
    where the file has no such run (or is torn, or hand-edited out of shape)."""
    runs = read_progress(exp).get("runs")
    entry = runs.get(swarm_id) if isinstance(runs, dict) else None
    state = entry.get("state") if isinstance(entry, dict) else None
    return state if isinstance(state, str) else None


@functools.cache
def machine() -> str:
    """What a run's numbers depend on beyond its code and seed: the processor (and GPU), and
    whether bf16 is native there, where generation samples from a bf16 copy of the weights
    by default (`compute.generation_precision: auto`), so its completions and their
    log-probs differ from an fp32 machine's."""
    import torch

    from sapo_core.policy.loading import native_bf16

    cpu = "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    parts = [cpu, "bf16 native" if native_bf16("cpu") else "no native bf16"]
    if torch.cuda.is_available():
        parts.append(torch.cuda.get_device_name(0))
    return "; ".join(parts)


def run_machines(progress: dict[str, Any]) -> dict[str, list[str]]:
    """Per run, the machines its attempts started on, in order, each once."""
    out: dict[str, list[str]] = {}
    for swarm_id, entry in (progress.get("runs") or {}).items():
        events = entry.get("events") if isinstance(entry, dict) else None
        for event in events if isinstance(events, list) else []:
            if not isinstance(event, dict):
                continue  # a hand-edited or torn entry: the others still count
            name = event.get("machine")
            if event.get("event") == "started" and isinstance(name, str):
                seen = out.setdefault(swarm_id, [])
                if name not in seen:
                    seen.append(name)
    return out


def wall_times(progress: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Per run: ``seconds`` from its last start to the finish or failure that ended it (None
    while it runs or when it was interrupted), ``attempts`` (starts) and ``interrupted``
    (starts that no finish or failure followed before the next start or the file's end,
    the current attempt of a running sweep included)."""
    out = {}
    for swarm_id, entry in (progress.get("runs") or {}).items():
        events = entry.get("events") if isinstance(entry, dict) else None
        if not isinstance(events, list):
            continue
        attempts = interrupted = 0
        started: datetime | None = None
        seconds = None
        for event in events:
            if not isinstance(event, dict):
                continue  # a hand-edited or torn entry: the others still count
            kind, at = event.get("event"), _time(event.get("at"))
            if kind == "started":
                attempts += 1
                interrupted += started is not None  # the previous start never ended
                started, seconds = at, None
            elif kind in ENDS and started is not None:
                seconds = (at - started).total_seconds() if at is not None else None
                started = None
        interrupted += started is not None
        out[swarm_id] = {"seconds": seconds, "attempts": attempts, "interrupted": interrupted}
    return out


def run_walls(exp: ExperimentConfig, records: Path | None = None) -> dict[str, dict[str, Any]]:
    """Per run, its wall time (as ``wall_times``) from this machine's progress file, or, for
    a run this machine never timed to its end (never started here, or stopped here and
    finished elsewhere), from its record in ``records``, written where it ran."""
    from analysis.record_folders import record_manifest

    times = wall_times(read_progress(exp))
    if records is None:
        return times
    for swarm_id in exp.replicates():
        if times.get(swarm_id, {}).get("seconds") is None:
            kept = _as_wall(record_manifest(records, swarm_id).get("wall"))
            if kept is not None:
                times[swarm_id] = kept
    return times


def _as_wall(value: object) -> dict[str, Any] | None:
    """A recorded wall time, or None unless it is one ``wall_times`` could have written for a
    run that ended: a record is a committed file, and may have been edited."""
    if not isinstance(value, dict) or set(value) != {"seconds", "attempts", "interrupted"}:
        return None
    seconds, attempts, interrupted = value["seconds"], value["attempts"], value["interrupted"]
    if type(seconds) not in (int, float) or not math.isfinite(seconds) or seconds < 0:
        return None  # JSON's NaN and Infinity parse; booleans are ints to isinstance
    if type(attempts) is not int or type(interrupted) is not int:
        return None
    if not 0 <= interrupted < attempts:  # the attempt that ended was not interrupted
        return None
    return dict(value)


def _time(text: object) -> datetime | None:
    try:
        return datetime.fromisoformat(str(text))
    except ValueError:
        return None


def wall_label(times: dict[str, Any] | None) -> str:
    """A run's wall time for the plan: ``21.4 min`` (its last attempt, from start to end),
    ``unfinished`` (running, or stopped), ``-`` (never started), with ``(+N earlier)`` for
    the attempts before the last (stopped or failed: their minutes are not the run's)."""
    if not times or not times["attempts"]:
        return "-"
    seconds = times["seconds"]
    label = "unfinished" if seconds is None else f"{seconds / 60:.1f} min"
    earlier = times["attempts"] - 1
    return label + (f" (+{earlier} earlier)" if earlier else "")
