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


@pytest.fixture(scope="session")
def tiny_family_policy(tmp_path_factory: pytest.TempPathFactory, tiny_policy):  # type: ignore[no-untyped-def]
    """A tiny policy of a model family, built once per family and session."""
    from sapo_core.policy.loading import load_policy

    built = {"llama": tiny_policy}

    def policy(family: Family):  # type: ignore[no-untyped-def]
        if family not in built:
            folder = tmp_path_factory.mktemp(family)
            built[family] = load_policy(str(build_tiny_model(folder, family=family)))
        return built[family]

    return policy
