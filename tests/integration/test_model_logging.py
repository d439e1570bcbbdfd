"""A node's final model in MLflow: logged in the transformers flavor, so the registered
version loads with `mlflow.transformers.load_model` and `mlflow.pyfunc.load_model`."""

from __future__ import annotations

from pathlib import Path

from flows.tracking import Tracker, open_tracker
from tests.tiny_models import build_tiny_model


def _node_run(tmp_path: Path) -> tuple[str, Tracker, str]:
    """A SQLite tracking store with artifacts under tmp_path, and a node's run in it."""
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    tracker = open_tracker(uri, "models", str(tmp_path / "artifacts"))
    run_id = tracker.run("node-0", {"sapo.node_id": "node-0"})
    assert run_id is not None
    return uri, tracker, run_id


def test_a_logged_and_registered_model_loads_with_both_flavors(tmp_path: Path, caplog) -> None:
    import mlflow
    import transformers

    checkpoint = build_tiny_model(tmp_path / "tiny")
    model = transformers.AutoModelForCausalLM.from_pretrained(checkpoint)
    tokenizer = transformers.AutoTokenizer.from_pretrained(checkpoint)
    uri, tracker, run_id = _node_run(tmp_path)
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
    # Issue 47: the pyfunc gave the prompt back unchanged and ignored params. It generates
    # the completion alone (greedy: the same as the network's own), and params set its length.
    (text,) = generic.predict(["What is 1 + 1?"])
    prompt = tokenizer("What is 1 + 1?", return_tensors="pt")
    greedy = model.generate(**prompt, max_new_tokens=64, do_sample=False)
    expected = tokenizer.decode(greedy[0, prompt["input_ids"].shape[1] :], skip_special_tokens=True)
    assert text == expected and len(tokenizer(text)["input_ids"]) > 8
    (short,) = generic.predict(["What is 1 + 1?"], params={"max_new_tokens": 4})
    assert len(tokenizer(short)["input_ids"]) <= 4 and expected.startswith(short)


def test_the_served_model_is_prompted_as_the_node_trained_it(tmp_path: Path) -> None:
    """Issue 47, run as a user runs it: the demo's registered model, asked a bare question
    through the pyfunc, gave '' (a chat model given no chat turn ends it at once). A node
    logs its prompt as the model's prompt template, so the pyfunc and `mlflow models serve`
    prompt as the node trained: system prompt, chat template, prefill."""
    import mlflow
    import transformers

    from sapo_core.config import PromptConfig
    from sapo_core.prompts import render_prompt, serving_template

    checkpoint = build_tiny_model(tmp_path / "tiny")
    model = transformers.AutoModelForCausalLM.from_pretrained(checkpoint)
    tokenizer = transformers.AutoTokenizer.from_pretrained(checkpoint)
    config = PromptConfig(system_prompt="Put {the} answer in tags.", prefill="<answer>")
    uri, tracker, run_id = _node_run(tmp_path)
    template = serving_template(tokenizer, config, "chat")
    tracker.log_model(run_id, model, tokenizer, scratch=tmp_path, prompt_template=template)
    mlflow.set_tracking_uri(uri)
    served = mlflow.pyfunc.load_model(f"runs:/{run_id}/model")
    (text,) = served.predict(["What is 1 + 1?"], params={"max_new_tokens": 8})
    prompt = tokenizer(render_prompt(tokenizer, "What is 1 + 1?", config), return_tensors="pt")
    greedy = model.generate(**prompt, max_new_tokens=8, do_sample=False)
    expected = tokenizer.decode(greedy[0, prompt["input_ids"].shape[1] :], skip_special_tokens=True)
    assert text == expected and text
    pipeline = mlflow.transformers.load_model(f"runs:/{run_id}/model")
    assert pipeline("Hi", max_new_tokens=1)[0]["generated_text"].startswith("Hi")  # as is


def test_a_served_plain_format_model_stops_at_the_nodes_stop_text(tmp_path: Path) -> None:
    """A base model prompted in the plain format ends its completion at `</answer>` in the
    node; served, it ends there too (the pipeline's stop_sequence), instead of writing on
    to max_new_tokens. Here the stop text is one the tiny model's greedy output holds."""
    import mlflow
    import transformers

    from sapo_core.config import PromptConfig
    from sapo_core.prompts import render_prompt, serving_template

    checkpoint = build_tiny_model(tmp_path / "tiny")
    model = transformers.AutoModelForCausalLM.from_pretrained(checkpoint)
    tokenizer = transformers.AutoTokenizer.from_pretrained(checkpoint)
    config = PromptConfig(system_prompt="")
    prompt = tokenizer(render_prompt(tokenizer, "2 + 2?", config, "plain"), return_tensors="pt")
    greedy = model.generate(**prompt, max_new_tokens=16, do_sample=False)
    new = greedy[0, prompt["input_ids"].shape[1] :]
    full = tokenizer.decode(new, skip_special_tokens=True)
    stop = tokenizer.decode(new[6:8], skip_special_tokens=True)
    assert stop.strip() and full.index(stop) + len(stop) < len(full)
    uri, tracker, run_id = _node_run(tmp_path)
    template = serving_template(tokenizer, config, "plain")
    tracker.log_model(
        run_id, model, tokenizer, scratch=tmp_path, prompt_template=template, stop=(stop,)
    )
    mlflow.set_tracking_uri(uri)
    served = mlflow.pyfunc.load_model(f"runs:/{run_id}/model")
    assert served.model_config["stop_sequence"] == [stop]
    (text,) = served.predict(["2 + 2?"], params={"max_new_tokens": 16})
    # It stops at the stop text's first match (transformers matches it across the
    # prompt's end too), never later: a strict prefix of the unstopped completion.
    assert full.startswith(text) and len(text) <= full.index(stop) + len(stop) < len(full)


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


def test_an_adapter_node_logs_its_adapter_which_loads_on_its_base_into_a_pipeline(
    tmp_path: Path,
) -> None:
    """A LoRA node's model is logged as its adapter and tokenizer, naming its base: the
    registered version loads (flavor and pyfunc) as the adapted model, without a copy of
    the base weights in the store."""
    import mlflow
    import torch
    import transformers

    from sapo_core.config import AdapterConfig
    from sapo_core.policy import adapter

    checkpoint = build_tiny_model(tmp_path / "tiny")
    model = adapter.attach(
        transformers.AutoModelForCausalLM.from_pretrained(checkpoint),
        AdapterConfig(kind="lora", rank=4, alpha=8),
    ).eval()
    with torch.no_grad():  # a trained adapter: B != 0
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.normal_(0, 0.5, generator=torch.Generator().manual_seed(0))
    tokenizer = transformers.AutoTokenizer.from_pretrained(checkpoint)
    uri, tracker, run_id = _node_run(tmp_path)
    tracker.log_model(run_id, model, tokenizer, scratch=tmp_path)
    version = tracker.register("tiny-lora", run_id)

    stored = [p for p in (tmp_path / "artifacts").rglob("*") if p.is_file()]
    weights = [p.relative_to(tmp_path / "artifacts").as_posix() for p in stored]
    assert [w for w in weights if w.endswith(".safetensors")] == [
        f"{run_id}/artifacts/model/peft/adapter_model.safetensors"
    ]  # the adapter alone: the base weights stay where they are
    base_bytes = sum(p.stat().st_size for p in Path(checkpoint).glob("*.safetensors"))
    adapter_bytes = sum(p.stat().st_size for p in stored if p.suffix == ".safetensors")
    assert adapter_bytes < base_bytes / 4

    mlflow.set_tracking_uri(uri)
    pipeline = mlflow.transformers.load_model(f"models:/tiny-lora/{version}")
    assert adapter.is_adapted(pipeline.model)
    assert adapter.base_directory(pipeline.model) == str(checkpoint)
    ids = torch.tensor([[5, 6, 7, 8, 9]])
    with torch.no_grad():
        want = model(input_ids=ids).logits
        got = pipeline.model(input_ids=ids).logits
        with adapter.base_only(model):
            base = model(input_ids=ids).logits
    assert torch.allclose(got, want, atol=1e-5)
    assert not torch.allclose(got, base, atol=1e-3)  # the adapter is applied, not dropped
    generic = mlflow.pyfunc.load_model(f"models:/tiny-lora/{version}")
    (text,) = generic.predict(["What is 1 + 1?"], params={"max_new_tokens": 6})
    assert text and not text.startswith("What is 1 + 1?")  # the completion, generated


LOG_A_MODEL = """
import logging, sys
from pathlib import Path
from flows.env import apply_offline_defaults
apply_offline_defaults()
logging.basicConfig(level=logging.INFO)  # as a node's log handler shows its warnings
import transformers
from flows.tracking import open_tracker
from tests.tiny_models import build_tiny_model
tmp = Path(sys.argv[1])
checkpoint = build_tiny_model(tmp / "tiny")
model = transformers.AutoModelForCausalLM.from_pretrained(checkpoint)
tokenizer = transformers.AutoTokenizer.from_pretrained(checkpoint)
tracker = open_tracker(f"sqlite:///{tmp}/mlflow.db", "quiet", str(tmp / "artifacts"))
tracker.log_model(tracker.run("n", {}), model, tokenizer, scratch=tmp)
print("bitsandbytes" in sys.modules)
"""


def test_logging_a_model_says_nothing_of_bitsandbytes_kernels(tmp_path: Path) -> None:
    """Issue 47: saving a model imports bitsandbytes (the gpu extra), which on a CPU warned
    in every node's output that an optional kernel package is missing. In a fresh process,
    since it warns once, on import."""
    import subprocess
    import sys

    from tests.mlflow_store import new_store

    root = Path(__file__).resolve().parents[2]
    new_store(tmp_path / "mlflow.db")  # migrated here: the process skips MLflow's migrations
    done = subprocess.run(
        [sys.executable, "-c", LOG_A_MODEL, str(tmp_path)],
        capture_output=True,
        text=True,
        cwd=root,
        timeout=300,
        check=True,
    )
    assert done.stdout.strip().endswith("True")  # it was imported: the case in question
    assert "kernels" not in done.stderr, done.stderr[-2000:]
