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
  per configuration, not compared.

The unit of replication is the swarm seed; nodes of one swarm train on each other's groups,
so they are not independent samples (dashboards/statistics.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import polars as pl

from dashboards.paper import paper_comparison, same_split_gains, shape_steps, sweep_labels
from dashboards.records import Query, RunRecords, records_from_ledger
from dashboards.statistics import paired_gains, per_configuration

METRICS = ("cumulative_claimed_reward", "cumulative_training_reward", "final_accuracy")
COMPUTE = ("tokens_generated", "tokens_trained", "update_seconds")  # per run, summed
DESCRIBED = (*METRICS, "oscillation", *COMPUTE)  # intervals per configuration; gains: METRICS


@dataclass
class ReplicateTables:
    node_rounds: pl.DataFrame  # per run, node and round: reward, accuracy, informative groups
    runs: pl.DataFrame  # per run: configuration, seed, the two metrics
    configurations: dict[str, pl.DataFrame]  # metric -> per-configuration mean and interval
    gains: dict[str, pl.DataFrame]  # metric -> paired gain over the baseline
    mechanism: pl.DataFrame  # per configuration: informative groups, discoveries, spread
    discoveries: pl.DataFrame  # per run, node and task
    heldout_overlap: tuple[int, int] | None = None  # held-out questions also trained on, of all
    unrun: list[str] | None = None  # planned runs with no rounds here: "<configuration> seed <s>"


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


def replicate_tables(
    query: Query,
    replicates: dict[str, tuple[str, int]],
    *,
    baseline: str,
    rounds: int,
    nodes: int | None = None,
    update_seconds: pl.DataFrame | None = None,
) -> ReplicateTables:
    """Everything the experiment's statistics need, from ledger SQL (`Ledger.query`), and
    the update's seconds from MLflow when given (see `node_rounds`)."""
    records = records_from_ledger(query, replicates, update_seconds=update_seconds)
    return tables_from_records(records, baseline=baseline, rounds=rounds, nodes=nodes)


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
) -> ReplicateTables:
    """The statistics of the runs in ``records`` (from a ledger, or read back from
    committed run records: dashboards/records.py).

    With ``planned`` (the experiment's runs: swarm_id -> (configuration, seed), in its
    order), the tables follow the experiment's order of configurations and name the
    planned runs that have no rounds at all, which would otherwise only show as a smaller
    seed count."""
    rows = records.node_rounds.sort(["configuration", "seed", "node_id", "node_round"])
    if rows.is_empty():
        raise ValueError("none of the experiment's runs has rounds in this ledger")
    metrics = run_metrics(rows, rounds, nodes)
    found = records.discoveries
    how = mechanism(rows, found)
    unrun = None
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
        mechanism=how,
        discoveries=found.sort("configuration", "seed", "node_id", "task"),
        unrun=unrun,
    )


def _num(value: object, spec: str = ".3f") -> str:
    if value is None or (isinstance(value, float) and value != value):
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return str(value)
    return format(value, spec) if isinstance(value, float) else str(value)


def table_lines(frame: pl.DataFrame, columns: dict[str, str]) -> list[str]:
    head = "| " + " | ".join(columns.values()) + " |"
    rule = "|" + "---|" * len(columns)
    body = [
        "| " + " | ".join(_num(row[c]) for c in columns) + " |"
        for row in frame.iter_rows(named=True)
    ]
    return [head, rule, *body]


SELECTION_NOTE = (
    "The training reward is partly selection: it averages every group a node selected, "
    "and peers' groups are drawn only among those whose completions did not all score "
    "alike (the paper's filter) while a node's own groups are all its questions, all-wrong "
    "ones included. The more groups come from peers, the fewer all-wrong groups the "
    "average holds, whether or not any node learned. The claimed reward (a node's own "
    "completions) has no such selection; at J = 0 the two are the same number."
)
"""Under every table of the training reward: why it outgrows the claimed reward with J."""

INTERVAL_COLUMNS = {"configuration": "configuration", "n_seeds": "seeds", "mean": "mean",
                    "low": "95% low", "high": "95% high"}  # fmt: skip


GLANCE = {
    "cumulative_claimed_reward": "own reward (cumulative)",
    "cumulative_training_reward": "training reward (cumulative)",
    "final_accuracy": "held-out accuracy",
    "oscillation": "oscillation",
    "tokens_generated": "tokens generated",
    "tokens_trained": "tokens trained",
}


def _with_interval(row: dict[str, object], spec: str) -> str:
    mean, low, high = row["mean"], row["low"], row["high"]
    if not isinstance(mean, float) or mean != mean:
        return "-"
    if not isinstance(low, float) or not isinstance(high, float) or low != low:
        return format(mean, spec)
    return f"{mean:{spec}} [{low:{spec}}, {high:{spec}}]"


def glance_lines(tables: ReplicateTables) -> list[str]:
    """One row per configuration with every described metric as mean [95% interval over
    seeds] (unpaired; the paired gains follow): the table a reader quotes."""
    metrics = [m for m in GLANCE if m in tables.configurations]
    if not metrics:
        return []
    cells: dict[str, dict[str, str]] = {}
    for metric in metrics:
        spec = ".0f" if metric.startswith("tokens") else ".3f"
        for row in tables.configurations[metric].iter_rows(named=True):
            line = cells.setdefault(str(row["configuration"]), {"seeds": str(row["n_seeds"])})
            line[metric] = _with_interval(row, spec)
    columns = {"configuration": "configuration", "seeds": "seeds"} | {m: GLANCE[m] for m in metrics}
    frame = pl.DataFrame(
        [{"configuration": c, **{k: line.get(k, "-") for k in columns if k != "configuration"}}
         for c, line in cells.items()]
    )  # fmt: skip
    return table_lines(frame, columns)


def replicate_markdown(tables: ReplicateTables, *, baseline: str) -> str:
    """The statistics as markdown: per configuration with intervals, gains per seed."""
    lines = [f"Baseline: {baseline}. Intervals: 95% t intervals over replicate seeds."]
    if tables.heldout_overlap is not None:
        seen, total = tables.heldout_overlap
        lines.append(
            f"Held-out questions whose text also appears among the runs' training questions: "
            f"{seen} of {total} distinct texts (other seeds can draw the same small-number "
            f"question)."
        )
    partial = tables.runs.filter(~pl.col("complete"))
    missing = [f"{r['configuration']} seed {r['seed']}" for r in partial.iter_rows(named=True)]
    if missing:
        lines.append(f"Incomplete runs, left out of the statistics: {', '.join(missing)}.")
    if tables.unrun:
        lines.append(f"Planned runs with no rounds here: {', '.join(tables.unrun)}.")
    glance = glance_lines(tables)
    if glance:
        lines += ["", "### at a glance (mean [95% interval] over seeds, per configuration)", ""]
        lines += glance
    names = {
        "cumulative_claimed_reward": "cumulative claimed reward",
        "cumulative_training_reward": "cumulative training reward (own and peers' groups "
        "as the node scored them: the paper's measure)",
        "final_accuracy": "final held-out accuracy",
    }
    for metric, name in names.items():
        if metric not in tables.gains:
            continue
        lines += ["", f"### {name}", ""]
        lines += table_lines(tables.configurations[metric], INTERVAL_COLUMNS)
        lines += [""]
        lines += table_lines(
            tables.gains[metric],
            {"configuration": "vs " + baseline, "diff_mean": "gain", "diff_low": "95% low",
             "diff_high": "95% high", "rel_gain": "relative", "per_seed": "gain per seed",
             "excludes_zero": "interval excludes 0"},
        )  # fmt: skip
        if metric == "cumulative_training_reward":
            lines += ["", SELECTION_NOTE]
    lines += paper_lines(tables, baseline=baseline)
    if "oscillation" in tables.configurations:
        lines += ["", "### oscillation (std of a node's round-to-round reward change)", ""]
        lines += table_lines(tables.configurations["oscillation"], INTERVAL_COLUMNS)
    compute = [m for m in COMPUTE if m in tables.configurations]
    if compute:
        lines += ["", "### compute per run (sums over nodes and rounds; mean over seeds)", ""]
        lines += table_lines(_compute_frame(tables, compute), {
            "configuration": "configuration", "n_seeds": "seeds",
            **{m: m.replace("_", " ") for m in compute},
        })  # fmt: skip
    lines += ["", "### mechanism (per configuration, pooled over seeds and nodes)", ""]
    lines += table_lines(
        tables.mechanism,
        {"configuration": "configuration", "informative_per_round": "informative groups/round",
         "from_peers_per_round": "of them from peers", "rounds_without_gradient":
         "rounds with no gradient", "node_tasks": "node x task drawn", "reward_at_first_draw":
         "rewarded when first drawn", "discovered_later": "rewarded only later",
         "discovered_after_peer_groups": "...after peers' groups of the task",
         "never_rewarded": "never rewarded"},
    )  # fmt: skip
    return "\n".join(lines) + "\n"


def _percent(value: object) -> str:
    if not isinstance(value, float) or value != value:
        return "-"
    return f"{value:+.1%}"


def paper_lines(tables: ReplicateTables, *, baseline: str) -> list[str]:
    """SAPO's Table 1 beside ours by external share, and each sampler of our own against the
    paper's at the same I/J (dashboards/paper.py); nothing for configurations not named as
    a sweep names them."""
    labels = tables.runs.get_column("configuration").unique().to_list()
    if not sweep_labels(labels):
        return []
    lines: list[str] = []
    names = {"cumulative_training_reward": "cumulative training reward (the paper's measure)",
             "cumulative_claimed_reward": "cumulative claimed reward"}  # fmt: skip
    for metric, name in names.items():
        if metric not in tables.gains:
            continue
        frame = paper_comparison(
            tables.gains[metric], tables.configurations[metric], baseline=baseline
        )
        if frame.height < 2:
            continue  # the baseline alone: no configuration the paper ran
        is_base = pl.col("configuration") == baseline  # its gains are 0 by definition
        frame = frame.with_columns(
            pl.when(is_base)
            .then(pl.lit("baseline" if c.endswith("rel_gain") else "-"))
            .otherwise(pl.col(c).map_elements(_percent, return_dtype=pl.String))
            .alias(c)
            for c in ("paper_rel_gain", "rel_gain", "rel_low", "rel_high")
        )
        lines += ["", f"### SAPO's Table 1 beside this experiment: {name}", ""]
        lines += table_lines(
            frame,
            {"paper_configuration": "paper", "paper_cumulative": "paper's cumulative",
             "paper_rel_gain": "paper's gain", "configuration": "here", "n_seeds": "seeds",
             "baseline_mean": f"{baseline} on these seeds", "mean": "cumulative (mean)",
             "rel_gain": "gain", "rel_low": "95% low", "rel_high": "95% high",
             "excludes_zero": "interval excludes 0"},
        )  # fmt: skip
        lines += [
            "",
            "Gain: the mean paired difference over the baseline's mean on the same "
            "seeds; its bounds are the difference's 95% t interval over that mean (the "
            "baseline mean's own uncertainty is not in them). The paper ran 2000 rounds: "
            "compare the shape across shares, not the percentages.",
        ]
        if metric == "cumulative_training_reward":
            lines += ["", SELECTION_NOTE]
    names["final_accuracy"] = "final held-out accuracy"
    for metric, name in names.items():
        steps = shape_steps(tables.runs, metric=metric)
        if steps.is_empty():
            continue
        steps = steps.with_columns(
            pl.col(c).map_elements(_percent, return_dtype=pl.String)
            for c in ("rel_step", "paper_step")
        )
        lines += ["", f"### the shape, step by step in external share: {name}", ""]
        lines += table_lines(
            steps,
            {"configuration": "step", "n_seeds": "seeds", "paper_step": "paper's step",
             "baseline_mean": "before", "mean": "after", "diff_mean": "difference",
             "rel_step": "relative", "diff_low": "95% low", "diff_high": "95% high",
             "excludes_zero": "interval excludes 0"},
        )  # fmt: skip
    for metric, name in names.items():
        same = same_split_gains(tables.runs, metric=metric)
        if same.is_empty():
            continue
        lines += ["", f"### samplers at the same I/J: {name}", ""]
        lines += table_lines(
            same,
            {"configuration": "pair", "n_seeds": "seeds", "baseline_mean": "paper's sampler",
             "mean": "ours", "diff_mean": "difference", "diff_low": "95% low",
             "diff_high": "95% high", "per_seed": "per seed", "excludes_zero":
             "interval excludes 0"},
        )  # fmt: skip
    return lines


def _compute_frame(tables: ReplicateTables, metrics: list[str]) -> pl.DataFrame:
    """One row per configuration: the mean over seeds of each compute figure, with the
    seeds each is over ("8", or "8/7" when a figure is known for fewer seeds: update
    seconds come from MLflow, tokens from the ledger)."""
    frames = [
        tables.configurations[m].select(
            "configuration", pl.col("mean").alias(m), pl.col("n_seeds").alias(f"n_{m}")
        )
        for m in metrics
    ]
    joined = frames[0]
    for frame in frames[1:]:
        joined = joined.join(frame, on="configuration", how="left", maintain_order="left")
    counts = [f"n_{m}" for m in metrics]
    return joined.with_columns(
        pl.concat_list([pl.col(c).fill_null(0) for c in counts])
        .list.unique(maintain_order=True)
        .cast(pl.List(pl.String))
        .list.join("/")
        .alias("n_seeds")
    ).drop(counts)


def write_replicate_report(tables: ReplicateTables, out_dir: Path, *, baseline: str) -> Path:
    """statistics.md, the per-node-round CSV, the per-run CSV and the discoveries CSV."""
    out_dir.mkdir(parents=True, exist_ok=True)
    tables.node_rounds.write_csv(out_dir / "node_rounds.csv")
    tables.runs.write_csv(out_dir / "runs.csv")
    tables.discoveries.write_csv(out_dir / "discoveries.csv")
    path = out_dir / "statistics.md"
    path.write_text(replicate_markdown(tables, baseline=baseline))
    return path
