"""End to end: real node processes, real Prefect (ephemeral, per node), real MLflow (SQLite),
a real ledger on local disk and on an S3 server over HTTP, tiny random models."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.conftest import stop_process_group
from tests.factories import open_ledger
from tests.tiny_models import build_tiny_model

# Whole swarms take minutes: out of the default run (`pytest -m ''` or `-m slow` runs them).
pytestmark = [pytest.mark.e2e, pytest.mark.slow]


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("tiny-model"))


def swarm_file(
    tmp_path: Path, model: Path, ledger: dict[str, Any] | None = None, **kw: Any
) -> Path:
    data: dict[str, Any] = {
        "swarm_id": "e2e-swarm",
        "workdir": str(tmp_path / "work"),
        "rounds": 2,
        # nodes start at different times (each starts its own Prefect server); a bounded
        # wait lets every node see peers in round 1 without making rounds a barrier
        "peer_wait_s": 120,
        # tiny random models earn 0 reward, so accept groups without variance: the test is
        # about sharing, not about learning
        "sampling": {"kind": "reward_filtered", "require_variance": False},
        "defaults": {
            "model": str(model),
            "local_groups": 2,
            "external_groups": 2,
            "tasks": {"specs": [{"name": "chain_sum", "config": {"max_terms": 2}}]},
            "generation": {"completions_per_question": 3, "max_new_tokens": 5},
            "grpo": {"drop_zero_variance": False},
        },
        "node_count": 3,
        **kw,
    }
    if ledger:
        data["ledger"] = ledger
    path = tmp_path / "swarm.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def sapo(
    *args: str, timeout: float = 600, env: dict[str, str] | None = None, cwd: Path | None = None
) -> str:
    """Run `sapo ...` to the end; whatever it started (nodes, their Prefect servers) is
    stopped with it, also when it times out or the test fails. From ``cwd``, through the
    installed console script, as a user standing there runs it."""
    launcher = (
        [str(Path(sys.executable).with_name("sapo"))]
        if cwd
        else [sys.executable, "-m", "flows.cli"]
    )
    proc = subprocess.Popen(
        [*launcher, *args],
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, **(env or {})},
        start_new_session=True,
    )
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    finally:
        stop_process_group(proc)
    assert proc.returncode == 0, stdout[-3000:] + stderr[-3000:]
    return stdout


def node_metrics(tracking_uri: str, experiment: str) -> dict[str, dict[str, Any]]:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=tracking_uri)
    exp = client.get_experiment_by_name(experiment)
    assert exp is not None
    runs = client.search_runs([exp.experiment_id])
    parents = [r for r in runs if r.data.tags.get("sapo.role") == "swarm"]
    assert len(parents) == 1
    parent = parents[0].info.run_id
    out = {}
    for run in runs:
        node = run.data.tags.get("sapo.node_id")
        if node is None:
            continue
        assert run.data.tags.get("mlflow.parentRunId") == parent
        history = {
            key: {m.step: m.value for m in client.get_metric_history(run.info.run_id, key)}
            for key in run.data.metrics
        }
        out[node] = {"tags": run.data.tags, "params": run.data.params, "metrics": history}
    return out


def check_swarm(path: Path, storage_options: dict[str, Any] | None = None) -> None:
    cfg = yaml.safe_load(path.read_text())
    work = Path(cfg["workdir"])
    url = (cfg.get("ledger") or {}).get("url") or str(work / "ledger")
    with open_ledger(url, storage_options) as ledger:
        rows = ledger.query(
            "SELECT node_id, node_round, count(*) AS n, count(DISTINCT rollout_id) AS ids "
            "FROM rollouts GROUP BY ALL ORDER BY ALL"
        )
        assert rows.height == 6  # 3 nodes x 2 rounds, 4 questions x 3 completions each
        assert rows["n"].to_list() == [12] * 6 and rows["ids"].to_list() == [12] * 6
        # every row carries its generator's claim, whole (issue 58)
        whole = ledger.query(
            "SELECT count(*) FILTER (len(token_ids) = completion_tokens AND "
            "len(token_logprobs) = completion_tokens AND tokenizer IS NOT NULL) FROM rollouts"
        ).item()
        assert whole == 72
        used = ledger.query("SELECT node_id, node_round, count(*) AS g FROM samples GROUP BY ALL")
        own = ledger.query(
            "SELECT node_id, node_round, avg(reward) AS r FROM rollouts GROUP BY ALL"
        )
    nodes = node_metrics(f"sqlite:///{work / 'mlflow.db'}", "e2e-swarm")
    assert sorted(nodes) == ["node-0", "node-1", "node-2"]
    for node_id, run in nodes.items():
        m = run["metrics"]
        for name in ("own_reward", "training_reward", "cumulative_own_reward",
                     "cumulative_training_reward"):  # fmt: skip
            assert set(m[name]) == {0, 1}, name
        own_sum = m["own_reward"][0] + m["own_reward"][1]
        assert m["cumulative_own_reward"][1] == pytest.approx(own_sum)
        # in round 1 (the second) every node trains on peers' groups
        assert m["external_groups_used"][1] >= 1, (node_id, m["external_groups_used"])
        for key in ("zero_variance_fraction", "loss", "clip_fraction", "seconds_generate",
                    "seconds_update", "seconds_publish", "seconds_sample", "seconds_orchestration",
                    "generation_tokens_per_s", "training_reward_local"):  # fmt: skip
            assert key in m, key
        assert run["tags"]["sapo.sharing"] == "2/2"
        assert run["params"]["grpo.eps_high"] == "0.28"
        assert (used.filter(used["node_id"] == node_id)["g"].sum() or 0) >= 1
        # MLflow's own_reward is the ledger's claimed_reward: its mean over what was published
        for node_round, r in own.filter(own["node_id"] == node_id).select("node_round", "r").rows():
            assert m["own_reward"][node_round] == pytest.approx(r, abs=1e-9)


def test_local_swarm_three_nodes_two_rounds(tmp_path: Path, tiny_model: Path) -> None:
    path = swarm_file(tmp_path, tiny_model)
    # Started from inside its working directory, whose folders are named like the packages
    # (the ledger's data folder is `ledger/`): the nodes import the installed ones.
    work = tmp_path / "work"
    for shadow in ("ledger", "flows", "sapo_core"):
        (work / shadow).mkdir(parents=True)
    out = sapo("swarm", "-c", str(path), cwd=work)
    assert "node-2 round 1: own_reward" in out
    check_swarm(path)
    # The node with the highest cumulative reward is registered in the model registry.
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'work' / 'mlflow.db'}")
    (version,) = client.search_model_versions("name = 'e2e-swarm-policy'")
    registered = client.get_run(version.run_id)
    nodes = node_metrics(f"sqlite:///{tmp_path / 'work' / 'mlflow.db'}", "e2e-swarm")
    best = max(run["metrics"]["cumulative_own_reward"][1] for run in nodes.values())
    assert registered.data.metrics["cumulative_own_reward"] == best
    assert f"registered {registered.data.tags['sapo.node_id']}'s model" in out
    import mlflow
    import transformers

    mlflow.set_tracking_uri(f"sqlite:///{tmp_path / 'work' / 'mlflow.db'}")
    loaded = mlflow.transformers.load_model(f"models:/e2e-swarm-policy/{version.version}")
    assert isinstance(loaded, transformers.TextGenerationPipeline)
    # What `sapo demo` ends with: the report of its swarm, beside the ledger.
    from flows.cli.swarm import write_demo_report
    from flows.config import load_swarm

    write_demo_report(load_swarm(path))
    assert (tmp_path / "work" / "report" / "report.html").stat().st_size > 10_000
    check_report_of_a_plain_swarm(tmp_path)


def check_report_of_a_plain_swarm(tmp_path: Path) -> None:
    """`sapo report` on a plain swarm's ledger (no experiment): per-node curves and tables,
    I/J and policy read from the nodes' manifests, numbers equal to plain DuckDB's."""
    import duckdb

    work, out_dir = tmp_path / "work", tmp_path / "report"
    printed = sapo(
        "report", "--ledger", str(work / "ledger"), "--mlflow", f"sqlite:///{work / 'mlflow.db'}",
        "--out", str(out_dir),
    )  # fmt: skip
    assert "MLflow cross-check: consistent (6 node-rounds" in printed
    html = (out_dir / "report.html").read_text()
    assert html.count("data:image/png;base64,") >= 3 and "e2e-swarm" in html
    assert (out_dir / "reward_per_round.png").stat().st_size > 1000
    report = json.loads((out_dir / "report.json").read_text())
    (swarm,) = report["summary"]
    assert (swarm["swarm_id"], swarm["local_groups"], swarm["external_groups"]) == (
        "e2e-swarm", 2, 2,
    )  # fmt: skip
    assert swarm["policy"] == "reward_filtered" and swarm["experiment"] is None
    expected = duckdb.sql(
        "SELECT sum(r) FROM (SELECT avg(reward) AS r FROM read_parquet("
        f"'{work / 'ledger'}/swarm_id=*/**/*.parquet', hive_partitioning = true) "
        "GROUP BY node_id, node_round)"
    ).fetchone()
    assert expected is not None
    assert swarm["cumulative_claimed_reward"] == pytest.approx(expected[0], abs=1e-9)


@pytest.mark.s3
def test_infra_swarm_config_runs_on_the_s3_server(
    tmp_path: Path, tiny_model: Path, s3_server: Any
) -> None:
    """infra/swarm.yaml (written for the compose stack) runs against the S3 server fixture
    with only configuration changed: endpoint, credentials, tracking and Prefect local."""
    bucket = "e2e-" + os.urandom(4).hex()
    s3_server.client().create_bucket(Bucket=bucket)
    options = s3_server.storage_options
    work = tmp_path / "work"
    infra = Path(__file__).resolve().parents[2] / "infra" / "swarm.yaml"
    sets = {
        "swarm_id": "e2e-swarm",
        "rounds": 2,
        "peer_wait_s": 120,
        "ledger.url": f"s3://{bucket}/ledger",
        "ledger.storage_options": json.dumps(options),
        "tracking.uri": "null",
        "prefect.api_url": "null",
        "sampling": json.dumps({"kind": "reward_filtered", "require_variance": False}),
        "defaults.model": str(tiny_model),
        "defaults.tasks": json.dumps(
            {"specs": [{"name": "chain_sum", "config": {"max_terms": 2}}]}
        ),
        "defaults.generation": json.dumps({"completions_per_question": 3, "max_new_tokens": 5}),
        "defaults.grpo": json.dumps({"drop_zero_variance": False}),
    }
    args = [a for k, v in sets.items() for a in ("--set", f"{k}={v}")]
    sapo("swarm", "-c", str(infra), "--workdir", str(work), *args)
    resolved = work / "swarm.yaml"
    check_swarm(resolved, options)
