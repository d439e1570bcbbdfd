"""`sapo report` and the sweep flow's last step: ledger SQL + MLflow cross-check -> files.

The report itself (SQL, figures, HTML) lives in dashboards/; this module opens the ledger
and reads the MLflow metrics it is checked against. An experiment's paired-seed statistics
are flows/experiments/records.py's.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import polars as pl

from dashboards.report import Report, cross_check, render_report, report_tables
from flows.tracking import existing_store
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
    ``tracking_uri`` is given (an existing store: a mistyped one is an error, never a new
    empty store). ValueError (one line) when there is nothing to report."""
    if tracking_uri is not None:
        existing_store(tracking_uri)
    with Ledger.open(ledger_url, **(storage_options or {})) as ledger:
        try:
            tables = report_tables(ledger.query, experiment)
        except ValueError as exc:
            raise ValueError(f"{ledger_url}: {exc}") from None
    check = None
    if tracking_uri is not None:
        check = cross_check(tables.rewards, tracked_metrics(tracking_uri, experiment))
    return render_report(tables, out_dir, check=check, source=ledger_url)
