"""`sapo compare`: node runs of a tracking store side by side, best first, each sharing
configuration's mean, and the best node that logged a model registered."""

from __future__ import annotations

import io
import json
from pathlib import Path

import polars as pl
import pytest
from typer.testing import CliRunner

from flows.cli import app
from flows.tracking import MODEL_PATH_TAG, open_tracker, sharing_tags

runner = CliRunner()

# node -> (sharing I/J, own_reward per round, logs a model)
NODES = {
    "a": ((4, 4), [0.5, 0.7, 0.9], False),  # the best, but it logged no model
    "b": ((4, 4), [0.4, 0.6, 0.6], True),
    "c": ((8, 0), [0.2, 0.3, 0.1], True),
}


def _store(tmp_path: Path) -> str:
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    tracker = open_tracker(uri, "cmp", str(tmp_path / "artifacts"))
    for node, ((i, j), rewards, model) in NODES.items():
        run_id = tracker.run(node, {"sapo.swarm_id": "s", "sapo.node_id": node})
        assert run_id is not None
        family = "bundled:gemma3-270m" if node == "c" else "bundled:smollm2-135m-instruct"
        tracker.set_tags(run_id, {**sharing_tags(i, j, "paper"), "sapo.model": family})
        total = 0.0
        for step, reward in enumerate(rewards):
            total += reward
            tracker.log_metrics(
                run_id, {"own_reward": reward, "cumulative_own_reward": total}, step=step
            )
        if model:
            folder = tmp_path / f"model-{node}"
            folder.mkdir()
            (folder / "weights.bin").write_bytes(node.encode())
            tracker.log_artifacts(run_id, str(folder), "model-round-2")
            tracker.set_tags(run_id, {MODEL_PATH_TAG: "model-round-2"})
    other = open_tracker(uri, "elsewhere", str(tmp_path / "artifacts"))
    assert other.run("z", {"sapo.swarm_id": "t", "sapo.node_id": "z"}) is not None
    return uri


def test_nodes_best_first_configurations_averaged_best_model_registered(tmp_path: Path) -> None:
    from mlflow.tracking import MlflowClient

    uri = _store(tmp_path)
    base = ["compare", "--mlflow", uri, "--experiment", "cmp"]
    done = runner.invoke(app, [*base, "--register", "best", "-f", "csv"])
    assert done.exit_code == 0, done.output
    # -f csv is one table (issue 61: it printed labels and both tables); the registration
    # is said on stderr
    nodes = pl.read_csv(io.StringIO(done.stdout))
    assert nodes["node_id"].to_list() == ["a", "b", "c"]
    assert nodes["cumulative_own_reward"].to_list() == pytest.approx([2.1, 1.6, 0.6])
    assert nodes["rounds"].to_list() == [3, 3, 3]
    assert nodes["sharing"].to_list() == ["4/4", "4/4", "8/0"]
    assert nodes["model"].to_list()[1:] == ["bundled:smollm2-135m-instruct", "bundled:gemma3-270m"]
    by_config = runner.invoke(app, [*base, "-f", "csv", "--table", "configurations"])
    assert by_config.exit_code == 0, by_config.output
    configs = pl.read_csv(io.StringIO(by_config.stdout))
    assert configs["sharing"].to_list() == ["4/4", "8/0"]
    assert configs["nodes"].to_list() == [2, 1]
    assert configs["models"].to_list() == ["bundled:smollm2-135m-instruct", "bundled:gemma3-270m"]
    assert configs["cumulative_own_reward"].to_list() == pytest.approx([1.85, 0.6])
    # a ranks first but logged no model: b's is registered
    said = "b of s (model-round-2, cumulative_own_reward 1.600) as 'best' version 1"
    assert done.stderr.strip() == f"registered {said}"
    # Registering again is a no-op that names the version (it made versions 2 and 3).
    for _ in range(2):
        again = runner.invoke(app, [*base, "--register", "best"])
        assert again.exit_code == 0 and f"already registered: {said}" in again.stdout
    (version,) = MlflowClient(uri).search_model_versions("name = 'best'")
    assert version.run_id == nodes.filter(pl.col("node_id") == "b")["run_id"][0]
    assert version.source.endswith("/model-round-2")
    # -f json is one document: both tables, and what --register registered.
    document = runner.invoke(app, [*base, "-f", "json", "--register", "best"])
    assert document.exit_code == 0, document.output
    parsed = json.loads(document.stdout)
    assert [n["node_id"] for n in parsed["nodes"]] == ["a", "b", "c"]
    assert [c["sharing"] for c in parsed["configurations"]] == ["4/4", "8/0"]
    assert parsed["registered"]["version"] == "1" and parsed["registered"]["new"] is False
    assert parsed["registered"]["node_id"] == "b"
    # Without --experiment, every experiment's node runs.
    every = runner.invoke(app, ["compare", "--mlflow", uri, "-f", "json"])
    assert every.exit_code == 0
    assert "z" in [n["node_id"] for n in json.loads(every.stdout)["nodes"]]


def test_nothing_to_compare_is_one_line(tmp_path: Path) -> None:
    uri = _store(tmp_path)
    for args, message in (
        (["--experiment", "nope"], "no MLflow experiment named 'nope'"),
        (["--experiment", "Default"], "no node runs in experiment 'Default'"),
    ):
        done = runner.invoke(app, ["compare", "--mlflow", uri, *args])
        assert done.exit_code == 2 and message in done.output, done.output


def test_an_unreachable_server_is_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    done = runner.invoke(app, ["compare", "--mlflow", "http://127.0.0.1:9"])
    assert done.exit_code == 2, done.output
    assert "http://127.0.0.1:9: " in done.output and "Traceback" not in done.output


def test_a_mistyped_store_is_refused_and_nothing_is_created(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 47: `--mlflow sqlite:///typo/mlflow.db` made a new empty store; the report then
    exited 0 saying "INCONSISTENT", compare said it found no runs."""
    from ledger import Ledger
    from tests.factories import round_rows

    monkeypatch.chdir(tmp_path)
    ledger = tmp_path / "ledger"
    with Ledger.open(str(ledger)) as led:
        led.publish(round_rows("a", 0, [[1, 0]]))
    out = tmp_path / "report"
    for args in (
        ["compare", "--mlflow", "sqlite:///nope/mlflow.db"],
        [
            "report",
            "--ledger",
            str(ledger),
            "--out",
            str(out),
            "--mlflow",
            "sqlite:///nope/mlflow.db",
        ],
    ):
        done = runner.invoke(app, args)
        assert done.exit_code == 2, done.output
        assert done.output.strip() == (
            "error: no MLflow store at nope/mlflow.db (sqlite:///nope/mlflow.db): give an "
            "existing mlflow.db"
        )
    assert not (tmp_path / "nope").exists() and not out.exists()
    folder = runner.invoke(app, ["compare", "--mlflow", str(tmp_path / "mlruns")])
    assert folder.exit_code == 2 and "no MLflow store at" in folder.output
    assert not (tmp_path / "mlruns").exists()


def test_an_unknown_format_fails_before_printing_anything(tmp_path: Path) -> None:
    done = runner.invoke(app, ["compare", "--mlflow", _store(tmp_path), "-f", "yaml"])
    assert done.exit_code == 2
    assert "nodes:" not in done.output and "'yaml' is not one of" in done.output
