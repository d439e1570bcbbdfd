"""Paired-seed comparison of sharing configurations: pure functions over small frames.

An experiment runs several sharing configurations (``"4/0"`` = J=0 baseline, ``"2/2 paper"``,
...) each with the same replicate seeds. Each (configuration, seed) gives one number per metric:
one whole swarm run. The unit of replication is that swarm seed, not the node: the nodes of one
swarm share rollouts and so influence each other, and treating them as independent samples
would shrink the intervals without any new evidence.

Because every configuration reuses the baseline's seeds (same initial weights, same data order),
the per-seed difference ``configuration - baseline`` cancels the seed-to-seed variation that both
runs share; its t interval is usually much narrower than the two unpaired intervals suggest.

The Student-t quantiles and the noncentral t of a power computation are scipy.stats'.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import polars as pl

CONFIGURATION = "configuration"
SEED = "seed"


@dataclass(frozen=True)
class Interval:
    """A confidence interval for a mean. ``low``/``high`` are NaN when n < 2 (no spread to
    estimate); ``mean`` is NaN only when n == 0."""

    mean: float
    low: float
    high: float
    n: int
    half_width: float

    def excludes_zero(self) -> bool:
        """Strictly above or strictly below 0 (False when the bounds are NaN)."""
        return self.low > 0 or self.high < 0


# --- Student-t quantile and the paired t test's power ---------------------------------------


def t_critical(df: int, confidence: float = 0.95) -> float:
    """The two-sided Student-t critical value: P(|T_df| <= value) = ``confidence``."""
    if df < 1:
        raise ValueError(f"degrees of freedom must be >= 1, got {df}")
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    from scipy import stats

    return float(stats.t.ppf(0.5 + confidence / 2.0, df))


def paired_t_power(effect: float, sd: float, n: int, alpha: float = 0.05) -> float:
    """The power of a two-sided paired t test at level ``alpha`` over ``n`` seeds to detect a
    mean per-seed difference ``effect`` whose per-seed standard deviation is ``sd``: how many
    seeds an experiment needs, computed before it runs (the noncentral t distribution)."""
    if n < 2:
        raise ValueError(f"a paired t test needs at least 2 seeds, got {n}")
    from scipy import stats

    df = n - 1
    critical = stats.t.ppf(1.0 - alpha / 2.0, df)
    shift = effect / sd * math.sqrt(n)  # the noncentrality
    return float(stats.nct.sf(critical, df, shift) + stats.nct.cdf(-critical, df, shift))


# --- intervals -------------------------------------------------------------------------------


def _clean(values: Sequence[float]) -> np.ndarray:
    array = np.asarray(values, dtype=float)
    if array.ndim != 1:
        raise ValueError(f"values must be one-dimensional, got shape {array.shape}")
    return array


def _too_few(array: np.ndarray) -> Interval | None:
    """The interval of fewer than two values (no spread to estimate), else None."""
    if len(array) >= 2:
        return None
    mean = float(array.mean()) if len(array) else math.nan
    return Interval(mean, math.nan, math.nan, len(array), math.nan)


def t_interval(values: Sequence[float], confidence: float = 0.95) -> Interval:
    """Student-t interval of the mean: mean ± t(df=n-1) · sd / √n, sd with n-1 in the
    denominator. It assumes roughly normal values, which is the best a handful of seeds allow."""
    array = _clean(values)
    if (few := _too_few(array)) is not None:
        return few
    n, mean = len(array), float(array.mean())
    sd = float(array.std(ddof=1))
    half = t_critical(n - 1, confidence) * sd / math.sqrt(n)
    return Interval(mean, mean - half, mean + half, n, half)


# --- frames ----------------------------------------------------------------------------------


def _validated(frame: pl.DataFrame, metric: str) -> pl.DataFrame:
    """The rows that count: one per (configuration, seed), metric neither null nor NaN.

    A duplicated (configuration, seed) is an error, not something to average: it means two runs
    were labelled with one seed (or a run was loaded twice), and either way the pairing is wrong.
    A null/NaN metric (a run that crashed or diverged) is a missing observation: the seed then
    drops out of that configuration's pairs, as an absent run would.
    """
    missing = [c for c in (CONFIGURATION, SEED, metric) if c not in frame.columns]
    if missing:
        raise ValueError(f"frame lacks column(s) {missing}; it has {frame.columns}")
    duplicated = (
        frame.group_by(CONFIGURATION, SEED, maintain_order=True).len().filter(pl.col("len") > 1)
    )
    if duplicated.height:
        first = duplicated.row(0, named=True)
        raise ValueError(
            f"seed {first[SEED]!r} appears {first['len']} times for configuration "
            f"{first[CONFIGURATION]!r}; each (configuration, seed) must be one run"
        )
    value = pl.col(metric).cast(pl.Float64)
    return frame.select(CONFIGURATION, SEED, value.alias(metric)).filter(
        value.is_not_null() & value.is_not_nan()
    )


def _configurations(frame: pl.DataFrame) -> list[str]:
    """Configurations in order of first appearance (the experiment's own order)."""
    return frame.get_column(CONFIGURATION).unique(maintain_order=True).to_list()


def _by_seed(frame: pl.DataFrame, configuration: str, metric: str) -> dict[Any, float]:
    rows = frame.filter(pl.col(CONFIGURATION) == configuration)
    return dict(
        zip(rows.get_column(SEED).to_list(), rows.get_column(metric).to_list(), strict=True)
    )


def _signed(value: float) -> str:
    """Three significant figures with a sign (``+0.12``, ``-0.0312``); whole numbers above 1000
    so large rewards do not turn into exponents."""
    return f"{value:+.0f}" if abs(value) >= 1000 else f"{value:+.3g}"


PAIRED_SCHEMA: dict[str, type[pl.DataType]] = {
    CONFIGURATION: pl.String,
    "n_seeds": pl.Int64,
    "baseline_mean": pl.Float64,
    "mean": pl.Float64,
    "diff_mean": pl.Float64,
    "diff_low": pl.Float64,
    "diff_high": pl.Float64,
    "rel_gain": pl.Float64,
    "per_seed": pl.String,
    "excludes_zero": pl.Boolean,
}

PER_CONFIGURATION_SCHEMA: dict[str, type[pl.DataType]] = {
    CONFIGURATION: pl.String,
    "n_seeds": pl.Int64,
    "mean": pl.Float64,
    "low": pl.Float64,
    "high": pl.Float64,
}


def paired_gains(
    frame: pl.DataFrame, *, baseline: str, metric: str, confidence: float = 0.95
) -> pl.DataFrame:
    """Each non-baseline configuration against ``baseline``, paired by seed.

    Input columns ``configuration``, ``seed``, ``metric``. Only seeds that both the
    configuration and the baseline have count (so ``baseline_mean`` is over the same seeds as
    ``mean``, and may differ from row to row); a configuration sharing no seed with the baseline
    has no row. The interval is the t interval of the per-seed differences, not of the two
    means separately: pairing removes what the seed does to both runs.

    Output, one row per configuration in order of first appearance: ``configuration, n_seeds,
    baseline_mean, mean, diff_mean, diff_low, diff_high, rel_gain, per_seed, excludes_zero``.
    ``rel_gain`` is ``diff_mean / baseline_mean`` (NaN when that mean is 0); ``per_seed`` reads
    ``"s0 +0.12, s1 -0.03"`` in seed order; ``excludes_zero`` is False when the interval is
    undefined (one paired seed).
    """
    rows = _validated(frame, metric)
    if baseline not in _configurations(frame):
        raise ValueError(
            f"baseline {baseline!r} is not among the configurations {_configurations(frame)}"
        )
    if baseline not in _configurations(rows):
        raise ValueError(f"baseline {baseline!r} has no non-null value of {metric!r}")
    reference = _by_seed(rows, baseline, metric)
    out: list[dict[str, object]] = []
    for configuration in _configurations(rows):
        if configuration == baseline:
            continue
        values = _by_seed(rows, configuration, metric)
        seeds = sorted(set(values) & set(reference))
        if not seeds:
            continue
        base = [reference[s] for s in seeds]
        diffs = [values[s] - reference[s] for s in seeds]
        interval = t_interval(diffs, confidence)
        baseline_mean = float(np.mean(base))
        out.append(
            {
                CONFIGURATION: configuration,
                "n_seeds": len(seeds),
                "baseline_mean": baseline_mean,
                "mean": float(np.mean([values[s] for s in seeds])),
                "diff_mean": interval.mean,
                "diff_low": interval.low,
                "diff_high": interval.high,
                "rel_gain": interval.mean / baseline_mean if baseline_mean != 0 else math.nan,
                "per_seed": ", ".join(
                    f"s{s} {_signed(d)}" for s, d in zip(seeds, diffs, strict=True)
                ),
                "excludes_zero": interval.excludes_zero(),
            }
        )
    return pl.DataFrame(out, schema=PAIRED_SCHEMA)


def per_configuration(
    frame: pl.DataFrame, *, metric: str, confidence: float = 0.95
) -> pl.DataFrame:
    """Per configuration, the t interval of ``metric`` across its seeds (one value per swarm
    seed, never per node): ``configuration, n_seeds, mean, low, high``, in order of first
    appearance. Unpaired, so wider than ``paired_gains`` for comparisons between them."""
    rows = _validated(frame, metric)
    out: list[dict[str, object]] = []
    # From the input frame, not the cleaned rows: a configuration whose every run crashed
    # still gets a row, with n_seeds 0, rather than vanishing from the table.
    for configuration in _configurations(frame):
        interval = t_interval(list(_by_seed(rows, configuration, metric).values()), confidence)
        out.append(
            {
                CONFIGURATION: configuration,
                "n_seeds": interval.n,
                "mean": interval.mean,
                "low": interval.low,
                "high": interval.high,
            }
        )
    return pl.DataFrame(out, schema=PER_CONFIGURATION_SCHEMA)
