"""A node's final model in MLflow: logged in the transformers flavor, so the registered
version loads with `mlflow.transformers.load_model` and `mlflow.pyfunc.load_model`."""

from __future__ import annotations

from pathlib import Path

from flows.tracking import open_tracker
from tests.tiny_models import build_tiny_model


def test_a_logged_and_registered_model_loads_with_both_flavors(tmp_path: Path, caplog) -> None:
    import mlflow
    import transformers

    checkpoint = build_tiny_model(tmp_path / "tiny")
    model = transformers.AutoModelForCausalLM.from_pretrained(checkpoint)
    tokenizer = transformers.AutoTokenizer.from_pretrained(checkpoint)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    tracker = open_tracker(uri, "models", str(tmp_path / "artifacts"))
    run_id = tracker.run("node-0", {"sapo.node_id": "node-0"})
    assert run_id is not None
    tracker.log_model(run_id, model, tokenizer, scratch=tmp_path)
    hub_noise = [r for r in caplog.records if r.name == "mlflow.transformers"]
    assert hub_noise == []  # no model card or licence warnings for a local model
    version = tracker.register("tiny-policy", run_id)
    assert not list(tmp_path.glob(".mlflow-model-*"))  # the scratch copy is gone

    mlflow.set_tracking_uri(uri)
    pipeline = mlflow.transformers.load_model(f"models:/tiny-policy/{version}")
    assert isinstance(pipeline, transformers.TextGenerationPipeline)
    loaded = pipeline.model
    for name, tensor in model.state_dict().items():
        assert loaded.state_dict()[name].equal(tensor), name
    generic = mlflow.pyfunc.load_model(f"models:/tiny-policy/{version}")
    (text,) = generic.predict(["What is 1 + 1?"])
    assert text.startswith("What is 1 + 1?")


def test_a_continued_node_logs_beside_its_earlier_model_and_registered_versions_keep_theirs(
    tmp_path: Path,
) -> None:
    import mlflow
    import torch
    import transformers

    from flows.tracking import MODEL_PATH_TAG, register_best

    checkpoint = build_tiny_model(tmp_path / "tiny")
    model = transformers.AutoModelForCausalLM.from_pretrained(checkpoint)
    tokenizer = transformers.AutoTokenizer.from_pretrained(checkpoint)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    tracker = open_tracker(uri, "models", str(tmp_path / "artifacts"))
    parent = tracker.run("swarm", {})
    assert parent is not None
    run_id = tracker.run("node-0", {"sapo.node_id": "node-0"}, parent_id=parent)
    assert run_id is not None
    tracker.log_metrics(run_id, {"cumulative_own_reward": 1.0}, step=0)
    first = tracker.log_model(run_id, model, tokenizer, tmp_path, path="model-round-0")
    assert first == f"runs:/{run_id}/model-round-0"
    found = register_best(tracker, parent, "p")
    assert found is not None and found[2] == "1"
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with torch.no_grad():  # the swarm is continued: the node trains on
        for tensor in model.parameters():
            tensor.add_(0.5)
    tracker.log_model(run_id, model, tokenizer, tmp_path, path="model-round-3")
    assert tracker.client.get_run(run_id).data.tags[MODEL_PATH_TAG] == "model-round-3"
    found = register_best(tracker, parent, "p")
    assert found is not None and found[2] == "2"
    mlflow.set_tracking_uri(uri)
    old = mlflow.transformers.load_model("models:/p/1").model.state_dict()
    new = mlflow.transformers.load_model("models:/p/2").model.state_dict()
    for name, tensor in before.items():
        assert old[name].equal(tensor), name
        assert not new[name].equal(tensor) or tensor.numel() == 0, name
