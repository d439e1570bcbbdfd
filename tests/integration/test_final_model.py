"""`checkpoint_keep: final-model`: a node done with its rounds keeps only its final model
(in MLflow when it was logged there, else in its checkpoint), and cannot be continued."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from flows.cli import app
from flows.config import SwarmConfig
from flows.node import checkpoint
from flows.node.finish import close_run
from flows.node.runtime import open_node
from tests.integration.test_round_steps import make_swarm, run_round

runner = CliRunner()


def sizes(path: Path) -> dict[str, int]:
    return {p.name: p.stat().st_size for p in path.iterdir() if p.is_file()}


def test_without_mlflow_the_checkpoint_keeps_the_model_and_drops_the_training_state(
    tmp_path: Path,
) -> None:
    swarm = make_swarm(tmp_path, rounds=1, checkpoint_keep="final-model")
    node = open_node(swarm, "a")
    try:
        run_round(node, 0, force=True)
        before = checkpoint.latest(swarm.workdir, "a")
        assert before is not None and before.resumable
        assert {"optimizer.pt", "rng.pt"} <= set(sizes(before.path))
        weights = {k: v.clone() for k, v in node.learner.policy.model.state_dict().items()}
        close_run(node, log_model=True)
    finally:
        node.close()
    after = checkpoint.latest(swarm.workdir, "a")
    assert after is not None and after.path == before.path
    assert (after.resumable, after.final_model, after.next_round) == (False, None, 1)
    kept = sizes(after.path)
    assert "optimizer.pt" not in kept and "rng.pt" not in kept
    assert "model.safetensors" in kept and "state.json" in kept
    # The weights kept are the trained ones, at full precision.
    from transformers import AutoModelForCausalLM

    loaded = AutoModelForCausalLM.from_pretrained(after.path, dtype=torch.float32)
    for name, tensor in loaded.state_dict().items():
        assert tensor.dtype == torch.float32 and tensor.equal(weights[name]), name
    # It cannot train on: opening it for more rounds says why and what to do.
    more = make_swarm(tmp_path, rounds=2, checkpoint_keep="final-model")
    with pytest.raises(
        checkpoint.NotResumable, match="a finished round 0 keeping only the final model"
    ):
        open_node(more, "a")


def test_keeping_nothing_leaves_the_record_that_the_node_finished(tmp_path: Path) -> None:
    swarm = make_swarm(tmp_path, rounds=1, checkpoint_keep="nothing")
    node = open_node(swarm, "a")
    try:
        run_round(node, 0, force=True)
        close_run(node, log_model=True)
    finally:
        node.close()
    after = checkpoint.latest(swarm.workdir, "a")
    assert after is not None and (after.resumable, after.next_round) == (False, 1)
    assert set(sizes(after.path)) == {"state.json"}  # no weights, no training state
    with pytest.raises(checkpoint.NotResumable, match="a's was not kept"):
        open_node(make_swarm(tmp_path, rounds=2, checkpoint_keep="nothing"), "a")


def test_with_mlflow_the_model_lives_only_there(tmp_path: Path) -> None:
    import mlflow
    import transformers

    swarm = make_swarm(
        tmp_path, rounds=1, checkpoint_keep="final-model", tracking={"enabled": True}
    )
    node = open_node(swarm, "a")
    try:
        run_round(node, 0, force=True)
        weights = {k: v.clone() for k, v in node.learner.policy.model.state_dict().items()}
        close_run(node, log_model=True)
    finally:
        node.close()
    after = checkpoint.latest(swarm.workdir, "a")
    assert after is not None and not after.resumable
    assert sorted(sizes(after.path)) == ["state.json"]  # no second copy of the model
    assert after.final_model is not None and after.final_model.startswith("runs:/")
    mlflow.set_tracking_uri(swarm.tracking_uri())
    pipeline = mlflow.transformers.load_model(after.final_model)
    assert isinstance(pipeline, transformers.TextGenerationPipeline)
    for name, tensor in pipeline.model.state_dict().items():
        assert tensor.equal(weights[name]), name


def finish_one_round(swarm: SwarmConfig, node_id: str) -> None:
    node = open_node(swarm, node_id)
    try:
        run_round(node, 0, force=True)
        close_run(node, log_model=False)
    finally:
        node.close()


def test_the_cli_refuses_more_rounds_and_says_a_finished_node_is_done(tmp_path: Path) -> None:
    swarm = make_swarm(tmp_path, rounds=1, checkpoint_keep="final-model")
    finish_one_round(swarm, "a")
    config = swarm.workdir / "swarm.yaml"
    from flows.swarm.launcher import write_resolved

    write_resolved(swarm, config)
    base = ["node", "--node-id", "a", "-c", str(config)]
    more = runner.invoke(app, [*base, "--rounds", "3"])
    assert more.exit_code == 2
    kept = checkpoint.latest(swarm.workdir, "a")
    assert kept is not None
    assert more.output.strip().startswith(
        "error: a finished round 0 keeping only the final model (--keep final-model or "
        f"nothing; a's is at {kept.path}), so the swarm cannot train on: start afresh with "
        "another --workdir (with --keep resume"
    )
    extra = runner.invoke(app, [*base, "--more-rounds", "1"])
    assert extra.exit_code == 2 and "cannot train on" in extra.output
    # A swarm names every such node in its one line, and a finished one says why it ends.
    finish_one_round(swarm, "b")
    both = runner.invoke(app, ["swarm", "-c", str(config), "--rounds", "2"])
    assert both.exit_code == 2
    assert both.output.startswith("error: a, b finished round 0 keeping only the final model")
    again = runner.invoke(app, ["swarm", "-c", str(config)])
    assert again.exit_code == 0, again.output
    assert "cannot be continued" in again.output
    done = runner.invoke(app, base)
    assert done.exit_code == 0, done.output
    assert done.output.strip().startswith("a has finished its 1 rounds; its final model is at")


def test_keeping_nothing_logs_no_model_to_mlflow_either(tmp_path: Path) -> None:
    """Issue 47: `--keep nothing` still logged (and registered) every node's model to MLflow,
    1.08 GB for the mixed example, while its help says "no model"."""
    import mlflow

    from flows.node.round import node_flow

    swarm = make_swarm(tmp_path, rounds=1, checkpoint_keep="nothing", tracking={"enabled": True})
    node_flow.fn("a", swarm=swarm)
    mlflow.set_tracking_uri(swarm.tracking_uri())
    (run,) = mlflow.search_runs(search_all_experiments=True, output_format="list")
    assert run.data.metrics["cumulative_own_reward"] >= 0.0  # tracked, its round logged
    logged = [a.path for a in mlflow.artifacts.list_artifacts(run_id=run.info.run_id)]
    assert logged == ["completions"]  # the rounds' sample tables, and no model
    # One rule, stated: the default follows what the swarm keeps; a set value wins.
    assert not swarm.logs_models
    assert make_swarm(tmp_path, tracking={"enabled": True}).logs_models
    chosen = {"enabled": True, "log_models": True}
    assert make_swarm(tmp_path, checkpoint_keep="nothing", tracking=chosen).logs_models
    assert not make_swarm(tmp_path, tracking={"enabled": False}).logs_models
