"""The round as Prefect records it, in-process against Prefect's test harness: one flow run
per round, its tasks the paper's steps in order, no task retries (the ledger retries I/O)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from tests.tiny_models import build_tiny_model

pytestmark = pytest.mark.integration


def swarm_text(tmp_path: Path, model: Path) -> str:
    return yaml.safe_dump(
        {
            "swarm_id": "flow-test",
            "workdir": str(tmp_path / "work"),
            "rounds": 2,
            "sampling": {"kind": "reward_filtered", "require_variance": False},
            "tracking": {"enabled": False},
            "defaults": {
                "model": str(model),
                "local_groups": 1,
                "external_groups": 1,
                "tasks": {"specs": [{"name": "chain_sum", "config": {"max_terms": 2}}]},
                "generation": {"completions_per_question": 2, "max_new_tokens": 3},
                "grpo": {"drop_zero_variance": False},
            },
            "nodes": [{"node_id": "a", "seed": 0}, {"node_id": "b", "seed": 1}],
        }
    )


@pytest.mark.slow  # Prefect's harness (a server: ~30 s to start)
def test_rounds_are_flows_of_the_papers_steps(tmp_path: Path, prefect_harness: None) -> None:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterName

    from flows.config import load_swarm
    from flows.node import steps
    from flows.node.round import node_flow

    model = build_tiny_model(tmp_path / "model")
    text = swarm_text(tmp_path, model)
    # a publishes first (its swarm as text, as deployments pass it); b then samples it (its
    # swarm resolved, as `sapo node` passes it)
    node_flow("a", swarm_text=text, until_round=1)
    result = node_flow("b", swarm=load_swarm(text=text))
    assert result["rounds"] == [0, 1]
    assert [m["external_groups_used"] for m in result["metrics"]] == [1.0, 1.0]

    with get_client(sync_client=True) as client:
        runs = client.read_flow_runs(
            flow_run_filter=FlowRunFilter(name=FlowRunFilterName(any_=["b-round-0", "b-round-1"]))
        )
        assert sorted(r.name for r in runs) == ["b-round-0", "b-round-1"]
        for run in runs:
            assert run.state is not None and run.state.is_completed()
            tasks = sorted(client.read_task_runs(), key=lambda t: t.expected_start_time)
            mine = [t for t in tasks if t.flow_run_id == run.id]
            # Each step of the round, in the one order (no evaluation due in this swarm).
            assert [t.name.rsplit("-", 1)[0] for t in mine] == [
                s.name for s in steps.ROUND if s.name != "evaluate"
            ]
            assert all(t.state is not None and t.state.is_completed() for t in mine)
            assert all(t.empirical_policy.retries == 0 for t in mine)


@pytest.mark.slow  # Prefect's harness (a server: ~30 s to start)
def test_a_scheduled_run_adds_its_rounds_up_to_the_swarms_last_in_the_workers_folder(
    tmp_path: Path,
    prefect_harness: None,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """What a deployment's runs do on a worker: the swarm comes resolved as text naming the
    deployer's folders, $SAPO_WORKDIR names the worker's; each run adds one round, the run
    that ends the last round logs the model, and a run after it ends without loading the
    model, unless the model is missing from MLflow: then it logs it."""
    from mlflow.tracking import MlflowClient

    from flows.config import load_swarm, swarm_yaml
    from flows.node import checkpoint
    from flows.node.round import node_flow
    from flows.tracking import MODEL_PATH_TAG

    model = build_tiny_model(tmp_path / "model")
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    resolved = load_swarm(
        text=swarm_text(tmp_path / "deployer", model),
        overrides=["tracking.enabled=true", f"tracking.uri={uri}"],
    )
    text = swarm_yaml(resolved)  # what `sapo deploy` sends
    machine = tmp_path / "machine" / "work"
    monkeypatch.setenv("SAPO_WORKDIR", str(machine))

    def run() -> list[int]:
        rounds: list[int] = node_flow("a", swarm_text=text, more_rounds=1, until_round=2)["rounds"]
        return rounds

    def model_tag() -> str | None:
        (found,) = MlflowClient(uri).search_runs(["1"], "tags.`sapo.node_id` = 'a'")
        tag: str | None = found.data.tags.get(MODEL_PATH_TAG)
        return tag

    assert run() == [0] and model_tag() is None  # not after every run
    assert run() == [1] and model_tag() == "model-round-1"  # the last round's run logs it
    capsys.readouterr()
    assert run() == []
    assert "a has finished its 2 rounds" in capsys.readouterr().out  # without loading it
    saved = checkpoint.latest(machine, "a")
    assert saved is not None and saved.next_round == 2
    # The run that ended the last round stopped before its model was logged: the next one
    # logs it.
    (found,) = MlflowClient(uri).search_runs(["1"], "tags.`sapo.node_id` = 'a'")
    MlflowClient(uri).delete_tag(found.info.run_id, MODEL_PATH_TAG)
    (checkpoint.node_dir(machine, "a") / checkpoint.FINISHED).unlink()
    assert run() == [] and model_tag() == "model-round-1"
    assert checkpoint.finished_rounds(machine, "a") == 2
    # The node's state is the worker's; the deployer's folder holds only the ledger it named.
    assert [p.name for p in (tmp_path / "deployer" / "work").iterdir()] == ["ledger"]
