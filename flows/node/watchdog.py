"""A node run that stops making progress while its process lives is ended, so that its
node's next scheduled run can go.

A deployed node run beats every 30 s from a thread of its own (flows/services/deploy.py), and the
server marks it Crashed when the beats stop: its process or machine is gone. A run that
hangs (a deadlocked step, a storage call that never returns, a verifier that loops) keeps
beating, and keeps its node's one-run slot for ever. So the run watches itself: every step
begun, every completion generated, every round ended is progress (`NodeProgress` events),
and a thread checks that some came within `stall_timeout_s`. When none did, it says where
the run hung (`no progress for 1800 s in step sample of round 4`), prints every thread's
stack, marks the run, its round and their running tasks Crashed with that message, and
ends the process with STALL_EXIT_CODE. Marking Crashed frees the node's slot; ending the
process frees its folder and its memory (a run marked from the server alone would live on
beside the next one); the next run resumes from the checkpoint.

Why in the run and not a server rule on progress events: the server can mark a run but not
end its process, and the case a server rule would add, a process hung in C code that holds
the GIL, stops the heartbeat thread too, which the heartbeat automation already catches.
That process is ended here by a backstop that needs no GIL (`faulthandler`'s timer, re-armed
at each check): it dumps the stacks and exits with status 1 a minute after the stall.

The decision is plain functions (`advance`, `stall`); `Watchdog` runs it on a thread;
`end_hung_run` is the side effect (Prefect, the process), at the edge.
"""

from __future__ import annotations

import contextvars
import faulthandler
import logging
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any
from uuid import UUID

log = logging.getLogger(__name__)

STALL_EXIT_CODE = 75
"""How a process the watchdog ended exits (EX_TEMPFAIL: try again; the next run does)."""
MARK_TIMEOUT_S = 30.0
"""How long the watchdog waits for the Prefect API to take the Crashed states."""
BACKSTOP_S = MARK_TIMEOUT_S + 30.0
"""How long after a stall the GIL-free backstop ends a process the watchdog could not."""
OPENING = "opening the node"
HANG_AT_ENV = "SAPO_TEST_HANG_AT"
"""Fault injection for tests: ``<step>:<round>`` makes a node block for ever on entering
that step of that round, its other threads (heartbeats, the watchdog) running; the
counterpart of flows/node/steps.py's SAPO_TEST_KILL_AT."""

Event = Mapping[str, Any]


@dataclass(frozen=True)
class Mark:
    """The node's last progress: when (monotonic seconds), in which step or phase."""

    at: float
    step: str
    round: int | None = None
    detail: str = ""

    def where(self) -> str:
        if self.round is None:
            return self.step
        where = {
            "round": f"round {self.round}, before its first step",
            "done": f"round {self.round}, after its last step",
        }.get(self.step, f"step {self.step} of round {self.round}")
        return f"{where} ({self.detail})" if self.detail else where


def advance(mark: Mark, event: Event, at: float) -> Mark:
    """The mark after a progress event (flows/progress.py's): any event is progress; a
    step or round event also says where the node is now."""
    kind = event.get("event")
    if kind == "step":
        return Mark(at, str(event["step"]), int(event["round"]))
    if kind in ("round", "done"):
        return Mark(at, str(kind), int(event["round"]))
    if kind == "generate":
        return Mark(at, mark.step, mark.round, f"{event['done']} of {event['total']} completions")
    return Mark(at, mark.step, mark.round, mark.detail)


def allowed_s(mark: Mark, timeout_s: float, grace: Mapping[str, float]) -> float:
    """How long the node may go without progress in the mark's step: the timeout, and the
    step's grace (the sample step may wait peer_wait_s for peers on top)."""
    return timeout_s + grace.get(mark.step, 0.0)


def stall(mark: Mark, now: float, timeout_s: float, grace: Mapping[str, float]) -> str | None:
    """Why the node is stalled (no progress for longer than it is allowed), or None."""
    idle = now - mark.at
    if idle < allowed_s(mark, timeout_s, grace):
        return None
    return f"no progress for {idle:.0f} s in {mark.where()}"


class Watchdog:
    """Calls `on_stall` once, from its thread, when no progress came in time.

    `saw` (a progress event) and `entering` (a phase outside the rounds) are what the node
    calls; `check` is one look at the clock (the thread's, and tests'). With `backstop_s`,
    each check also re-arms faulthandler's timer to end the process `backstop_s` after the
    stall, should this thread never get to run again."""

    def __init__(
        self,
        timeout_s: float,
        on_stall: Callable[[str], None],
        *,
        grace: Mapping[str, float] | None = None,
        backstop_s: float | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.timeout_s = timeout_s
        self.check_every_s = min(5.0, max(timeout_s / 10, 0.05))
        self._on_stall = on_stall
        self._grace = dict(grace or {})
        self._backstop_s = backstop_s
        self._clock = clock
        self._lock = threading.Lock()
        self._mark = Mark(clock(), OPENING)
        self._stopped = threading.Event()
        self._thread: threading.Thread | None = None

    def saw(self, event: Event) -> None:
        with self._lock:
            self._mark = advance(self._mark, event, self._clock())
        _hang_if_asked(event)

    def entering(self, phase: str) -> None:
        with self._lock:
            self._mark = Mark(self._clock(), phase)

    @property
    def mark(self) -> Mark:
        with self._lock:
            return self._mark

    def check(self) -> str | None:
        mark, now = self.mark, self._clock()
        why = stall(mark, now, self.timeout_s, self._grace)
        if self._backstop_s is not None:
            left = 0.0 if why else allowed_s(mark, self.timeout_s, self._grace) - (now - mark.at)
            faulthandler.dump_traceback_later(
                max(left, 0.0) + self._backstop_s, exit=True, file=_stderr()
            )
        return why

    def start(self) -> Watchdog:
        self.check()  # arms the backstop before the first wait
        # In a copy of this context: the thread sees the flow run's Prefect settings.
        context = contextvars.copy_context()
        self._thread = threading.Thread(
            target=context.run, args=(self._watch,), name="sapo-watchdog", daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stopped.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=10)
        if self._backstop_s is not None:
            faulthandler.cancel_dump_traceback_later()

    def _watch(self) -> None:
        while not self._stopped.wait(self.check_every_s):
            why = self.check()
            if why is not None:
                self._on_stall(why)
                return


@contextmanager
def watching(
    timeout_s: float | None, *, grace: Mapping[str, float] | None = None
) -> Iterator[Watchdog]:
    """A watchdog over the flow run this is called in, for as long as the block runs; a
    stall ends the run and the process (`end_hung_run`). With `timeout_s` None it takes
    progress and never checks it."""
    if timeout_s is None:
        yield Watchdog(float("inf"), lambda why: None)
        return
    run_id = current_flow_run_id()
    dog = Watchdog(
        timeout_s, lambda why: end_hung_run(run_id, why), grace=grace, backstop_s=BACKSTOP_S
    )
    dog.start()
    try:
        yield dog
    finally:
        dog.stop()


def current_flow_run_id() -> UUID | None:
    from prefect.context import FlowRunContext

    context = FlowRunContext.get()
    return context.flow_run.id if context is not None and context.flow_run else None


def end_hung_run(
    flow_run_id: UUID | None, why: str, mark_timeout_s: float = MARK_TIMEOUT_S
) -> None:
    """Say why, show where every thread is, mark the run Crashed and end the process."""
    print(f"sapo: {why}; ending this run (exit status {STALL_EXIT_CODE})", file=sys.stderr)
    sys.stderr.flush()
    faulthandler.dump_traceback(file=_stderr(), all_threads=True)
    if flow_run_id is not None:
        # On a thread of its own: a Prefect API that does not answer must not keep the
        # process alive (the run is then marked when its heartbeats stop).
        marking = threading.Thread(
            target=contextvars.copy_context().run,
            args=(_mark_crashed, flow_run_id, why),
            name="sapo-watchdog-mark",
            daemon=True,
        )
        marking.start()
        marking.join(timeout=mark_timeout_s)
    sys.stderr.flush()
    sys.stdout.flush()
    os._exit(STALL_EXIT_CODE)


def _mark_crashed(flow_run_id: UUID, why: str) -> None:
    """The run, its running subflow runs (the round) and their running tasks: Crashed."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas import filters
    from prefect.client.schemas.objects import StateType
    from prefect.states import Crashed

    running = [StateType.RUNNING]
    try:
        with get_client(sync_client=True) as client:
            rounds = client.read_flow_runs(
                flow_run_filter=filters.FlowRunFilter(
                    parent_flow_run_id=filters.FlowRunFilterParentFlowRunId(any_=[flow_run_id]),
                    state=filters.FlowRunFilterState(
                        type=filters.FlowRunFilterStateType(any_=running)
                    ),
                )
            )
            runs = [run.id for run in rounds] + [flow_run_id]
            tasks = client.read_task_runs(
                flow_run_filter=filters.FlowRunFilter(id=filters.FlowRunFilterId(any_=runs)),
                task_run_filter=filters.TaskRunFilter(
                    state=filters.TaskRunFilterState(
                        type=filters.TaskRunFilterStateType(any_=running)
                    )
                ),
            )
            for task_run in tasks:
                client.set_task_run_state(task_run.id, Crashed(message=why))
            for run_id in runs:  # the node's run last: its slot frees when all is marked
                client.set_flow_run_state(run_id, Crashed(message=why))
    except Exception as exc:  # the process ends anyway; its heartbeats stop
        log.warning("could not mark the hung run %s Crashed: %s", flow_run_id, exc)


def _stderr() -> Any:
    """Where faulthandler writes (it needs a file descriptor): this process's stderr,
    also where a test's capture replaced `sys.stderr` with an object that has none."""
    try:
        sys.stderr.fileno()
        return sys.stderr
    except (AttributeError, ValueError, OSError):
        return sys.__stderr__


def _hang_if_asked(event: Event) -> None:
    wanted = os.environ.get(HANG_AT_ENV)
    if wanted and event.get("event") == "step" and wanted == f"{event['step']}:{event['round']}":
        print(f"sapo: hanging in step {wanted} ({HANG_AT_ENV})", file=sys.stderr, flush=True)
        threading.Event().wait()
