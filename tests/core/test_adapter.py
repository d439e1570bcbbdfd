"""LoRA adapters (sapo_core/policy/adapter.py): what trains, both log-prob paths with the
adapter on, the reference with it off, and the errors."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from sapo_core.config import AdapterConfig
from sapo_core.grpo.logprobs import plain_logprobs
from sapo_core.grpo.segments import Segment
from sapo_core.grpo.shared_prompt import shared_prompt_logprobs, supports_shared_prompt
from sapo_core.policy import adapter
from sapo_core.policy.loading import load_model
from tests.tiny_models import build_tiny_model

PAD = 2
LORA = AdapterConfig(kind="lora", rank=4, alpha=8)


def _segments() -> list[Segment]:
    return [
        Segment([5, 6, 7, 8], [[11, 12, 13], [14]], [1.0, -1.0], [None] * 2),
        Segment([9, 10], [[21, 22, 23, 24], [25, 26]], [0.5, -0.5], [None] * 2),
    ]


def _nudge(model: Any, seed: int = 0) -> None:
    """Give every LoRA B matrix random values: a fresh adapter (B = 0) changes nothing."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.copy_(torch.randn(param.shape, generator=generator) * 0.5)


@pytest.fixture(params=["llama", "qwen2", "gemma3"])
def base_dir(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp(request.param), family=request.param)


def test_only_the_adapter_trains_and_a_fresh_one_changes_nothing(base_dir: Path) -> None:
    base = load_model(str(base_dir)).eval()
    with torch.no_grad():
        expected, _ = plain_logprobs(base, _segments(), 0.7, PAD)
    model = adapter.attach(load_model(str(base_dir)), LORA).eval()
    assert adapter.is_adapted(model) and not adapter.is_adapted(base)
    trainable = [n for n, p in model.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n for n in trainable)
    # every default projection of every layer got an A and a B
    layers = base.config.num_hidden_layers
    assert len(trainable) == 2 * 7 * layers
    count, total = adapter.trainable_parameters(model)
    assert 0 < count < total / 10
    with torch.no_grad():
        got, _ = plain_logprobs(model, _segments(), 0.7, PAD)
    assert torch.allclose(got, expected, atol=1e-6)


def test_both_paths_agree_with_the_adapter_on_and_off_is_the_base(base_dir: Path) -> None:
    base = load_model(str(base_dir)).eval()
    model = adapter.attach(load_model(str(base_dir)), LORA).eval()
    _nudge(model)
    assert supports_shared_prompt(model)  # the fast path reaches the decoder through peft
    with torch.no_grad():
        fast, _ = shared_prompt_logprobs(model, _segments(), 0.7, PAD)
        plain, mask = plain_logprobs(model, _segments(), 0.7, PAD)
        untouched, _ = plain_logprobs(base, _segments(), 0.7, PAD)
        with adapter.base_only(model):
            off, _ = shared_prompt_logprobs(model, _segments(), 0.7, PAD)
        after, _ = plain_logprobs(model, _segments(), 0.7, PAD)
    assert torch.allclose(fast, plain, atol=1e-5)
    assert (plain - untouched).abs()[mask == 1].max() > 1e-2  # the adapter does act
    assert torch.allclose(off, untouched, atol=1e-5)  # the reference: the base exactly
    assert torch.equal(after, plain)  # switched back on afterwards


def test_gradients_reach_only_the_adapter_on_the_fast_path(base_dir: Path) -> None:
    model = adapter.attach(load_model(str(base_dir)), LORA).train()
    _nudge(model)
    logprobs, mask = shared_prompt_logprobs(model, _segments(), 1.0, PAD)
    (logprobs * mask).sum().backward()
    grads = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
    assert grads and all("lora_" in n for n in grads)
    assert all(g.abs().sum() > 0 for n, g in grads.items() if "lora_A" in n)


def test_unknown_family_and_unmatched_targets_are_clear_errors(base_dir: Path) -> None:
    model = load_model(str(base_dir))
    model.config.model_type = "mystery"
    with pytest.raises(adapter.AdapterError, match="no default LoRA targets for model type"):
        adapter.attach(model, LORA)
    wrong = AdapterConfig(kind="lora", target_modules=["no_such_proj"])
    with pytest.raises(adapter.AdapterError, match="no_such_proj"):
        adapter.attach(load_model(str(base_dir)), wrong)


def test_an_adapter_runs_on_either_backend_and_is_labelled_by_its_rank() -> None:
    from pydantic import ValidationError

    from sapo_core.config import GenerationConfig, GRPOConfig, NodeConfig, VLLMConfig

    on_vllm = NodeConfig(generation=GenerationConfig(backend="vllm"), grpo=GRPOConfig(adapter=LORA))
    assert on_vllm.generation.vllm.adapter_sync == "merged"  # faster per round on CPU
    assert on_vllm.grpo.adapter.label() == "lora-r4"
    assert NodeConfig().grpo.adapter.label() is None
    with pytest.raises(ValidationError, match="adapter_sync"):
        VLLMConfig(adapter_sync="copy")  # type: ignore[arg-type]


@pytest.mark.parametrize("shard_bytes", [1 << 28, 40_000])
def test_the_merged_weights_are_peft_merge_written_without_a_second_model(
    base_dir: Path, tmp_path: Path, shard_bytes: int
) -> None:
    """What vLLM reloads for an adapter node (sapo_core/policy/merged_weights.py): the
    tensors peft's own merge gives, bit for bit, under the names and files save_pretrained
    writes (one file, or shards with an index), loadable without peft as the adapted
    function; the adapted model itself is left as it was."""
    import copy

    from safetensors.torch import load_file

    from sapo_core.policy.merged_weights import INDEX, save_merged

    model = adapter.attach(load_model(str(base_dir)), LORA).eval()
    _nudge(model)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    written = save_merged(model, tmp_path / "merged", shard_bytes=shard_bytes)
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())

    reference = copy.deepcopy(model).merge_and_unload()
    reference.save_pretrained(tmp_path / "peft", safe_serialization=True)
    want: dict[str, torch.Tensor] = {}
    for file in (tmp_path / "peft").glob("*.safetensors"):
        want |= load_file(str(file))
    got: dict[str, torch.Tensor] = {}
    for file in written:
        got |= load_file(str(file))
    assert sorted(got) == sorted(want)
    assert all(torch.equal(got[k], want[k]) for k in want)
    if shard_bytes < 1 << 28:  # the tiny model spans several shards, each listed
        assert len(written) > 2 and (tmp_path / "merged" / INDEX).is_file()
        index = json.loads((tmp_path / "merged" / INDEX).read_text())
        assert set(index["weight_map"]) == set(want)
        assert {index["weight_map"][k] for k in want} == {w.name for w in written}
    else:
        assert [w.name for w in written] == ["model.safetensors"]

    plain = load_model(str(tmp_path / "merged")).eval()
    assert not adapter.is_adapted(plain)
    with torch.no_grad():
        expected, _ = plain_logprobs(model, _segments(), 0.7, PAD)
        loaded, _ = plain_logprobs(plain, _segments(), 0.7, PAD)
    assert torch.allclose(loaded, expected, atol=1e-5)


def test_rewriting_merged_weights_with_another_layout_leaves_no_stale_shard(
    tmp_path: Path,
) -> None:
    from sapo_core.policy.merged_weights import INDEX, save_merged

    model = adapter.attach(load_model(str(build_tiny_model(tmp_path / "base"))), LORA)
    folder = tmp_path / "merged"
    save_merged(model, folder, shard_bytes=40_000)
    assert (folder / INDEX).is_file()
    (only,) = save_merged(model, folder)
    assert sorted(p.name for p in folder.glob("model*")) == [only.name]


def _peft_merged_tensors(model: Any, folder: Path) -> dict[str, torch.Tensor]:
    """The reference: peft's own merge of a copy, saved by transformers, read back."""
    import copy

    from safetensors.torch import load_file

    copy.deepcopy(model).merge_and_unload().save_pretrained(folder, safe_serialization=True)
    tensors: dict[str, torch.Tensor] = {}
    for file in folder.glob("*.safetensors"):
        tensors |= load_file(str(file))
    return tensors


def _random_embedding_a(model: Any) -> None:
    for name, param in model.named_parameters():  # peft starts an embedding's A at 0
        if "lora_embedding_A" in name:
            with torch.no_grad():
                param.normal_(0, 0.5, generator=torch.Generator().manual_seed(1))


ON_EMBEDDINGS = AdapterConfig(kind="lora", rank=4, alpha=8,
                              target_modules=["embed_tokens", "q_proj"])  # fmt: skip


def test_an_adapter_on_untied_embeddings_is_folded_into_the_same_function(
    tmp_path: Path,
) -> None:
    """The folder, loaded by transformers, computes what the adapted model computes."""
    from safetensors.torch import load_file

    from sapo_core.policy.merged_weights import save_merged

    base = build_tiny_model(tmp_path / "base", tied=False)
    model = adapter.attach(load_model(str(base)), ON_EMBEDDINGS).eval()
    _nudge(model)
    _random_embedding_a(model)
    (file,) = save_merged(model, tmp_path / "merged")
    got = load_file(str(file))
    want = _peft_merged_tensors(model, tmp_path / "peft")
    assert sorted(got) == sorted(want) and "lm_head.weight" in got
    assert all(torch.equal(got[k], want[k]) for k in want)
    embed = "model.embed_tokens.weight"
    assert not torch.equal(got[embed], load_model(str(base)).state_dict()[embed])
    ids = torch.tensor([[1, 5, 9, 20, 3]])
    with torch.no_grad():
        plain = load_model(str(tmp_path / "merged")).eval()(ids).logits
        adapted = model(ids).logits
    assert torch.allclose(plain, adapted, atol=1e-4)
    assert not torch.allclose(plain, load_model(str(base)).eval()(ids).logits, atol=1e-2)
    config = json.loads((tmp_path / "merged" / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"] and config["dtype"] == "float32"


def test_an_adapter_on_a_tied_weight_is_refused_either_side(tmp_path: Path) -> None:
    """Written once and tied again by the loader, a tied tensor with the embeddings' delta
    would change the head, which peft's embedding adapter leaves alone: a different policy
    than the one trained. Refused, on the embeddings as on the head."""
    from sapo_core.policy.merged_weights import save_merged

    base = build_tiny_model(tmp_path / "base")  # tied: the head shares the embeddings
    model = adapter.attach(load_model(str(base)), ON_EMBEDDINGS)
    _random_embedding_a(model)
    with pytest.raises(ValueError, match="tied weight"):
        save_merged(model, tmp_path / "embeddings")
    on_head = AdapterConfig(kind="lora", rank=4, alpha=8, target_modules=["lm_head"])
    with pytest.raises(ValueError, match="tied weight"):
        save_merged(adapter.attach(load_model(str(base)), on_head), tmp_path / "head")


def test_what_the_fold_cannot_say_is_refused_and_an_inactive_adapter_ignored(
    tmp_path: Path,
) -> None:
    from peft import LoraConfig, get_peft_model

    from sapo_core.policy.merged_weights import save_merged

    base = build_tiny_model(tmp_path / "base", tied=False)
    # a whole trained copy of the head (peft's modules_to_save): no plain name for it
    saved_head = LoraConfig(r=4, target_modules=["q_proj"], modules_to_save=["lm_head"])
    with pytest.raises(ValueError, match="other than LoRA"):
        save_merged(get_peft_model(load_model(str(base)), saved_head), tmp_path / "a")
    # merged in place already: folding again would add the delta twice
    merged = adapter.attach(load_model(str(base)), LORA)
    _nudge(merged)
    merged.merge_adapter()
    with pytest.raises(ValueError, match="unmerge first"):
        save_merged(merged, tmp_path / "b")
    # a second, inactive adapter elsewhere changes nothing the fold writes
    model = adapter.attach(load_model(str(base)), LORA).eval()
    _nudge(model)
    model.add_adapter("other", LoraConfig(r=4, target_modules=["down_proj"]))
    _nudge(model, seed=1)  # both adapters' B: the inactive one would change the function
    assert len(save_merged(model, tmp_path / "c")) == 1
    ids = torch.tensor([[1, 5, 9, 20, 3]])
    with torch.no_grad():
        plain = load_model(str(tmp_path / "c")).eval()(ids).logits
        assert torch.allclose(plain, model(ids).logits, atol=1e-4)


def test_a_model_transformers_regroups_on_save_is_merged_in_a_copy(tmp_path: Path) -> None:
    """Qwen2-MoE's experts are fused when loaded and split again when saved: a tensor by
    tensor write would give the fused names; the fold falls back to transformers' save."""
    from transformers import Qwen2MoeConfig, Qwen2MoeForCausalLM

    from sapo_core.policy.merged_weights import converts_on_save, save_merged

    config = Qwen2MoeConfig(
        vocab_size=128, hidden_size=32, intermediate_size=64, moe_intermediate_size=16,
        shared_expert_intermediate_size=32, num_experts=4, num_experts_per_tok=2,
        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
    )  # fmt: skip
    torch.manual_seed(0)
    Qwen2MoeForCausalLM(config).save_pretrained(tmp_path / "moe")
    loaded = load_model(str(tmp_path / "moe"))
    assert converts_on_save(loaded)
    assert not converts_on_save(load_model(str(build_tiny_model(tmp_path / "llama"))))
    attention = AdapterConfig(kind="lora", rank=4, alpha=8, target_modules=["q_proj", "v_proj"])
    model = adapter.attach(loaded, attention)
    _nudge(model)
    from safetensors.torch import load_file

    got: dict[str, torch.Tensor] = {}
    for file in save_merged(model, tmp_path / "merged"):
        got |= load_file(str(file))
    want = _peft_merged_tensors(model, tmp_path / "peft")
    assert sorted(got) == sorted(want) and any(".experts.0." in k for k in want)
    assert all(torch.equal(got[k], want[k]) for k in want)


def test_a_bf16_base_keeps_an_fp32_adapter_and_both_paths_agree(base_dir: Path) -> None:
    """``base_precision: bf16``: the base's weights take half the bytes, the adapter and
    its gradients stay fp32, both log-prob paths agree within bf16's precision, and
    generation's bf16 copy shares the base's storage instead of copying it."""
    from sapo_core.config import ComputeConfig
    from sapo_core.policy.loading import base_dtype, load_policy

    half = AdapterConfig(kind="lora", rank=4, alpha=8, base_precision="bf16")
    assert base_dtype(half, "cpu") == torch.bfloat16
    assert base_dtype(AdapterConfig(kind="lora", base_precision="fp32"), "cpu") == torch.float32
    assert base_dtype(None, "cpu") == torch.float32  # full fine-tuning
    compute = ComputeConfig(device="cpu", precision="fp32", generation_precision="bf16")
    policy = load_policy(str(base_dir), compute=compute, adapter=half)
    torch.manual_seed(0)  # the same A matrices as the fp32 twin below
    model = adapter.attach(policy.model, half).train()
    policy.model = model
    _nudge(model)
    for name, param in model.named_parameters():
        assert param.dtype == (torch.float32 if "lora_" in name else torch.bfloat16), name
    torch.manual_seed(0)
    fp32 = adapter.attach(load_model(str(base_dir)), LORA).eval()
    _nudge(fp32)
    with torch.no_grad():
        exact, mask = plain_logprobs(fp32, _segments(), 0.7, PAD)
    fast, _ = shared_prompt_logprobs(model, _segments(), 0.7, PAD)
    with torch.no_grad():
        plain, _ = plain_logprobs(model.eval(), _segments(), 0.7, PAD)
    assert fast.dtype == plain.dtype == torch.float32
    # Within bf16's precision, as the base's own rounding below: the two paths run matmuls of
    # other shapes, which CPUs without native bf16 kernels round apart (~3e-3 measured on an
    # AMD EPYC, ~2e-6 where they agree); a wrong position or mask would be off by ~1.
    assert (fast - plain).abs()[mask == 1].max() < 2e-2
    # The base's bf16 rounding alone (~5e-3 measured), not nothing: the weights are halved.
    assert 1e-5 < (plain - exact).abs()[mask == 1].max() < 2e-2
    (fast * mask).sum().backward()
    grads = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
    assert grads and all("lora_" in n and g.dtype == torch.float32 for n, g in grads.items())
    assert not policy.exact_behaviour  # behaviour log-probs come from the training forward
    sampler = policy.sampler()
    shared = {p.data_ptr() for n, p in model.named_parameters() if "lora_" not in n}
    copied = {n: p for n, p in sampler.named_parameters()}
    assert all(p.data_ptr() in shared for n, p in copied.items() if "lora_" not in n)
    assert all(p.dtype == torch.bfloat16 for p in copied.values())


def test_a_bf16_base_needs_an_adapter() -> None:
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="base_precision bf16 needs an adapter"):
        AdapterConfig(base_precision="bf16")
    assert AdapterConfig(kind="lora", base_precision="bf16").base_precision == "bf16"
