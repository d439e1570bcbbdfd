"""Paired-seed statistics on hand-made numbers whose answers are worked out by hand here."""

from __future__ import annotations

import math

import polars as pl
import pytest

from analysis.statistics import (
    Interval,
    paired_gains,
    paired_t_power,
    per_configuration,
    t_critical,
    t_interval,
)

# Two-sided 95% Student-t critical values as printed in the usual tables (3 decimals).
PRINTED_95 = {1: 12.706, 2: 4.303, 4: 2.776, 10: 2.228, 29: 2.045, 30: 2.042}


def frame(rows: dict[str, dict[int, float]], metric: str = "reward") -> pl.DataFrame:
    """``{configuration: {seed: value}}`` as the long frame the functions take."""
    return pl.DataFrame(
        [
            {"configuration": c, "seed": s, metric: v}
            for c, by_seed in rows.items()
            for s, v in by_seed.items()
        ]
    )


# --- t critical values -----------------------------------------------------------------------


@pytest.mark.parametrize(("df", "printed"), sorted(PRINTED_95.items()))
def test_t_critical_matches_printed_tables(df: int, printed: float) -> None:
    assert round(t_critical(df), 3) == printed


def test_t_critical_other_confidences_and_large_df() -> None:
    assert round(t_critical(1, 0.99), 3) == 63.657
    assert round(t_critical(5, 0.90), 3) == 2.015
    assert round(t_critical(3, 0.999), 3) == 12.924
    assert abs(t_critical(100_000) - 1.960) < 1e-3  # tends to the normal's 1.96


def test_t_critical_rejects_bad_arguments() -> None:
    with pytest.raises(ValueError, match="degrees of freedom"):
        t_critical(0)
    with pytest.raises(ValueError, match="confidence"):
        t_critical(3, 1.0)


# --- t interval ------------------------------------------------------------------------------


def test_t_interval_one_two_three() -> None:
    # mean 2, sd 1 (squares 1+0+1 over n-1 = 2), half width 4.303 / sqrt(3) = 2.484
    got = t_interval([1.0, 2.0, 3.0])
    assert got.n == 3
    assert got.mean == 2.0
    assert got.half_width == pytest.approx(4.303 / math.sqrt(3), abs=1e-3)
    assert got.half_width == pytest.approx(2.484, abs=1e-3)
    assert got.low == pytest.approx(2.0 - 2.484, abs=1e-3)
    assert got.high == pytest.approx(2.0 + 2.484, abs=1e-3)


def test_t_interval_df_four_and_twenty_nine() -> None:
    # 5 values 1..5: mean 3, sd sqrt(10/4) = 1.5811; half = 2.776 * 1.5811 / sqrt(5) = 1.963
    five = t_interval([1.0, 2.0, 3.0, 4.0, 5.0])
    assert five.half_width == pytest.approx(2.776 * math.sqrt(2.5) / math.sqrt(5), abs=1e-3)
    # 30 values alternating 0, 1: mean 0.5, sd sqrt(30 * 0.25 / 29); half = 2.045 * sd / sqrt 30
    thirty = t_interval([float(i % 2) for i in range(30)])
    sd = math.sqrt(30 * 0.25 / 29)
    assert thirty.mean == 0.5
    assert thirty.half_width == pytest.approx(2.045 * sd / math.sqrt(30), abs=1e-3)


def test_t_interval_two_values_uses_df_one() -> None:
    # sd / sqrt(2) for two values is |a - b| / 2 = 1; half = 12.706
    got = t_interval([4.0, 6.0])
    assert got.half_width == pytest.approx(12.706, abs=1e-3)


def test_t_interval_all_equal_is_zero_width() -> None:
    assert t_interval([5.0, 5.0, 5.0]) == Interval(5.0, 5.0, 5.0, 3, 0.0)


def test_t_interval_too_few_values_gives_nan_bounds() -> None:
    one = t_interval([3.0])
    assert (one.mean, one.n) == (3.0, 1)
    assert math.isnan(one.low) and math.isnan(one.high) and math.isnan(one.half_width)
    assert not one.excludes_zero()
    empty = t_interval([])
    assert empty.n == 0 and math.isnan(empty.mean) and math.isnan(empty.low)


def test_wider_confidence_gives_wider_interval() -> None:
    values = [1.0, 2.0, 4.0, 7.0]
    assert t_interval(values, 0.99).half_width > t_interval(values, 0.90).half_width


# --- paired gains ----------------------------------------------------------------------------


def experiment() -> pl.DataFrame:
    return frame(
        {
            "4/0": {0: 10.0, 1: 20.0, 2: 30.0},
            # differences 1, 2, 3: mean 2, half width 2.484 -> [-0.484, 4.484], contains 0
            "2/2 paper": {0: 11.0, 1: 22.0, 2: 33.0},
            # differences 5, 6, 7: mean 6 -> [3.516, 8.484], strictly above 0
            "2/2 variance-weighted": {0: 15.0, 1: 26.0, 2: 37.0},
            # differences -5, -6, -7: mean -6 -> [-8.484, -3.516], strictly below 0
            "0/4": {0: 5.0, 1: 14.0, 2: 23.0},
        }
    )


def test_paired_gains_columns_and_order() -> None:
    got = paired_gains(experiment(), baseline="4/0", metric="reward")
    assert got.columns == [
        "configuration",
        "n_seeds",
        "baseline_mean",
        "mean",
        "diff_mean",
        "diff_low",
        "diff_high",
        "rel_gain",
        "per_seed",
        "excludes_zero",
    ]
    # baseline left out; the rest in the order the experiment lists them
    assert got["configuration"].to_list() == ["2/2 paper", "2/2 variance-weighted", "0/4"]


def test_paired_gains_numbers() -> None:
    got = paired_gains(experiment(), baseline="4/0", metric="reward")
    paper = got.row(0, named=True)
    assert paper["n_seeds"] == 3
    assert paper["baseline_mean"] == 20.0
    assert paper["mean"] == 22.0
    assert paper["diff_mean"] == 2.0
    assert paper["diff_low"] == pytest.approx(2.0 - 2.484, abs=1e-3)
    assert paper["diff_high"] == pytest.approx(2.0 + 2.484, abs=1e-3)
    assert paper["rel_gain"] == pytest.approx(2.0 / 20.0)
    assert paper["per_seed"] == "s0 +1, s1 +2, s2 +3"


def test_excludes_zero_both_ways() -> None:
    got = paired_gains(experiment(), baseline="4/0", metric="reward")
    by_name = {r["configuration"]: r for r in got.iter_rows(named=True)}
    assert by_name["2/2 paper"]["excludes_zero"] is False
    above = by_name["2/2 variance-weighted"]
    assert above["excludes_zero"] is True
    assert above["diff_low"] == pytest.approx(6.0 - 2.484, abs=1e-3)
    below = by_name["0/4"]
    assert below["excludes_zero"] is True
    assert below["diff_high"] == pytest.approx(-6.0 + 2.484, abs=1e-3)
    assert below["rel_gain"] == pytest.approx(-6.0 / 20.0)
    assert below["per_seed"] == "s0 -5, s1 -6, s2 -7"


def test_paired_gains_pairing_removes_the_seed_effect() -> None:
    # Seeds differ a lot (10 vs 30) but the gain is the same +1 on every seed: the paired
    # interval is zero-width and excludes 0, while the unpaired intervals overlap widely.
    data = frame({"base": {0: 10.0, 1: 30.0, 2: 20.0}, "new": {0: 11.0, 1: 31.0, 2: 21.0}})
    row = paired_gains(data, baseline="base", metric="reward").row(0, named=True)
    assert (row["diff_low"], row["diff_mean"], row["diff_high"]) == (1.0, 1.0, 1.0)
    assert row["excludes_zero"] is True
    unpaired = per_configuration(data, metric="reward")
    assert unpaired["low"][1] < unpaired["high"][0]


def test_unpaired_seeds_are_dropped() -> None:
    # "x" lacks seed 2 and has seed 3 the baseline lacks: only seeds 0 and 1 count.
    # Differences 0.12 and -0.03: mean 0.045; sd / sqrt(2) = |0.12 + 0.03| / 2 = 0.075;
    # df 1: half width 12.706 * 0.075 = 0.953.
    data = frame(
        {
            "base": {0: 1.0, 1: 2.0, 2: 3.0},
            "x": {0: 1.12, 1: 1.97, 3: 9.0},
        },
        metric="accuracy",
    )
    row = paired_gains(data, baseline="base", metric="accuracy").row(0, named=True)
    assert row["n_seeds"] == 2
    assert row["baseline_mean"] == pytest.approx(1.5)
    assert row["mean"] == pytest.approx((1.12 + 1.97) / 2)
    assert row["diff_mean"] == pytest.approx(0.045)
    assert row["diff_high"] - row["diff_mean"] == pytest.approx(12.706 * 0.075, abs=1e-3)
    assert row["per_seed"] == "s0 +0.12, s1 -0.03"
    assert row["excludes_zero"] is False


def test_per_seed_is_in_numeric_seed_order() -> None:
    data = frame({"base": {10: 0.0, 2: 0.0, 1: 0.0}, "x": {2: 0.5, 10: -0.25, 1: 1.0}})
    row = paired_gains(data, baseline="base", metric="reward").row(0, named=True)
    assert row["per_seed"] == "s1 +1, s2 +0.5, s10 -0.25"


def test_configuration_without_shared_seeds_has_no_row() -> None:
    data = frame({"base": {0: 1.0, 1: 2.0}, "x": {0: 2.0, 1: 3.0}, "y": {5: 1.0}})
    got = paired_gains(data, baseline="base", metric="reward")
    assert got["configuration"].to_list() == ["x"]


def test_rel_gain_nan_when_baseline_mean_is_zero() -> None:
    data = frame({"base": {0: -1.0, 1: 1.0}, "x": {0: 0.0, 1: 2.0}})
    row = paired_gains(data, baseline="base", metric="reward").row(0, named=True)
    assert row["diff_mean"] == 1.0
    assert math.isnan(row["rel_gain"])


def test_single_paired_seed_has_nan_interval() -> None:
    data = frame({"base": {0: 1.0}, "x": {0: 3.0}})
    row = paired_gains(data, baseline="base", metric="reward").row(0, named=True)
    assert row["n_seeds"] == 1 and row["diff_mean"] == 2.0
    assert math.isnan(row["diff_low"]) and math.isnan(row["diff_high"])
    assert row["excludes_zero"] is False


def test_null_or_nan_metric_drops_that_seed() -> None:
    data = pl.DataFrame(
        {
            "configuration": ["base", "base", "base", "x", "x", "x"],
            "seed": [0, 1, 2, 0, 1, 2],
            "reward": [1.0, 2.0, None, 2.0, float("nan"), 5.0],
        }
    )
    row = paired_gains(data, baseline="base", metric="reward").row(0, named=True)
    assert row["n_seeds"] == 1 and row["per_seed"] == "s0 +1"


def test_duplicate_seed_raises_naming_it() -> None:
    data = pl.concat([experiment(), frame({"2/2 paper": {1: 99.0}})])
    with pytest.raises(ValueError, match=r"seed 1 .*'2/2 paper'"):
        paired_gains(data, baseline="4/0", metric="reward")
    with pytest.raises(ValueError, match=r"seed 1 "):
        per_configuration(data, metric="reward")


def test_missing_baseline_raises() -> None:
    with pytest.raises(ValueError, match="baseline '8/0'"):
        paired_gains(experiment(), baseline="8/0", metric="reward")


def test_missing_column_raises() -> None:
    with pytest.raises(ValueError, match="accuracy"):
        paired_gains(experiment(), baseline="4/0", metric="accuracy")


def test_empty_result_keeps_the_schema() -> None:
    got = paired_gains(frame({"base": {0: 1.0}}), baseline="base", metric="reward")
    assert got.height == 0
    assert got.schema["excludes_zero"] == pl.Boolean
    assert got.schema["per_seed"] == pl.String


# --- per configuration -----------------------------------------------------------------------


def test_per_configuration() -> None:
    got = per_configuration(experiment(), metric="reward")
    assert got.columns == ["configuration", "n_seeds", "mean", "low", "high"]
    assert got["configuration"].to_list() == ["4/0", "2/2 paper", "2/2 variance-weighted", "0/4"]
    base = got.row(0, named=True)
    # 10, 20, 30: mean 20, sd 10, half width 4.303 * 10 / sqrt(3) = 24.843; the printed 4.303
    # is rounded by up to 0.0005, which the factor 10 / sqrt(3) = 5.77 scales to 0.003.
    assert base["n_seeds"] == 3 and base["mean"] == 20.0
    assert base["low"] == pytest.approx(20.0 - 24.843, abs=3e-3)
    assert base["high"] == pytest.approx(20.0 + 24.843, abs=3e-3)
    paper = got.row(1, named=True)
    # 11, 22, 33: mean 22, sd 11, half width 4.303 * 11 / sqrt(3) = 27.328 (same rounding)
    assert paper["high"] - paper["mean"] == pytest.approx(27.328, abs=4e-3)


def test_per_configuration_keeps_configuration_without_values() -> None:
    data = pl.DataFrame(
        {"configuration": ["a", "a", "b"], "seed": [0, 1, 0], "reward": [1.0, 3.0, None]}
    )
    got = per_configuration(data, metric="reward")
    assert got["configuration"].to_list() == ["a", "b"]
    assert got["n_seeds"].to_list() == [2, 0]
    assert math.isnan(got["mean"][1])


@pytest.mark.parametrize(
    ("seeds", "printed"), [(8, 0.62), (10, 0.75), (11, 0.80), (12, 0.84), (14, 0.90)]
)
def test_paired_t_power_gives_the_compute_matched_sweeps_seed_table(
    seeds: int, printed: float
) -> None:
    """docs/compute-matched-cpu.md chose 12 seeds from this table (half the paper-table gain,
    0.151, against a per-seed sd of 0.162), computed before the runs."""
    assert round(paired_t_power(0.151, 0.162, seeds), 2) == printed


def test_paired_t_power_grows_with_seeds_and_effect() -> None:
    assert paired_t_power(0.1, 0.2, 20) > paired_t_power(0.1, 0.2, 10)
    assert paired_t_power(0.2, 0.2, 10) > paired_t_power(0.1, 0.2, 10)
    assert paired_t_power(0.0, 0.2, 10) == pytest.approx(0.05)  # no effect: the test's level
    with pytest.raises(ValueError, match="at least 2 seeds"):
        paired_t_power(0.1, 0.2, 1)
