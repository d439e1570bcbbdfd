"""The published experiment reports are what their committed records give: the numbers
quoted in docs/ and the README come back byte for byte from `--report-only` with today's
code, so a change to the statistics cannot silently leave them stale."""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# (experiment file, its committed records, the committed report the docs quote)
PUBLISHED = [
    (
        "examples/paper-table-cpu.yaml",
        "docs/paper-table-cpu/records",
        "docs/paper-table-cpu/report",
    ),
]


@pytest.mark.parametrize(("experiment", "records", "report"), PUBLISHED)
def test_a_published_report_is_what_its_records_give(
    experiment: str, records: str, report: str, tmp_path: Path
) -> None:
    from flows.experiments.flow import experiment_report

    out = tmp_path / "report"
    experiment_report(
        str(ROOT / experiment),
        # No sweep here: the statistics come from the records alone, none is written.
        [f"workdir={tmp_path / 'no-sweep-here'}"],
        str(out),
        str(ROOT / records),
        write_records=False,
    )
    assert not (tmp_path / "no-sweep-here").exists()
    for name in ("statistics.md", "runs.csv", "node_rounds.csv", "discoveries.csv"):
        fresh = (out / name).read_bytes()
        committed = (ROOT / report / name).read_bytes()
        assert fresh == committed, (
            f"{report}/{name} is stale: regenerate it with `sapo experiment -c {experiment} "
            f"--records {records} --report-only --report-dir {report}` and update the docs "
            "that quote it"
        )
