"""Rebuilding a peer's question where its cost can be stopped.

A peer picks the task config behind its rows, and what a reasoning-gym generator costs is not
a function any per-field bound can see: `tower_of_hanoi` with three pegs writes out all
``2**disks - 1`` moves of its answer (each disk doubles time and memory, and 70 disks pass a
bound of 10x a node's own 7), `propositional_logic` checks each candidate conclusion against a
``2**vars`` truth table. So the node rebuilds, and scores answers against, a peer's question
in a worker process with its address space capped, and kills the worker when one question
overruns a wall-clock timeout. The worker is started once and reused (it keeps reasoning-gym
imported and its built datasets cached, as the node does), so an honest question costs one
round trip over a pipe.

What crosses the pipe is small and fixed in kind: the four task fields and the answers to
score go in; digests of the rebuilt question and answer and one score per answer come back.
A rebuilt question of any size never enters the node's memory.

Run as ``python -m sapo_core.rebuild MEMORY_MB NODE_PID``, this module is the worker.
"""

from __future__ import annotations

import atexit
import enum
import hashlib
import json
import logging
import os
import resource
import select
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Final

from sapo_core.tasks import Question, dataset, entry

log = logging.getLogger(__name__)

UNJUDGED: Final = "unjudged: "
"""How a verdict that says nothing about the peer begins (the node's own budget ran short,
its worker did not start, a task it has no use for): its reputation ignores the row."""

START_TIMEOUT_S = 120.0
"""How long a new worker may take to import reasoning-gym and say it is ready."""

MAX_REPLY_BYTES = 1 << 20
"""The longest reply line the node reads from a worker (a reply is digests and scores)."""


class _Gone(enum.Enum):
    DIED = "the worker died before it answered"
    EOF = "the worker's output ended"


_DIED, _EOF = _Gone.DIED, _Gone.EOF
PARENT_CHECK_S = 0.5


@dataclass(frozen=True)
class Rebuilt:
    """A question as the worker rebuilt it: digests of its text and answer, and the score
    (in [0, 1]) of each answer it was asked about, in order."""

    question_sha256: str
    answer_sha256: str | None
    scores: tuple[float, ...]

    def problem(self, q: Question) -> str | None:
        """Why ``q``'s shipped question or answer is not the rebuilt one, or None."""
        if digest(q.question) != self.question_sha256:
            return "question differs from the regenerated one"
        if (None if q.answer is None else digest(q.answer)) != self.answer_sha256:
            return "answer differs from the regenerated ground truth"
        return None


def digest(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


def score_answer(data: Any, truth: dict[str, Any], answer: str | None) -> float:
    """reasoning-gym's score of one answer, clamped to [0, 1]. A verifier that raises on odd
    text scores it wrong, not the node; running out of memory is not odd text, and raises."""
    try:
        correct = float(data.score_answer(answer, truth))
    except MemoryError:
        raise
    except Exception as exc:
        log.debug("verifier raised on %r: %s", answer, exc)
        correct = 0.0
    return min(max(correct, 0.0), 1.0)


def rebuild_and_score(
    task: str, task_config: str, task_seed: int, task_index: int, answers: Sequence[str | None]
) -> Rebuilt:
    """Rebuild one question and score ``answers`` against it (raises TaskError). What the
    worker runs; in-process it would be unbounded."""
    data = dataset(task, task_config, task_seed)
    truth = entry(task, task_config, task_seed, task_index)
    gold = truth.get("answer")
    return Rebuilt(
        digest(str(truth["question"])),
        None if gold is None else digest(str(gold)),
        tuple(score_answer(data, truth, a) for a in answers),
    )


def _quoted(text: str) -> str:
    """A generator's error about a peer's config, as inert text (it may quote the config:
    control characters escaped as ``repr`` writes them), at most 500 characters."""
    return repr(text)[1:-1][:500]


def _caused_by_memory(exc: BaseException) -> bool:
    while exc is not None:
        if isinstance(exc, MemoryError):
            return True
        exc = exc.__cause__ or exc.__context__  # type: ignore[assignment]
    return False


# -- the node's side -------------------------------------------------------------------------


class Rebuilder:
    """A worker process that rebuilds peers' questions under a time and memory budget.

    Started on first use and reused; a worker that overran a budget or died is replaced
    at once (its replacement imports while the node goes on). Safe to share between threads:
    questions are rebuilt one at a time.
    """

    def __init__(self, timeout_s: float, memory_mb: int) -> None:
        self.timeout_s = timeout_s
        self.memory_mb = memory_mb
        self._lock = threading.Lock()
        self._proc: subprocess.Popen[bytes] | None = None
        self._ready = False
        self._buffer = b""
        self._last_exit: int | None = None
        """The exit status of the last worker stopped (what a death is reported with)."""

    @property
    def pid(self) -> int | None:
        """The current worker's process id (None before the first start)."""
        return None if self._proc is None else self._proc.pid

    def check(
        self, q: Question, answers: Sequence[str | None], timeout_s: float | None = None
    ) -> Rebuilt | str:
        """Rebuild ``q`` from its four task fields and score ``answers`` against it, or say
        why not (a problem as a Verdict carries it). ``timeout_s`` lowers this rebuilder's
        timeout for this question (what is left of a round's verification budget)."""
        limit = self.timeout_s if timeout_s is None else min(timeout_s, self.timeout_s)
        request = {
            "task": q.task,
            "task_config": q.task_config,
            "task_seed": q.task_seed,
            "task_index": q.task_index,
            "answers": list(answers),
        }
        with self._lock:
            # A worker that died while idle (killed from outside, out of memory) is no
            # verdict on this question: it is asked once more of a fresh worker. One that
            # dies on a question it was started for has answered.
            reused = self._ready
            outcome = self._ask(request, limit, len(answers))
            if outcome is _DIED and reused:
                outcome = self._ask(request, limit, len(answers))
            if isinstance(outcome, _Gone):
                return self._replace(f"refused: the rebuild worker died ({self._exit()})")
            return outcome

    def _ask(self, request: dict[str, Any], limit: float, asked: int) -> Rebuilt | str | _Gone:
        """One request to a started worker: its answer, a problem, or ``_DIED``."""
        problem = self._start()
        if problem:
            return problem
        assert self._proc is not None and self._proc.stdin is not None
        try:
            self._proc.stdin.write(json.dumps(request).encode() + b"\n")
            self._proc.stdin.flush()
        except OSError:
            self._stop()
            return _DIED
        reply = self._read_line(time.monotonic() + limit)
        if reply is _EOF:
            self._stop()
            return _DIED
        if reply is None:
            if limit < self.timeout_s:  # the round's budget ran short, not the question
                return self._replace(f"{UNJUDGED}the verification budget ran out ({limit:.3g} s)")
            return self._replace(f"refused: rebuilding the question took more than {limit:g} s")
        assert isinstance(reply, bytes)
        return self._answer(reply, asked)

    def close(self) -> None:
        """Stop the worker (a later check starts another)."""
        with self._lock:
            self._stop()

    # The methods below run under self._lock.

    def _answer(self, reply: bytes, asked: int) -> Rebuilt | str:
        try:
            message = json.loads(reply)
            if "memory" in message:
                return self._replace(
                    f"refused: rebuilding the question took more than {self.memory_mb} MB"
                )
            if "problem" in message:
                return f"unverifiable: {message['problem']}"
            rebuilt = Rebuilt(
                str(message["question_sha256"]),
                None if message["answer_sha256"] is None else str(message["answer_sha256"]),
                tuple(float(s) for s in message["scores"]),
            )
        except (ValueError, KeyError, TypeError) as exc:
            return self._replace(f"refused: the rebuild worker's reply is garbled ({exc})")
        if len(rebuilt.scores) != asked:
            return self._replace("refused: the rebuild worker's reply is garbled (scores)")
        return rebuilt

    def _start(self) -> str | None:
        """Start a worker if none runs and wait until it is ready; a problem, or None."""
        if self._proc is None or self._proc.poll() is not None:
            self._spawn()
        if self._ready:
            return None
        line = self._read_line(time.monotonic() + START_TIMEOUT_S)
        if not isinstance(line, bytes) or not line.startswith(b'{"ready"'):
            self._stop()
            return f"{UNJUDGED}the rebuild worker did not start"
        if not json.loads(line)["ready"]:
            log.warning("the rebuild worker runs without a memory cap on this platform")
        self._ready = True
        return None

    def _spawn(self) -> None:
        package_root = str(Path(__file__).resolve().parents[1])
        path = os.pathsep.join(p for p in (package_root, os.environ.get("PYTHONPATH")) if p)
        self._proc = subprocess.Popen(
            # -P: the current folder is not put on the path, so a folder named like a
            # package where the node was started cannot stand in for it.
            [
                sys.executable,
                "-P",
                "-m",
                "sapo_core.rebuild",
                str(self.memory_mb),
                str(os.getpid()),
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env={**os.environ, "PYTHONPATH": path},
            close_fds=True,
        )
        self._ready = False
        self._buffer = b""

    def _replace(self, problem: str) -> str:
        """Kill the worker and start its replacement (not waited for); returns ``problem``."""
        self._stop()
        self._spawn()
        log.warning("rebuild worker replaced: %s", problem)
        return problem

    def _stop(self) -> None:
        if self._proc is not None:
            if self._proc.poll() is None:
                self._proc.kill()
            self._last_exit = self._proc.wait()
            for pipe in (self._proc.stdin, self._proc.stdout):
                if pipe is not None:
                    pipe.close()
        self._proc = None
        self._ready = False
        self._buffer = b""

    def _exit(self) -> str:
        return f"exit status {self._last_exit}"

    def _read_line(self, deadline: float) -> bytes | _Gone | None:
        """One line from the worker before ``deadline``; ``_EOF`` at the end of its output
        (it died); None on timeout or a line longer than MAX_REPLY_BYTES."""
        assert self._proc is not None and self._proc.stdout is not None
        fd = self._proc.stdout.fileno()
        while b"\n" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0 or len(self._buffer) > MAX_REPLY_BYTES:
                return None
            readable, _, _ = select.select([fd], [], [], left)
            if not readable:
                return None
            chunk = os.read(fd, 65536)
            if not chunk:
                return _EOF
            self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        return line


_shared: dict[tuple[float, int], Rebuilder] = {}
_shared_lock = threading.Lock()


def shared(timeout_s: float, memory_mb: int) -> Rebuilder:
    """The process's rebuilder for these budgets: one worker however many nodes or calls
    verify peers' rows in this process (stopped at exit)."""
    with _shared_lock:
        if not _shared:
            atexit.register(close_shared)
        key = (timeout_s, memory_mb)
        if key not in _shared:
            _shared[key] = Rebuilder(timeout_s, memory_mb)
        return _shared[key]


def close_shared() -> None:
    """Stop the workers of every shared rebuilder (a later use starts one again)."""
    for rebuilder in _shared.values():
        rebuilder.close()


# -- the worker's side -----------------------------------------------------------------------


def _vm_bytes(field: str) -> int | None:
    """This process's ``field`` of /proc/self/status (VmSize, VmPeak) in bytes, or None."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(f"{field}:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def _cap_address_space(memory_mb: int) -> int | None:
    """Cap this process's address space at what it holds now plus ``memory_mb``, so a rebuild
    past it fails; the cap in bytes, or None where the platform cannot (no /proc or
    RLIMIT_AS)."""
    size = _vm_bytes("VmSize")
    if size is None:
        return None
    try:
        _, hard = resource.getrlimit(resource.RLIMIT_AS)
        cap = size + memory_mb * 2**20
        if hard != resource.RLIM_INFINITY:
            cap = min(cap, hard)
        resource.setrlimit(resource.RLIMIT_AS, (cap, hard))
    except (OSError, ValueError, AttributeError):
        return None
    return cap


def _ran_into(cap: int | None, memory_mb: int, peak_before: int | None) -> bool:
    """Whether the request just failed came within a tenth of ``memory_mb`` of the cap: a
    failed allocation surfaces as MemoryError, or as whatever C code makes of it (a
    SystemError 'error return without exception set', an error the task wraps)."""
    peak = _vm_bytes("VmPeak")
    if cap is None or peak is None or peak_before is None or peak <= peak_before:
        return False
    return peak >= cap - memory_mb * 2**20 // 10


def _die_with_parent(parent: int) -> None:
    """End this worker when the node is gone, even mid-rebuild: a thread checks its parent
    every ``PARENT_CHECK_S`` (PR_SET_PDEATHSIG would fire when the *thread* that started the
    worker ends, and nodes verify in task threads that come and go)."""

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(PARENT_CHECK_S)
        os._exit(1)

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()


def _serve(memory_mb: int, parent: int) -> None:
    """Answer requests, one JSON line each, until the node closes the pipe."""
    _die_with_parent(parent)
    # Replies go on a private copy of stdout; what reasoning-gym prints goes to stderr.
    replies: IO[bytes] = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    import reasoning_gym  # noqa: F401  (imported once, before the cap)

    dataset("chain_sum", "{}", 0)  # warm: what every build needs is loaded before the cap
    cap = _cap_address_space(memory_mb)
    replies.write(json.dumps({"ready": cap is not None}).encode() + b"\n")
    replies.flush()
    for line in sys.stdin.buffer:
        replies.write(json.dumps(_reply(line, cap, memory_mb)).encode() + b"\n")
        replies.flush()


def _reply(line: bytes, cap: int | None, memory_mb: int) -> dict[str, Any]:
    """The worker's answer to one request line."""
    try:
        request = json.loads(line)
        fields = (
            str(request["task"]),
            str(request["task_config"]),
            int(request["task_seed"]),
            int(request["task_index"]),
            [None if a is None else str(a) for a in request["answers"]],
        )
    except (ValueError, KeyError, TypeError) as exc:
        return {"problem": _quoted(f"bad request: {exc}")}
    peak_before = _vm_bytes("VmPeak")
    try:
        rebuilt = rebuild_and_score(*fields)
    except MemoryError:
        return {"memory": True}
    except Exception as exc:  # TaskError, or what a generator raised under the cap
        if _caused_by_memory(exc) or _ran_into(cap, memory_mb, peak_before):
            return {"memory": True}
        return {"problem": _quoted(str(exc))}
    return {
        "question_sha256": rebuilt.question_sha256,
        "answer_sha256": rebuilt.answer_sha256,
        "scores": list(rebuilt.scores),
    }


if __name__ == "__main__":
    _serve(int(sys.argv[1]), int(sys.argv[2]))
