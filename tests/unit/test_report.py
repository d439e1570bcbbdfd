"""The report's numbers on hand-made frames whose answers are known."""

from __future__ import annotations

import math

import polars as pl
import pytest

from dashboards.figures import label, moving_average
from dashboards.report import cross_check, markdown_table, report_markdown, sections, summarise


def rewards_frame() -> pl.DataFrame:
    """Two configurations of 2 nodes x 4 rounds; node rewards chosen by hand."""
    rows = []
    per_node = {
        ("exp-2x0", "a"): [0.0, 0.25, 0.25, 0.5],
        ("exp-2x0", "b"): [0.25, 0.25, 0.5, 0.5],
        ("exp-1x1", "a"): [0.25, 0.5, 0.75, 0.75],
        ("exp-1x1", "b"): [0.0, 0.5, 0.5, 1.0],
    }
    for (swarm, node), values in per_node.items():
        i, j = (int(x) for x in swarm.removeprefix("exp-").split("x"))
        for node_round, value in enumerate(values):
            rows.append(
                {"experiment": "exp", "swarm_id": swarm, "local_groups": i, "external_groups": j,
                 "policy": "paper", "node_id": node, "node_round": node_round,
                 "claimed_reward": value, "completions": 16}
            )  # fmt: skip
    return pl.DataFrame(rows)


def test_summary_cumulative_reward_gain_and_quarters() -> None:
    summary = {r["swarm_id"]: r for r in summarise(rewards_frame()).to_dicts()}
    base, shared = summary["exp-2x0"], summary["exp-1x1"]
    assert base["cumulative_claimed_reward"] == pytest.approx(2.5)
    assert shared["cumulative_claimed_reward"] == pytest.approx(4.25)
    assert base["gain_over_baseline"] == pytest.approx(0.0)
    assert shared["gain_over_baseline"] == pytest.approx(4.25 / 2.5 - 1)
    assert (shared["nodes"], shared["rounds"], shared["node_rounds"]) == (2, 4, 8)
    assert shared["first_quarter_mean"] == pytest.approx(0.125)  # round 0
    assert shared["last_quarter_mean"] == pytest.approx(0.875)  # round 3
    values = [0.25, 0.5, 0.75, 0.75, 0.0, 0.5, 0.5, 1.0]
    mean = sum(values) / 8
    std = math.sqrt(sum((v - mean) ** 2 for v in values) / 7)
    assert shared["cumulative_claimed_reward_se"] == pytest.approx(std * math.sqrt(8))


def test_markdown_table_marks_baseline_and_gain() -> None:
    rows = summarise(rewards_frame()).to_dicts()
    table = markdown_table(sorted(rows, key=lambda r: r["external_groups"]), sweep=True)
    lines = table.splitlines()
    assert lines[2].startswith("| 2/0 | - | 2 x 4 | 2.50 |") and "baseline" in lines[2]
    assert lines[3].startswith("| 1/1 | paper | 2 x 4 | 4.25 |") and "+70.0%" in lines[3]


def test_cross_check_finds_agreement_differences_and_gaps() -> None:
    rewards = rewards_frame()
    tracked = rewards.select(
        "swarm_id", "node_id", "node_round",
        pl.col("claimed_reward").alias("own_reward"),
        (pl.col("claimed_reward") + 0.1).alias("training_reward"),
    )  # fmt: skip
    check = cross_check(rewards, tracked)
    assert check.consistent and check.matched == 16 and check.max_abs_diff == 0.0
    assert check.cumulative_training_reward["exp-1x1"] == pytest.approx(4.25 + 0.8)
    off = tracked.with_columns(
        pl.when(pl.col("node_round") == 2)
        .then(pl.col("own_reward") + 0.25)
        .otherwise(pl.col("own_reward"))
        .alias("own_reward")
    ).filter(pl.col("node_round") != 3)
    check = cross_check(rewards, off)
    assert not check.consistent
    assert check.max_abs_diff == pytest.approx(0.25)
    assert (check.matched, check.missing_in_mlflow) == (12, 4)


def test_moving_average_is_trailing() -> None:
    assert moving_average([1.0, 0.0, 1.0, 0.0], window=2) == [1.0, 0.5, 0.5, 0.5]
    assert moving_average([], window=3) == []


def without_configuration(frame: pl.DataFrame) -> pl.DataFrame:
    """The same rewards as a ledger without manifests shows them: configuration NULL."""
    return frame.with_columns(
        pl.lit(None, pl.String).alias("experiment"),
        pl.lit(None, pl.Int64).alias("local_groups"),
        pl.lit(None, pl.Int64).alias("external_groups"),
        pl.lit(None, pl.String).alias("policy"),
    )


def test_swarms_without_manifests_are_summarised_with_configuration_unknown() -> None:
    frame = without_configuration(rewards_frame())
    summary = {r["swarm_id"]: r for r in summarise(frame).to_dicts()}
    assert set(summary) == {"exp-2x0", "exp-1x1"}  # the ids are names, never parsed
    shared = summary["exp-1x1"]
    assert shared["cumulative_claimed_reward"] == pytest.approx(4.25)
    assert shared["experiment"] is None and shared["local_groups"] is None
    assert shared["gain_over_baseline"] is None
    rows = list(summary.values())
    (only,) = sections(rows)
    assert only.title == "Swarms" and not only.sweep
    text = report_markdown(rows)
    assert "gain" not in text and "| exp-1x1 | unknown | - | 2 x 4 | 4.25 |" in text
    assert label(shared) == "exp-1x1"


def test_a_swarm_whose_nodes_disagree_has_no_single_configuration() -> None:
    frame = rewards_frame().with_columns(
        pl.when((pl.col("swarm_id") == "exp-1x1") & (pl.col("node_id") == "b"))
        .then(pl.lit(2))
        .otherwise(pl.col("external_groups"))
        .alias("external_groups")
    )
    summary = {r["swarm_id"]: r for r in summarise(frame).to_dicts()}
    assert summary["exp-1x1"]["external_groups"] is None
    assert summary["exp-1x1"]["local_groups"] == 1 and summary["exp-1x1"]["experiment"] == "exp"
    assert summary["exp-1x1"]["cumulative_claimed_reward"] == pytest.approx(4.25)


def test_sweeps_and_lone_swarms_get_their_own_tables() -> None:
    lone = without_configuration(rewards_frame().filter(pl.col("swarm_id") == "exp-1x1"))
    lone = lone.with_columns(pl.lit("solo").alias("swarm_id"))
    rows = summarise(pl.concat([rewards_frame(), lone])).to_dicts()
    assert [r["swarm_id"] for r in rows] == ["exp-2x0", "exp-1x1", "solo"]
    parts = sections(rows)
    assert [(p.title, p.sweep, len(p.rows)) for p in parts] == [
        ("Sweep exp", True, 2), ("Swarms outside any experiment", False, 1)
    ]  # fmt: skip
    text = report_markdown(rows)
    assert "**Sweep exp**" in text and "| 1/1 | paper | 2 x 4 | 4.25 |" in text
    assert "| solo | unknown |" in text


def test_node_table_marks_a_node_resumed_with_another_configuration() -> None:
    from dashboards.report import node_cells

    base = {
        "node_id": "n", "local_groups": 2, "external_groups": 2, "policy": "paper",
        "model_id": "m", "rounds": 3, "cumulative_claimed_reward": 1.5, "mean_claimed_reward": 0.5,
        "zero_variance_fraction": 0.25, "groups_drawn": 4, "peers_drawn_from": 2,
    }  # fmt: skip
    _, body = node_cells([{**base, "manifest_revisions": 1}, {**base, "manifest_revisions": 3}])
    assert body[0][1] == "2/2" and body[1][1] == "2/2 (first of 3 configurations)"
    assert body[0][4:] == ["3", "1.50", "0.500", "25%", "4 (2)"]
