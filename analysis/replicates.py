"""Does sharing pay? An experiment's paired replicates: per-run metrics, gains over J = 0
with 95% intervals over seeds, and the diagnostics of the mechanism.

The experiment file fixes, before anything runs, the configurations, the seeds, the rounds
and the baseline; this module only reads what the ledger holds for those runs (a run is one
configuration with one replicate seed: one swarm). The metrics, decided up front:

- cumulative claimed reward: each node's claimed_reward (the mean reward of its own
  completions as it published them) summed over its rounds, averaged over the swarm's
  nodes (the policy's skill on fresh questions, the same measure whatever the configuration);
- cumulative training reward: the paper's measure, the mean reward of everything a node
  trained on (every group it selected, its own and peers' as its verifier scored them)
  summed over its rounds, averaged over nodes; partly selection (`SELECTION_NOTE`);
- final held-out accuracy: the mean over nodes of the last evaluation (the policy after
  the last round) on the fixed evaluation set;
- oscillation and compute (tokens generated, tokens trained on, update seconds): described
  per configuration, not compared;
- the return on compute: the gain in cumulative claimed reward over the baseline per
  1,000 tokens a node generated and trained on, and per 1,000 extra tokens it spent
  (analysis/returns.py).

The unit of replication is the swarm seed; nodes of one swarm train on each other's groups,
so they are not independent samples (analysis/statistics.py). The tables become
statistics.md in analysis/replicate_report.py.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import polars as pl

from analysis.drift import DriftTables, drift_tables
from analysis.records import RunRecords
from analysis.returns import token_returns
from analysis.statistics import paired_gains, per_configuration

METRICS = ("cumulative_claimed_reward", "cumulative_training_reward", "final_accuracy")
COMPUTE = ("tokens_generated", "tokens_trained", "update_seconds")  # per run, summed
DESCRIBED = (*METRICS, "oscillation", *COMPUTE)  # intervals per configuration; gains: METRICS


@dataclass
class ReplicateTables:
    node_rounds: pl.DataFrame  # per run, node and round: reward, accuracy, informative groups
    runs: pl.DataFrame  # per run: configuration, seed, the two metrics
    configurations: dict[str, pl.DataFrame]  # metric -> per-configuration mean and interval
    gains: dict[str, pl.DataFrame]  # metric -> paired gain over the baseline
    returns: pl.DataFrame  # per configuration and token kind: analysis/returns.py
    mechanism: pl.DataFrame  # per configuration: informative groups, discoveries, spread
    discoveries: pl.DataFrame  # per run, node and task
    heldout_overlap: tuple[int, int] | None = None  # held-out questions also trained on, of all
    unrun: list[str] | None = None  # planned runs with no rounds here: "<configuration> seed <s>"
    unpaired: list[str] | None = None  # seeds whose runs computed apart: `unpaired_seeds`
    drift: DriftTables | None = None  # peers' drift over rounds, where records carry it


def run_metrics(rows: pl.DataFrame, rounds: int, nodes: int | None = None) -> pl.DataFrame:
    """One row per run: cumulative claimed reward (mean over nodes of each node's sum over rounds
    0..rounds-1) and final held-out accuracy (mean over nodes, evaluation at `rounds`).

    A run missing nodes (fewer than `nodes`), rounds or final evaluations gets null metrics
    and `complete` false: a partial sum would bias the comparison, so it is left out of
    the pairing visibly rather than averaged in. Rows without the training and compute
    columns (a frame made by hand) get them empty."""
    optional = {"training_reward": pl.Float64, "tokens_generated": pl.Int64,
                "tokens_trained": pl.Int64, "seconds_update": pl.Float64}  # fmt: skip
    # One row order whatever the input's: group_by's float sums and means follow it, and
    # the report's CSVs should be the same bytes from one call to the next.
    rows = rows.with_columns(
        pl.lit(None, dtype).alias(name) for name, dtype in optional.items() if name not in rows
    ).sort("swarm_id", "node_id", "node_round")
    trained = rows.filter(pl.col("node_round") < rounds, pl.col("claimed_reward").is_not_null())
    per_node = trained.group_by("configuration", "seed", "swarm_id", "node_id").agg(
        pl.col("claimed_reward").sum().alias("cumulative_claimed_reward"),
        # null unless every round's training log was read (no partial sums)
        _all_known("training_reward", pl.col("training_reward").sum()).alias(
            "cumulative_training_reward"
        ),
        pl.col("tokens_generated").sum(),
        _all_known("tokens_trained", pl.col("tokens_trained").sum()),
        _all_known("seconds_update", pl.col("seconds_update").sum()).alias("update_seconds"),
        pl.len().alias("rounds_done"),
        # the paper's instability at high J: how much reward jumps from round to round
        pl.col("claimed_reward").diff().std().alias("oscillation"),
    )
    final = rows.filter(pl.col("node_round") == rounds, pl.col("accuracy").is_not_null())
    final = final.group_by("swarm_id").agg(
        pl.col("accuracy").mean().alias("final_accuracy"),
        pl.col("node_id").n_unique().alias("evaluated_nodes"),
    )
    first = rows.filter(pl.col("node_round") == 0, pl.col("accuracy").is_not_null())
    first = first.group_by("swarm_id").agg(pl.col("accuracy").mean().alias("initial_accuracy"))
    summary = (
        per_node.sort("swarm_id", "node_id")  # group_by's output order is its own
        .group_by("configuration", "seed", "swarm_id")
        .agg(
            pl.col("cumulative_claimed_reward").mean(),
            # a node without its training log nulls the run's figure: averaging the other
            # nodes alone would pass a partial swarm for the whole
            _all_known("cumulative_training_reward", pl.col("cumulative_training_reward").mean()),
            pl.col("oscillation").mean(),
            pl.col("tokens_generated").sum(),
            _all_known("tokens_trained", pl.col("tokens_trained").sum()),
            _all_known("update_seconds", pl.col("update_seconds").sum()),
            pl.len().alias("nodes"),
            pl.col("rounds_done").min(),
        )
        .join(first, on="swarm_id", how="left")
        .join(final, on="swarm_id", how="left")
        .sort("configuration", "seed")
    )
    expected = pl.col("nodes").max() if nodes is None else pl.lit(nodes)
    trained_all = (pl.col("rounds_done") >= rounds) & (pl.col("nodes") >= expected)
    evaluated_all = pl.col("evaluated_nodes").fill_null(0) >= expected
    return summary.with_columns(
        *[
            pl.when(trained_all).then(pl.col(name)).alias(name)
            for name in (
                "cumulative_claimed_reward",
                "cumulative_training_reward",
                "oscillation",
                *COMPUTE,
            )
        ],
        pl.when(trained_all & evaluated_all).then(pl.col("final_accuracy")).alias("final_accuracy"),
        (trained_all & evaluated_all).alias("complete"),
    )


# What a node did at round 0, before any update: its own groups' reward and tokens, and its
# held-out answers. The held-out evaluation is seeded apart from the configuration, so its
# answers match in every configuration of a seed when the runs compute alike; the own groups
# match only between configurations that generate the same questions a round and groups of the
# same size (a control that makes 8 questions where the others make 4, or groups of 16 where
# the others make 8, draws other groups by design).
OWN_GROUP_FIGURES = ("claimed_reward", "tokens_generated")
ROUND_0_FINGERPRINT = (*OWN_GROUP_FIGURES, "accuracy")


Round0 = dict[tuple[str, str], str]  # (node, figure) -> its value at round 0, as text


def _alike(a: Round0, b: Round0, *, own: bool) -> bool:
    """Two runs' round 0 (the same (node, figure) keys: those every run of the seed logged)
    agree on every figure; on the own groups' figures only when ``own`` (the runs generate
    alike)."""
    return all(
        value == b[key] for key, value in a.items() if own or key[1] not in OWN_GROUP_FIGURES
    )


def unpaired_seeds(
    rows: pl.DataFrame,
    order: list[str] | None = None,
    generates: Mapping[str, object] | None = None,
) -> list[str]:
    """Seeds whose configurations did not compute alike at round 0, as
    "seed <s>: <configurations> apart from <configurations>".

    At round 0 every node samples its own groups and answers the held-out set with the
    untrained model, so within a seed each node's held-out accuracy is the same in every
    configuration, and its reward and tokens generated are the same in every configuration
    that generates alike, unless the runs computed differently: another machine's kernels
    (a sweep moved mid-seed), kernels that are not deterministic (GPU sampling may not be),
    another code or library version. Such a seed is paired in name only; its gains mix the
    configurations' effect with the machine's.

    ``generates`` maps a configuration to what decides its own round-0 groups (its questions
    a round, its group size); configurations with different values are compared on
    held-out accuracy only. Without it every configuration generates alike. Only what every
    run of the seed logged is compared (a node or a figure a run lacks is left out, not
    counted as a difference).
    ``order`` lists configurations in the experiment's order (else by name): each
    configuration joins the first named group whose runs it agrees with on every figure
    they share, so the groups shown are the configurations that computed alike."""
    fields = [f for f in ROUND_0_FINGERPRINT if f in rows.columns]
    first = rows.filter(pl.col("node_round") == 0).select(
        "configuration", "seed", "node_id", *[pl.col(f).cast(pl.String) for f in fields]
    )
    known = first.unpivot(
        index=["configuration", "seed", "node_id"], variable_name="field", value_name="value"
    ).drop_nulls("value")
    runs_per_seed = first.group_by("seed").agg(pl.col("configuration").n_unique().alias("runs"))
    shared = (  # (seed, node, figure) logged by every run of the seed
        known.group_by("seed", "node_id", "field")
        .agg(pl.col("configuration").n_unique().alias("logged"))
        .join(runs_per_seed, on="seed")
        .filter(pl.col("logged") == pl.col("runs"))
        .drop("logged", "runs")
    )
    figures = known.join(shared, on=["seed", "node_id", "field"])
    rank = {c: i for i, c in enumerate(order or [])}
    for conf in sorted(set(figures["configuration"]) - set(rank)):  # not in order: by name
        rank[conf] = len(rank)
    kind = generates or {}
    named = []
    for (seed,), seed_figures in sorted(figures.group_by("seed"), key=lambda kv: kv[0][0]):
        drawn: dict[str, Round0] = {}
        for r in seed_figures.iter_rows(named=True):
            drawn.setdefault(r["configuration"], {})[(r["node_id"], r["field"])] = r["value"]
        groups: list[list[str]] = []  # configurations that computed alike
        for conf in sorted(drawn, key=rank.__getitem__):
            for g in groups:
                if all(_alike(drawn[conf], drawn[c], own=kind.get(conf) == kind.get(c)) for c in g):
                    g.append(conf)
                    break
            else:
                groups.append([conf])
        if len(groups) > 1:
            named.append(f"seed {seed}: " + " apart from ".join(", ".join(g) for g in groups))
    return named


def _all_known(column: str, value: pl.Expr) -> pl.Expr:
    """``value`` when ``column`` is known in every row of the group, else null."""
    return pl.when(pl.col(column).is_not_null().all()).then(value).alias(column)


def mechanism(rows: pl.DataFrame, discoveries: pl.DataFrame) -> pl.DataFrame:
    """Per configuration: informative groups trained per node-round (and from peers), how
    many (node, task) pairs earned their first reward only after failing the task in an
    earlier round (discoveries), and how many of those followed informative peer groups of
    the same task (possible spread)."""
    groups = rows.filter(pl.col("informative_trained").is_not_null()).group_by("configuration")
    groups_frame = groups.agg(
        pl.col("informative_trained").mean().alias("informative_per_round"),
        pl.col("informative_external").mean().alias("from_peers_per_round"),
        (pl.col("informative_trained") == 0).mean().alias("rounds_without_gradient"),
    )
    later = pl.col("first_round") > pl.col("first_drawn")
    found = discoveries.with_columns(
        later.fill_null(False).alias("discovered"),
        (later & (pl.col("peer_groups_before") > 0)).fill_null(False).alias("after_peers"),
    ).group_by("configuration")
    found_frame = found.agg(
        pl.len().alias("node_tasks"),
        (pl.col("first_round") == pl.col("first_drawn")).sum().alias("reward_at_first_draw"),
        pl.col("discovered").sum().alias("discovered_later"),
        pl.col("after_peers").sum().alias("discovered_after_peer_groups"),
        pl.col("first_round").is_null().sum().alias("never_rewarded"),
    )
    return groups_frame.join(found_frame, on="configuration", how="full", coalesce=True).sort(
        "configuration"
    )


def planned_order(planned: dict[str, tuple[str, int]]) -> list[str]:
    """The experiment's configurations in its own order, from its planned runs
    (swarm_id -> (configuration, seed))."""
    return list(dict.fromkeys(c for c, _ in planned.values()))


def tables_from_records(
    records: RunRecords,
    *,
    baseline: str,
    rounds: int,
    nodes: int | None = None,
    planned: dict[str, tuple[str, int]] | None = None,
    generates: Mapping[str, object] | None = None,
) -> ReplicateTables:
    """The statistics of the runs in ``records`` (from a ledger, or read back from
    committed run records: analysis/records.py).

    With ``planned`` (the experiment's runs: swarm_id -> (configuration, seed), in its
    order), the tables follow the experiment's order of configurations and name the
    planned runs that have no rounds at all, which would otherwise only show as a smaller
    seed count. ``generates`` (configuration -> its own questions a round and group size)
    tells the round-0 pairing check which configurations should draw the same own groups
    (`unpaired_seeds`)."""
    rows = records.node_rounds.sort(["configuration", "seed", "node_id", "node_round"])
    if rows.is_empty():
        raise ValueError("none of the experiment's runs has rounds in this ledger")
    metrics = run_metrics(rows, rounds, nodes)
    found = records.discoveries
    how = mechanism(rows, found)
    unrun = None
    order = None
    if planned is not None:
        order = planned_order(planned)
        rank = pl.col("configuration").replace_strict(
            {c: i for i, c in enumerate(order)}, default=len(order), return_dtype=pl.Int64
        )
        metrics = metrics.sort(rank, "configuration", "seed")
        how = how.sort(rank, "configuration")
        present = set(metrics["swarm_id"])
        unrun = [f"{c} seed {seed}" for s, (c, seed) in planned.items() if s not in present]
    # a metric the baseline never has (no run evaluated, say) has no gains to show
    base = metrics.filter(pl.col("configuration") == baseline)
    return ReplicateTables(
        node_rounds=rows,
        runs=metrics,
        configurations={
            m: per_configuration(metrics, metric=m)
            for m in DESCRIBED
            if metrics[m].is_not_null().any()
        },
        gains={
            m: paired_gains(metrics, baseline=baseline, metric=m)
            for m in METRICS
            if metrics[m].is_not_null().any() and base[m].is_not_null().any()
        },
        returns=token_returns(metrics, baseline=baseline),
        mechanism=how,
        discoveries=found.sort("configuration", "seed", "node_id", "task"),
        unrun=unrun,
        unpaired=unpaired_seeds(rows, order, generates),
        drift=drift_tables(
            records.drift,
            metrics.filter(pl.col("complete")).select("swarm_id", "configuration", "seed"),
            rounds,
            order,
        ),
    )
