"""An experiment's runs as records and paired-seed statistics: each complete run's few
kilobytes of figures (kept beside the sweep, so a run made on another machine counts), and
the report over them (analysis/replicate_report.py renders it)."""

from __future__ import annotations

import logging
import platform
import subprocess
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path

import polars as pl

from analysis.families import family_markdown, family_tables
from analysis.record_folders import (
    RecordError,
    digests_of,
    encode_record,
    read_record,
    read_records,
    record_manifest,
    recorded,
    replacement_losses,
    write_record,
)
from analysis.records import RunRecords, records_from_ledger
from analysis.replicate_report import write_replicate_report
from analysis.replicates import planned_order, run_metrics, tables_from_records
from dashboards.figures import configuration_curves
from flows.config import SwarmConfig
from flows.experiments.progress import read_progress, run_machines, run_walls
from flows.experiments.sweep import ExperimentConfig
from flows.reports.report import tracked_metrics
from ledger import Ledger

log = logging.getLogger(__name__)


def heldout_keys(swarm: SwarmConfig) -> set[tuple[str, str]]:
    """The held-out questions (task, text) of the swarm's evaluation; empty when it has none."""
    from sapo_core.evaluation import heldout_questions

    node = swarm.nodes[0].node
    if not node.evaluation.every:
        return set()
    return {(q.task, q.question) for q in heldout_questions(node.evaluation, node.tasks)}


def ledger_records(exp: ExperimentConfig, swarm_ids: list[str] | None = None) -> RunRecords:
    """The run records of the experiment's runs (or of ``swarm_ids``) as this machine's
    ledger and MLflow store hold them."""
    first = exp.swarm_config(*exp.runs()[0])
    replicates = exp.replicates()
    if swarm_ids is not None:
        replicates = {s: replicates[s] for s in swarm_ids}
    seconds = None
    if first.tracking.enabled:
        # The update's seconds are in MLflow only (a node's timings are not the ledger's).
        seconds = tracked_metrics(exp.tracking_uri(), exp.experiment, ("seconds_update",))
    with Ledger(first.ledger) as ledger:
        return records_from_ledger(
            ledger.query, replicates, update_seconds=seconds, heldout=heldout_keys(first)
        )


def complete_runs(exp: ExperimentConfig, records: RunRecords) -> list[str]:
    """The runs in ``records`` with every node's rounds and final evaluation."""
    first = exp.swarm_config(*exp.runs()[0])
    if records.node_rounds.is_empty():
        return []
    metrics = run_metrics(records.node_rounds, first.rounds, len(first.nodes))
    return sorted(metrics.filter(pl.col("complete"))["swarm_id"].to_list())


def record_covers(exp: ExperimentConfig, root: Path, swarm_id: str) -> bool:
    """Whether ``root`` holds a record of the run as ``exp`` plans it: every node's rounds
    and final evaluation. A record of the same swarm id under other settings (``--set
    swarm.rounds=...``) does not; one that cannot be read does (it is kept, not run over:
    ``record_runs`` says why)."""
    if not recorded(root, swarm_id):
        return False
    try:
        found = read_record(root / swarm_id)
    except RecordError:
        return True
    return swarm_id in complete_runs(exp, found)


def record_runs(
    exp: ExperimentConfig,
    root: Path,
    swarm_ids: list[str] | None = None,
    *,
    records: RunRecords | None = None,
) -> list[str]:
    """Write ``<root>/<swarm_id>/`` for each complete run (of ``swarm_ids``, or all) that
    this machine's ledger holds (or ``records``, read from it already): what a replaced
    machine would otherwise lose. A record already there is kept as it is when this one
    says the same, or would lose anything it has (``replacement_losses``), or cannot be
    read (a newer version, a damaged file: the warning says which). Returns the runs whose
    record now holds what this machine has."""
    if records is None:
        records = ledger_records(exp, swarm_ids)
    facts = {"experiment": exp.experiment, "code": code_version(), "host": platform.node(),
             "written_at": datetime.now(UTC).isoformat(timespec="seconds")}  # fmt: skip
    done = []
    walls = run_walls(exp, root)  # before any is rewritten: a record keeps what it had
    machines = run_machines(read_progress(exp))
    for swarm_id in complete_runs(exp, records):
        manifest = record_manifest(root, swarm_id)
        if recorded(root, swarm_id) and (why := _keeps(root, swarm_id, records)):
            log.warning("%s: its record in %s is kept: %s", swarm_id, root, why)
            continue
        kept = {"wall": walls.get(swarm_id), **_kept(manifest, facts, machines.get(swarm_id))}
        if not _says_more(manifest, records, swarm_id, kept):
            done.append(swarm_id)  # the same tables, machines and wall time: no churn
            continue
        write_record(records, swarm_id, root, **facts, **kept)
        done.append(swarm_id)
    return done


def _keeps(root: Path, swarm_id: str, records: RunRecords) -> str | None:
    """Why the record in ``root`` must not be replaced by ``records``' (None: it may be)."""
    try:
        old = read_record(root / swarm_id)
    except RecordError as exc:
        return f"it cannot be read here ({exc}); move it away to record the run again"
    lost = replacement_losses(old, records.only([swarm_id]))
    if lost:
        return "this machine holds less of the run (" + "; ".join(lost) + ")"
    return None


def _says_more(
    manifest: Mapping[str, object], records: RunRecords, swarm_id: str, kept: Mapping[str, object]
) -> bool:
    """Whether writing would change what the record says of the run: its tables, machines or
    wall time (not merely who wrote it, and when)."""
    if manifest.get("sha256") != digests_of(encode_record(records, swarm_id)):
        return True
    return any(manifest.get(k) != kept.get(k) for k in ("machines", "wall") if kept.get(k))


def _kept(
    manifest: Mapping[str, object], facts: Mapping[str, str], ran_on: list[str] | None
) -> dict[str, object]:
    """The facts a record carries beside ``facts`` and its wall time: the machines the run's
    attempts started on (those the record it replaces named, then this machine's progress
    file's, each once), and, when other code or another host rewrites a record, the code,
    host and time that first recorded the run (a sweep's fixed clone) as ``earlier``."""
    out: dict[str, object] = {}
    before = manifest.get("machines")
    named = [m for m in before if isinstance(m, str)] if isinstance(before, list) else []
    machines = list(dict.fromkeys([*named, *(ran_on or [])]))
    if machines:
        out["machines"] = machines
    first = {k: manifest[k] for k in ("code", "host", "written_at") if k in manifest}
    if "earlier" in manifest:
        out["earlier"] = manifest["earlier"]
    elif first and (first.get("code"), first.get("host")) != (facts["code"], facts["host"]):
        out["earlier"] = first
    return out


def code_version() -> str:
    """The commit of the checkout this code runs from (a sweep's fixed clone), or 'unknown'."""
    here = Path(__file__).resolve().parents[2]
    try:
        found = subprocess.run(
            ["git", "-C", str(here), "rev-parse", "HEAD"],
            capture_output=True, text=True, timeout=10, check=True,
        )  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return found.stdout.strip() or "unknown"


def report_replicates(
    exp: ExperimentConfig,
    out_dir: Path,
    records_dir: Path | None = None,
    *,
    write_records: bool = True,
    from_ledger: bool = True,
) -> Path | None:
    """The experiment's paired-seed statistics and diagnostics (statistics.md, CSVs and the
    held-out figure) under ``out_dir``; None when the experiment has no J = 0 baseline.
    Without ``from_ledger``, the records alone: no ledger or MLflow store is opened (or
    made) on this machine.

    With ``records_dir``, every complete run this machine holds is (re)recorded there first
    (unless ``write_records`` is false: a report beside a running sweep, which writes its
    own), and runs this machine lacks are read from their records: a sweep finished across
    several machines is reported as one."""
    baseline = exp.baseline_label()
    if baseline is None:
        return None
    first = exp.swarm_config(*exp.runs()[0])
    records = ledger_records(exp) if from_ledger else RunRecords.concat([])
    if records_dir is not None:
        if write_records:
            here = record_runs(exp, records_dir, records=records)
        else:
            here = complete_runs(exp, records)
        elsewhere = [s for s in exp.replicates() if s not in here and recorded(records_dir, s)]
        ours = records.only(s for s in records.swarm_ids() if s not in elsewhere)
        records = RunRecords.concat([ours, read_records(records_dir, elsewhere)])
    if records.node_rounds.is_empty():  # say where it looked: a wrong file or folder, often
        read = ["this machine's ledger"] if from_ledger else []
        read += [] if records_dir is None else [f"the records in {records_dir}"]
        raise ValueError(
            f"none of {exp.experiment}'s {len(exp.replicates())} planned runs has rounds in "
            f"{' or '.join(read) or 'nothing read'}"
        )
    tables = tables_from_records(records, baseline=baseline, rounds=first.rounds,
                                 nodes=len(first.nodes), planned=exp.replicates(),
                                 generates=exp.own_generation())  # fmt: skip
    total = len(heldout_keys(first))
    seen = records.heldout_seen.select("task", "question").unique().height
    tables.heldout_overlap = (seen, total)
    mixed = len({spec.node.model for spec in first.nodes}) > 1
    families = family_tables(records, baseline=baseline, rounds=first.rounds) if mixed else None
    path = write_replicate_report(tables, out_dir, baseline=baseline)
    if families is not None:
        # A swarm of several models: each family against its own baseline runs as well.
        families.runs.write_csv(out_dir / "families.csv")
        path.write_text(path.read_text() + "\n" + family_markdown(families, baseline=baseline))
    done = tables.runs.filter(pl.col("complete"))["swarm_id"].implode()
    order = planned_order(exp.replicates())
    configuration_curves(
        tables.node_rounds.filter(pl.col("swarm_id").is_in(done)), out_dir / "curves.png", order
    )
    return path
