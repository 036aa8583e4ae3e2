"""Graded: group_advantages (losses.py). Literal rewards, expected values worked out by hand."""
import math

import pytest
import torch

from losses import group_advantages

pytestmark = pytest.mark.part("group_advantages")
F64 = dict(dtype=torch.float64)


def test_groups_are_consecutive_rows_and_use_the_sample_std():
    # Rows are [g0 g0 g0 g1 g1 g1]. g0 = [1, 2, 3]: mean 2, sample std 1;
    # g1 = [10, 20, 30]: mean 20, sample std 10. A = (r - mean) / (std + 1e-4).
    adv = group_advantages(torch.tensor([1.0, 2.0, 3.0, 10.0, 20.0, 30.0], **F64), group_size=3)
    assert adv.shape == (6,)
    assert adv.tolist() == pytest.approx([-1 / 1.0001, 0.0, 1 / 1.0001, -10 / 10.0001, 0.0, 10 / 10.0001],
                                         abs=1e-12)


def test_two_completions_sample_std_not_population_std():
    # [1, 0]: mean 0.5, sample std sqrt(0.5) = 0.70711 (the population std would be 0.5).
    adv = group_advantages(torch.tensor([1.0, 0.0], **F64), group_size=2)
    assert adv.tolist() == pytest.approx([0.5 / (math.sqrt(0.5) + 1e-4), -0.5 / (math.sqrt(0.5) + 1e-4)],
                                         abs=1e-12)


def test_the_same_rewards_in_another_order_give_the_same_advantages_per_completion():
    adv = group_advantages(torch.tensor([0.0, 1.0, 0.0, 0.0], **F64), group_size=4)
    # mean 0.25, sample std sqrt((3 * 0.0625 + 0.5625) / 3) = 0.5
    assert adv.tolist() == pytest.approx([-0.25 / 0.5001, 0.75 / 0.5001, -0.25 / 0.5001, -0.25 / 0.5001],
                                         abs=1e-12)


def test_a_group_with_equal_rewards_gets_exactly_zero():
    rewards = torch.tensor([0.1, 0.1, 0.1, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0], dtype=torch.float32)
    adv = group_advantages(rewards, group_size=3)
    assert torch.isfinite(adv).all()
    assert adv[:3].tolist() == [0.0, 0.0, 0.0]      # 0.1 * 3 / 3 != 0.1 in float32: still exactly 0
    assert adv[6:].tolist() == [0.0, 0.0, 0.0]      # 0 / 0 would be NaN
    assert adv[3].item() == pytest.approx(2 / 3 / (math.sqrt(1 / 3) + 1e-4), rel=1e-5)
    assert adv[4].item() == adv[5].item() == pytest.approx(-1 / 3 / (math.sqrt(1 / 3) + 1e-4), rel=1e-5)


def test_dr_grpo_does_not_divide_by_the_std():
    adv = group_advantages(torch.tensor([1.0, 0.0, 0.0, 0.0, 2.0, 4.0, 6.0, 8.0], **F64), group_size=4,
                           scale_std=False)
    assert adv.tolist() == pytest.approx([0.75, -0.25, -0.25, -0.25, -3.0, -1.0, 1.0, 3.0], abs=1e-12)


def test_bad_shapes_and_group_sizes_are_refused():
    assert group_advantages(torch.tensor([1.0, 0.0, 1.0, 1.0]), group_size=2).tolist() == \
        pytest.approx([0.5 / (math.sqrt(0.5) + 1e-4), -0.5 / (math.sqrt(0.5) + 1e-4), 0.0, 0.0], rel=1e-5)
    with pytest.raises(ValueError, match="multiple"):
        group_advantages(torch.zeros(7), group_size=3)
    with pytest.raises(ValueError, match="multiple"):
        group_advantages(torch.zeros(2, 3), group_size=3)
    with pytest.raises(ValueError, match=">= 2"):
        group_advantages(torch.zeros(4), group_size=1)
