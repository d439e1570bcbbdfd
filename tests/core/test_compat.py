"""The transformers names that moved within 5.x (sapo_core/policy/compat.py).

CI also runs the update and generation tests against the floor pyproject.toml declares
(`.ci/run`: transformers 5.17 beside the environment's); here, the shims themselves.
"""

from __future__ import annotations

import types
from typing import Any

import transformers

from sapo_core.policy.compat import (
    cache_argument,
    is_checkpointing,
    output_cache,
    release,
    set_checkpointing,
)


def test_the_cache_keyword_follows_the_installed_release() -> None:
    renamed = release(transformers.__version__) >= (5, 24)
    assert cache_argument() == ("cache" if renamed else "past_key_values")


def test_release_reads_candidates_and_builds() -> None:
    assert release("5.24rc1") == (5, 24) and release("5.25.0.dev0") == (5, 25)
    assert release("5.17.0") == (5, 17)


def test_a_forwards_cache_is_read_by_either_name() -> None:
    new, old = object(), object()
    assert output_cache(types.SimpleNamespace(cache=new, past_key_values=None)) is new
    assert output_cache(types.SimpleNamespace(past_key_values=old)) is old


def test_checkpointing_is_switched_by_the_names_the_model_has(tiny_model_dir: Any) -> None:
    from sapo_core.policy.loading import load_policy

    model = load_policy(str(tiny_model_dir)).model
    model.train()
    for wanted in (True, False, True, False):
        set_checkpointing(model, wanted)
        assert is_checkpointing(model) is wanted
