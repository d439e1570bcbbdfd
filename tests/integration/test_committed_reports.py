"""The published experiment reports are what their committed records give: each report's
statistics.md and every CSV (where docs/ and the README take their tables from) come back byte
for byte from `--report-only` with today's code, so a change to the statistics cannot
silently leave them stale. (Figures the docs mark *post hoc* are in no report.) Bytes hold
with the versions CI installs (constraints.txt); another polars or SciPy may print a float
otherwise."""

from __future__ import annotations

import shutil
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAPER_TABLE = "docs/paper-table-cpu"
COMPUTE_MATCHED = "docs/compute-matched-cpu"


@dataclass(frozen=True)
class Published:
    experiment: str  # the experiment file
    records: str  # its committed run records
    report: str  # the committed report the docs quote
    overrides: list[str] = field(default_factory=list)  # `--set` as the doc gives it
    # records committed apart that replace the runs of the same name (a re-run)
    replaced_by: str | None = None


PUBLISHED = {
    "paper-table": Published(
        "examples/paper-table-cpu.yaml", f"{PAPER_TABLE}/records", f"{PAPER_TABLE}/report"
    ),
    # issue 32's supplementary checks of seed 4 (docs/paper-table-cpu.md)
    "paper-table-without-seed-4": Published(
        "examples/paper-table-cpu.yaml",
        f"{PAPER_TABLE}/records",
        f"{PAPER_TABLE}/report-without-seed4",
        overrides=["seeds=[0,1,2,3,5,6,7]"],
    ),
    "paper-table-seed-4-re-paired": Published(
        "examples/paper-table-cpu.yaml",
        f"{PAPER_TABLE}/records",
        f"{PAPER_TABLE}/report-seed4-rerun",
        replaced_by=f"{PAPER_TABLE}/records-seed4-rerun",
    ),
    # issue 46: every configuration against nodes alone, and the question itself
    "compute-matched": Published(
        "examples/compute-matched-cpu.yaml",
        f"{COMPUTE_MATCHED}/records",
        f"{COMPUTE_MATCHED}/report",
    ),
    "compute-matched-vs-control": Published(
        "examples/compute-matched-cpu.yaml",
        f"{COMPUTE_MATCHED}/records",
        f"{COMPUTE_MATCHED}/report-vs-control",
        overrides=["baseline=4/0-q8-informative-first"],
    ),
}


def records_folder(published: Published, tmp_path: Path) -> Path:
    committed = ROOT / published.records
    if published.replaced_by is None:
        return committed
    combined = tmp_path / "records"
    shutil.copytree(committed, combined)
    for run in sorted((ROOT / published.replaced_by).iterdir()):
        assert (combined / run.name).is_dir(), f"{run.name} replaces no committed record"
        shutil.rmtree(combined / run.name)
        shutil.copytree(run, combined / run.name)
    return combined


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_a_published_report_is_what_its_records_give(name: str, tmp_path: Path) -> None:
    from flows.experiments.flow import experiment_report

    published = PUBLISHED[name]
    out = tmp_path / "report"
    experiment_report(
        str(ROOT / published.experiment),
        # No sweep here: the statistics come from the records alone, none is written.
        [*published.overrides, f"workdir={tmp_path / 'no-sweep-here'}"],
        str(out),
        str(records_folder(published, tmp_path)),
        write_records=False,
    )
    assert not (tmp_path / "no-sweep-here").exists()
    committed_dir = ROOT / published.report
    tables = sorted(p.name for p in committed_dir.glob("*.csv"))
    # every table the report writes is committed (drift_rounds.csv where runs logged drift)
    assert sorted(p.name for p in out.glob("*.csv")) == tables, regenerate(published)
    for file in ("statistics.md", *tables):
        fresh = (out / file).read_bytes()
        committed = (committed_dir / file).read_bytes()
        assert fresh == committed, f"{published.report}/{file} is stale: {regenerate(published)}"


def regenerate(published: Published) -> str:
    """How to write the report again, for the failure message."""
    records = published.records
    steps = ""
    if published.replaced_by is not None:
        records = "/tmp/records"
        steps = (
            f"cp -r {published.records} {records}, replace its runs of the same names by "
            f"those of {published.replaced_by}, then "
        )
    overrides = "".join(f" --set '{o}'" for o in published.overrides)
    return (
        f"{steps}sapo experiment -c {published.experiment}{overrides} --records {records} "
        f"--report-only --report-dir {published.report}; then update the docs that quote it"
    )
