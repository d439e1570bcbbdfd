"""An adapted policy written as plain weights, shard by shard, without a second model.

A consumer that knows nothing of peft (vLLM reloading the policy, a user's
``from_pretrained``) needs the LoRA folded into the weights: W + scale * B @ A per adapted
projection. peft's ``merge_and_unload`` folds in place, so keeping the adapter training
meant merging a deep copy of the whole model: for a moment twice the model's memory, on
the accelerator where it lives, which is where memory runs out first. Here each merged
tensor is made only while its shard is written (one shard at a time, ``shard_bytes`` at
most beside the model), every other tensor is written from the model's own storage, and
the model is never modified: the frozen base stays the base exactly.

The folder is what ``save_pretrained`` writes: ``config.json`` (and the generation config
where the model has one), ``model.safetensors`` or numbered shards with
``model.safetensors.index.json``, the tensors under the plain model's names, a tied tensor
written once under its first name.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

DEFAULT_SHARD_BYTES = 256 << 20  # the most a write holds beside the model
INDEX = "model.safetensors.index.json"
BASE_LAYER = ".base_layer."


def _lora_layers(base: Any, adapter_name: str) -> dict[str, Any]:
    """Module name -> the peft LoRA layer wrapping it, for layers the adapter acts on; an
    adapter kind this merge does not fold (DoRA, LoRA biases) is an error, not a silent
    drop of what it learned."""
    from peft.tuners.lora import LoraLayer

    layers = {}
    for name, module in base.named_modules():
        if not isinstance(module, LoraLayer) or adapter_name not in module.lora_A:
            continue
        if adapter_name in getattr(module, "lora_variant", {}) or module.lora_bias.get(
            adapter_name
        ):
            raise ValueError(f"{name}: only plain LoRA is folded into the weights here")
        layers[name] = module
    return layers


def _plain_tensors(model: Any) -> Iterator[tuple[str, torch.Tensor, Any | None]]:
    """(plain name, the model's tensor, the LoRA layer to fold into it or None), in the
    model's order, adapter matrices left out and tied tensors given once."""
    adapter_name = model.active_adapter
    base = model.get_base_model()
    layers = _lora_layers(base, adapter_name)
    seen: set[tuple[int, tuple[int, ...]]] = set()
    for key, tensor in base.state_dict().items():
        if ".lora_" in key:
            continue
        name, layer = key, None
        if BASE_LAYER in key:
            module, param = key.split(BASE_LAYER, 1)
            name = f"{module}.{param}"
            layer = layers.get(module) if param == "weight" else None
        storage = (
            tensor.untyped_storage().data_ptr() + tensor.storage_offset(),
            tuple(tensor.shape),
        )
        if storage in seen:
            continue  # a tied tensor (the output head sharing the embeddings): once
        seen.add(storage)
        yield name, tensor, layer


def _folded(tensor: torch.Tensor, layer: Any | None, adapter_name: str) -> torch.Tensor:
    if layer is None:
        return tensor.detach().contiguous()
    merged = tensor.detach().clone()
    merged += layer.get_delta_weight(adapter_name)  # as peft's merge: in the weight's dtype
    return merged


def _shards(sizes: list[tuple[str, int]], shard_bytes: int) -> list[list[str]]:
    """Names grouped in order into shards of at most ``shard_bytes`` (a bigger tensor alone)."""
    shards: list[list[str]] = [[]]
    filled = 0
    for name, size in sizes:
        if shards[-1] and filled + size > shard_bytes:
            shards.append([])
            filled = 0
        shards[-1].append(name)
        filled += size
    return shards


def save_merged(model: Any, folder: Path, *, shard_bytes: int | None = None) -> list[Path]:
    """Write the adapted ``model`` (a peft model) to ``folder`` as a plain transformers
    model with the active adapter folded in, in shards of at most ``shard_bytes`` (default
    ``DEFAULT_SHARD_BYTES``, read at the call); returns the weight files written. Weight files
    of an earlier write that this one does not rewrite are removed, so a reader never mixes
    two layouts."""
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    adapter_name = model.active_adapter
    tensors = {name: (tensor, layer) for name, tensor, layer in _plain_tensors(model)}
    sizes = [(name, t.numel() * t.element_size()) for name, (t, _) in tensors.items()]
    groups = _shards(sizes, shard_bytes or DEFAULT_SHARD_BYTES)
    if len(groups) == 1:
        files = ["model.safetensors"]
    else:
        files = [
            f"model-{i:05d}-of-{len(groups):05d}.safetensors" for i in range(1, len(groups) + 1)
        ]
    for stale in folder.glob("model*.safetensors*"):
        if stale.name not in files:
            stale.unlink()
    written = []
    for file, names in zip(files, groups, strict=True):
        shard = {name: _folded(*tensors[name], adapter_name) for name in names}
        save_file(shard, str(folder / file), metadata={"format": "pt"})
        del shard  # the merged tensors of this shard go before the next is made
        written.append(folder / file)
    if len(groups) > 1:
        weight_map = {
            name: file for file, names in zip(files, groups, strict=True) for name in names
        }
        index = {
            "metadata": {"total_size": sum(size for _, size in sizes)},
            "weight_map": weight_map,
        }
        (folder / INDEX).write_text(json.dumps(index, indent=2))
    base = model.get_base_model()
    base.config.save_pretrained(folder)
    if getattr(base, "generation_config", None) is not None:
        base.generation_config.save_pretrained(folder)
    return written
