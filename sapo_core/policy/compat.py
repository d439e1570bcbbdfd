"""The transformers APIs sapo calls whose names moved between the 5.x releases it supports.

transformers 5.24 renamed a causal LM's ``past_key_values`` argument and output to ``cache``
(5.23 and earlier: ``past_key_values``; 5.24 puts an unknown ``past_key_values`` into its
kwargs and decodes without a cache), and 5.2x named activation checkpointing
``activation_checkpointing_*`` where 5.17 has ``gradient_checkpointing_*``. sapo runs on both
(pyproject.toml's floor, tests/core/test_compat.py); everything else it calls is the same.
"""

from __future__ import annotations

import functools
import re
from typing import Any


@functools.cache
def cache_argument() -> str:
    """The keyword a causal LM's forward takes its KV cache by."""
    import transformers

    return "cache" if release(transformers.__version__) >= (5, 24) else "past_key_values"


def release(version: str) -> tuple[int, int]:
    """(major, minor) of a version string, whatever follows them ("5.24rc1", "5.25.0.dev0")."""
    found = re.match(r"(\d+)\.(\d+)", version)
    if found is None:
        raise ValueError(f"not a version: {version!r}")
    return int(found.group(1)), int(found.group(2))


def output_cache(out: Any) -> Any:
    """The KV cache a forward returned, by either name."""
    cache = getattr(out, "cache", None)
    return cache if cache is not None else out.past_key_values


def is_checkpointing(model: Any) -> bool:
    """Whether the model recomputes its layers' activations in the backward."""
    flag = getattr(type(model), "is_activation_checkpointing", None)
    return bool(
        model.is_activation_checkpointing if flag is not None else model.is_gradient_checkpointing
    )


def set_checkpointing(model: Any, wanted: bool) -> None:
    """Turn activation checkpointing on (non-reentrant) or off; a model without it is left."""
    enable = getattr(model, "activation_checkpointing_enable", None) or getattr(
        model, "gradient_checkpointing_enable", None
    )
    if enable is None:
        return
    if wanted and not is_checkpointing(model):
        enable({"use_reentrant": False})
    elif not wanted and is_checkpointing(model):
        disable = getattr(model, "activation_checkpointing_disable", None)
        (disable or model.gradient_checkpointing_disable)()
