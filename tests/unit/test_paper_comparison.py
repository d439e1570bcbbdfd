"""analysis/paper.py: SAPO's Table 1 beside an experiment by external share, its shape
step by step, and a sampler of our own paired with the paper's at the same I/J, on hand-made
per-run frames."""

from __future__ import annotations

import polars as pl
import pytest

from analysis.paper import (
    Split,
    paper_comparison,
    parse_label,
    same_split_gains,
    shape_steps,
    sweep_labels,
)
from analysis.statistics import paired_gains, per_configuration


def runs(values: dict[str, list[float]]) -> pl.DataFrame:
    """One row per (configuration, seed): seeds 0, 1, 2, ... in list order."""
    return pl.DataFrame(
        [
            {"configuration": conf, "seed": seed, "metric": value}
            for conf, per_seed in values.items()
            for seed, value in enumerate(per_seed)
        ]
    )


def test_labels_are_read_as_the_sweep_writes_them() -> None:
    assert parse_label("1/3-fresh") == Split(1, 3, "fresh")
    assert parse_label("4/0") == Split(4, 0, None)
    assert parse_label("2/6-variance-weighted").external_share == 0.75
    assert parse_label("6/2").external_share == parse_label("1/3").external_share / 3
    assert sweep_labels(["4/0", "1/3-fresh"]) and not sweep_labels(["4/0", "2/2 paper"])
    with pytest.raises(ValueError, match="I/J or I/J-policy"):
        parse_label("2/2 paper")


def test_each_paper_split_meets_the_paper_row_of_its_external_share() -> None:
    # I + J = 8 as in the paper, plus a share the paper did not run (1/7) and a sampler of
    # our own (2/6-fresh): neither gets a paper row.
    frame = runs({
        "8/0": [1.0, 2.0, 3.0],
        "6/2": [1.5, 2.5, 3.5],   # +0.5 every seed: +25% of the baseline mean 2.0
        "1/7": [9.0, 9.0, 9.0],
        "2/6": [1.0, 3.0, 3.0],   # 0, +1, 0: interval 1/3 -/+ 4.303 * sd / sqrt(3)
        "2/6-fresh": [4.0, 4.0, 4.0],
    })  # fmt: skip
    gains = paired_gains(frame, baseline="8/0", metric="metric")
    table = paper_comparison(gains, per_configuration(frame, metric="metric"), baseline="8/0")
    rows = {r["configuration"]: r for r in table.iter_rows(named=True)}
    assert list(rows) == ["8/0", "6/2", "2/6"]
    assert rows["8/0"]["paper_cumulative"] == 561.79 and rows["8/0"]["mean"] == 2.0
    assert rows["8/0"]["n_seeds"] == 3 and rows["8/0"]["rel_gain"] == 0.0
    assert rows["6/2"]["baseline_mean"] == 2.0  # the paired seeds: all three here
    assert rows["6/2"]["paper_configuration"] == "6/2"
    assert rows["6/2"]["paper_rel_gain"] == pytest.approx(854.43 / 561.79 - 1)
    assert rows["6/2"]["rel_gain"] == pytest.approx(0.25)
    assert (rows["6/2"]["rel_low"], rows["6/2"]["rel_high"]) == pytest.approx((0.25, 0.25))
    assert rows["6/2"]["excludes_zero"] is True
    half = 4.302653 * (1 / 3) ** 0.5 / 3**0.5  # sd of (0, 1, 0) is sqrt(1/3)
    assert rows["2/6"]["paper_configuration"] == "2/6"
    assert rows["2/6"]["rel_gain"] == pytest.approx(1 / 3 / 2.0)
    assert rows["2/6"]["rel_low"] == pytest.approx((1 / 3 - half) / 2.0)
    assert rows["2/6"]["excludes_zero"] is False


def test_a_smaller_swarm_maps_onto_the_paper_by_share() -> None:
    frame = runs({"4/0": [1.0, 1.0], "3/1": [1.5, 1.5], "2/2": [2.0, 2.0], "1/3": [1.2, 1.6]})
    gains = paired_gains(frame, baseline="4/0", metric="metric")
    table = paper_comparison(gains, per_configuration(frame, metric="metric"), baseline="4/0")
    assert table.select("configuration", "paper_configuration").rows() == [
        ("4/0", "8/0"), ("3/1", "6/2"), ("2/2", "4/4"), ("1/3", "2/6"),
    ]  # fmt: skip
    assert table["rel_gain"].to_list() == pytest.approx([0.0, 0.5, 1.0, 0.4])


def test_a_sampler_of_our_own_is_paired_with_the_papers_at_the_same_split() -> None:
    frame = runs({
        "4/0": [1.0, 1.0, 1.0],
        "1/3": [2.0, 1.0, 3.0],
        "1/3-fresh": [2.5, 1.5, 3.0],  # +0.5, +0.5, 0 over the paper's sampler, seed by seed
        "3/1-fresh": [5.0, 5.0, 5.0],  # no 3/1 with the paper's sampler: no pair
    })  # fmt: skip
    (pair,) = same_split_gains(frame, metric="metric").to_dicts()
    half = 4.302653 * (1 / 12) ** 0.5 / 3**0.5
    assert pair["configuration"] == "1/3-fresh vs 1/3" and pair["n_seeds"] == 3
    assert pair["baseline_mean"] == pytest.approx(2.0) and pair["mean"] == pytest.approx(7 / 3)
    assert (pair["diff_low"], pair["diff_high"]) == pytest.approx((1 / 3 - half, 1 / 3 + half))
    assert pair["per_seed"] == "s0 +0.5, s1 +0.5, s2 +0"


def test_no_pair_when_the_papers_sampler_has_no_complete_run() -> None:
    frame = runs({"4/0": [1.0], "1/3": [None], "1/3-fresh": [2.0]})  # type: ignore[list-item]
    assert same_split_gains(frame, metric="metric").is_empty()
    assert same_split_gains(runs({"4/0": [1.0], "2/2": [2.0]}), metric="metric").is_empty()


def test_a_node_alone_with_a_suffix_is_no_sampler_to_pair() -> None:
    """The compute-matched control (issue 46) makes more questions at J = 0: no sampler of
    its own, so no "samplers at the same I/J" row against 4/0."""
    frame = runs({"4/0": [1.0, 1.0], "2/2": [2.0, 2.0], "4/0-q8-informative-first": [1.5, 1.5]})
    assert same_split_gains(frame, metric="metric").is_empty()


def test_the_gain_is_over_the_baseline_on_the_paired_seeds_and_its_bounds_ordered() -> None:
    # 6/2 lacks seed 2: its gain is over the baseline's seeds 0 and 1 (mean 1.5), while the
    # baseline's own row keeps all three seeds (mean 2.0).
    frame = runs({"8/0": [1.0, 2.0, 3.0], "6/2": [2.0, 2.5, None]})  # type: ignore[list-item]
    gains = paired_gains(frame, baseline="8/0", metric="metric")
    table = paper_comparison(gains, per_configuration(frame, metric="metric"), baseline="8/0")
    base, shared = table.to_dicts()
    assert (base["baseline_mean"], base["n_seeds"]) == (2.0, 3)
    assert (shared["baseline_mean"], shared["n_seeds"]) == (1.5, 2)
    assert shared["rel_gain"] == pytest.approx(0.75 / 1.5)
    # A negative baseline (a reward that can go below zero) keeps low below high.
    negative = runs({"8/0": [-1.0, -1.0], "6/2": [-0.5, 0.0]})
    gains = paired_gains(negative, baseline="8/0", metric="metric")
    row = paper_comparison(gains, per_configuration(negative, metric="metric"), baseline="8/0")
    assert row["rel_low"][1] < row["rel_high"][1]


def test_an_all_nan_papers_sampler_gives_no_pair() -> None:
    frame = runs({"4/0": [1.0], "1/3": [float("nan")], "1/3-fresh": [2.0]})
    assert same_split_gains(frame, metric="metric").is_empty()


def test_the_shape_is_each_step_in_external_share_paired_by_seed() -> None:
    frame = runs({
        "4/0": [1.0, 2.0, 3.0],
        "2/2": [2.0, 3.0, 4.0],        # +1 every seed over 3/1... listed before it
        "3/1": [1.0, 2.0, 3.0],        # no change over 4/0
        "1/3": [1.0, 3.0, 3.0],        # -1, 0, -1 against 2/2
        "1/3-fresh": [9.0, 9.0, 9.0],  # a sampler of our own: not a step of the paper's
    })  # fmt: skip
    steps = {r["configuration"]: r for r in shape_steps(frame, metric="metric").to_dicts()}
    assert list(steps) == ["3/1 vs 4/0", "2/2 vs 3/1", "1/3 vs 2/2"]  # by external share
    assert steps["3/1 vs 4/0"]["diff_mean"] == pytest.approx(0.0)
    assert steps["3/1 vs 4/0"]["paper_step"] == pytest.approx(854.43 / 561.79 - 1)
    up = steps["2/2 vs 3/1"]
    assert (up["diff_mean"], up["diff_low"], up["diff_high"]) == pytest.approx((1, 1, 1))
    assert up["rel_step"] == pytest.approx(0.5) and up["excludes_zero"] is True
    assert up["paper_step"] == pytest.approx(1093.31 / 854.43 - 1)
    down = steps["1/3 vs 2/2"]
    half = 4.302653 * (1 / 3) ** 0.5 / 3**0.5  # sd of (-1, 0, -1) is sqrt(1/3)
    assert down["diff_mean"] == pytest.approx(-2 / 3)
    assert down["diff_low"] == pytest.approx(-2 / 3 - half) and down["excludes_zero"] is False
    assert down["paper_step"] == pytest.approx(945.87 / 1093.31 - 1)
    # a share the paper did not run has no paper step; a missing configuration is skipped
    odd = shape_steps(runs({"4/0": [1.0, 2.0], "2/2": [2.0, 2.0], "0/4": [3.0, 3.0]}),
                      metric="metric")  # fmt: skip
    assert odd["configuration"].to_list() == ["2/2 vs 4/0", "0/4 vs 2/2"]
    assert odd["paper_step"].to_list()[1] is None
    assert shape_steps(runs({"base": [1.0], "shared": [2.0]}), metric="metric").is_empty()


def test_a_correction_is_paired_with_none_at_the_same_split_and_a_group_size_is_no_sampler() -> (
    None
):
    assert parse_label("4/0-L16") == Split(4, 0, "L16") and not parse_label("4/0-L16").alone
    frame = runs({
        "4/0-L16": [1.0, 1.0, 1.0],
        "2/2-none": [2.0, 1.0, 3.0],
        "2/2-token-truncate": [2.5, 1.0, 3.5],  # +0.5, 0, +0.5 over none, seed by seed
        "1/3-token-truncate": [4.0, 4.0, 4.0],  # no 1/3-none: no pair
    })  # fmt: skip
    (pair,) = same_split_gains(frame, metric="metric").to_dicts()
    assert pair["configuration"] == "2/2-token-truncate vs 2/2-none" and pair["n_seeds"] == 3
    assert pair["baseline_mean"] == pytest.approx(2.0) and pair["mean"] == pytest.approx(7 / 3)
    assert pair["per_seed"] == "s0 +0.5, s1 +0, s2 +0.5"
