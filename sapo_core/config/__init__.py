"""Configuration of one node's algorithm: tasks, prompt, reward, generation, GRPO, node.

One validated model per concern, bounds declared on the fields, unknown keys rejected.
This package imports no torch, so tools that only read configs or the ledger stay light.

The models live by concern (base.py: `Strict` and shared defaults; questions.py: tasks,
prompt, reward, evaluation; training.py: generation, compute, adapter, GRPO; node.py:
reputation and `NodeConfig`); import them from here.
"""

from sapo_core.config.base import BUNDLED_MODEL, DEFAULT_SYSTEM_PROMPT, PAPER_SPECIALTIES, Strict
from sapo_core.config.node import NodeConfig, ReputationConfig
from sapo_core.config.questions import (
    EvaluationConfig,
    Example,
    PromptConfig,
    RewardConfig,
    TaskConfig,
    TaskSpec,
)
from sapo_core.config.training import (
    AdapterConfig,
    ComputeConfig,
    GenerationConfig,
    GRPOConfig,
    OffPolicyConfig,
    VLLMConfig,
)

__all__ = [
    "BUNDLED_MODEL",
    "DEFAULT_SYSTEM_PROMPT",
    "PAPER_SPECIALTIES",
    "AdapterConfig",
    "ComputeConfig",
    "EvaluationConfig",
    "Example",
    "GRPOConfig",
    "GenerationConfig",
    "NodeConfig",
    "OffPolicyConfig",
    "PromptConfig",
    "ReputationConfig",
    "RewardConfig",
    "Strict",
    "TaskConfig",
    "TaskSpec",
    "VLLMConfig",
]
