"""Fixtures of the core tests: tiny random models with the bundled tokenizer, built offline."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.tiny_models import Family, build_tiny_model


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("tiny-model"))


@pytest.fixture(scope="session")
def tiny_policy(tiny_model_dir: Path):  # type: ignore[no-untyped-def]
    from sapo_core.policy.loading import load_policy

    return load_policy(str(tiny_model_dir))


def _tiny_family(tmp_path_factory: pytest.TempPathFactory, family: Family):  # type: ignore[no-untyped-def]
    from sapo_core.policy.loading import load_policy

    return load_policy(str(build_tiny_model(tmp_path_factory.mktemp(family), family=family)))


@pytest.fixture(scope="session")
def tiny_qwen2_policy(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    return _tiny_family(tmp_path_factory, "qwen2")


@pytest.fixture(scope="session")
def tiny_qwen3_policy(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    return _tiny_family(tmp_path_factory, "qwen3")


@pytest.fixture(scope="session")
def tiny_mistral_policy(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    return _tiny_family(tmp_path_factory, "mistral")


@pytest.fixture(scope="session")
def tiny_smollm3_policy(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    return _tiny_family(tmp_path_factory, "smollm3")
