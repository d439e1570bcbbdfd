"""A miniature sharing experiment end to end: `sapo experiment` (two configurations x two
replicate seeds, two rounds, held-out evaluation, tiny models, real node processes, Prefect,
MLflow) then `sapo report`, whose numbers are checked against plain DuckDB over the
ledger's Parquet and JSON files."""

from __future__ import annotations

import json
import shutil
import sqlite3
from pathlib import Path
from typing import Any

import duckdb
import polars as pl
import pytest
import yaml
from mlflow.tracking import MlflowClient

from tests.e2e.interrupting import interrupted, processes_mentioning
from tests.e2e.test_swarm import sapo
from tests.tiny_models import build_tiny_model

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


def experiment_file(tmp_path: Path, model: Path, prefect_api: str | None = None) -> Path:
    data: dict[str, Any] = {
        "experiment": "mini",
        "workdir": str(tmp_path / "work"),
        "seeds": [0, 1],
        "swarm": {
            "rounds": 2,
            "peer_wait_s": 120,
            # tiny random models: accept peers' groups whatever their rewards
            "sampling": {"kind": "reward_filtered", "require_variance": False},
            "defaults": {
                "model": str(model),
                "questions_per_round": 6,
                "tasks": {
                    "specs": [
                        {
                            "name": "chain_sum",
                            "config": {
                                "min_terms": 2,
                                "max_terms": 2,
                                "min_digits": 1,
                                "max_digits": 1,
                            },
                        }
                    ]
                },
                # A random model writes no digits; the prefill answers "6" for it, right
                # for some questions, so rewards are not all zero.
                "prompt": {"prefill": "The answer is 6 "},
                "reward": {"extraction": "last_number"},
                "generation": {"completions_per_question": 3, "max_new_tokens": 4},
                "grpo": {"drop_zero_variance": False},
                "evaluation": {"every": 1, "questions_per_task": 2, "completions": 1},
            },
            "node_count": 2,
        },
        "configurations": [
            {"local_groups": 2, "external_groups": 0},
            {"local_groups": 1, "external_groups": 1},
        ],
    }
    if prefect_api:
        # The node processes' runs go to one server (the `prefect_api` fixture); the sweep's
        # own flow keeps the server it starts under its working directory (checked below).
        data["swarm"]["prefect"] = {"api_url": prefect_api}
    path = tmp_path / "mini.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def direct_sql(ledger: Path) -> dict[str, float]:
    """Cumulative reward per swarm with plain DuckDB, no project code."""
    rows = duckdb.sql(
        f"""SELECT swarm_id, sum(r) FROM (
              SELECT swarm_id, node_id, node_round, avg(reward) AS r
              FROM read_parquet('{ledger}/**/*.parquet', hive_partitioning = true)
              GROUP BY ALL)
            GROUP BY swarm_id"""
    ).fetchall()
    return {swarm: float(total) for swarm, total in rows}


def check_statistics(work: Path, cumulative: dict[str, float]) -> None:
    """The experiment's paired-seed files agree with plain DuckDB over the ledger."""
    out = work / "reports" / "mini"
    runs = {
        (r["configuration"], r["seed"]): r
        for r in duckdb.sql(f"SELECT * FROM read_csv('{out}/runs.csv')").pl().to_dicts()
    }
    assert set(runs) == {(c, s) for c in ("2/0", "1/1-reward-filtered") for s in (0, 1)}
    for (conf, seed), row in runs.items():
        swarm = f"mini-{conf.replace('/', 'x', 1)}-s{seed}"
        assert row["cumulative_claimed_reward"] == pytest.approx(cumulative[swarm] / 2)  # mean node
    final = dict(
        duckdb.sql(
            f"""SELECT swarm_id, avg(accuracy) FROM read_json(
                  '{work}/ledger/_evaluations/*/*/*/*.jsonl', format = 'newline_delimited',
                  hive_partitioning = true)
                WHERE node_round = 2 GROUP BY ALL"""
        ).fetchall()
    )
    assert len(final) == 4  # every node evaluated its final policy
    for (conf, seed), row in runs.items():
        swarm = f"mini-{conf.replace('/', 'x', 1)}-s{seed}"
        assert row["final_accuracy"] == pytest.approx(final[swarm])
    evaluated = duckdb.sql(
        f"SELECT DISTINCT node_round FROM read_csv('{out}/node_rounds.csv') "
        "WHERE accuracy IS NOT NULL ORDER BY 1"
    ).fetchall()
    assert evaluated == [(0,), (1,), (2,)]
    text = (out / "statistics.md").read_text()
    assert "vs 2/0" in text and "1/1-reward-filtered" in text
    assert "Held-out questions whose text also appears" in text
    # one machine, one code: every seed's configurations computed alike at round 0 (its
    # rewards, tokens and held-out answers; a sweep moved mid-seed would be named here)
    assert "did not compute alike at round 0" not in text
    assert (out / "curves.png").stat().st_size > 1000


@pytest.mark.timeout(1800)  # the sweep's own limits (1200 s, then 600 s twice), not the default
def test_miniature_sweep_and_report(tmp_path: Path, prefect_api: str) -> None:
    model = build_tiny_model(tmp_path / "model")
    path = experiment_file(tmp_path, model, prefect_api)
    work = tmp_path / "work"
    records = tmp_path / "records"
    # Ctrl-C in the first run: the sweep says how far it got, as `sapo swarm` does, leaves no
    # process (its Prefect server included), and the same command resumes it.
    args = ["experiment", "-c", str(path), "--records", str(records)]
    stopped, took = interrupted(args, "round 0: own_reward", 600)
    assert took < 15, f"{took:.1f} s from Ctrl-C to exit"
    for noise in ("Traceback", "Crash detected", "Error logging to API", "ConnectError"):
        assert noise not in stopped, stopped[-3000:]
    tail = stopped.strip().splitlines()[-4:]  # a checkpoint in flight may not have landed
    assert tail[0] == "mini-2x0-s0: stopped", tail
    assert tail[1].startswith("node-0: stopped") and tail[2].startswith("node-1: stopped")
    assert tail[3] == "stopped by SIGINT: rerun the same command to resume"
    assert "Cancelled('mini-2x0-s0: stopped by SIGINT')" in stopped  # Prefect's state
    assert processes_mentioning(str(work)) == []  # the nodes, and every Prefect server
    out = sapo(*args, timeout=1200)
    assert "mini-2x0-s0: 2/0" in out and "mini-1x1-reward-filtered-s1: 1/1" in out

    expected = direct_sql(work / "ledger")
    swarms = {f"mini-{c}-s{s}" for c in ("2x0", "1x1-reward-filtered") for s in (0, 1)}
    assert set(expected) == swarms
    assert sum(expected.values()) > 0  # the check below compares real numbers, not zeros
    rows = duckdb.sql(
        f"SELECT swarm_id, count(*) FROM read_parquet('{work}/ledger/**/*.parquet', "
        "hive_partitioning = true) GROUP BY ALL"
    ).fetchall()
    assert dict(rows) == {s: 2 * 2 * 6 * 3 for s in expected}  # nodes x rounds x q x c
    # Every node recorded its configuration as data (its manifest); nothing parses swarm ids.
    manifests = duckdb.sql(
        f"SELECT swarm_id, node_id, experiment, local_groups, external_groups, policy "
        f"FROM read_json('{work}/ledger/_manifests/*/*/*.jsonl', format = 'newline_delimited') "
        "ORDER BY ALL"
    ).fetchall()
    assert manifests == [
        (f"mini-{c}-s{s}", node, "mini", i, j, "reward_filtered")
        for c, i, j in (("1x1-reward-filtered", 1, 1), ("2x0", 2, 0))
        for s in (0, 1)
        for node in ("node-0", "node-1")
    ]
    check_statistics(work, expected)

    # The flow's report and a separate `sapo report` agree with the direct SQL.
    for folder in (work / "reports" / "mini", tmp_path / "again"):
        if folder.name == "again":
            sapo("report", "--ledger", str(work / "ledger"), "--out", str(folder),
                 "--mlflow", f"sqlite:///{work / 'mlflow.db'}", "--experiment", "mini")  # fmt: skip
        report = json.loads((folder / "report.json").read_text())
        got = {r["swarm_id"]: r["cumulative_claimed_reward"] for r in report["summary"]}
        assert got == pytest.approx(expected, abs=1e-9)
        assert report["cross_check"]["consistent"] is True
        assert report["cross_check"]["matched"] == 4 * 2 * 2  # runs x nodes x rounds
        page = (folder / "report.html").read_text()
        assert page.count("data:image/png;base64,") == len(report["figures"]) == 4
        for name in report["figures"]:
            assert (folder / name).stat().st_size > 1000

    # MLflow: the experiment's run holds the report; swarm runs nest under it.
    client = MlflowClient(tracking_uri=f"sqlite:///{work / 'mlflow.db'}")
    exp = client.get_experiment_by_name("mini")
    runs = client.search_runs([exp.experiment_id])
    (top,) = [r for r in runs if r.data.tags.get("sapo.role") == "experiment"]
    swarms = [r for r in runs if r.data.tags.get("sapo.role") == "swarm"]
    assert {r.data.tags["mlflow.parentRunId"] for r in swarms} == {top.info.run_id}
    artifacts = {a.path for a in client.list_artifacts(top.info.run_id, "report")}
    assert {"report/report.html", "report/cumulative.png", "report/statistics.md"} <= artifacts
    assert {r.data.tags["sapo.sharing"] for r in runs if "sapo.node_id" in r.data.tags} == {
        "2/0", "1/1"
    }  # fmt: skip

    # Prefect: the flow run left a markdown artifact with the summary table.
    db = sqlite3.connect(work / "prefect" / "experiment" / "prefect.db")
    (kind, data) = db.execute(
        "SELECT type, data FROM artifact WHERE key = 'mini-summary'"
    ).fetchone()
    db.close()
    assert kind == "markdown" and "cumulative claimed reward" in data and "| 2/0 |" in data
    assert "## Paired seeds" in data and "final held-out accuracy" in data
    assert "cumulative training reward" in data and "### compute per run" in data
    runs_csv = pl.read_csv(work / "reports" / "mini" / "runs.csv")
    assert (runs_csv["tokens_generated"] > 0).all() and (runs_csv["update_seconds"] > 0).all()

    # A finished run keeps only its nodes' final models (in MLflow): no training state.
    kept = sorted(p.name for p in (work / "swarms").glob("*/nodes/*/checkpoints/*/*"))
    assert kept == ["state.json"] * 8  # runs x nodes

    # Running it again resumes: both configurations are complete, so nothing trains. A run
    # whose record a stop cut short (deleted here) is recorded as it is skipped; a Ctrl-C in
    # the report stops as cleanly as one in a run, and the experiment's MLflow run says so.
    shutil.rmtree(records / "mini-1x1-reward-filtered-s1")
    again, took = interrupted(args, "writing the report under", 600)
    assert took < 15, f"{took:.1f} s from Ctrl-C to exit"
    assert again.count("skipped") == 4 and "round 0:" not in again
    assert f"mini-1x1-reward-filtered-s1: recorded in {records}" in again
    for noise in ("Traceback", "Crash detected", "Error logging to API", "ConnectError"):
        assert noise not in again, again[-3000:]
    assert again.strip().splitlines()[-2:] == [
        "mini: stopped by SIGINT in the report, every run done",
        "stopped by SIGINT: rerun the same command to resume",
    ]
    assert client.get_run(top.info.run_id).info.status == "KILLED"
    assert processes_mentioning(str(work)) == []
    assert "writing the report under" in sapo(*args, timeout=600)
    assert client.get_run(top.info.run_id).info.status == "FINISHED"
    # The progress file says where the sweep stands: every run started, finished, skipped.
    progress = json.loads((work / "progress.json").read_text())
    assert progress["summary"].startswith("4 of 4 runs done")
    events = {run: [e["event"] for e in r["events"]] for run, r in progress["runs"].items()}
    skipped = ["skipped", "skipped"]  # once in the stopped report's attempt, once after it
    assert events.pop("mini-2x0-s0") == ["started", "stopped", "started", "finished", *skipped]
    assert list(events.values()) == [["started", "finished", *skipped]] * 3

    # Each run was recorded as it finished; on a replaced machine (nothing of the working
    # directory left) the sweep skips every recorded run and reports the same statistics.
    assert sorted(p.name for p in records.iterdir()) == sorted(expected)
    meta = json.loads((records / "mini-2x0-s0" / "record.json").read_text())
    assert meta["experiment"] == "mini" and len(meta["code"]) == 40
    assert meta["wall"]["attempts"] == 2 and meta["wall"]["interrupted"] == 1  # the stop
    assert meta["wall"]["seconds"] > 0  # the attempt that finished, kept off-machine
    assert meta["version"] == 3 and len(meta["machines"]) == 1  # where its attempt ran
    shared = pl.read_csv(records / "mini-1x1-reward-filtered-s0" / "drift.csv")
    assert set(shared["origin"]) == {"local", "external"}  # peers' drift kept off-machine
    assert (
        "### peers' drift over rounds" in (work / "reports" / "mini" / "statistics.md").read_text()
    )
    first = (work / "reports" / "mini" / "statistics.md").read_text()
    shutil.rmtree(work)
    elsewhere = sapo("experiment", "-c", str(path), "--records", str(records), timeout=600)
    assert elsewhere.count("(done, here or elsewhere); skipped") == 4
    assert "round 0:" not in elsewhere
    assert "timed runs: 4," in elsewhere  # the plan's wall times came with the records
    assert (work / "reports" / "mini" / "statistics.md").read_text() == first
