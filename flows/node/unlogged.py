"""Round metrics MLflow did not take (its server down, restarting or cut off), kept in the
node's folder and logged once a run takes them, each at its round's step and with the time
it was measured: a tracking outage loses no metric (issue 60).

One file per round, written whole (flows/node/files.py): a node killed between keeping and
logging logs that round on its next run. The round's table of sample completions and its
tags are not kept (docs/running.md, "What a fault costs").
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from flows.node.files import write_atomically

log = logging.getLogger(__name__)

FOLDER = "unlogged-metrics"

LogMetrics = Callable[[Mapping[str, float], int, int], bool]
"""Log ``metrics`` at ``step`` with ``timestamp_ms``; whether the store took them."""


@dataclass(frozen=True)
class UnloggedMetrics:
    """The rounds' metrics waiting for MLflow, under ``folder``."""

    folder: Path

    def keep(self, step: int, metrics: Mapping[str, float], timestamp_ms: int) -> None:
        record = {"step": step, "timestamp_ms": timestamp_ms, "metrics": dict(metrics)}
        name = f"step-{step:06d}-{timestamp_ms}.json"  # a step may be logged twice
        write_atomically(self.folder / name, json.dumps(record))

    def steps(self) -> list[int]:
        return [int(p.stem.split("-")[1]) for p in self._files()]

    def _files(self) -> list[Path]:
        return sorted(self.folder.glob("step-*.json")) if self.folder.is_dir() else []

    def replay(self, log_metrics: LogMetrics) -> int:
        """Log every kept round, oldest first, removing each once the store took it; stops
        at the first it refuses (the rest wait for the next try). The rounds logged."""
        logged = 0
        for path in self._files():
            try:
                record = json.loads(path.read_text())
                step, stamp = int(record["step"]), int(record["timestamp_ms"])
                metrics = {str(k): float(v) for k, v in record["metrics"].items()}
            except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
                log.warning("tracking: %s is unreadable, set aside: %s", path.name, exc)
                path.rename(path.with_suffix(".unreadable"))
                continue
            if not log_metrics(metrics, step, stamp):
                break
            path.unlink()
            logged += 1
        if logged:
            log.info("tracking: logged %d round(s) of metrics kept while MLflow was away", logged)
        return logged
