"""Run records (analysis/records.py): what a finished run leaves to outlive its machine,
read back exactly or refused with the file named; and `--report-only` from records alone."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import polars as pl
import pytest

from ledger import Ledger
from tests.integration.replicate_runs import (
    BASE,
    SEEDS,
    SHARED,
    mini_experiment,
    replicate_ledger,
    swarm,
)


@pytest.fixture
def ledger(tmp_path: Path) -> Ledger:
    return replicate_ledger(tmp_path / "ledger")


def test_run_records_round_trip_to_the_same_statistics(ledger: Ledger, tmp_path: Path) -> None:
    """A sweep finished across machines: half its runs come back from committed records,
    the rest from this machine's ledger, and every number is what the ledger alone gives."""
    from analysis.record_folders import read_records, write_record
    from analysis.records import RunRecords, records_from_ledger
    from analysis.replicates import tables_from_records

    replicates = {swarm(c, s): (c, s) for c in (BASE, SHARED) for s in SEEDS}
    heldout = {("basic_arithmetic", "q0 of n1"), ("gcd", "never generated")}
    records = records_from_ledger(ledger.query, replicates, heldout=heldout)
    assert records.heldout_seen.height == 6  # every run generated "q0 of n1"
    assert set(records.heldout_seen["question"]) == {"q0 of n1"}
    assert records.models.is_empty()  # the hand-made ledger has no manifests
    assert records.peer_groups.height == 3 * 2 * 2  # shared seeds x nodes x rounds
    # drift: each trained group's generator; all 24 own groups but seed 0's n0 round 0
    assert records.drift.filter(pl.col("origin") == "external").height == 3 * 2 * 2
    assert records.drift.filter(pl.col("origin") == "local").height == 23
    root = tmp_path / "records"
    elsewhere = [swarm(SHARED, s) for s in SEEDS] + [swarm(BASE, 0)]
    for swarm_id in elsewhere:
        folder = write_record(records, swarm_id, root, code="abc", host="old-machine")
        assert sorted(p.name for p in folder.iterdir()) == [
            "discoveries.csv", "drift.csv", "heldout_seen.csv", "models.csv",
            "node_rounds.csv", "peer_groups.csv", "record.json",
        ]  # fmt: skip
    assert not list(root.glob(".*"))  # no staging folder left behind
    # the same run is the same bytes in whatever order the ledger's SQL gave its rows (two
    # held-out questions of one task: rows that tie on the natural keys)
    two = pl.DataFrame(
        {"swarm_id": [elsewhere[0]] * 2, "task": ["gcd"] * 2, "question": ["b", "a"]}
    )
    records.heldout_seen = pl.concat([records.heldout_seen, two])
    write_record(records, elsewhere[0], root, code="abc", host="old-machine")
    tables = ("node_rounds", "discoveries", "models", "peer_groups", "heldout_seen", "drift")
    for seed in range(4):
        shuffled = RunRecords(**{
            name: getattr(records, name).sample(fraction=1.0, shuffle=True, seed=seed)
            for name in tables
        })  # fmt: skip
        for swarm_id in elsewhere:
            again = write_record(shuffled, swarm_id, tmp_path / "again", code="abc", host="h")
            for csv_file in again.glob("*.csv"):
                assert csv_file.read_bytes() == (root / swarm_id / csv_file.name).read_bytes()
    here = records.only(s for s in replicates if s not in elsewhere)
    combined = RunRecords.concat([here, read_records(root, list(replicates))])
    assert combined.swarm_ids() == sorted(replicates)
    direct = tables_from_records(records, baseline=BASE, rounds=2)
    mixed = tables_from_records(combined, baseline=BASE, rounds=2)
    for metric in ("cumulative_claimed_reward", "cumulative_training_reward", "final_accuracy"):
        assert mixed.gains[metric].to_dicts() == direct.gains[metric].to_dicts()
    assert mixed.runs.sort("swarm_id").equals(direct.runs.sort("swarm_id"))
    assert mixed.mechanism.equals(direct.mechanism)
    assert mixed.discoveries.equals(direct.discoveries)
    assert mixed.drift is not None and direct.drift is not None
    assert mixed.drift.blocks.equals(direct.drift.blocks)
    assert mixed.drift.rounds.equals(direct.drift.rounds)


def test_a_damaged_run_record_is_an_error_naming_its_file(ledger: Ledger, tmp_path: Path) -> None:
    from analysis.record_folders import RecordError, read_record, write_record
    from analysis.records import records_from_ledger

    sid = swarm(SHARED, 1)
    records = records_from_ledger(ledger.query, {sid: (SHARED, 1)})
    folder = write_record(records, sid, tmp_path)
    assert read_record(folder).node_rounds.height == records.node_rounds.height
    rows = folder / "node_rounds.csv"
    good = rows.read_text()
    manifest = folder / "record.json"
    written = json.loads(manifest.read_text())
    assert written["version"] == 3 and set(written["sha256"]) == {
        p.name for p in folder.glob("*.csv")
    }
    # A copy cut short: mid-row, or at a row's end (which parses as a smaller table: only
    # the digest tells); any edit at all.
    rows.write_text(good[: len(good) // 2])
    with pytest.raises(RecordError, match=r"node_rounds\.csv: cut short"):
        read_record(folder)
    whole_rows = good[: good.index("\n", len(good) // 2) + 1]
    rows.write_text(whole_rows)
    with pytest.raises(RecordError, match=r"node_rounds\.csv: not the file record.json"):
        read_record(folder)
    rows.write_text(good.replace(sid, swarm(BASE, 1)))
    with pytest.raises(RecordError, match="SHA-256 differs"):
        read_record(folder)
    # Version 1 (the issue-32 sweep's records) has no digests: read, with the checks that
    # need none.
    manifest.write_text(json.dumps({**written, "version": 1, "sha256": None}))
    rows.write_text(good)
    assert read_record(folder).node_rounds.height == records.node_rounds.height
    rows.write_text(whole_rows)
    assert read_record(folder).node_rounds.height < records.node_rounds.height  # undetectable
    rows.write_text(good.replace("\n", "\nnot,a,row\n", 1))
    with pytest.raises(RecordError, match=r"node_rounds\.csv: row 2 has 3 fields"):
        read_record(folder)
    rows.write_text(good.replace(sid, swarm(BASE, 1)))  # another run's rows in this folder
    with pytest.raises(RecordError, match="rows of another run"):
        read_record(folder)
    rows.write_text(good)
    manifest.write_text(json.dumps({**written, "sha256": {"node_rounds.csv": "0" * 64}}))
    with pytest.raises(RecordError, match="no SHA-256 for each of its files"):
        read_record(folder)
    # a malformed digest is record.json's fault, not the CSV's
    upper = {k: v.upper() for k, v in written["sha256"].items()}
    for digests in (upper, dict.fromkeys(written["sha256"], None)):
        manifest.write_text(json.dumps({**written, "sha256": digests}))
        with pytest.raises(RecordError, match=r"record\.json: no SHA-256 for each of its files"):
            read_record(folder)
    # a version that only compares equal to 1 does not skip the digests
    for version in (True, 1.0, "2"):
        manifest.write_text(json.dumps({**written, "version": version}))
        with pytest.raises(RecordError, match="unknown record version"):
            read_record(folder)
    manifest.write_text(json.dumps(written))
    assert read_record(folder).node_rounds.height == records.node_rounds.height
    # a blanked swarm_id is not this run's row (v1: no digest to catch it)
    manifest.write_text(json.dumps({**written, "version": 1}))
    rows.write_text(good.replace(f"\n{sid},", "\n,", 1))
    with pytest.raises(RecordError, match="rows of another run"):
        read_record(folder)
    rows.write_text(good)
    (folder / "record.json").write_text('{"version": 99}')
    with pytest.raises(RecordError, match="unknown record version"):
        read_record(folder)
    (folder / "record.json").write_text("{")
    with pytest.raises(RecordError, match="not a run record"):
        read_record(folder)


def test_a_record_keeps_long_fields_and_its_own_version(ledger: Ledger, tmp_path: Path) -> None:
    from analysis.record_folders import read_record, write_record
    from analysis.records import records_from_ledger

    sid = swarm(SHARED, 1)
    long_question = "What is " + " + ".join(["1"] * 60_000) + "?"  # past csv's 128 KiB default
    records = records_from_ledger(ledger.query, {sid: (SHARED, 1)}, heldout={("gcd", "x")})
    records.heldout_seen = pl.DataFrame(
        {"swarm_id": [sid], "task": ["gcd"], "question": [long_question]}
    )
    # a fact named like the manifest's own keys does not replace them
    folder = write_record(records, sid, tmp_path, version=99, sha256="forged", host="h")
    meta = json.loads((folder / "record.json").read_text())
    assert meta["version"] == 3 and isinstance(meta["sha256"], dict) and meta["host"] == "h"
    assert read_record(folder).heldout_seen["question"].to_list() == [long_question]


def test_a_record_keeps_its_runs_wall_time_for_a_new_machine(
    ledger: Ledger, tmp_path: Path
) -> None:
    """The progress file stays on its machine; the record carries each run's wall time, so
    the plan of a sweep resumed elsewhere still says what its earlier runs took."""
    import shutil

    from analysis.record_folders import record_manifest
    from analysis.records import records_from_ledger
    from flows.experiments.plan import format_plan
    from flows.experiments.progress import record_progress, run_walls
    from flows.experiments.records import record_runs
    from flows.experiments.sweep import ExperimentConfig

    exp = ExperimentConfig.model_validate(mini_experiment(tmp_path / "old-machine"))
    records = records_from_ledger(ledger.query, exp.replicates())
    timed, untimed = swarm(SHARED, 1), swarm(BASE, 0)
    record_progress(exp, timed, "started")  # stopped with a session, then resumed
    record_progress(exp, timed, "started")
    record_progress(exp, timed, "finished", failed=0)
    root = tmp_path / "records"
    assert sorted(record_runs(exp, root, records=records)) == sorted(exp.replicates())
    wall = record_manifest(root, timed)["wall"]
    assert isinstance(wall, dict) and wall["attempts"] == 2 and wall["interrupted"] == 1
    assert wall["seconds"] is not None and 0 <= wall["seconds"] < 60
    assert record_manifest(root, untimed)["wall"] is None  # never started on that machine
    # the machine each attempt started on: what a seed computes depends on it (bf16 or not)
    from flows.experiments.progress import machine

    assert record_manifest(root, timed)["machines"] == [machine()]
    assert "bf16" in machine() and "machines" not in record_manifest(root, untimed)

    shutil.rmtree(tmp_path / "old-machine")  # a new machine: no progress file
    assert timed not in run_walls(exp) and run_walls(exp, root)[timed] == wall
    (row,) = [line for line in format_plan(exp, root).splitlines() if timed in line]
    assert row.rstrip().endswith("0.0 min (+1 earlier)")
    # re-recorded where it was never timed (a report on the new machine): the wall is kept
    record_runs(exp, root, records=records)
    assert record_manifest(root, timed)["wall"] == wall
    # this machine's own finished time comes first; one it never saw end does not hide the
    # record's (stopped here before the record arrived from where it finished)
    manifest = root / timed / "record.json"
    meta = json.loads(manifest.read_text())
    recorded_wall = {"seconds": 1260.0, "attempts": 1, "interrupted": 0}
    manifest.write_text(json.dumps({**meta, "wall": recorded_wall}))
    record_progress(exp, timed, "started")
    assert run_walls(exp, root)[timed] == recorded_wall
    record_progress(exp, timed, "skipped", recorded=True)
    (row,) = [line for line in format_plan(exp, root).splitlines() if timed in line]
    assert row.rstrip().endswith("21.0 min")
    record_progress(exp, timed, "started")
    record_progress(exp, timed, "finished", failed=0)
    local = run_walls(exp, root)[timed]
    assert local["attempts"] == 2 and local["seconds"] < 60
    shutil.rmtree(tmp_path / "old-machine")
    # a hand-edited wall time is not believed
    bad_walls = [
        {"seconds": -5, "attempts": 1, "interrupted": 0}, {"seconds": 3}, "21 min",
        {"seconds": True, "attempts": True, "interrupted": False},
        {"seconds": float("nan"), "attempts": 1, "interrupted": 0},
        {"seconds": float("inf"), "attempts": 1, "interrupted": 0},
        {"seconds": 60, "attempts": 1, "interrupted": 5},
        {"seconds": 60, "attempts": 0, "interrupted": 0},
        {"seconds": None, "attempts": 1, "interrupted": 1},
    ]  # fmt: skip
    for bad in bad_walls:
        manifest.write_text(json.dumps({**meta, "wall": bad}))
        assert timed not in run_walls(exp, root), bad
    assert "timed runs" not in format_plan(exp, root)
    # nor is a record.json of another run put in this run's folder
    manifest.write_text(json.dumps({**meta, "wall": recorded_wall, "swarm_id": untimed}))
    assert timed not in run_walls(exp, root)


def test_report_only_reads_the_records_and_starts_no_run(ledger: Ledger, tmp_path: Path) -> None:
    """`sapo experiment --report-only` beside a sweep: the recorded runs and the runs this
    machine's ledger holds (one of them not recorded yet), with SAPO's Table 1 beside them;
    nothing trained and no record written or rewritten (the running sweep writes its own)."""
    import yaml
    from typer.testing import CliRunner

    from analysis.record_folders import write_record
    from analysis.records import records_from_ledger
    from flows.cli import app

    replicates = {swarm(c, s): (c, s) for c in (BASE, SHARED) for s in SEEDS}
    records = records_from_ledger(ledger.query, replicates)
    root = tmp_path / "records"
    for swarm_id in replicates:
        if swarm_id != swarm(SHARED, 2):
            write_record(records, swarm_id, root, code="abc", host="elsewhere")
    before = {p: p.read_bytes() for p in root.rglob("*") if p.is_file()}
    experiment = mini_experiment(tmp_path)  # its ledger: ours
    path = tmp_path / "x.yaml"
    path.write_text(yaml.safe_dump(experiment))

    def report_only(out: Path) -> str:
        result = CliRunner().invoke(
            app, ["experiment", "-c", str(path), "--records", str(root), "--report-only",
                  "--report-dir", str(out)],
        )  # fmt: skip
        assert result.exit_code == 0, result.output
        return result.output

    out = tmp_path / "report"
    output = report_only(out)
    assert not (tmp_path / "progress.json").exists() and not (tmp_path / "swarms").exists()
    assert {p: p.read_bytes() for p in root.rglob("*") if p.is_file()} == before
    runs = pl.read_csv(out / "runs.csv")
    assert sorted(runs["swarm_id"]) == sorted(replicates)  # seed 2 of 1/1 from the ledger
    text = (out / "statistics.md").read_text()
    assert "| 4/4 | 1093.310 | +94.6% | 1/1 | 3 | 0.500 | 0.833 | +66.7% |" in text
    assert "| 1/1 vs 2/0 | 3 | +94.6% | 0.500 | 0.833 | 0.333 | +66.7% |" in text  # the shape
    assert "## Paired seeds" in output and (out / "curves.png").is_file()

    # On a machine that never ran the sweep: the records alone, and no empty ledger or
    # MLflow store made where the working directory would be.
    experiment["workdir"] = str(tmp_path / "never-ran")
    path.write_text(yaml.safe_dump(experiment))
    elsewhere = tmp_path / "elsewhere"
    output = report_only(elsewhere)
    assert not (tmp_path / "never-ran").exists()
    runs = pl.read_csv(elsewhere / "runs.csv")
    assert sorted(runs["swarm_id"]) == sorted(s for s in replicates if s != swarm(SHARED, 2))
    assert "Planned runs with no rounds here: 1/1 seed 2." in output
    # another experiment's file against these records: says where it looked
    experiment["experiment"] = "y"
    path.write_text(yaml.safe_dump(experiment))
    result = CliRunner().invoke(
        app, ["experiment", "-c", str(path), "--records", str(root), "--report-only"]
    )
    assert result.exit_code == 2
    assert f"none of y's 6 planned runs has rounds in the records in {root}" in result.output


def test_a_record_of_version_2_reads_without_drift(ledger: Ledger, tmp_path: Path) -> None:
    """Records written before peers' drift (version 2: the paper-table and compute-matched
    sweeps, and the first runs of issue 58's) read as they were, the drift table empty; a
    version-3 record without its drift.csv is damaged."""
    from analysis.record_folders import RecordError, read_record, write_record
    from analysis.records import DRIFT, records_from_ledger

    sid = swarm(SHARED, 1)
    folder = write_record(records_from_ledger(ledger.query, {sid: (SHARED, 1)}), sid, tmp_path)
    manifest = folder / "record.json"
    meta = json.loads(manifest.read_text())
    assert read_record(folder).drift.height == 8  # 2 nodes x 2 rounds x (own, peer's)
    (folder / "drift.csv").unlink()
    with pytest.raises(RecordError, match=r"drift\.csv: No such file"):
        read_record(folder)
    del meta["sha256"]["drift.csv"]
    manifest.write_text(json.dumps({**meta, "version": 2}))
    old = read_record(folder)
    assert old.drift.is_empty() and old.drift.schema == DRIFT
    assert old.node_rounds.height == 6  # two nodes: rounds 0, 1 and the final evaluation
    manifest.write_text(json.dumps({**meta, "version": 3}))  # v3 needs drift.csv's digest
    with pytest.raises(RecordError, match="no SHA-256 for each of its files"):
        read_record(folder)


def test_rerecord_gives_older_records_the_drift_and_keeps_who_first_recorded_them(
    ledger: Ledger, tmp_path: Path
) -> None:
    """`--report-only --rerecord` on the machine whose ledger holds the runs: records an
    older sapo wrote (version 2, no drift: a sweep's fixed clone) are rewritten with this
    version's tables, their other files the same bytes, and record.json keeps the code, host
    and time that first recorded them, however often it is rewritten."""
    import yaml
    from typer.testing import CliRunner

    from analysis.record_folders import write_record
    from analysis.records import records_from_ledger
    from flows.cli import app

    replicates = {swarm(c, s): (c, s) for c in (BASE, SHARED) for s in SEEDS}
    records = records_from_ledger(ledger.query, replicates)
    root = tmp_path / "records"
    first = {"code": "abc", "host": "elsewhere", "written_at": "2026-12-06T10:00:00+00:00"}
    for sid in replicates:  # as version 2 wrote them
        folder = write_record(records, sid, root, **first)
        (folder / "drift.csv").unlink()
        meta = json.loads((folder / "record.json").read_text())
        del meta["sha256"]["drift.csv"]
        (folder / "record.json").write_text(json.dumps({**meta, "version": 2}))
    before = {p: p.read_bytes() for p in root.rglob("*.csv")}
    path = tmp_path / "x.yaml"
    path.write_text(yaml.safe_dump(mini_experiment(tmp_path)))
    command = ["experiment", "-c", str(path), "--records", str(root)]

    alone = CliRunner().invoke(app, [*command, "--rerecord"])
    assert alone.exit_code == 2
    assert "--rerecord goes with --report-only and --records" in alone.output
    for _ in range(2):
        out = tmp_path / "report"
        result = CliRunner().invoke(
            app, [*command, "--report-only", "--rerecord", "--report-dir", str(out)]
        )
        assert result.exit_code == 0, result.output
        for sid in replicates:
            meta = json.loads((root / sid / "record.json").read_text())
            assert meta["version"] == 3 and meta["earlier"] == first and meta["code"] != "abc"
            assert (root / sid / "drift.csv").is_file()
        assert {p: p.read_bytes() for p in before} == before
        assert "### peers' drift over rounds" in (out / "statistics.md").read_text()


def test_a_record_is_replaced_only_by_one_that_loses_nothing(
    ledger: Ledger, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Records are committed from several machines: a machine whose ledger or MLflow store
    holds less of a run (here: no update seconds, a round's peer groups missing) keeps the
    record made where it ran, as a newer version or a damaged record is kept, each with a
    warning naming why; the same tables again rewrite nothing."""
    import yaml

    from analysis.record_folders import write_record
    from flows.experiments.records import record_runs
    from flows.experiments.sweep import load_experiment

    path = tmp_path / "x.yaml"
    path.write_text(yaml.safe_dump(mini_experiment(tmp_path)))
    exp = load_experiment(str(path))
    replicates = exp.replicates()
    records = records_from_ledger_of(ledger, replicates)
    root = tmp_path / "records"
    richer, fewer, newer, damaged, same = sorted(replicates)[:5]
    timed = records.node_rounds.with_columns(pl.lit(1.5).alias("seconds_update"))
    full = type(records)(**{**vars(records), "node_rounds": timed})
    write_record(full, richer, root, code="there", host="m1")
    more = pl.concat([records.peer_groups, records.peer_groups.filter(pl.col("swarm_id") == fewer)
                      .with_columns(pl.col("group_id") + "-x")])  # fmt: skip
    write_record(type(records)(**{**vars(records), "peer_groups": more}), fewer, root)
    for sid in (newer, damaged, same):
        write_record(records, sid, root, code="there", host="m1", machines=["m1"])
    meta = json.loads((root / newer / "record.json").read_text())
    (root / newer / "record.json").write_text(json.dumps({**meta, "version": 4}))
    (root / damaged / "models.csv").write_text("swarm_id,node_id,model_id\nx,y,z\n")
    before = {p: p.read_bytes() for p in root.rglob("*") if p.is_file()}

    with caplog.at_level("WARNING"):
        done = record_runs(exp, root, records=records)
    assert {p: p.read_bytes() for p in before} == before  # four kept, one the same
    (sixth,) = set(replicates) - {richer, fewer, newer, damaged, same}
    assert set(done) == {same, sixth} and (root / sixth / "record.json").is_file()
    said = caplog.text
    assert f"{richer}: its record in {root} is kept" in said
    assert "node_rounds.seconds_update: 0 values where the record has 6" in said
    assert "peer_groups: 4 rows where the record has 8" in said
    assert "unknown record version" in said and "SHA-256 differs" in said
    assert not list(root.glob(".*"))


def records_from_ledger_of(ledger: Ledger, replicates: dict[str, tuple[str, int]]) -> Any:
    from analysis.records import records_from_ledger

    return records_from_ledger(ledger.query, replicates)


def test_a_write_killed_between_its_renames_leaves_the_old_record(
    ledger: Ledger, tmp_path: Path
) -> None:
    """Replacing a record moves the old one aside before the new one takes its place: a
    process killed in between leaves it aside, where it still counts as recorded (a sweep
    does not run the run again) and is put back by the next read or write."""
    from analysis.record_folders import (
        read_records,
        record_manifest,
        recorded,
        recover,
        write_record,
    )

    replicates = {swarm(c, s): (c, s) for c in (BASE, SHARED) for s in SEEDS}
    records = records_from_ledger_of(ledger, replicates)
    root = tmp_path / "records"
    sid = swarm(SHARED, 0)
    folder = write_record(records, sid, root, code="first")
    files = {p.name: p.read_bytes() for p in folder.iterdir()}
    aside = root / f".{sid}.old-killed"
    aside.mkdir()
    folder.rename(aside / sid)  # killed here: the new record staged, never renamed in
    (root / f".{sid}.partial-killed").mkdir()
    assert not folder.exists() and recorded(root, sid)
    assert read_records(root, [sid]).swarm_ids() == [sid]
    assert {p.name: p.read_bytes() for p in folder.iterdir()} == files
    assert not list(root.glob(".*"))  # what the killed write left is gone
    recover(root, sid)  # nothing to do
    write_record(records, sid, root, code="second")
    assert json.loads((folder / "record.json").read_text())["code"] == "second"
    assert not list(root.glob(".*"))
    aside.mkdir()
    folder.rename(aside / sid)  # killed again: the manifest's reader puts it back too
    assert record_manifest(root, sid)["code"] == "second" and folder.is_dir()


@pytest.mark.parametrize(
    ("old", "ran_on", "machines", "earlier"),
    [
        ({}, ["a"], ["a"], None),  # a first record
        ({"machines": ["a"], "code": "c", "host": "h"}, ["b", "a"], ["a", "b"], None),
        ({"machines": ["a", 7], "code": "c", "host": "h"}, None, ["a"], None),  # edited by hand
        ({"code": "old", "host": "h", "written_at": "t"}, None, None,
         {"code": "old", "host": "h", "written_at": "t"}),  # other code
        ({"code": "c", "host": "other", "written_at": "t"}, None, None,
         {"code": "c", "host": "other", "written_at": "t"}),  # another host, same code
    ],
)  # fmt: skip
def test_a_rewritten_record_keeps_every_machine_and_who_first_recorded_it(
    old: dict[str, Any], ran_on: list[str] | None, machines: list[str] | None, earlier: Any
) -> None:
    from flows.experiments.records import _kept

    kept = _kept(old, {"code": "c", "host": "h"}, ran_on)
    assert kept.get("machines") == machines and kept.get("earlier") == earlier


def test_the_old_import_of_the_record_folders_names_the_new_one() -> None:
    import analysis.records

    with pytest.raises(AttributeError, match=r"now analysis\.record_folders\.write_record"):
        analysis.records.write_record  # noqa: B018


def test_a_record_counts_as_done_only_for_the_rounds_it_covers(
    ledger: Ledger, tmp_path: Path
) -> None:
    """A sweep skips a recorded run; the same swarm id under other settings (more rounds)
    is not that run, so its record does not make it done."""
    import yaml

    from analysis.record_folders import write_record
    from flows.experiments.plan import plan
    from flows.experiments.records import record_covers
    from flows.experiments.sweep import load_experiment

    path = tmp_path / "x.yaml"
    path.write_text(yaml.safe_dump(mini_experiment(tmp_path)))
    exp = load_experiment(str(path))
    sid = sorted(exp.replicates())[0]
    root = tmp_path / "records"
    write_record(records_from_ledger_of(ledger, exp.replicates()), sid, root)
    assert record_covers(exp, root, sid)
    assert [r["swarm_id"] for r in plan(exp, root) if r["done"]] == [sid]
    longer = load_experiment(str(path), ["swarm.rounds=3"])
    assert longer.swarm_id(*longer.runs()[0]) in longer.replicates()
    assert not record_covers(longer, root, sid)
    assert not any(r["done"] for r in plan(longer, root))
