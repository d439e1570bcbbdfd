"""The optimizer chosen for the device's memory (issue 44): 8-bit moments where fp32 ones
would crowd a GPU, the same step as fp32 AdamW within quantisation, a quarter of the state,
and a resume that never loads one kind's state into the other."""

from __future__ import annotations

import copy
import logging
import sys
from typing import Any

import pytest
import torch

from sapo_core.config import GRPOConfig
from sapo_core.grpo.optimizer import (
    choose_optimizer,
    load_state,
    make_optimizer,
    moment_bytes,
    optimizer_kind,
)

GIB = 2**30
QWEN_1_5B = 1_543_714_304  # Qwen2.5-1.5B's parameters (tied embeddings)
QWEN_0_5B = 494_032_768


@pytest.mark.parametrize(
    ("params", "device", "card_gib", "expected"),
    [
        (QWEN_1_5B, "cuda", 24, "adamw_8bit"),  # 23 GiB of fp32 state on a 24 GB card
        (QWEN_1_5B, "cuda", 40, "adamw_8bit"),  # still more than half of it
        (QWEN_1_5B, "cuda", 48, "adamw"),  # 23 of 48 GiB: room for activations
        (QWEN_1_5B, "cuda", 80, "adamw"),  # an H100 holds it with room for activations
        (QWEN_0_5B, "cuda", 24, "adamw"),  # 7.4 GiB
        (QWEN_0_5B, "cuda", 8, "adamw_8bit"),
        (QWEN_1_5B, "cpu", 0, "adamw"),  # a CPU keeps fp32 moments
    ],
)
def test_auto_takes_8_bit_moments_only_where_fp32_ones_crowd_the_gpu(
    params: int, device: str, card_gib: int, expected: str
) -> None:
    kind = choose_optimizer(
        GRPOConfig(), device=device, trainable_params=params, device_total_bytes=card_gib * GIB
    )
    assert kind == expected


def test_a_set_optimizer_wins_over_auto() -> None:
    for kind in ("adamw", "adamw_8bit"):
        config = GRPOConfig(optimizer=kind)
        assert (
            choose_optimizer(
                config, device="cuda", trainable_params=QWEN_1_5B, device_total_bytes=24 * GIB
            )
            == kind
        )
        assert (
            choose_optimizer(config, device="cpu", trainable_params=10, device_total_bytes=0)
            == kind
        )


def _model(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.Tanh(), torch.nn.Linear(256, 64))


def _steps(model: torch.nn.Module, optimizer: Any, steps: int, seed: int = 1) -> None:
    generator = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        x = torch.randn(32, 64, generator=generator)
        model(x).pow(2).mean().backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)


def _state_bytes(optimizer: Any) -> int:
    return sum(
        v.numel() * v.element_size()
        for state in optimizer.state.values()
        for v in state.values()
        if isinstance(v, torch.Tensor)
    )


def test_8_bit_moments_take_the_step_fp32_ones_take_in_a_quarter_of_the_state() -> None:
    start = _model()
    fp32, eight = _model(), _model()
    plain = make_optimizer(fp32, GRPOConfig(optimizer="adamw", learning_rate=1e-3))
    small = make_optimizer(eight, GRPOConfig(optimizer="adamw_8bit", learning_rate=1e-3))
    assert (optimizer_kind(plain), optimizer_kind(small)) == ("adamw", "adamw_8bit")
    _steps(fp32, plain, 5)
    _steps(eight, small, 5)
    for p0, a, b in zip(start.parameters(), fp32.parameters(), eight.parameters(), strict=True):
        moved = (a - p0).abs().mean()
        assert moved > 1e-3  # both trained: five steps of about lr each
        assert (b - a).abs().mean() < 0.1 * moved  # and took nearly the same steps
    params = sum(p.numel() for p in fp32.parameters())
    assert _state_bytes(plain) >= 8 * params
    # 2 bytes a parameter plus a float per block and the quantisation maps: about a quarter
    assert _state_bytes(small) < 0.3 * _state_bytes(plain)


def test_moment_bytes_count_what_the_first_step_will_allocate() -> None:
    model = _model()
    params = sum(p.numel() for p in model.parameters())
    for kind, per_param in (("adamw", 8), ("adamw_8bit", 2)):
        optimizer = make_optimizer(model, GRPOConfig(optimizer=kind))
        assert moment_bytes(optimizer, params, 4 * params) == per_param * params
        _steps(model, optimizer, 1)
        assert moment_bytes(optimizer, params, 4 * params) == 0  # allocated already


def test_a_resume_continues_8_bit_moments_exactly() -> None:
    config = GRPOConfig(optimizer="adamw_8bit", learning_rate=1e-3)
    straight = _model()
    optimizer = make_optimizer(straight, config)
    _steps(straight, optimizer, 2)
    saved_weights = {k: v.clone() for k, v in straight.state_dict().items()}
    saved_state = copy.deepcopy(optimizer.state_dict())  # as a checkpoint saves it
    _steps(straight, optimizer, 2, seed=2)

    resumed = _model()
    resumed.load_state_dict(saved_weights)
    again = make_optimizer(resumed, config)
    assert load_state(again, saved_state)
    _steps(resumed, again, 2, seed=2)
    for a, b in zip(straight.parameters(), resumed.parameters(), strict=True):
        assert torch.equal(a, b)


def test_one_kinds_state_never_loads_into_the_other(caplog: pytest.LogCaptureFixture) -> None:
    model = _model()
    eight = make_optimizer(model, GRPOConfig(optimizer="adamw_8bit"))
    _steps(model, eight, 1)
    plain = make_optimizer(model, GRPOConfig(optimizer="adamw"))
    with caplog.at_level(logging.WARNING):
        assert not load_state(plain, eight.state_dict())
    assert "moments start afresh" in caplog.text
    assert not plain.state  # nothing of the other kind's state was loaded
    assert load_state(plain, make_optimizer(model, GRPOConfig(optimizer="adamw")).state_dict())


def test_without_bitsandbytes_8_bit_fails_in_one_line_naming_the_extra(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "bitsandbytes", None)  # import raises ImportError
    with pytest.raises(
        RuntimeError, match=r"pip install 'bitsandbytes>=0.50' \(sapo's gpu extra\)"
    ) as err:
        make_optimizer(_model(), GRPOConfig(optimizer="adamw_8bit"))
    assert "\n" not in str(err.value)


@pytest.mark.parametrize(
    ("module", "name", "says"),
    [
        ("sapo_core.grpo.update", "make_optimizer", "moved to sapo_core.grpo.optimizer"),
        ("sapo_core.policy.loading", "resolve", r"use resolve_model\(model\).weights\(\)"),
        ("sapo_core.grpo.logprobs", "shared_prompt_logprobs", "moved to sapo_core.grpo.shared"),
        ("sapo_core.grpo.logprobs", "supports_shared_prompt", "moved to sapo_core.grpo.shared"),
    ],
)
def test_a_removed_name_fails_in_one_line_naming_its_replacement(
    module: str, name: str, says: str
) -> None:
    """Issue 59 removed a re-export and an unused helper; the old imports say where to go."""
    import importlib

    with pytest.raises(ImportError, match=says) as caught:
        exec(f"from {module} import {name}", {})
    assert "\n" not in str(caught.value)
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        importlib.import_module(module).nope  # noqa: B018
