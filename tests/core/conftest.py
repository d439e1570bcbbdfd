"""Fixtures of the core tests: tiny random models with the bundled tokenizer, built offline."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.tiny_models import build_tiny_model


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("tiny-model"))


@pytest.fixture(scope="session")
def tiny_policy(tiny_model_dir: Path):  # type: ignore[no-untyped-def]
    from sapo_core.policy.loading import load_policy

    return load_policy(str(tiny_model_dir))


@pytest.fixture(scope="session")
def tiny_qwen2_policy(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    from sapo_core.policy.loading import load_policy

    return load_policy(str(build_tiny_model(tmp_path_factory.mktemp("tiny-qwen2"), family="qwen2")))
