"""The optimizer: which Adam, chosen for the device's memory, and its state across a resume.

Full fine-tuning with fp32 weights and torch's AdamW holds 16 bytes a trained parameter
before any activation: the weights, their gradients and Adam's two moments, 4 bytes each.
A 1.5B model needs 23 GiB of it, more than a 24 GB card leaves (issue 44). Of the ways to
cut it, 8-bit block-wise moments (bitsandbytes' AdamW8bit, Dettmers et al. 2022) take 2
bytes a parameter where fp32 took 8, leaving the weights and gradients in fp32, so every
update is applied at full precision: 16 bytes become 10, and a 1.5B model's 23 GiB become
14.4. bf16 weights with an fp32 master copy save nothing (2 + 2 + 4 + 8 = 16 bytes), and bf16
weights without one round a 1e-5 step of a 0.02 weight away. 8-bit moments are what TRL's
users pick for the same problem (``optim="adamw_8bit"``). Learning parity with fp32 moments
on the bundled model: benchmarks/README.md.

`auto` keeps fp32 moments unless they would crowd the device: on a GPU where 16 bytes a
trained parameter take more than `GPU_FULL_STATE_SHARE` of its memory (a 1.5B model on a
card of up to 46 GiB, a 0.5B on one of up to 14). A CPU always keeps them: its memory is
the machine's, and its users' models are small.
"""

from __future__ import annotations

import logging
from typing import Any, Literal

import torch

from sapo_core.config import GRPOConfig

OptimizerKind = Literal["adamw", "adamw_8bit"]

FULL_STATE_BYTES = 16
"""Bytes a trained parameter holds under fp32 AdamW: weight, gradient, two moments."""
GPU_FULL_STATE_SHARE = 0.5
"""Past this share of a GPU's memory, fp32 moments leave too little for a useful pass
(activations, the logits of a 152k vocabulary) and for generation's KV cache."""
EIGHT_BIT_MOMENT_BYTES = 2
"""Bytes of AdamW8bit's two moments a parameter (plus a float per 256-value block)."""


def device_bytes(device: torch.device, config: GRPOConfig) -> int:
    """The device memory the update plans for: the config's `device_memory_gib` where set,
    else the whole GPU's (0 on a CPU: nothing to plan)."""
    if device.type != "cuda":
        return 0
    total = int(torch.cuda.mem_get_info(device)[1])
    if config.device_memory_gib is not None:
        return min(total, int(config.device_memory_gib * 2**30))
    return total


def choose_optimizer(
    config: GRPOConfig, *, device: str, trainable_params: int, device_total_bytes: int
) -> OptimizerKind:
    """The config's optimizer, or under `auto` the one that fits: 8-bit moments on a GPU
    whose memory fp32 AdamW's full state would take more than `GPU_FULL_STATE_SHARE` of."""
    if config.optimizer != "auto":
        return config.optimizer
    if device != "cuda":
        return "adamw"
    full_state = FULL_STATE_BYTES * trainable_params
    return "adamw_8bit" if full_state > GPU_FULL_STATE_SHARE * device_total_bytes else "adamw"


def _bitsandbytes() -> Any:
    try:
        # Its import logs that optional CPU kernels are missing: noise for an optimizer.
        quiet = logging.getLogger("bitsandbytes")
        level = quiet.level
        quiet.setLevel(logging.ERROR)
        try:
            import bitsandbytes
        finally:
            quiet.setLevel(level)
    except ImportError as err:
        raise RuntimeError(
            "grpo.optimizer adamw_8bit needs bitsandbytes: pip install 'bitsandbytes>=0.50' "
            "(sapo's gpu extra), or set grpo.optimizer: adamw"
        ) from err
    return bitsandbytes


def make_optimizer(model: Any, config: GRPOConfig) -> torch.optim.Optimizer:
    """Adam (decoupled weight decay) over the trainable parameters, of the kind
    `choose_optimizer` picks for where the model is.

    torch's is the fused kernel: one pass over each parameter and its state, where the
    default loop makes several and a temporary the size of each parameter.
    """
    params = [p for p in model.parameters() if p.requires_grad]
    device = params[0].device if params else torch.device("cpu")
    kind = choose_optimizer(
        config,
        device=device.type,
        trainable_params=sum(p.numel() for p in params),
        device_total_bytes=device_bytes(device, config),
    )
    if kind == "adamw_8bit":
        optimizer: torch.optim.Optimizer = _bitsandbytes().optim.AdamW8bit(
            params, lr=config.learning_rate, weight_decay=config.weight_decay
        )
    else:
        optimizer = torch.optim.AdamW(
            params, lr=config.learning_rate, weight_decay=config.weight_decay, fused=True
        )
    optimizer.sapo_kind = kind  # type: ignore[attr-defined]
    return optimizer


def optimizer_kind(optimizer: Any) -> OptimizerKind:
    """Which kind ``optimizer`` is (what `make_optimizer` chose)."""
    return getattr(optimizer, "sapo_kind", "adamw")


def moment_bytes(optimizer: Any, trainable_params: int, trainable_bytes: int) -> int:
    """What Adam's moments will take at ``optimizer``'s first step (0 once it has taken
    one: they are already allocated)."""
    if optimizer is not None and optimizer.state:
        return 0
    if optimizer_kind(optimizer) == "adamw_8bit":
        return EIGHT_BIT_MOMENT_BYTES * trainable_params
    return 2 * trainable_bytes  # two moments in the parameters' dtype


def state_kind(state: dict[str, Any]) -> OptimizerKind | None:
    """The kind of optimizer a saved state dict came from, by its per-parameter keys (None:
    no step taken, so no moments to tell by)."""
    for per_param in state.get("state", {}).values():
        return "adamw" if "exp_avg" in per_param else "adamw_8bit"  # bitsandbytes: state1/2
    return None


def load_state(optimizer: Any, state: dict[str, Any]) -> bool:
    """Load a saved state into ``optimizer`` when it is of the same kind; False (the moments
    start afresh) when `auto` chose the other kind here, as on a GPU of another size."""
    saved = state_kind(state)
    if saved is not None and saved != optimizer_kind(optimizer):
        logging.getLogger(__name__).warning(
            "the checkpoint's optimizer state is %s and this device's optimizer %s: Adam's "
            "moments start afresh (set grpo.optimizer to keep one kind)",
            saved,
            optimizer_kind(optimizer),
        )
        return False
    optimizer.load_state_dict(state)
    return True
