"""An adapted policy written as plain weights, shard by shard, without a second model.

A consumer that knows nothing of peft (vLLM reloading the policy, a user's
``from_pretrained``) needs the LoRA folded into the weights: W + scale * B @ A per adapted
projection. peft's ``merge_and_unload`` folds in place, so keeping the adapter training
meant merging a deep copy of the whole model: for a moment twice the model's memory, on
the accelerator where it lives, which is where memory runs out first. Here each merged
tensor is made only while its shard is written (one shard at a time: about ``shard_bytes``
beside the model, plus one projection's B @ A while it is folded, and on a GPU a host copy
of the shard as safetensors writes it), every other tensor is written from the model's own
storage, and the model is never modified: the frozen base stays the base exactly.

For models transformers saves under the names it loaded them by (Llama, Qwen2, Gemma 3's
text model among them), the folder is what ``save_pretrained`` writes: ``config.json`` (and
the generation config where the model has one), ``model.safetensors`` or numbered shards with
``model.safetensors.index.json``, the tensors under the plain model's names, a tied tensor
written once under its first name. A model whose tensors transformers renames or regroups
on save (``converts_on_save``) is merged in a copy and saved by transformers, as before.
"""

from __future__ import annotations

import copy
import json
import logging
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

log = logging.getLogger(__name__)

DEFAULT_SHARD_BYTES = 256 << 20  # the most a write holds beside the model
INDEX = "model.safetensors.index.json"
BASE_LAYER = ".base_layer."
PEFT_WRAPPERS = (".modules_to_save.", ".original_module.", ".token_adapter.")
"""Parts of the names of peft's other wrappers (whole trained copies of modules, trainable
token rows): written as they are, they would land under names no loader knows."""


def _lora_layers(base: Any, adapter_name: str) -> dict[str, Any]:
    """Module name -> the peft LoRA layer wrapping it (a linear or an embedding), for layers
    the adapter acts on; an adapter kind this merge does not fold (DoRA, LoRA biases) is an
    error, not a silent drop of what it learned."""
    from peft.tuners.lora import LoraLayer

    layers = {}
    for name, module in base.named_modules():
        if not isinstance(module, LoraLayer):
            continue
        held = adapter_name in module.lora_A or adapter_name in module.lora_embedding_A
        if not held:
            continue
        if adapter_name in getattr(module, "lora_variant", {}) or module.lora_bias.get(
            adapter_name
        ):
            raise ValueError(f"{name}: only plain LoRA is folded into the weights here")
        if module.merged:  # peft's merge_adapter: the weights hold the delta already
            raise ValueError(f"{name}: the adapter is merged into the weights; unmerge first")
        layers[name] = module
    return layers


def _adapter_of(lora_key: str) -> str:
    """The adapter a LoRA tensor belongs to: ``q_proj.lora_A.<adapter>.weight``,
    ``embed_tokens.lora_embedding_A.<adapter>``."""
    parts = lora_key.split(".lora_", 1)[1].split(".")
    return parts[1] if len(parts) > 1 else ""


def _storage(tensor: torch.Tensor) -> tuple[int, torch.dtype, tuple[int, ...], tuple[int, ...]]:
    return tensor.data_ptr(), tensor.dtype, tuple(tensor.shape), tuple(tensor.stride())


def _plain_tensors(model: Any) -> Iterator[tuple[str, torch.Tensor, Any | None]]:
    """(plain name, the model's tensor, the LoRA layer to fold into it or None), in the
    model's order, adapter matrices left out and tied tensors given once."""
    adapter_name = _active_adapter(model)
    base = model.get_base_model()
    layers = _lora_layers(base, adapter_name)
    state = base.state_dict()
    shared = Counter(_storage(t) for k, t in state.items() if ".lora_" not in k)
    seen: set[tuple[int, torch.dtype, tuple[int, ...], tuple[int, ...]]] = set()
    folded: set[str] = set()
    for key, tensor in state.items():
        if ".lora_" in key:
            if _adapter_of(key) == adapter_name and key.split(".lora_", 1)[0] not in layers:
                raise ValueError(f"{key}: an adapter weight this fold does not handle")
            continue  # the active adapter's is folded below; an inactive one's is not used
        if any(part in key for part in PEFT_WRAPPERS):
            raise ValueError(f"{key}: a peft wrapper other than LoRA is not folded here")
        if tensor.device.type == "meta":
            raise ValueError(f"{key} is offloaded (meta device): nothing to write from")
        name, layer = key, None
        if BASE_LAYER in key:
            module, param = key.split(BASE_LAYER, 1)
            name = f"{module}.{param}"
            layer = layers.get(module) if param == "weight" else None
        same = _storage(tensor)
        if layer is not None:
            folded.add(key.split(BASE_LAYER, 1)[0])
            if shared[same] > 1:
                # A tied tensor (the output head sharing the embeddings) is written once, as
                # save_pretrained does, and a loader ties the other name to it again. An
                # adapter on either name would then act on both: an embedding adapter, which
                # peft applies to the lookup only, would change the head too.
                raise ValueError(f"{key}: an adapter on a tied weight is not folded here")
        if same in seen:
            continue
        seen.add(same)
        yield name, tensor, layer
    unfolded = sorted(set(layers) - folded)
    if unfolded:  # e.g. peft's adapters on parameters other than a module's weight
        raise ValueError(f"{unfolded[0]}: an adapter this fold does not handle")


def _active_adapter(model: Any) -> str:
    name = model.active_adapter
    if not isinstance(name, str):
        raise ValueError(f"one active adapter is folded, not several: {name}")
    return name


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


def converts_on_save(base: Any) -> bool:
    """Whether transformers renames or regroups this model's tensors when it saves them
    (``save_pretrained``'s original format: multimodal wrappers, fused experts): a folder
    written tensor by tensor under the loaded names would not be what a loader expects."""
    attached = getattr(base, "_weight_conversions", None)
    if attached is not None:  # what from_pretrained applied, reverted on save
        return bool(attached)
    from transformers.conversion_mapping import get_model_conversion_mapping
    from transformers.core_model_loading import PrefixChange

    mapping = get_model_conversion_mapping(base, add_legacy=False)
    return any(not isinstance(entry, PrefixChange) for entry in mapping)


def save_merged(model: Any, folder: Path, *, shard_bytes: int | None = None) -> list[Path]:
    """Write the adapted ``model`` (a peft model) to ``folder`` as a plain transformers
    model with the active adapter folded in, in shards of at most ``shard_bytes`` (default
    ``DEFAULT_SHARD_BYTES``, read at the call); returns the weight files written. Weight files
    of an earlier write that this one does not rewrite are removed, so a reader never mixes
    two layouts. A model whose saved names differ from its loaded ones is merged in a copy
    and saved by transformers instead: correct, at the copy's memory."""
    folder.mkdir(parents=True, exist_ok=True)
    base = model.get_base_model()
    if converts_on_save(base):
        log.warning("%s renames its tensors on save: merging a copy", type(base).__name__)
        _remove_weights(folder, keep=[])
        copy.deepcopy(model).merge_and_unload().save_pretrained(folder, safe_serialization=True)
        return sorted(folder.glob("*.safetensors"))
    return _save_folded(model, base, folder, shard_bytes or DEFAULT_SHARD_BYTES)


def _remove_weights(folder: Path, keep: list[str]) -> None:
    for stale in folder.glob("model*.safetensors*"):
        if stale.name not in keep:
            stale.unlink()


def _save_folded(model: Any, base: Any, folder: Path, shard_bytes: int) -> list[Path]:
    from safetensors.torch import save_file

    adapter_name = _active_adapter(model)
    tensors = {name: (tensor, layer) for name, tensor, layer in _plain_tensors(model)}
    sizes = [(name, t.numel() * t.element_size()) for name, (t, _) in tensors.items()]
    groups = _shards(sizes, shard_bytes)
    if len(groups) == 1:
        files = ["model.safetensors"]
    else:
        count = len(groups)
        files = [f"model-{i:05d}-of-{count:05d}.safetensors" for i in range(1, count + 1)]
    _remove_weights(folder, keep=files)
    written = []
    for file, names in zip(files, groups, strict=True):
        shard = {name: _folded(*tensors[name], adapter_name) for name in names}
        save_file(shard, str(folder / file), metadata={"format": "pt"})
        del shard  # the merged tensors of this shard go before the next is made
        written.append(folder / file)
    if len(groups) > 1:
        weight_map = {n: file for file, names in zip(files, groups, strict=True) for n in names}
        total = sum(size for _, size in sizes)
        index = {"metadata": {"total_size": total}, "weight_map": weight_map}
        (folder / INDEX).write_text(json.dumps(index, indent=2))
    # As save_pretrained: the config names the class and the dtype the tensors are in.
    config = copy.deepcopy(base.config)
    config.dtype = str(base.dtype).removeprefix("torch.")
    config.architectures = [type(base).__name__]
    config.save_pretrained(folder)
    if getattr(base, "generation_config", None) is not None:
        base.generation_config.save_pretrained(folder)
    return written
