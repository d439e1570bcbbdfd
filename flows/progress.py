"""Progress of rounds and generation, for one node or for a whole local swarm.

A node reports events (a round starts, a step starts, completions finish, a round ends).
Under `sapo swarm` the launcher owns the terminal: each node writes its events to stdout as
marker lines that the launcher turns into one rounds bar and one generation bar per node.
A node run alone on a terminal draws the same bars itself; anywhere else (logs, CI) events
are dropped and only the one-line round summaries are printed.
"""

from __future__ import annotations

import json
import os
import sys
import threading
from collections.abc import Callable
from types import TracebackType
from typing import Any

# Set by the launcher for its node processes: "lines" means "write events to stdout".
PROGRESS_ENV = "SAPO_PROGRESS"
MARKER = "@sapo-progress "

Event = dict[str, Any]


def parse(line: str) -> Event | None:
    """The event a marker line carries, or None for an ordinary output line."""
    if not line.startswith(MARKER):
        return None
    try:
        event = json.loads(line[len(MARKER) :])
    except json.JSONDecodeError:
        return None
    return event if isinstance(event, dict) and "node" in event else None


def _label(node: str, round_: int, total: Any, step: str) -> str:
    """The bar's label: rounds numbered from 0 as in the logs and the ledger, with how many
    of the total this one makes."""
    of = f" ({round_ + 1} of {int(total)})" if total else ""
    return f"{node} round {round_}{of}: {step}"


class SwarmProgress:
    """Rich progress bars: per node, rounds done and this round's completions."""

    def __init__(self, *, enabled: bool | None = None) -> None:
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

        console = Console(file=sys.stderr)
        self.enabled = console.is_terminal if enabled is None else enabled
        self.progress = Progress(
            TextColumn("{task.description:<34}"),
            BarColumn(),
            MofNCompleteColumn(),
            console=console,
            disable=not self.enabled,
            transient=False,
        )
        self._rounds: dict[str, Any] = {}
        self._generation: dict[str, Any] = {}
        self._lock = threading.Lock()

    def __enter__(self) -> SwarmProgress:
        self.progress.start()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.progress.stop()

    def _tasks(self, node: str) -> tuple[Any, Any]:
        with self._lock:
            if node not in self._rounds:
                self._rounds[node] = self.progress.add_task(f"{node} rounds", total=None)
                self._generation[node] = self.progress.add_task(f"{node} generate", total=None)
            return self._rounds[node], self._generation[node]

    def update(self, event: Event) -> None:
        """Move the bars of the event's node."""
        node = str(event["node"])
        rounds, generation = self._tasks(node)
        kind = event.get("event")
        if kind == "round":
            stop, round_ = int(event["stop"]), int(event["round"])
            self.progress.update(
                rounds,
                total=stop,
                completed=round_,
                description=_label(node, round_, stop, "generate"),
            )
            self.progress.reset(generation, total=None)
        elif kind == "step":
            round_ = int(event["round"])
            total = self.progress.tasks[rounds].total
            self.progress.update(
                rounds, description=_label(node, round_, total, str(event["step"]))
            )
        elif kind == "generate":
            self.progress.update(
                generation, total=int(event["total"]), completed=int(event["done"])
            )
        elif kind == "done":
            self.progress.update(rounds, completed=int(event["round"]) + 1)

    def feed(self, node: str, line: str, out: Callable[[str], None]) -> None:
        """One line of a node's output: an event moves a bar, anything else is printed."""
        event = parse(line)
        if event is None:
            out(f"[{node}] {line}")
        elif self.enabled:
            self.update(event)


class NodeProgress:
    """What a node's runtime calls; where the events go depends on how the node runs."""

    def __init__(
        self,
        node_id: str,
        sink: Callable[[Event], None] | None,
        display: SwarmProgress | None = None,
    ) -> None:
        self.node_id = node_id
        self._sink = sink
        self._display = display
        self._watchers: list[Callable[[Event], None]] = []

    @classmethod
    def for_process(cls, node_id: str) -> NodeProgress:
        """Marker lines under the launcher, own bars on a terminal, nothing otherwise."""
        if os.environ.get(PROGRESS_ENV) == "lines":
            return cls(node_id, _print_marker)
        if sys.stderr.isatty():
            display = SwarmProgress(enabled=True)
            display.progress.start()
            return cls(node_id, display.update, display)
        return cls(node_id, None)

    def close(self) -> None:
        if self._display is not None:
            self._display.progress.stop()

    def watch(self, watcher: Callable[[Event], None]) -> None:
        """Also hand every event to `watcher`, however the node runs (the run's
        watchdog, flows/node/watchdog.py, takes each one as progress)."""
        self._watchers.append(watcher)

    def emit(self, event: str, **fields: Any) -> None:
        message = {"node": self.node_id, "event": event, **fields}
        if self._sink is not None:
            self._sink(message)
        for watcher in self._watchers:
            watcher(message)

    def generation(self, done: int, total: int) -> None:
        self.emit("generate", done=done, total=total)


def _print_marker(event: Event) -> None:
    print(MARKER + json.dumps(event, separators=(",", ":")), flush=True)
