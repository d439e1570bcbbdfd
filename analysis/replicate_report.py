"""An experiment's paired-seed statistics as its report: statistics.md (the tables at a
glance, per configuration with intervals, gains over the baseline, SAPO's Table 1 beside
them, the shape step by step, samplers at the same split, oscillation, compute and the
mechanism) and the CSVs beside it, from the tables of analysis/replicates.py."""

from __future__ import annotations

from pathlib import Path

import polars as pl

from analysis.drift import drift_lines
from analysis.paper import (
    paper_comparison,
    parse_label,
    same_split_gains,
    shape_steps,
    sweep_labels,
)
from analysis.replicates import COMPUTE, ReplicateTables
from analysis.returns import TOKENS


def _num(value: object, spec: str = ".3f") -> str:
    if value is None or (isinstance(value, float) and value != value):
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return str(value)
    return format(value, spec) if isinstance(value, float) else str(value)


def table_lines(frame: pl.DataFrame, columns: dict[str, str], spec: str = ".3f") -> list[str]:
    """A Markdown table of ``columns`` (name: heading); floats written with ``spec``."""
    head = "| " + " | ".join(columns.values()) + " |"
    rule = "|" + "---|" * len(columns)
    body = [
        "| " + " | ".join(_num(row[c], spec) for c in columns) + " |"
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
    if tables.unpaired:
        lines.append(
            "Seeds whose configurations did not compute alike at round 0 (the untrained "
            "model's own groups or held-out answers differ between them: another machine's "
            "numerics, nondeterministic kernels or other code), so their pairing mixes in "
            "that difference: "
            f"{'; '.join(tables.unpaired)}."
        )
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
        # Means over seeds of token counts and seconds: a tenth is their precision.
        lines += table_lines(_compute_frame(tables, compute), {
            "configuration": "configuration", "n_seeds": "seeds",
            **{m: m.replace("_", " ") for m in compute},
        }, spec=".1f")  # fmt: skip
    lines += returns_lines(tables, baseline=baseline)
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
    if tables.drift is not None:
        lines += drift_lines(tables.drift)
    return "\n".join(lines) + "\n"


def _percent(value: object) -> str:
    if not isinstance(value, float) or value != value:
        return "-"
    return f"{value:+.1%}"


def paper_lines(tables: ReplicateTables, *, baseline: str) -> list[str]:
    """SAPO's Table 1 beside ours by external share, and each sampler of our own against the
    paper's at the same I/J (analysis/paper.py); nothing for configurations not named as
    a sweep names them."""
    labels = tables.runs.get_column("configuration").unique().to_list()
    if not sweep_labels(labels):
        return []
    lines: list[str] = []
    names = {"cumulative_training_reward": "cumulative training reward (the paper's measure)",
             "cumulative_claimed_reward": "cumulative claimed reward"}  # fmt: skip
    # The paper's gains are over 8/0: beside ours only when ours are over nodes alone too.
    alone = sweep_labels([baseline]) and parse_label(baseline).alone
    for metric, name in names.items():
        if metric not in tables.gains or not alone:
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
        lines += ["", f"### samplers and corrections at the same I/J: {name}", ""]
        lines += table_lines(
            same,
            {"configuration": "pair", "n_seeds": "seeds", "baseline_mean": "the paper's way",
             "mean": "ours", "diff_mean": "difference", "diff_low": "95% low",
             "diff_high": "95% high", "per_seed": "per seed", "excludes_zero":
             "interval excludes 0"},
        )  # fmt: skip
    return lines


RETURNS_NOTE = (
    "Gain: the mean paired gain in cumulative own (claimed) reward over the baseline. Per "
    "1k: per seed, that gain over the thousands of tokens a node of the configuration "
    "generated or trained on, then the mean and 95% interval over seeds: the same gain for "
    "twice the tokens reads half. Per 1k extra: the mean gain over the mean extra tokens a "
    "node spent beyond the baseline's on the same seeds (a ratio of means, no interval); "
    "'-' unless the configuration spent over 5% more than the baseline: the same or a "
    "smaller spend has no price."
)


def _interval_text(row: dict[str, object] | None) -> str:
    if row is None:
        return "-"
    cells = {"mean": row["per_1k"], "low": row["per_1k_low"], "high": row["per_1k_high"]}
    return _with_interval(cells, ".4f")


def returns_lines(tables: ReplicateTables, *, baseline: str) -> list[str]:
    """What each configuration's gain over the baseline cost: per 1,000 tokens a node
    generated and trained on, and per 1,000 extra tokens (analysis/returns.py)."""
    if tables.returns.is_empty():
        return []
    rows: dict[str, dict[str, dict[str, object]]] = {}
    for row in tables.returns.iter_rows(named=True):
        rows.setdefault(str(row["configuration"]), {})[str(row["tokens"])] = row
    lines = [
        "",
        f"### return on compute: the gain over {baseline} per 1,000 tokens a node spent",
        "",
    ]
    kinds = list(TOKENS)
    columns = {"configuration": "configuration", "seeds": "seeds", "gain": "gain"}
    columns |= {f"per_{k}": f"gain per 1k {k}" for k in kinds}
    columns |= {f"extra_{k}": f"extra {k} (k/node)" for k in kinds}
    columns |= {f"marginal_{k}": f"gain per 1k extra {k}" for k in kinds}
    body = []
    for configuration, by_kind in rows.items():
        first = next(iter(by_kind.values()))
        line: dict[str, object] = {
            "configuration": configuration,
            "seeds": "/".join(dict.fromkeys(str(r["n_seeds"]) for r in by_kind.values())),
            "gain": _num(first["gain"]),
        }
        for kind in kinds:
            found = by_kind.get(kind)
            line[f"per_{kind}"] = _interval_text(found)
            line[f"extra_{kind}"] = "-" if found is None else _num(found["extra_k"])
            line[f"marginal_{kind}"] = "-" if found is None else _num(found["per_1k_extra"], ".4f")
        body.append(line)
    lines += table_lines(pl.DataFrame(body, schema=dict.fromkeys(columns, pl.String)), columns)
    lines += ["", RETURNS_NOTE]
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
    """statistics.md, the per-node-round CSV, the per-run CSV, the discoveries CSV and,
    where records carry it, peers' drift per run and round (drift_rounds.csv)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    tables.node_rounds.write_csv(out_dir / "node_rounds.csv")
    tables.runs.write_csv(out_dir / "runs.csv")
    tables.discoveries.write_csv(out_dir / "discoveries.csv")
    if tables.drift is not None:
        tables.drift.rounds.write_csv(out_dir / "drift_rounds.csv")
    path = out_dir / "statistics.md"
    path.write_text(replicate_markdown(tables, baseline=baseline))
    return path
