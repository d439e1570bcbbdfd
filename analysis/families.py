"""A mixed swarm's statistics per model family: does each family gain over J = 0?

In a swarm of several models the run-level means of ``analysis.replicates`` mix families
whose skill differs. Here each run's nodes are split by the model their manifest declares;
each family's metrics are the means over its own nodes in that run, and the paired-seed
gains over the baseline are computed per family (the swarm seed stays the unit: a family's
nodes learn from the other family's, so nodes are still not independent samples). Which
peers a node trained on is read from its training log: the share of its trained peer groups
that came from another family says how much it actually took from the other model.
"""

from __future__ import annotations

from dataclasses import dataclass

import polars as pl

from analysis.records import RunRecords
from analysis.replicate_report import INTERVAL_COLUMNS, table_lines
from analysis.replicates import run_metrics
from analysis.statistics import paired_gains, per_configuration

FAMILY_METRICS = ("final_accuracy", "cumulative_claimed_reward")


@dataclass
class FamilyTables:
    runs: pl.DataFrame  # per run and family: its nodes' means
    configurations: dict[str, pl.DataFrame]  # metric -> per (configuration, family) interval
    gains: dict[str, pl.DataFrame]  # metric -> per family, gain over the baseline
    crossing: pl.DataFrame  # per configuration and family: share of peer groups from others


def family_tables(records: RunRecords, *, baseline: str, rounds: int) -> FamilyTables:
    """Per-family metrics and gains from the experiment's run records: per-node-round rows,
    each node's model (its manifest's) and the peer groups it trained on."""
    node_rows, models = records.node_rounds, records.models
    rows = node_rows.join(models, on=["swarm_id", "node_id"], how="left")
    families = sorted(m for m in rows["model_id"].unique().to_list() if m is not None)
    runs, configurations, gains = [], {}, {}
    for family in families:
        own = rows.filter(pl.col("model_id") == family)
        # A run is complete for a family when all of that family's nodes finished.
        counts = own.select(["swarm_id", "node_id"]).unique().group_by("swarm_id").len()
        expected = max(counts["len"].to_list(), default=None)
        metrics = run_metrics(own, rounds, expected).with_columns(pl.lit(family).alias("model"))
        runs.append(metrics)
    all_runs = pl.concat(runs) if runs else pl.DataFrame()
    for metric in FAMILY_METRICS:
        described, compared = [], []
        for family in families:
            mine = all_runs.filter(pl.col("model") == family)
            if not mine[metric].is_not_null().any():
                continue
            described.append(
                per_configuration(mine, metric=metric).with_columns(pl.lit(family).alias("model"))
            )
            compared.append(
                paired_gains(mine, baseline=baseline, metric=metric).with_columns(
                    pl.lit(family).alias("model")
                )
            )
        if described:
            configurations[metric] = pl.concat(described, how="diagonal_relaxed")
            gains[metric] = pl.concat(compared, how="diagonal_relaxed")
    return FamilyTables(all_runs, configurations, gains, crossing(records))


def crossing(records: RunRecords) -> pl.DataFrame:
    """Per configuration and family: peer groups trained on, and the share of them whose
    publisher runs another model."""
    trained, node_rows, models = records.peer_groups, records.node_rounds, records.models
    labels = node_rows.select("swarm_id", "configuration").unique()
    receiver = models.rename({"model_id": "model"})
    publisher = models.rename({"node_id": "peer_node_id", "model_id": "peer_model"})
    joined = (
        trained.join(labels, on="swarm_id")
        .join(receiver, on=["swarm_id", "node_id"], how="left")
        .join(publisher, on=["swarm_id", "peer_node_id"], how="left")
    )
    return (
        joined.group_by("configuration", "model")
        .agg(
            pl.len().alias("peer_groups_trained"),
            (pl.col("peer_model") != pl.col("model")).mean().alias("from_other_family"),
        )
        .sort("configuration", "model")
    )


def family_markdown(tables: FamilyTables, *, baseline: str) -> str:
    """The per-family tables as markdown."""
    lines = [f"Per model family. Baseline: {baseline}. Intervals: 95% t over replicate seeds."]
    names = {"final_accuracy": "final held-out accuracy",
             "cumulative_claimed_reward": "cumulative claimed reward"}  # fmt: skip
    for metric, name in names.items():
        if metric not in tables.gains:
            continue
        lines += ["", f"### {name}, per family", ""]
        lines += table_lines(tables.configurations[metric], {"model": "model", **INTERVAL_COLUMNS})
        lines += [""]
        lines += table_lines(
            tables.gains[metric],
            {"model": "model", "configuration": "vs " + baseline, "diff_mean": "gain",
             "diff_low": "95% low", "diff_high": "95% high", "per_seed": "gain per seed",
             "excludes_zero": "interval excludes 0"},
        )  # fmt: skip
    if tables.crossing.height:
        lines += ["", "### peer groups trained on, by the publisher's family", ""]
        lines += table_lines(
            tables.crossing,
            {"configuration": "configuration", "model": "model",
             "peer_groups_trained": "peer groups trained", "from_other_family":
             "from the other family"},
        )  # fmt: skip
    return "\n".join(lines) + "\n"


__all__ = ["FamilyTables", "crossing", "family_markdown", "family_tables"]
