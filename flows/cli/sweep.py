"""`sapo experiment`, `sapo report` and `sapo compare`: sharing sweeps, the report of any
ledger, and the nodes of an MLflow tracking store side by side."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from flows.cli.common import (
    Format,
    FormatOpt,
    StorageOpt,
    fail,
    guarded,
    open_ledger,
    parse_storage_options,
    print_frame,
    require,
)

if TYPE_CHECKING:
    from flows.experiments.sweep import ExperimentConfig


def experiment(
    config: Annotated[Path, typer.Option("-c", "--config", help="Experiment YAML (a sweep).")],
    dry_run: Annotated[
        bool, typer.Option(help="Validate the sweep and print its plan; train nothing.")
    ] = False,
    report_dir: Annotated[
        Path | None,
        typer.Option(help="Where the report goes (default <workdir>/reports/<experiment>)."),
    ] = None,
    records: Annotated[
        Path | None,
        typer.Option(
            help="Folder of run records (commit it): each finished run's statistics go there "
            "at once, a recorded run is skipped, and the report counts recorded runs, so a "
            "sweep can finish on another machine."
        ),
    ] = None,
    report_only: Annotated[
        bool,
        typer.Option(
            help="Start no run and write no record: report what --records holds and what "
            "this machine's ledger holds (a sweep finished elsewhere, or one still running)."
        ),
    ] = False,
    rerecord: Annotated[
        bool,
        typer.Option(
            help="With --report-only: first (re)write into --records the record of each "
            "complete run this machine's ledger holds, with this version's tables (a record "
            "an older sapo wrote gains what this one adds, such as peers' drift); the "
            "earlier record's code, host and time stay in its record.json."
        ),
    ] = False,
    overrides: Annotated[
        list[str] | None,
        typer.Option(
            "--set",
            metavar="KEY=VALUE",
            help="Override any key of the experiment file (repeatable): --set swarm.rounds=2; "
            "--set baseline=2/2 reports the gains over another configuration.",
        ),
    ] = None,
) -> None:
    """Run a sweep of sharing configurations, then its report. Every configuration runs
    the same seeds, tasks and models."""
    require("flows")
    require("dashboards")
    from flows.config import ConfigError
    from flows.experiments.plan import format_plan
    from flows.experiments.sweep import load_experiment

    try:
        exp = load_experiment(config, overrides or [])
    except ConfigError as exc:
        raise fail(f"bad experiment configuration: {exc}") from exc
    if records is not None and records.exists() and not records.is_dir():
        # Found now, not when the first run of many hours tries to write its record.
        raise fail(f"--records {records}: not a folder")
    if rerecord and (not report_only or records is None):
        raise fail("--rerecord goes with --report-only and --records (the folder to rewrite)")
    if report_only and records is not None and not records.exists():
        # a typo would otherwise read as "no run has rounds"
        raise fail(f"--records {records}: no such folder to report from")
    print(format_plan(exp, None if records is None else records.resolve()))
    if dry_run:
        return
    if report_only:
        out_dir = report_dir or exp.report_path()
        from flows.experiments.flow import experiment_report

        made = guarded(
            lambda: experiment_report(
                str(config.resolve()), overrides or [], str(out_dir.resolve()),
                str(records.resolve()) if records else None, write_records=rerecord,
            )
        )  # fmt: skip
        print(made["markdown"])
        # Nothing at all when no ledger here holds a run and the sweep has no J = 0 baseline.
        print(f"report: {made['html']}" if made["html"] else "no report: nothing to report")
        return
    with _sweep_prefect(exp):
        from prefect.exceptions import CancelledRun

        from flows.experiments.flow import experiment_flow, stopped_runs

        try:
            result = experiment_flow(
                str(config.resolve()),
                exp.experiment,
                overrides or [],
                str(report_dir.resolve()) if report_dir else None,
                str(records.resolve()) if records else None,
            )
        except CancelledRun as cancelled:  # stopped: one line a node, as `sapo swarm` says it
            raise stopped_runs(exp, str(cancelled)) from None
        if not isinstance(result, dict):
            raise stopped_runs(exp)
    print(f"report: {result['report']}")
    if result["failed"]:
        raise fail(f"{result['failed']} node(s) failed")


@contextmanager
def _sweep_prefect(exp: ExperimentConfig) -> Iterator[None]:
    """The Prefect server of the sweep's flow: PREFECT_API_URL's, else one of its own under
    the working directory, which a Ctrl-C does not stop before the flow has said that it
    stopped (flows/services/prefect_server.py). Node processes keep their own (each an
    ephemeral one, flows/swarm/launcher.py): this one is not in their environment."""
    from flows.services.prefect_server import flows_outlive_ctrl_c

    home = exp.workdir_path() / "prefect" / "experiment"
    if not os.environ.get("PREFECT_API_URL"):
        home.mkdir(parents=True, exist_ok=True)
        os.environ["PREFECT_HOME"] = str(home)  # the flow's result storage too
    with flows_outlive_ctrl_c(home):
        yield


def report(
    ledger: Annotated[str, typer.Option(help="Ledger root: a path, file:// or s3://bkt/p.")],
    out: Annotated[Path, typer.Option(help="Folder for report.html, figures and report.json.")],
    mlflow: Annotated[
        str | None, typer.Option(help="MLflow tracking URI to cross-check against.")
    ] = None,
    experiment_name: Annotated[
        str | None, typer.Option("--experiment", help="Only this experiment's swarms.")
    ] = None,
    storage_option: StorageOpt = None,
) -> None:
    """Report a ledger's swarms and sweeps: HTML, PNGs, tables. Each sweep gets its
    comparison of sharing configurations."""
    require("dashboards")
    if mlflow is not None:
        require("flows", "mlflow")
    from flows.reports.report import report_ledger

    open_ledger(ledger, storage_option).close()  # a mistyped ledger is an error, not empty
    made = guarded(
        lambda: report_ledger(
            ledger,
            out,
            tracking_uri=mlflow,
            experiment=experiment_name,
            storage_options=parse_storage_options(storage_option),
        )
    )
    print(made.markdown)
    if made.check is not None:
        print(
            f"MLflow cross-check: {'consistent' if made.check.consistent else 'INCONSISTENT'} "
            f"({made.check.matched} node-rounds, max difference {made.check.max_abs_diff:.1e})"
        )
    print(f"report: {made.html}")


class CompareTable(StrEnum):
    """Which of `sapo compare`'s tables `-f csv` prints (a CSV holds one)."""

    nodes = "nodes"
    configurations = "configurations"


def compare(
    mlflow: Annotated[
        str,
        typer.Option(
            envvar="MLFLOW_TRACKING_URI",
            help="MLflow tracking URI: a server (http://host:5000) or sqlite:///path.",
        ),
    ],
    experiment_name: Annotated[
        str | None, typer.Option("--experiment", help="One MLflow experiment (default: all).")
    ] = None,
    register: Annotated[
        str | None,
        typer.Option(
            help="Register the best node's logged model under this name (once: again, it "
            "names the version it already is)."
        ),
    ] = None,
    fmt: FormatOpt = Format.table,
    table: Annotated[
        CompareTable,
        typer.Option(help="With -f csv, the one table to print (json holds both)."),
    ] = CompareTable.nodes,
) -> None:
    """Nodes and sharing configurations side by side, from MLflow. Best first by
    cumulative_own_reward; optionally register the best node's model."""
    require("flows", "mlflow")
    from flows.reports.compare import read_comparison, register_best_model

    made = guarded(lambda: read_comparison(mlflow, experiment_name))
    registered: dict[str, Any] | None = None
    if register is not None:
        found = guarded(lambda: register_best_model(mlflow, made.nodes, register))
        if found is None:
            raise fail("no node run logged a model: nothing to register")
        best, version, new = found
        registered = {"name": register, "version": version, "new": new,
                      **{k: best[k] for k in ("node_id", "swarm_id", "run_id", "logged_model")},
                      "cumulative_own_reward": best["cumulative_own_reward"]}  # fmt: skip
    if fmt == "json":  # one document: both tables and what was registered
        document = {
            "nodes": json.loads(made.nodes.write_json()),
            "configurations": json.loads(made.configurations.write_json()),
        }
        if register is not None:
            document["registered"] = registered
        print(json.dumps(document, default=str))
        return
    if fmt == "csv":  # one table; what was registered goes to stderr
        print_frame(made.nodes if table == "nodes" else made.configurations, fmt)
    else:
        print("nodes:")
        print_frame(made.nodes.drop("run_id"), fmt)  # a terminal table without run ids
        print("configurations (means over their nodes):")
        print_frame(made.configurations, fmt)
    if registered is not None:
        line = (
            f"{'registered' if registered['new'] else 'already registered:'} "
            f"{registered['node_id']} of {registered['swarm_id']} "
            f"({registered['logged_model']}, cumulative_own_reward "
            f"{registered['cumulative_own_reward']:.3f}) as {register!r} "
            f"version {registered['version']}"
        )
        typer.echo(line, err=fmt == "csv")
