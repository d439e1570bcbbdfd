"""A configured model's name is resolved once, into one object the node carries (issue 45):
its id, its bundled entry (prompt format, files), where its weights and tokenizer load from."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from sapo_core.config import GenerationConfig, NodeConfig, TaskConfig
from sapo_core.learner import Learner
from sapo_core.policy import loading
from sapo_core.policy.loading import ModelSource, resolve_model


def test_a_path_and_a_bundled_name_resolve_to_what_they_load_from(tiny_model_dir: Path) -> None:
    path = resolve_model(str(tiny_model_dir))
    assert path == ModelSource(str(tiny_model_dir))
    assert path.weights() == path.tokenizer() == str(tiny_model_dir)
    assert path.prompt_format is None  # decided from the tokenizer's template
    bundled = resolve_model("bundled:gemma3-270m")  # nothing fetched or converted yet
    assert bundled.id == "bundled:gemma3-270m" and bundled.entry is not None
    assert bundled.prompt_format == "plain"
    assert resolve_model(bundled) is bundled


def test_a_nodes_start_resolves_its_model_once(
    tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    looked_up: list[str] = []
    real = loading.lookup

    def counted(name: str) -> Any:
        looked_up.append(name)
        return real(name)

    monkeypatch.setattr(loading, "lookup", counted)
    config = NodeConfig(
        model=str(tiny_model_dir),
        tasks=TaskConfig.model_validate({"specs": [{"name": "chain_sum"}]}),
        generation=GenerationConfig(completions_per_question=2, max_new_tokens=4),
        local_groups=1,
    )
    learner = Learner(config)
    assert looked_up == [str(tiny_model_dir)]  # weights, tokenizer and format: one lookup
    assert learner.model_source.id == learner.policy.model_id == str(tiny_model_dir)
