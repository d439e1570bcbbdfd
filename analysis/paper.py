"""An experiment read against SAPO's Table 1, its shape step by step in external share, and
each sampler against the paper's at the same split of local and external groups.

The paper (arXiv 2509.08721, Table 1; 8 nodes, I + J = 8) reports one run per
configuration: the cumulative reward summed over agents and rounds. Its configurations
differ in the external share J / (I + J), which is what a smaller swarm can keep (3/1 at
I + J = 4 is the paper's 6/2); a relative gain is a ratio of cumulative rewards, so the
number of nodes cancels and the paper's percentages can sit beside ours. The number of
rounds does not: a gain over 12 rounds and one over 2000 measure different horizons of
the same curve, so what compares is the shape across shares, not the percentages.

Configuration labels are the sweep's (flows/experiments/sweep.py): ``I/J``, or
``I/J-policy`` when a sampling policy other than the paper's acts.
"""

from __future__ import annotations

import itertools
import re
from dataclasses import dataclass

import polars as pl

from analysis.statistics import PAIRED_SCHEMA, paired_gains
from ledger.schema import sharing_label


@dataclass(frozen=True)
class PaperRow:
    configuration: str
    external_share: float
    cumulative_reward: float


# SAPO's Table 1: cumulative reward over 8 agents and 2000 rounds (../shared/SAPO.md).
PAPER_TABLE = (
    PaperRow("8/0", 0.0, 561.79),
    PaperRow("6/2", 0.25, 854.43),
    PaperRow("4/4", 0.5, 1093.31),
    PaperRow("2/6", 0.75, 945.87),
)
PAPER_BASELINE = PAPER_TABLE[0].cumulative_reward

_LABEL = re.compile(r"^(?P<local>\d+)/(?P<external>\d+)(?:-(?P<policy>[A-Za-z0-9-]+))?$")
CORRECTIONS = ("token-truncate", "token-mask", "sequence-truncate", "sequence-mask")
"""The off-policy corrections as a sweep's labels spell them (`2/2-token-truncate`); the
paper's way, `none`, is their counterpart (`2/2-none`)."""


@dataclass(frozen=True)
class Split:
    local: int
    external: int
    policy: str | None  # None: the paper's sampler (or no peers at all)

    @property
    def external_share(self) -> float:
        total = self.local + self.external
        # rounded so that 2/8 and 1/4 meet the paper's 6/2 under one key
        return round(self.external / total, 6) if total else 0.0

    @property
    def alone(self) -> bool:
        """Nodes alone with nothing else varied: what the paper's 8/0 is."""
        return self.external == 0 and self.policy is None

    @property
    def plain(self) -> str:
        return sharing_label(self.local, self.external)


def parse_label(label: str) -> Split:
    """``"1/3-fresh"`` -> Split(1, 3, "fresh"); a label of another shape is an error."""
    found = _LABEL.match(label)
    if found is None:
        raise ValueError(f"configuration {label!r} is not of the form I/J or I/J-policy")
    return Split(int(found["local"]), int(found["external"]), found["policy"])


def sweep_labels(labels: list[str]) -> bool:
    """Whether every label is a sweep's ``I/J[-policy]`` (hand-made frames may name
    configurations otherwise; they get no paper comparison)."""
    return all(_LABEL.match(label) for label in labels)


PAPER_COMPARISON_SCHEMA: dict[str, type[pl.DataType]] = {
    "configuration": pl.String,
    "external_share": pl.Float64,
    "paper_configuration": pl.String,
    "paper_cumulative": pl.Float64,
    "paper_rel_gain": pl.Float64,
    "n_seeds": pl.Int64,
    "baseline_mean": pl.Float64,  # the baseline over this row's paired seeds
    "mean": pl.Float64,
    "rel_gain": pl.Float64,
    "rel_low": pl.Float64,
    "rel_high": pl.Float64,
    "excludes_zero": pl.Boolean,
}


def paper_comparison(
    gains: pl.DataFrame, configurations: pl.DataFrame, *, baseline: str
) -> pl.DataFrame:
    """One row per configuration run with the paper's sampler whose external share the paper
    ran too, the baseline first: the paper's cumulative reward and gain beside ours.

    ``gains`` is ``paired_gains`` of a cumulative metric against the J = 0 ``baseline``,
    ``configurations`` its ``per_configuration`` (the baseline's row: mean and seeds).

    Our relative gain is the mean paired difference over the baseline's mean on the same
    seeds (``baseline_mean``), and its bounds are the difference's 95% t interval over that
    same mean: the interval of the difference, rescaled, not an interval of the ratio (the
    baseline mean's own uncertainty is not in it, so it is narrower than a ratio's would
    be). Whether it excludes zero is the difference's test. The paper has no interval.
    """
    paper = {row.external_share: row for row in PAPER_TABLE}
    base = paper[0.0]
    own = configurations.filter(pl.col("configuration") == baseline).row(0, named=True)
    rows: list[dict[str, object]] = [
        {"configuration": baseline, "external_share": 0.0,
         "paper_configuration": base.configuration, "paper_cumulative": base.cumulative_reward,
         "paper_rel_gain": 0.0, "n_seeds": own["n_seeds"], "baseline_mean": own["mean"],
         "mean": own["mean"], "rel_gain": 0.0}
    ]  # fmt: skip
    for gain in gains.iter_rows(named=True):
        split = parse_label(gain["configuration"])
        reference = paper.get(split.external_share)
        if split.policy is not None or reference is None:
            continue  # our own samplers have no paper row; other shares have no paper run
        scale = gain["baseline_mean"]
        bounds = sorted([_ratio(gain["diff_low"], scale), _ratio(gain["diff_high"], scale)])
        rows.append(
            {"configuration": gain["configuration"], "external_share": split.external_share,
             "paper_configuration": reference.configuration,
             "paper_cumulative": reference.cumulative_reward,
             "paper_rel_gain": reference.cumulative_reward / PAPER_BASELINE - 1,
             "n_seeds": gain["n_seeds"], "baseline_mean": scale, "mean": gain["mean"],
             "rel_gain": _ratio(gain["diff_mean"], scale), "rel_low": bounds[0],
             "rel_high": bounds[1], "excludes_zero": gain["excludes_zero"]}
        )  # fmt: skip
    frame = pl.DataFrame(rows, schema=PAPER_COMPARISON_SCHEMA)
    return frame.sort("external_share", maintain_order=True)


def _ratio(value: float, scale: float) -> float:
    return value / scale if scale else float("nan")


def _counterpart(label: str, split: Split, labels: list[str]) -> str | None:
    """What a configuration is paired with at the same I/J: the same label with `-none` for
    an off-policy correction (`2/2-token-truncate` vs `2/2-none`), else the paper's sampler
    (`1/3-fresh` vs `1/3`); None when that was not run."""
    for correction in CORRECTIONS:
        if label.endswith("-" + correction):
            paper = label.removesuffix(correction) + "none"
            return paper if paper in labels else None
    return split.plain if split.plain in labels else None


def same_split_gains(runs: pl.DataFrame, *, metric: str) -> pl.DataFrame:
    """Each configuration with a sampler or an off-policy correction of its own against the
    paper's way at the same I/J, paired by seed: ``I/J-policy`` against the paper's sampler
    ``I/J``, ``I/J[-policy]-<correction>`` against ``I/J[-policy]-none``. ``paired_gains``
    columns, the configuration named ``"<label> vs <counterpart>"``. Empty when no such pair
    was run. A node alone (J = 0) samples no peer, so a suffix there names something else
    (the compute-matched control's ``4/0-q8-informative-first``, a group size ``4/0-L16``),
    never a sampler."""
    labels = runs.get_column("configuration").unique(maintain_order=True).to_list()
    frames = []
    for label in labels:
        if not sweep_labels([label]):
            continue  # a hand-made frame's name: no I/J to pair on
        split = parse_label(label)
        counterpart = _counterpart(label, split, labels)
        if split.policy is None or split.external == 0 or counterpart is None:
            continue
        pair = runs.filter(pl.col("configuration").is_in([label, counterpart]))
        if not _measured(pair, counterpart, metric):
            continue  # no complete run of the paper's way to pair with
        gains = paired_gains(pair, baseline=counterpart, metric=metric)
        frames.append(
            gains.with_columns(pl.lit(f"{label} vs {counterpart}").alias("configuration"))
        )
    return pl.concat(frames) if frames else pl.DataFrame(schema=PAIRED_SCHEMA)


SHAPE_SCHEMA: dict[str, pl.DataType | type[pl.DataType]] = {
    **PAIRED_SCHEMA,
    "rel_step": pl.Float64,
    "paper_step": pl.Float64,
}


def shape_steps(runs: pl.DataFrame, *, metric: str) -> pl.DataFrame:
    """The paper's shape, tested: each configuration of the paper's sampler against the one
    with the next smaller external share (3/1 vs 4/0, 2/2 vs 3/1, 1/3 vs 2/2), paired by
    seed, with the paper's own step beside it. The paper rises to 4/4 and falls at 2/6: its
    shape appears here when the middle steps' intervals say up and the last says down.

    ``paired_gains`` columns (the configuration named ``"2/2 vs 3/1"``) plus ``rel_step``
    (the mean difference over the earlier configuration's mean on the same seeds) and
    ``paper_step`` (the paper's relative change between the matching configurations; null
    for shares the paper did not run)."""
    labels = runs.get_column("configuration").unique(maintain_order=True).to_list()
    if not sweep_labels(labels):
        return pl.DataFrame(schema=SHAPE_SCHEMA)
    plain = sorted(
        (split for split in map(parse_label, labels) if split.policy is None),
        key=lambda split: split.external_share,
    )
    paper = {row.external_share: row.cumulative_reward for row in PAPER_TABLE}
    frames = []
    for before, after in itertools.pairwise(plain):
        pair = runs.filter(pl.col("configuration").is_in([before.plain, after.plain]))
        if not _measured(pair, before.plain, metric):
            continue
        gains = paired_gains(pair, baseline=before.plain, metric=metric)
        low, high = paper.get(before.external_share), paper.get(after.external_share)
        step = None if low is None or high is None else high / low - 1
        frames.append(
            gains.with_columns(
                pl.lit(f"{after.plain} vs {before.plain}").alias("configuration"),
                (pl.col("diff_mean") / pl.col("baseline_mean")).alias("rel_step"),
                pl.lit(step, pl.Float64).alias("paper_step"),
            )
        )
    return pl.concat(frames) if frames else pl.DataFrame(schema=SHAPE_SCHEMA)


def _measured(runs: pl.DataFrame, configuration: str, metric: str) -> bool:
    """Whether some run of ``configuration`` has ``metric`` (neither null nor NaN): a
    configuration to pair with."""
    values = runs.filter(pl.col("configuration") == configuration)[metric].cast(pl.Float64)
    return not (values.is_null() | values.is_nan()).all()
