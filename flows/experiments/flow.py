"""The sweep as a Prefect flow: each configuration's swarm in turn, then the report.

Configurations run one after another so that each gets the same machine; a configuration
whose nodes all checkpointed their last round is skipped, so running the command again
resumes a stopped sweep. The report's figures go to the experiment's MLflow run and its
summary table becomes a Prefect markdown artifact of this flow run.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

from prefect import flow, task
from prefect.artifacts import create_markdown_artifact
from prefect.cache_policies import NONE
from prefect.states import Cancelled, State

from flows.experiments.progress import read_progress, record_progress, run_state
from flows.experiments.sweep import ExperimentConfig, load_experiment
from flows.node.lifecycle import is_complete
from flows.stops import stop_signal
from flows.swarm.launcher import run_swarm, write_resolved
from flows.swarm.stopping import SwarmStopped, stopped_lines

if TYPE_CHECKING:
    from flows.config import SwarmConfig


@task(name="run-configuration", cache_policy=NONE)
def run_configuration(
    experiment_file: str,
    overrides: list[str],
    index: int,
    parent_run_id: str | None,
    records_dir: str | None = None,
) -> dict[str, Any] | State:
    exp = load_experiment(experiment_file, overrides)
    conf, seed = exp.runs()[index]
    swarm = exp.swarm_config(conf, seed)
    try:
        return _run_or_skip(exp, swarm, conf.label, conf.policy_kind(exp.swarm), parent_run_id,
                            None if records_dir is None else Path(records_dir))  # fmt: skip
    except SwarmStopped as stopped:
        name: str | None = stopped.signal_name
    except BaseException as exc:  # outside the swarm's nodes: its models, MLflow run, record
        if (name := stop_signal(exc)) is None:
            raise
    # A stop is no failure: the task and the flow end Cancelled, with no traceback, and
    # `sapo experiment` says how far the run got (`stopped_runs`). A run that finished
    # stays finished (its record, if the stop cut it short, is written when it is skipped).
    if run_state(exp, swarm.swarm_id) == "started":
        record_progress(exp, swarm.swarm_id, "stopped", signal=name)
    return Cancelled(message=f"{swarm.swarm_id}: stopped by {name}")


def _run_or_skip(
    exp: ExperimentConfig,
    swarm: SwarmConfig,
    label: str,
    policy: str,
    parent_run_id: str | None,
    records: Path | None,
) -> dict[str, Any]:
    from analysis.record_folders import recorded
    from flows.experiments.records import record_covers

    if records is not None and recorded(records, swarm.swarm_id):
        if record_covers(exp, records, swarm.swarm_id):
            print(f"{swarm.swarm_id}: recorded in {records} (done, here or elsewhere); skipped")
            record_progress(exp, swarm.swarm_id, "skipped", recorded=True)
            return {"swarm_id": swarm.swarm_id, "skipped": True, "failed": 0}
        print(
            f"{swarm.swarm_id}: its record in {records} does not cover {swarm.rounds} rounds "
            f"of {len(swarm.nodes)} nodes (other settings); running it"
        )
    if is_complete(swarm):
        print(f"{swarm.swarm_id}: every node finished {swarm.rounds} rounds; skipped")
        _record(exp, swarm.swarm_id, records)  # a stop may have come before its record
        record_progress(exp, swarm.swarm_id, "skipped")
        return {"swarm_id": swarm.swarm_id, "skipped": True, "failed": 0}
    print(f"{swarm.swarm_id}: {label} with {policy} sampling")
    record_progress(exp, swarm.swarm_id, "started")
    failed = run_swarm(swarm, write_resolved(swarm), parent_run_id=parent_run_id)
    record_progress(exp, swarm.swarm_id, "finished" if failed == 0 else "failed", failed=failed)
    if failed == 0:
        # The run's few kilobytes of statistics, at once: the machine may not see the end.
        _record(exp, swarm.swarm_id, records)
    return {"swarm_id": swarm.swarm_id, "skipped": False, "failed": failed}


def _record(exp: ExperimentConfig, swarm_id: str, records: Path | None) -> None:
    """Write the run's record into ``records`` (if given) unless it already says as much."""
    if records is None:
        return
    from flows.experiments.records import record_runs

    for done in record_runs(exp, records, [swarm_id]):
        print(f"{done}: recorded in {records}")


def experiment_report(
    experiment_file: str,
    overrides: list[str],
    out_dir: str,
    records_dir: str | None = None,
    *,
    write_records: bool = True,
) -> dict[str, Any]:
    """The sweep's report under ``out_dir``: every swarm this machine's ledger holds, and the
    paired-seed statistics of the runs it holds or ``records_dir`` records (this machine's
    complete runs are recorded there too, unless ``write_records`` is false)."""
    from flows.experiments.records import report_replicates
    from flows.reports.report import report_ledger

    exp = load_experiment(experiment_file, overrides)
    out = Path(out_dir)
    # A machine that never ran the sweep (no working directory) reports from the records
    # alone, and leaves no empty ledger or MLflow store behind.
    local = records_dir is None or exp.workdir_path().exists()
    report = None
    try:
        if local:
            report = report_ledger(
                exp.ledger_url(), out, tracking_uri=exp.tracking_uri(), experiment=exp.experiment
            )
        else:
            print(f"no sweep here ({exp.workdir_path()}): the statistics come from {records_dir}")
    except ValueError as exc:
        if records_dir is None:
            raise
        # Every run was done on other machines: their records carry the statistics.
        print(f"no ledger report ({exc}); the statistics come from {records_dir}")
    records = None if records_dir is None else Path(records_dir)
    statistics = report_replicates(
        exp, out, records, write_records=write_records, from_ledger=local
    )
    markdown = report.markdown if report is not None else f"# {exp.experiment}\n"
    if statistics is not None:
        markdown += "\n\n## Paired seeds\n\n" + statistics.read_text()
    if report is not None:
        html: str | None = str(report.html)
    else:
        html = None if statistics is None else str(statistics)
    return {"html": html, "markdown": markdown, "figures": report.figures if report else []}


@task(name="report", cache_policy=NONE)
def report_task(
    experiment_file: str, overrides: list[str], out_dir: str, records_dir: str | None = None
) -> dict[str, Any] | State:
    print(f"writing the report under {out_dir}", flush=True)
    try:
        return experiment_report(experiment_file, overrides, out_dir, records_dir)
    except BaseException as exc:  # every run is done: a rerun skips them and writes it
        if (name := stop_signal(exc)) is None:
            raise
        return Cancelled(message=f"stopped by {name} in the report, every run done")


def _experiment_run(exp: ExperimentConfig) -> tuple[Any, str] | None:
    from flows.node.runtime import open_swarm_tracker

    # The experiment's run lives where its swarms' runs do, so they can nest under it.
    first = exp.swarm_config(exp.configurations[0])
    if not first.tracking.enabled:
        return None
    tracker = open_swarm_tracker(first)
    tags = {"sapo.experiment": exp.experiment, "sapo.role": "experiment"}
    params = {
        "configurations": ",".join(exp.swarm_id(c, s) for c, s in exp.runs()),
        "ledger.url": exp.ledger_url(),
    }
    run_id = tracker.run(exp.experiment, tags, params)
    return None if run_id is None else (tracker, run_id)


@flow(name="sapo-experiment", flow_run_name="{experiment_name}")
def experiment_flow(
    experiment_file: str,
    experiment_name: str,
    overrides: list[str] | None = None,
    report_dir: str | None = None,
    records_dir: str | None = None,
) -> dict[str, Any] | State:
    """Run every configuration of a sweep, then write and attach its report; Cancelled
    (the caller gets prefect's CancelledRun) when a stop signal ends a run. With
    ``records_dir``, each finished run's record is written there (analysis/record_folders.py), a
    run already recorded there is skipped, and the report counts recorded runs too."""
    overrides = overrides or []
    exp = load_experiment(experiment_file, overrides)
    opened = _experiment_run(exp)
    try:
        outcome = _runs_then_report(
            exp, experiment_file, overrides, opened, report_dir, records_dir
        )
    except BaseException as exc:  # between two tasks: in Prefect's code, or MLflow's
        if (name := stop_signal(exc)) is None:
            raise
        outcome = Cancelled(message=f"{exp.experiment}: stopped by {name}")
    if isinstance(outcome, State) and opened is not None:
        opened[0].finish(opened[1], "KILLED")  # the runs after the stop wait for a rerun
    return outcome


def _runs_then_report(
    exp: ExperimentConfig,
    experiment_file: str,
    overrides: list[str],
    opened: tuple[Any, str] | None,
    report_dir: str | None,
    records_dir: str | None,
) -> dict[str, Any] | State:
    parent = opened[1] if opened else None
    results = []
    for i in range(len(exp.runs())):
        result = run_configuration(experiment_file, overrides, i, parent, records_dir)
        if isinstance(result, State):  # stopped
            return Cancelled(message=result.message)
        results.append(result)
    failed = sum(r["failed"] for r in results)
    out_dir = report_dir or str(exp.report_path())
    report = report_task(experiment_file, overrides, out_dir, records_dir)
    if isinstance(report, State):
        return Cancelled(message=f"{exp.experiment}: {report.message}")
    create_markdown_artifact(
        report["markdown"],
        key=f"{exp.experiment.lower().replace('_', '-').replace('.', '-')}-summary",
        description=f"Cumulative reward per configuration of {exp.experiment}",
    )
    if opened is not None:
        tracker, run_id = opened
        tracker.log_artifacts(run_id, out_dir, "report")
        tracker.finish(run_id, "FINISHED" if failed == 0 else "FAILED")
    return {"configurations": results, "report": report["html"], "failed": failed}


def stopped_runs(exp: ExperimentConfig, message: str = "") -> SwarmStopped:
    """What a stop left, from the progress file: per run it stopped, where each node
    resumes; as the SwarmStopped that `sapo` prints (and exits 130 for). ``message``: the
    cancelled flow's (``<what>: stopped by <signal>...``), the one line where the stop came
    outside a run (between two, or in the report)."""
    runs = read_progress(exp).get("runs") or {}
    lines, name = [], "a signal"
    for conf, seed in exp.runs():
        swarm = exp.swarm_config(conf, seed)
        entry = runs.get(swarm.swarm_id)
        if not isinstance(entry, dict) or entry.get("state") != "stopped":
            continue
        lines.append(f"{swarm.swarm_id}: stopped")
        lines += stopped_lines(swarm.workdir, [n.node_id for n in swarm.nodes])
        name = str(entry["events"][-1].get("signal", name))
    if not lines and message:
        lines.append(message)
        found = re.search(r"stopped by (SIG[A-Z]+)", message)
        name = found.group(1) if found else name
    return SwarmStopped(name, lines)
