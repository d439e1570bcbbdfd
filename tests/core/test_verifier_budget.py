"""A peer cannot make the node's verifier pay an unbounded cost (issue 27, second round).

The attack: a task config within the node's per-field bounds whose question is exponential
to build. reasoning-gym's tower_of_hanoi with three pegs writes all 2**disks - 1 moves of its
answer; a node running it with 3 to 7 disks accepts up to 70, and 24 disks cost ~16 s and
~2.2 GB in process (each disk doubles both). The rebuild now runs in a worker process with a
timeout and an address-space cap.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from sapo_core.config import PAPER_SPECIALTIES, RewardConfig, TaskConfig, TaskSpec
from sapo_core.rebuild import Rebuilder
from sapo_core.rewards import ConfigBounds, score_group, score_groups
from sapo_core.rollouts import Group, Rollout
from sapo_core.tasks import Question, TaskSource, canonical_config
from tests.factories import rollout_of

HANOI = TaskSpec(name="tower_of_hanoi", config={"min_disks": 3, "max_disks": 7})
NODE = TaskConfig(specs=(*TaskConfig().specs, HANOI))


def _bounds(tasks: TaskConfig = NODE) -> ConfigBounds:
    return ConfigBounds.of({s.name: [s.config] for s in tasks.specs}, default=1000.0)


def _bomb(disks: int) -> Question:
    """A tower_of_hanoi question of ``disks`` disks on three pegs (its text and answer are
    claims the verifier never gets to compare)."""
    config = canonical_config({"min_disks": disks, "max_disks": disks, "max_pegs": 3})
    honest = TaskSource(TaskConfig(specs=(HANOI,)), seed=1).draw(0, 1)[0]
    return dataclasses.replace(honest, task_config=config)


def _group(q: Question, completions: list[str], node: str = "peer") -> Group:
    rows = tuple(rollout_of(q, c, node, j) for j, c in enumerate(completions))
    return Group(rows[0].group_id, "external", rows)


def _honest_groups(count: int = 12) -> list[Group]:
    """Peers' groups over the paper's tasks and tower_of_hanoi: a right answer, wrong ones,
    an untagged one, and a row whose shipped answer was tampered with."""
    groups = []
    for k, q in enumerate(TaskSource(NODE, seed=7).draw(0, count)):
        right = f"thinking <answer>{q.answer}</answer>"
        rows: list[Rollout] = [
            rollout_of(q, right, "peer", 0),
            rollout_of(q, "<answer>-1</answer>", "peer", 1),
            rollout_of(q, "no tags at all", "peer", 2),
            rollout_of(q, right, "peer", 3),
        ]
        if k % 3 == 0:
            rows.append(rollout_of(dataclasses.replace(q, answer="-1"), right, "peer", 4))
        groups.append(Group(rows[0].group_id, "external", tuple(rows)))
    return groups


def _peak_rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    pytest.skip("no /proc/self/status")


@pytest.fixture
def rebuilder() -> Iterator[Rebuilder]:
    worker = Rebuilder(timeout_s=1.0, memory_mb=1024)
    yield worker
    worker.close()


def _warm(worker: Rebuilder) -> None:
    """Start the worker outside the timed part (its start is a node's, once)."""
    q = TaskSource(NODE, seed=0).draw(0, 1)[0]
    assert not isinstance(worker.check(q, [q.answer]), str)


def test_an_exponential_config_within_bounds_is_stopped_at_the_timeout(rebuilder) -> None:
    bomb = _bomb(23)  # in process: ~7 s and ~1 GB here; each disk doubles both
    assert _bounds().problem(bomb.task, bomb.task_config) is None  # the bounds accept it
    _warm(rebuilder)
    first = rebuilder.pid
    peak_before = _peak_rss_mb()
    started = time.monotonic()
    config = RewardConfig(rebuild_timeout_s=1.0)
    scored, problems = score_group(
        _group(bomb, ["<answer>x</answer>"] * 4), config, _bounds(), rebuilder
    )
    elapsed = time.monotonic() - started
    assert scored is None and len(problems) == 4
    assert all("refused: rebuilding the question took more than 1 s" in p for p in problems)
    assert elapsed < 3.0  # a hang bound: the worker is killed at 1 s
    assert _peak_rss_mb() - peak_before < 100  # the question was never built here
    assert rebuilder.pid != first  # killed and replaced


@pytest.mark.slow  # kills and restarts the verifier's worker process
def test_a_rebuild_past_the_memory_cap_is_stopped() -> None:
    worker = Rebuilder(timeout_s=60.0, memory_mb=200)
    try:
        _warm(worker)
        started = time.monotonic()
        scored, problems = score_group(
            _group(_bomb(26), ["<answer>x</answer>"] * 2), RewardConfig(), _bounds(), worker
        )
        assert scored is None
        # Past the cap an allocation fails: the worker says so, or C code aborts it (then
        # the question is asked once more of a fresh worker, which dies the same way).
        capped = ("rebuilding the question took more than 200 MB", "the rebuild worker died")
        assert all(any(f"refused: {c}" in p for c in capped) for p in problems), problems
        assert time.monotonic() - started < 30.0  # well before the timeout
        q = TaskSource(NODE, seed=0).draw(0, 1)[0]
        assert not isinstance(worker.check(q, [q.answer]), str)  # a fresh worker answers
    finally:
        worker.close()


def test_a_task_the_node_does_not_run_is_refused_unbuilt(rebuilder) -> None:
    bounds = _bounds(TaskConfig())  # the paper's nine; no tower_of_hanoi
    honest_hanoi = TaskSource(TaskConfig(specs=(HANOI,)), seed=1).draw(0, 1)[0]
    scored, problems = score_group(
        _group(honest_hanoi, [f"<answer>{honest_hanoi.answer}</answer>"] * 3),
        RewardConfig(),
        bounds,
        rebuilder,
    )
    assert scored is None and len(problems) == 3
    assert all(
        "unjudged: task tower_of_hanoi is not one this node trains or is evaluated on" in p
        for p in problems
    )
    assert rebuilder.pid is None  # refused before any worker was asked


def test_a_task_config_nested_thousands_deep_is_refused_not_raised(rebuilder) -> None:
    """`[[[[...` 5,000 deep fits the ledger's 8,192-character bound on task_config; parsing
    it raised RecursionError out of the node's round, before the peer's reputation could
    count it, so every retried round drew the same group and crashed again."""
    honest = TaskSource(TaskConfig(), seed=1).draw(0, 1)[0]
    bomb = dataclasses.replace(honest, task_config="[" * 5000)
    scored, problems = score_group(
        _group(bomb, [f"<answer>{honest.answer}</answer>"] * 2),
        RewardConfig(),
        _bounds(),
        rebuilder,
    )
    assert scored is None and len(problems) == 2
    assert all("task_config nested too deeply to parse" in p for p in problems)
    assert rebuilder.pid is None  # refused before any worker was asked


def test_a_specialist_accepts_the_tasks_it_is_evaluated_on(rebuilder) -> None:
    # A specialist trains on chain_sum and learns tower_of_hanoi only from peers' groups:
    # tasks it is evaluated on are its own for verification.
    chain_sum = TaskSpec(name="chain_sum", config={"min_terms": 2, "max_terms": 2})
    bounds = ConfigBounds.for_node(
        TaskConfig(specs=(chain_sum,)), TaskConfig(specs=(chain_sum, HANOI)), 1000.0
    )
    q = TaskSource(TaskConfig(specs=(HANOI,)), seed=1).draw(0, 1)[0]
    scored, problems = score_group(
        _group(q, [f"<answer>{q.answer}</answer>", "<answer>no</answer>"]),
        RewardConfig(),
        bounds,
        rebuilder,
    )
    assert problems == [] and scored is not None and scored.rewards == (1.0, 0.0)
    untrained = ConfigBounds.for_node(TaskConfig(specs=(chain_sum,)), None, 1000.0)
    assert "not one this node trains or is evaluated on" in str(
        untrained.problem(q.task, q.task_config)
    )


def test_honest_groups_score_as_they_do_in_process(rebuilder) -> None:
    groups = _honest_groups()
    assert {g.question.task for g in groups} - set(PAPER_SPECIALTIES) <= {"tower_of_hanoi"}
    for config in (RewardConfig(), RewardConfig(format_weight=0.5, extraction="lenient")):
        here = [score_group(g, config) for g in groups]  # the in-process path, as before
        there = [score_group(g, config, _bounds(), rebuilder) for g in groups]
        assert [(s and s.rewards, p) for s, p in here] == [(s and s.rewards, p) for s, p in there]
        assert any(s is not None and s.rewards.count(1.0) >= 2 for s, _ in there)
        assert sum(len(p) for _, p in there) == 4  # the tampered rows, in both
    worker = rebuilder.pid
    score_groups(groups, RewardConfig(), rebuilder=rebuilder)  # own groups: never the worker
    assert rebuilder.pid == worker


def test_rows_of_another_question_in_a_peer_group_are_refused(rebuilder) -> None:
    q, other = TaskSource(NODE, seed=3).draw(0, 2)
    rows = (
        rollout_of(q, f"<answer>{q.answer}</answer>", "peer", 0),
        rollout_of(q, "<answer>-1</answer>", "peer", 1),
        rollout_of(other, f"<answer>{other.answer}</answer>", "peer", 2),
    )
    scored, problems = score_group(
        Group("peer.g", "external", rows), RewardConfig(), _bounds(), rebuilder
    )
    assert scored is not None and len(scored.rollouts) == 2
    assert problems == [f"{rows[2].rollout_id}: refused: row's question is not its group's"]


@pytest.mark.slow  # kills and restarts the verifier's worker process
def test_the_worker_recovers_after_a_kill(rebuilder) -> None:
    honest = _honest_groups(2)
    expected = [score_group(g, RewardConfig()) for g in honest]  # in process
    assert all(scored is not None for scored, _ in expected)
    timed_out, problems = score_group(
        _group(_bomb(28), ["<answer>x</answer>"] * 2), RewardConfig(), _bounds(), rebuilder
    )
    assert timed_out is None
    assert all("took more than 1 s" in p for p in problems)
    after_timeout = score_group(honest[0], RewardConfig(), _bounds(), rebuilder)
    assert after_timeout == expected[0]
    pid = rebuilder.pid
    assert pid is not None
    os.kill(pid, signal.SIGKILL)  # killed from outside, while idle: no verdict on a question
    after_kill = score_group(honest[1], RewardConfig(), _bounds(), rebuilder)
    assert after_kill == expected[1]
    assert rebuilder.pid != pid


def test_one_round_of_bombs_stays_within_the_verification_budget() -> None:
    worker = Rebuilder(timeout_s=30.0, memory_mb=1024)
    try:
        _warm(worker)
        config = RewardConfig(verify_budget_s=1.5, rebuild_timeout_s=30.0)
        bombs = [_group(_bomb(28 + k), ["<answer>x</answer>"] * 2) for k in range(3)]
        started = time.monotonic()
        scored, problems = score_groups(bombs, config, _bounds(), rebuilder=worker)
        assert scored == [] and len(problems) == 6
        assert time.monotonic() - started < 4.5  # a hang bound: 3x the budget
        assert "the verification budget ran out" in problems[0]  # not held against the peer
        assert "verification budget of 1.5 s spent" in problems[-1]
    finally:
        worker.close()


@pytest.mark.slow  # kills and restarts the verifier's worker process
def test_the_worker_dies_with_its_node_even_mid_rebuild(tmp_path) -> None:
    # A node killed while its worker builds a bomb must not leave the worker running.
    script = tmp_path / "node.py"
    script.write_text(
        "import sys, threading\n"
        "from sapo_core.rebuild import Rebuilder\n"
        "from tests.core.test_verifier_budget import _bomb, _warm\n"
        "w = Rebuilder(timeout_s=600.0, memory_mb=8192)\n"
        "_warm(w)\n"
        "print(w.pid, flush=True)\n"
        "w.check(_bomb(30), ['x'])\n"
    )
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": str(root)}
    node = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, env=env)
    try:
        assert node.stdout is not None
        worker = int(node.stdout.readline())
        time.sleep(0.5)  # the worker is building
        assert _alive(worker)
        node.kill()
        node.wait()
        deadline = time.monotonic() + 10
        while _alive(worker) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _alive(worker)
    finally:
        node.kill()
        node.wait()


def _alive(pid: int) -> bool:
    status = Path(f"/proc/{pid}/status")
    try:
        return "\nState:\tZ" not in status.read_text()
    except FileNotFoundError:
        return False
