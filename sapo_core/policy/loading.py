"""Load a policy and its tokenizer from a Hugging Face id, a local directory or the bundle."""

from __future__ import annotations

import contextlib
import copy
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from sapo_core.config import AdapterConfig, ComputeConfig
from sapo_core.config.bundled import BundledModel, lookup
from sapo_core.moved import moved_names


@dataclass
class Policy:
    """A causal LM with its tokenizer; `model_id` is what the ledger records.

    `autocast` names the reduced format its forward passes run in (None: the weights'
    format); the weights are fp32 on `model`'s device, but for a frozen base under an
    adapter, which may be bf16 (`base_dtype`).
    """

    model: Any
    tokenizer: Any
    model_id: str
    autocast: Any = None  # a torch dtype, or None
    sampling_dtype: Any = None  # generation runs a copy of the weights in this dtype, or None

    @property
    def device(self) -> Any:
        return next(self.model.parameters()).device

    @property
    def exact_behaviour(self) -> bool:
        """Whether generation's log-probs are the training forward's (fp32 both ways)."""
        import torch

        fp32 = self.model.get_input_embeddings().weight.dtype == torch.float32
        return fp32 and self.autocast is None and self.sampling_dtype is None

    def sampler(self) -> Any:
        """The network generation runs: the policy itself, or a copy of its current weights
        in `sampling_dtype` (the weights change every round, so the copy is the caller's)."""
        if self.sampling_dtype is None:
            return self.model
        return reduced_copy(self.model, self.sampling_dtype)

    @contextlib.contextmanager
    def precision(self) -> Iterator[None]:
        """Forward passes inside run in the policy's format."""
        if self.autocast is None:
            yield
            return
        import torch

        with torch.autocast(device_type=self.device.type, dtype=self.autocast):
            yield


def placement(compute: ComputeConfig) -> tuple[str, Any]:
    """The device a config asks for, and the autocast dtype (None: fp32)."""
    import torch

    cuda = torch.cuda.is_available()
    if compute.device == "cuda" and not cuda:
        raise RuntimeError("compute.device is 'cuda' but torch sees no CUDA device")
    device = "cuda" if compute.device == "cuda" or (compute.device == "auto" and cuda) else "cpu"
    if compute.precision == "bf16":
        return device, torch.bfloat16
    if compute.precision == "auto" and device == "cuda" and torch.cuda.is_bf16_supported():
        return device, torch.bfloat16
    return device, None


def reduced_copy(model: Any, dtype: Any) -> Any:
    """A frozen copy of `model` whose parameters are cast to `dtype`; buffers (rotary
    frequencies) keep their format. Each parameter is cast straight from the original, so
    no full-precision copy exists on the way, and tied parameters stay tied."""
    import torch

    memo = {
        id(p): torch.nn.Parameter(p.detach().to(dtype), requires_grad=False)
        for p in model.parameters()
    }
    copied = copy.deepcopy(model, memo)
    copied.eval()
    return copied


def native_bf16(device: str) -> bool:
    """Whether the device computes bf16 matmuls in hardware (not emulated in fp32)."""
    import torch

    if device == "cuda":
        return bool(torch.cuda.is_bf16_supported())
    probes = ("_is_avx512_bf16_supported", "_is_amx_tile_supported")  # private, so guarded
    return any(bool(getattr(torch.cpu, name, lambda: False)()) for name in probes)


def base_dtype(adapter: AdapterConfig | None, device: str) -> Any:
    """The dtype the network's weights load in: fp32 for training them all, bf16 for a
    frozen base under an adapter where asked for or (auto) native on the device."""
    import torch

    if adapter is None or not adapter.enabled or adapter.base_precision == "fp32":
        return torch.float32
    if adapter.base_precision == "bf16" or native_bf16(device):
        return torch.bfloat16
    return torch.float32


def sampling_dtype(compute: ComputeConfig, device: str, autocast: Any) -> Any:
    """The dtype generation's copy of the weights takes, or None to sample with the policy."""
    import torch

    if compute.generation_precision == "bf16":
        return torch.bfloat16
    if compute.generation_precision == "fp32":
        return None
    if autocast is not None:
        return autocast  # a reduced copy beats casting every weight on every token
    return torch.bfloat16 if native_bf16(device) else None


@dataclass(frozen=True)
class ModelSource:
    """A configured model name, resolved once: the id the ledger and MLflow record, and, for
    a bundled model, its catalogue entry (its files, its prompt format). Where its weights and
    tokenizer load from is asked of it (a bundled model's are converted on first use)."""

    id: str
    entry: BundledModel | None = None

    @property
    def prompt_format(self) -> Literal["chat", "plain"] | None:
        """The prompt format its catalogue entry names (None: decide from the tokenizer)."""
        return self.entry.prompt_format if self.entry else None

    def weights(self) -> str:
        """The path or hub id transformers loads the network from."""
        from sapo_core.policy import bundled

        return self.id if self.entry is None else str(bundled.model_dir(self.entry))

    def tokenizer(self) -> str:
        """The path or hub id of its tokenizer (a bundled one needs no converted weights)."""
        from sapo_core.policy import bundled

        return self.id if self.entry is None else str(bundled.tokenizer_dir(self.entry))


def resolve_model(model: str | ModelSource) -> ModelSource:
    """A configured model name as a `ModelSource` (one given is returned as it is)."""
    if isinstance(model, ModelSource):
        return model
    return ModelSource(model, lookup(model))


def model_problem(model: str) -> str | None:
    """Why the configured ``model`` cannot load here, told before anything starts (None:
    nothing found against it): a hub id that is not in the local Hugging Face cache while
    downloads are off. A bundled model is fetched from the package index on first use, a
    folder is read as it is, and with downloads on the hub answers for itself."""
    if lookup(model) is not None or Path(model).expanduser().exists():
        return None
    if os.environ.get("HF_HUB_OFFLINE", "").lower() not in ("1", "true", "yes", "on"):
        return None
    from huggingface_hub import try_to_load_from_cache

    try:
        cached = try_to_load_from_cache(model, "config.json")
    except ValueError:  # not a hub id at all (huggingface_hub's HFValidationError)
        cached = None
    if isinstance(cached, str):
        return None
    return (
        f"model {model!r} is not a folder here, not a bundled model and not in the Hugging "
        "Face cache, and downloads are off (HF_HUB_OFFLINE=1): give a model folder, a "
        "bundled:<name>, or run once with HF_HUB_OFFLINE=0 to download it"
    )


# resolve(model) was removed in issue 59, unused; the old import says what replaces it.
__getattr__ = moved_names(__name__, {"resolve": "is gone: use resolve_model(model).weights()"})


def load_tokenizer(model: str | ModelSource) -> Any:
    """The tokenizer alone (a bundled one does not need the weights converted)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(resolve_model(model).tokenizer())
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def load_model(model: str | ModelSource, dtype: Any = None) -> Any:
    """The network alone, in fp32 for training (bf16 is slower on CPUs without native bf16)
    unless `dtype` says otherwise."""
    import torch
    from transformers import AutoModelForCausalLM

    local_only = os.environ.get("HF_HUB_OFFLINE") == "1"
    network = AutoModelForCausalLM.from_pretrained(
        resolve_model(model).weights(), dtype=dtype or torch.float32, local_files_only=local_only
    )
    network.generation_config.pad_token_id = network.generation_config.eos_token_id
    return network


def load_policy(
    model: str | ModelSource,
    *,
    threads: int | None = None,
    compute: ComputeConfig | None = None,
    adapter: AdapterConfig | None = None,
) -> Policy:
    """The network and its tokenizer, placed as `compute` says (default: fp32 on the CPU,
    generation included), its weights in `base_dtype` when an `adapter` will train on it;
    `threads` sets torch's intra-op thread count first."""
    import torch

    if threads:
        torch.set_num_threads(threads)
    compute = compute or ComputeConfig(device="cpu", precision="fp32", generation_precision="fp32")
    source = resolve_model(model)
    device, autocast = placement(compute)
    network = load_model(source, base_dtype(adapter, device)).to(device)
    sampling = sampling_dtype(compute, device, autocast)
    return Policy(network, load_tokenizer(source), source.id, autocast, sampling)
