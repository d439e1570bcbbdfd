"""`sapo report` and the sweep flow's last step: ledger SQL + MLflow cross-check -> files.

The report itself (SQL, figures, HTML) lives in dashboards/; this module opens the ledger
and reads the MLflow metrics it is checked against.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import polars as pl

from dashboards.families import family_markdown, family_tables
from dashboards.figures import configuration_curves
from dashboards.replicates import replicate_tables, write_replicate_report
from dashboards.report import Report, cross_check, render_report, report_tables
from flows.config import SwarmConfig
from flows.experiments.sweep import ExperimentConfig
from ledger import Ledger

CHECKED_METRICS = ("own_reward", "training_reward")


def tracked_metrics(
    tracking_uri: str, experiment: str | None = None, keys: tuple[str, ...] = CHECKED_METRICS
) -> pl.DataFrame:
    """Per node-round MLflow metrics ``keys`` of every node run (of one MLflow experiment,
    if named)."""
    from flows.env import apply_offline_defaults

    apply_offline_defaults()
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=tracking_uri)
    if experiment is not None:
        found = client.get_experiment_by_name(experiment)
        ids = [found.experiment_id] if found is not None else []
    else:
        ids = [e.experiment_id for e in client.search_experiments()]
    rows: dict[tuple[str, str, int], dict[str, Any]] = {}
    runs = client.search_runs(ids, filter_string="tags.`sapo.node_id` != ''") if ids else []
    for run in runs:
        swarm, node = run.data.tags.get("sapo.swarm_id", ""), run.data.tags["sapo.node_id"]
        for key in keys:
            for metric in client.get_metric_history(run.info.run_id, key):
                row = rows.setdefault(
                    (swarm, node, metric.step),
                    {"swarm_id": swarm, "node_id": node, "node_round": metric.step},
                )
                row[key] = metric.value
    schema = {"swarm_id": pl.String, "node_id": pl.String, "node_round": pl.Int64}
    schema |= {key: pl.Float64 for key in keys}
    return pl.DataFrame(list(rows.values()), schema=schema)


def report_ledger(
    ledger_url: str,
    out_dir: Path,
    *,
    tracking_uri: str | None = None,
    experiment: str | None = None,
    storage_options: dict[str, Any] | None = None,
) -> Report:
    """Write the report of the ledger at ``ledger_url`` under ``out_dir``: every swarm in
    it, or only the swarms of ``experiment``; cross-checked against MLflow when a
    ``tracking_uri`` is given. ValueError (one line) when there is nothing to report."""
    with Ledger.open(ledger_url, **(storage_options or {})) as ledger:
        try:
            tables = report_tables(ledger.query, experiment)
        except ValueError as exc:
            raise ValueError(f"{ledger_url}: {exc}") from None
    check = None
    if tracking_uri is not None:
        check = cross_check(tables.rewards, tracked_metrics(tracking_uri, experiment))
    return render_report(tables, out_dir, check=check, source=ledger_url)


def heldout_overlap(ledger: Ledger, swarm: SwarmConfig, swarm_ids: list[str]) -> tuple[int, int]:
    """How many held-out questions (by task and text) the runs also generated for training:
    different seeds never share a (seed, index) key, but tiny task settings repeat texts."""
    from sapo_core.evaluation import heldout_questions

    node = swarm.nodes[0].node
    questions = {(q.task, q.question) for q in heldout_questions(node.evaluation, node.tasks)}
    if not questions or not node.evaluation.every:
        return (0, 0)
    seen = ledger.query(
        "SELECT DISTINCT task, question FROM rollouts WHERE list_contains($swarms, swarm_id)",
        {"swarms": swarm_ids},
    )
    return (len(questions & set(seen.rows())), len(questions))


def report_replicates(exp: ExperimentConfig, out_dir: Path) -> Path | None:
    """The experiment's paired-seed statistics and diagnostics (statistics.md, CSVs and the
    held-out figure) under ``out_dir``; None when the experiment has no J = 0 baseline."""
    baseline = exp.baseline_label()
    if baseline is None:
        return None
    first = exp.swarm_config(*exp.runs()[0])
    seconds = None
    if first.tracking.enabled:
        # The update's seconds are in MLflow only (a node's timings are not the ledger's).
        seconds = tracked_metrics(exp.tracking_uri(), exp.experiment, ("seconds_update",))
    with Ledger(first.ledger) as ledger:
        tables = replicate_tables(
            ledger.query,
            exp.replicates(),
            baseline=baseline,
            rounds=first.rounds,
            nodes=len(first.nodes),
            update_seconds=seconds,
        )
        tables.heldout_overlap = heldout_overlap(ledger, first, list(exp.replicates()))
        mixed = len({spec.node.model for spec in first.nodes}) > 1
        families = (
            family_tables(ledger.query, tables.node_rounds, baseline=baseline, rounds=first.rounds)
            if mixed
            else None
        )
    path = write_replicate_report(tables, out_dir, baseline=baseline)
    if families is not None:
        # A swarm of several models: each family against its own J = 0 runs as well.
        families.runs.write_csv(out_dir / "families.csv")
        path.write_text(path.read_text() + "\n" + family_markdown(families, baseline=baseline))
    done = tables.runs.filter(pl.col("complete"))["swarm_id"].implode()
    configuration_curves(
        tables.node_rounds.filter(pl.col("swarm_id").is_in(done)), out_dir / "heldout.png"
    )
    return path
