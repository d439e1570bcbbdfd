"""Group-relative advantages by explicit group id, against hand-computed numbers."""

from __future__ import annotations

import math

import pytest
import torch

from sapo_core.grpo.advantages import dense_group_ids, group_advantages


def test_dense_group_ids_number_in_first_seen_order() -> None:
    assert dense_group_ids(["b", "a", "b", "c", "a"]).tolist() == [0, 1, 0, 2, 1]


def test_group_scaling_by_hand() -> None:
    # group 0: rewards 1, 0, 0, 1 -> mean 0.5, unbiased std sqrt(1/3)
    # group 1: rewards 1, 0 -> mean 0.5, unbiased std sqrt(0.5)
    rewards = torch.tensor([1.0, 0.0, 1.0, 0.0, 0.0, 1.0])
    groups = torch.tensor([0, 0, 1, 1, 0, 0])
    adv = group_advantages(rewards, groups, "group", eps=0.0)
    s0, s1 = math.sqrt(1 / 3), math.sqrt(0.5)
    expected = [0.5 / s0, -0.5 / s0, 0.5 / s1, -0.5 / s1, -0.5 / s0, 0.5 / s0]
    assert adv.tolist() == pytest.approx(expected, rel=1e-6)


def test_all_equal_group_has_zero_advantage() -> None:
    adv = group_advantages(torch.tensor([1.0, 1.0, 1.0, 0.2, 0.8]), torch.tensor([0, 0, 0, 1, 1]))
    assert adv[:3].tolist() == [0.0, 0.0, 0.0]
    assert adv[3] < 0 < adv[4]


def test_partial_group_of_one_gets_zero_not_nan() -> None:
    adv = group_advantages(torch.tensor([1.0, 0.0, 1.0]), torch.tensor([0, 0, 1]))
    assert adv[2].item() == 0.0
    assert not torch.isnan(adv).any()


def test_partial_groups_use_their_own_size() -> None:
    # a group that lost rows keeps a correct mean: 3 rows of group 0, 5 of group 1
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0, 0.0])
    groups = torch.tensor([0, 0, 0, 1, 1, 1, 1, 1])
    adv = group_advantages(rewards, groups, "none")
    assert adv[:3].tolist() == pytest.approx([2 / 3, -1 / 3, -1 / 3])
    assert adv[3:].tolist() == pytest.approx([0.2, 0.2, 0.2, 0.2, -0.8])


def test_batch_scaling_divides_by_the_batch_std() -> None:
    rewards = torch.tensor([1.0, 0.0, 0.5, 0.5])
    groups = torch.tensor([0, 0, 1, 1])
    adv = group_advantages(rewards, groups, "batch", eps=0.0)
    std = rewards.std().item()
    assert adv.tolist() == pytest.approx([0.5 / std, -0.5 / std, 0.0, 0.0])


def test_no_scaling_is_centred_rewards() -> None:
    adv = group_advantages(torch.tensor([0.25, 0.75]), torch.tensor([7, 7]), "none")
    assert adv.tolist() == pytest.approx([-0.25, 0.25])
