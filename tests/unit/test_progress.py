"""Progress events: what a node writes and what the launcher does with each line."""

from __future__ import annotations

from flows.progress import MARKER, NodeProgress, SwarmProgress, parse


def test_events_round_trip_through_marker_lines_and_plain_lines_pass() -> None:
    events: list[dict] = []
    progress = NodeProgress("node-1", events.append)
    progress.emit("round", round=2, stop=5)
    progress.generation(3, 16)
    assert events == [
        {"node": "node-1", "event": "round", "round": 2, "stop": 5},
        {"node": "node-1", "event": "generate", "done": 3, "total": 16},
    ]
    assert parse("node-1 round 0: own_reward 0.250") is None
    assert parse(MARKER + "not json") is None
    assert parse(MARKER + '{"event": "done"}') is None  # no node: not ours
    assert parse(MARKER + '{"node": "n", "event": "done", "round": 1}') == {
        "node": "n", "event": "done", "round": 1,
    }  # fmt: skip


def test_launcher_moves_bars_on_events_and_prints_everything_else() -> None:
    printed: list[str] = []
    display = SwarmProgress(enabled=True)
    with display:
        for line in [
            MARKER + '{"node": "node-0", "event": "round", "round": 1, "stop": 4}',
            MARKER + '{"node": "node-0", "event": "step", "round": 1, "step": "update"}',
            MARKER + '{"node": "node-0", "event": "generate", "done": 6, "total": 8}',
            "node-0 round 1: own_reward 0.500",
            MARKER + '{"node": "node-0", "event": "done", "round": 1}',
        ]:
            display.feed("node-0", line, printed.append)
    assert printed == ["[node-0] node-0 round 1: own_reward 0.500"]
    rounds, generation = (display.progress.tasks[i] for i in (0, 1))
    assert (rounds.completed, rounds.total) == (2, 4)
    assert rounds.description == "node-0 round 1 (2 of 4): update"  # numbered as in the logs
    assert (generation.completed, generation.total) == (6, 8)


def test_a_stopped_swarm_still_shows_the_rounds_its_nodes_finished() -> None:
    """Issue 47: after Ctrl-C a node's round-0 summary, printed as the stop came, was never
    shown (everything a node printed after the stop was dropped, to hide its dying noise)."""
    import io
    import threading

    from flows.node.metrics import describe
    from flows.progress import SwarmProgress
    from flows.swarm.launcher import _pump

    metrics = {"own_reward": 0.5, "cumulative_own_reward": 0.5, "training_reward": 0.25,
               "external_groups_used": 2.0, "seconds_generate": 3.0}  # fmt: skip
    summary = describe(metrics, "node-1", 0)
    stream = io.StringIO(f"Traceback (most recent call last):\n{summary}\nKeyboardInterrupt\n")
    stopping = threading.Event()
    stopping.set()
    shown: list[str] = []
    _pump(stream, "node-1", SwarmProgress(enabled=False), shown.append, stopping)
    assert shown == [f"[node-1] {summary}"]
