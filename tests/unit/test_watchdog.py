"""The hung-run decision (flows/node/watchdog.py): what counts as progress, where the node was,
when it is stalled; and the setting that bounds it."""

from __future__ import annotations

import threading
import time

import pytest
import yaml

from flows.config import ConfigError, load_swarm
from flows.node.watchdog import OPENING, Mark, Watchdog, advance, stall


def test_progress_events_say_where_the_node_is() -> None:
    mark = Mark(0.0, OPENING)
    assert mark.where() == "opening the node"
    mark = advance(mark, {"event": "round", "round": 3, "stop": 5}, 1.0)
    assert (mark.at, mark.where()) == (1.0, "round 3, before its first step")
    mark = advance(mark, {"event": "step", "round": 3, "step": "generate"}, 2.0)
    assert mark.where() == "step generate of round 3"
    mark = advance(mark, {"event": "generate", "done": 4, "total": 12}, 3.0)
    assert (mark.at, mark.where()) == (3.0, "step generate of round 3 (4 of 12 completions)")
    mark = advance(mark, {"event": "step", "round": 3, "step": "publish"}, 4.0)
    assert mark.where() == "step publish of round 3"  # the count was generate's
    mark = advance(mark, {"event": "done", "round": 3}, 5.0)
    assert mark.where() == "round 3, after its last step"
    assert advance(mark, {"event": "something-new"}, 6.0) == Mark(6.0, "done", 3)


def test_a_node_is_stalled_once_it_goes_the_timeout_without_progress() -> None:
    mark = Mark(100.0, "update", 2)
    assert stall(mark, 100.0, 60.0, {}) is None
    assert stall(mark, 159.9, 60.0, {}) is None
    assert stall(mark, 160.0, 60.0, {}) == "no progress for 60 s in step update of round 2"
    assert stall(mark, 1000.0, 60.0, {}) == "no progress for 900 s in step update of round 2"


def test_the_sample_step_may_also_wait_for_peers() -> None:
    grace = {"sample": 120.0}
    assert stall(Mark(0.0, "sample", 0), 150.0, 60.0, grace) is None
    assert stall(Mark(0.0, "sample", 0), 180.0, 60.0, grace) is not None
    assert stall(Mark(0.0, "reward", 0), 150.0, 60.0, grace) is not None


def test_progress_resets_the_clock() -> None:
    now = [0.0]
    dog = Watchdog(10.0, lambda why: None, clock=lambda: now[0])
    dog.saw({"event": "step", "round": 1, "step": "generate"})
    for at in (5.0, 12.0, 19.0, 26.0):  # 26 s in all, never 10 without an event
        now[0] = at
        assert dog.check() is None
        dog.saw({"event": "generate", "done": int(at), "total": 30})
    now[0] = 36.0
    assert dog.check() == (
        "no progress for 10 s in step generate of round 1 (26 of 30 completions)"
    )
    dog.entering("the final evaluation")
    assert dog.check() is None


def test_the_thread_reports_a_stall_once_and_not_while_progress_comes() -> None:
    stalls: list[str] = []
    seen = threading.Event()

    def report(why: str) -> None:
        stalls.append(why)
        seen.set()

    dog = Watchdog(0.3, report).start()
    try:
        for _ in range(12):  # 0.6 s of progress every 0.05 s
            dog.saw({"event": "step", "round": 0, "step": "update"})
            time.sleep(0.05)
        assert stalls == []
        assert seen.wait(5)
        time.sleep(0.2)
    finally:
        dog.stop()
    assert len(stalls) == 1 and stalls[0].endswith("in step update of round 0")


def test_the_stall_timeout_is_a_validated_setting_of_the_swarm() -> None:
    text = yaml.safe_dump({"workdir": "/tmp/sapo-t"})
    assert load_swarm(text=text).stall_timeout_s == 1800.0
    assert load_swarm(text=text, overrides=["stall_timeout_s=90"]).stall_timeout_s == 90.0
    assert load_swarm(text=text, overrides=["stall_timeout_s=null"]).stall_timeout_s is None
    with pytest.raises(ConfigError, match=r"--set: stall_timeout_s: .*greater than or equal"):
        load_swarm(text=text, overrides=["stall_timeout_s=0"])
