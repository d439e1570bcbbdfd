"""The sweep as a Prefect flow: each configuration's swarm in turn, then the report.

Configurations run one after another so that each gets the same machine; a configuration
whose nodes all checkpointed their last round is skipped, so running the command again
resumes a stopped sweep. The report's figures go to the experiment's MLflow run and its
summary table becomes a Prefect markdown artifact of this flow run.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from prefect import flow, task
from prefect.artifacts import create_markdown_artifact
from prefect.cache_policies import NONE
from prefect.states import Cancelled, State

from flows.experiments.progress import read_progress, record_progress
from flows.experiments.sweep import ExperimentConfig, load_experiment
from flows.node.lifecycle import is_complete
from flows.swarm.launcher import run_swarm, write_resolved
from flows.swarm.stopping import SwarmStopped, stopped_lines


@task(name="run-configuration", cache_policy=NONE)
def run_configuration(
    experiment_file: str,
    overrides: list[str],
    index: int,
    parent_run_id: str | None,
    records_dir: str | None = None,
) -> dict[str, Any] | State:
    from analysis.record_folders import recorded
    from flows.experiments.records import record_covers

    exp = load_experiment(experiment_file, overrides)
    conf, seed = exp.runs()[index]
    swarm = exp.swarm_config(conf, seed)
    if records_dir is not None and recorded(Path(records_dir), swarm.swarm_id):
        if record_covers(exp, Path(records_dir), swarm.swarm_id):
            print(f"{swarm.swarm_id}: recorded in {records_dir} (done, here or elsewhere); skipped")
            record_progress(exp, swarm.swarm_id, "skipped", recorded=True)
            return {"swarm_id": swarm.swarm_id, "skipped": True, "failed": 0}
        print(
            f"{swarm.swarm_id}: its record in {records_dir} does not cover {swarm.rounds} rounds "
            f"of {len(swarm.nodes)} nodes (other settings); running it"
        )
    if is_complete(swarm):
        print(f"{swarm.swarm_id}: every node finished {swarm.rounds} rounds; skipped")
        record_progress(exp, swarm.swarm_id, "skipped")
        return {"swarm_id": swarm.swarm_id, "skipped": True, "failed": 0}
    print(f"{swarm.swarm_id}: {conf.label} with {conf.policy_kind(exp.swarm)} sampling")
    record_progress(exp, swarm.swarm_id, "started")
    try:
        failed = run_swarm(swarm, write_resolved(swarm), parent_run_id=parent_run_id)
    except SwarmStopped as stopped:
        # A stop is no failure: the task and the flow end Cancelled, with no traceback, and
        # `sapo experiment` says how far the run got (`stopped_runs`).
        record_progress(exp, swarm.swarm_id, "stopped", signal=stopped.signal_name)
        return Cancelled(message=f"{swarm.swarm_id}: {stopped}")
    record_progress(exp, swarm.swarm_id, "finished" if failed == 0 else "failed", failed=failed)
    if failed == 0 and records_dir is not None:
        from flows.experiments.records import record_runs

        # The run's few kilobytes of statistics, at once: the machine may not see the end.
        for done in record_runs(exp, Path(records_dir), [swarm.swarm_id]):
            print(f"{done}: recorded in {records_dir}")
    return {"swarm_id": swarm.swarm_id, "skipped": False, "failed": failed}


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
) -> dict[str, Any]:
    return experiment_report(experiment_file, overrides, out_dir, records_dir)


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
    parent = opened[1] if opened else None
    results = []
    for i in range(len(exp.runs())):
        result = run_configuration(experiment_file, overrides, i, parent, records_dir)
        if isinstance(result, State):  # stopped: the runs after it wait for a rerun
            if opened is not None:
                opened[0].finish(opened[1], "KILLED")
            return Cancelled(message=result.message)
        results.append(result)
    failed = sum(r["failed"] for r in results)
    out_dir = report_dir or str(exp.report_path())
    report = report_task(experiment_file, overrides, out_dir, records_dir)
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


def stopped_runs(exp: ExperimentConfig) -> SwarmStopped:
    """What a stop left, from the progress file: per run it stopped, where each node
    resumes; as the SwarmStopped that `sapo` prints (and exits 130 for)."""
    runs = read_progress(exp).get("runs") or {}
    lines, signal_name = [], "a signal"
    for conf, seed in exp.runs():
        swarm = exp.swarm_config(conf, seed)
        entry = runs.get(swarm.swarm_id)
        if not isinstance(entry, dict) or entry.get("state") != "stopped":
            continue
        lines.append(f"{swarm.swarm_id}: stopped")
        lines += stopped_lines(swarm.workdir, [n.node_id for n in swarm.nodes])
        signal_name = str(entry["events"][-1].get("signal", signal_name))
    return SwarmStopped(signal_name, lines)
