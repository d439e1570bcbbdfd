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
