"""Graded: tepo_sequence_ratio and tepo_kl_mask (losses.py). Literal inputs, values by hand."""
import pytest
import torch

from losses import tepo_kl_mask, tepo_sequence_ratio

pytestmark = pytest.mark.part("tepo")
F64 = dict(dtype=torch.float64)
S0 = (1.5 * 1.0 * 0.5) ** (1 / 3)       # 0.90856: geometric mean of row 0's token ratios
S1 = (1.25 * 0.9) ** (1 / 2)            # 1.06066: row 1 (its pad does not count)


def example(pad_log_ratio=0.3):
    # token ratios row0 = [1.5, 1.0, 0.5], row1 = [1.25, 0.9, (pad)]
    logp = torch.tensor([[0.5, 0.25, 0.8], [0.1, 0.6, 0.3]], **F64).log().requires_grad_()
    log_ratio = torch.tensor([[1.5, 1.0, 0.5], [1.25, 0.9, 1.0]], **F64).log()
    log_ratio[1, 2] = pad_log_ratio
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]], **F64)
    return logp, logp.detach() - log_ratio, mask


def test_sequence_ratio_value_is_the_geometric_mean_of_the_row():
    logp, old, mask = example()
    s = tepo_sequence_ratio(logp, old, mask)
    assert s.shape == (2, 3)
    assert s[0].tolist() == pytest.approx([S0, S0, S0], abs=1e-12)
    assert s[1, :2].tolist() == pytest.approx([S1, S1], abs=1e-12)


def test_each_token_gets_the_gradient_of_its_sequence_ratio():
    logp, old, mask = example()
    upstream = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]], **F64)
    (tepo_sequence_ratio(logp, old, mask) * upstream * mask).sum().backward()
    # d s_i,t / d logp_t = s_i, and nothing to the row's other tokens
    assert logp.grad.tolist() == [pytest.approx([S0, 2 * S0, 3 * S0], abs=1e-12),
                                  pytest.approx([4 * S1, 5 * S1, 0.0], abs=1e-12)]


def test_garbage_on_padding_changes_nothing():
    logp, old, mask = example(pad_log_ratio=1000.0)              # exp(1000) = inf if the pad counted
    s = tepo_sequence_ratio(logp, old, mask)
    assert s[1, :2].tolist() == pytest.approx([S1, S1], abs=1e-12)
    (s * mask).sum().backward()
    assert torch.isfinite(logp.grad).all()


def test_a_row_without_valid_tokens_has_ratio_one():
    logp, old, _ = example()
    s = tepo_sequence_ratio(logp, old, torch.tensor([[1.0, 1.0, 1.0], [0.0, 0.0, 0.0]], **F64))
    assert s[1].tolist() == [1.0, 1.0, 1.0]
    assert s[0].tolist() == pytest.approx([S0, S0, S0], abs=1e-12)


def test_kl_mask_by_hand():
    logp = torch.tensor([[0.5, 0.25, 0.8], [0.1, 0.6, 0.3]], **F64).log()
    entropy = torch.tensor([[0.5, 2.0, 0.1], [3.0, 3.0, 3.0]], **F64)
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]], **F64)
    # row 0 (A > 0): log p + H = [ln .5 + .5, ln .25 + 2, ln .8 + .1] = [-0.19, +0.61, -0.12]
    # row 1 (A < 0): no token is masked in, whatever log p + H
    m = tepo_kl_mask(logp, entropy, torch.tensor([1.0, -0.5], **F64), mask)
    assert m.dtype == torch.float64 and m.tolist() == [[0.0, 1.0, 0.0], [0.0, 0.0, 0.0]]
    # with A > 0 in both rows: row 1 has log p + H = [0.70, 2.49, (pad)] -> [1, 1, 0]
    m = tepo_kl_mask(logp, entropy, torch.tensor([1.0, 0.5], **F64), mask)
    assert m.tolist() == [[0.0, 1.0, 0.0], [1.0, 1.0, 0.0]]


def test_kl_mask_is_strict_and_carries_no_gradient():
    logp = torch.tensor([[-1.0, -1.0, -2.0]], **F64, requires_grad=True)
    entropy = torch.tensor([[1.0, 1.5, 1.0]], **F64)
    mask = torch.ones(1, 3, **F64)
    m = tepo_kl_mask(logp, entropy, torch.tensor([1.0], **F64), mask)
    assert m.tolist() == [[0.0, 1.0, 0.0]]                      # log p + H = 0 is not > 0
    assert not m.requires_grad
    # A = 0: no token is masked
    assert tepo_kl_mask(logp, entropy, torch.tensor([0.0], **F64), mask).tolist() == [[0.0, 0.0, 0.0]]
