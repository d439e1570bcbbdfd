"""The rounds' metrics kept while MLflow is away (flows/node/unlogged.py): logged oldest
first with their step and time, each removed once taken; a refusal stops the replay and
keeps the rest; an unreadable file is set aside, not logged and not lost."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from flows.node.unlogged import UnloggedMetrics


def test_replay_logs_oldest_first_and_keeps_what_the_store_refused(tmp_path: Path) -> None:
    kept = UnloggedMetrics(tmp_path / "unlogged")
    assert kept.steps() == [] and kept.replay(lambda *_: True) == 0
    kept.keep(3, {"own_reward": 0.5}, 3000)
    kept.keep(1, {"own_reward": 0.25, "groups": 2}, 1000)
    kept.keep(3, {"accuracy": 0.75}, 3500)  # the same step twice: both kept
    assert kept.steps() == [1, 3, 3]
    calls: list[tuple[dict[str, float], int, int]] = []

    def refuses_after_one(metrics: Mapping[str, float], step: int, stamp: int) -> bool:
        calls.append((dict(metrics), step, stamp))
        return len(calls) == 1

    assert kept.replay(refuses_after_one) == 1
    assert calls == [({"own_reward": 0.25, "groups": 2.0}, 1, 1000), ({"own_reward": 0.5}, 3, 3000)]
    assert kept.steps() == [3, 3]
    calls.clear()
    assert kept.replay(lambda m, s, t: calls.append((dict(m), s, t)) is None) == 2
    assert [c[2] for c in calls] == [3000, 3500] and kept.steps() == []


def test_an_unreadable_file_is_set_aside(tmp_path: Path) -> None:
    kept = UnloggedMetrics(tmp_path)
    kept.keep(0, {"own_reward": 1.0}, 10)
    (tmp_path / "step-000001-20.json").write_text("{not json")
    logged: list[int] = []
    assert kept.replay(lambda m, s, t: logged.append(s) is None) == 1
    assert logged == [0] and kept.steps() == []
    assert (tmp_path / "step-000001-20.unreadable").exists()
