"""The base of every config model, and the defaults several of them name."""

from __future__ import annotations

from pathlib import Path
from typing import Self

import yaml
from pydantic import BaseModel, ConfigDict

from sapo_core.config.bundled import DEFAULT, PREFIX

# The paper's nine reasoning-gym specialties, drawn uniformly with replacement.
PAPER_SPECIALTIES = (
    "base_conversion",
    "basic_arithmetic",
    "arc_1d",
    "bf",
    "propositional_logic",
    "fraction_simplification",
    "decimal_arithmetic",
    "calendar_arithmetic",
    "binary_matrix",
)

BUNDLED_MODEL = f"{PREFIX}{DEFAULT.name}"
"""The model a node trains unless told: the bundled catalogue's default (config/bundled.py)."""

# The system prompt reasoning-gym ships as its default, so scores are comparable with its tools.
DEFAULT_SYSTEM_PROMPT = (
    "Given a problem, your task is to answer the question by thinking step-by-step in a clear "
    "and specific manner.\nOnce you have thought about the reasoning process, provide the "
    "answer in the following format:\n<answer>answer here</answer>\nDo not explain your "
    "reasoning inside the answer tags, provide only the final answer. When an example is "
    "provided, you should strictly follow the format of the output/answer in that example."
)


class Strict(BaseModel):
    """Base of every config model: unknown keys are an error, never silently ignored."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    @classmethod
    def from_yaml(cls, path: str | Path) -> Self:
        """Load from a YAML file; unknown keys and out-of-bounds values raise."""
        data = yaml.safe_load(Path(path).read_text()) or {}
        return cls.model_validate(data)
