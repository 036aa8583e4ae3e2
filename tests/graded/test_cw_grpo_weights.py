"""Graded: cw_grpo_weights (losses.py). Literal log-probs and advantages, literal weights."""
import pytest
import torch

from losses import cw_grpo_weights

pytestmark = pytest.mark.part("cw_grpo_weights")
F64 = dict(dtype=torch.float64)


def example():
    # 2 completions of 3 positions; row 1 has 2 valid tokens and a pad.
    p = torch.tensor([[0.5, 0.25, 0.8], [0.1, 0.6, 0.3]], **F64)
    return p.log(), torch.tensor([1.0, -0.5], **F64), torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]], **F64)


def valid(w, mask):
    return [[round(v, 9) for v, m in zip(row, mrow) if m] for row, mrow in zip(w.tolist(), mask.tolist())]


def test_batch_scope_by_hand():
    logp, adv, mask = example()
    w = cw_grpo_weights(logp, adv, mask)
    assert w.shape == (2, 3)
    assert valid(w, mask) == [pytest.approx([1.3806726824, 1.3628980179, 1.0223232236], abs=1e-9),
                              pytest.approx([0.1828062480, 1.0512998281], abs=1e-9)]


def test_mean_one_over_valid_tokens_and_the_most_extreme_token_weighs_least():
    logp, adv, mask = example()
    w = cw_grpo_weights(logp, adv, mask)
    assert (w * mask).sum().item() == pytest.approx(5.0, abs=1e-12)
    others = [w[0, 0].item(), w[0, 1].item(), w[0, 2].item(), w[1, 1].item()]
    assert w[1, 0].item() < min(others)          # the largest |covariance| of the five tokens


def test_padding_values_change_no_valid_weight():
    logp, adv, mask = example()
    garbage = logp.clone()
    garbage[1, 2] = -50.0
    w = cw_grpo_weights(garbage, adv, mask)
    assert w[1, :2].tolist() == pytest.approx([0.1828062480, 1.0512998281], abs=1e-9)
    assert valid(w, mask) == valid(cw_grpo_weights(logp, adv, mask), mask)


def test_no_spread_gives_unit_weights():
    logp, adv, mask = example()
    assert cw_grpo_weights(logp, adv, mask)[0, 0].item() == pytest.approx(1.3806726824, abs=1e-9)  # spread
    w = cw_grpo_weights(logp, torch.tensor([0.7, 0.7], **F64), mask)   # equal advantages: covariance 0
    assert w.tolist() == [[1.0, 1.0, 1.0], [1.0, 1.0, 1.0]]
    w = cw_grpo_weights(torch.full((2, 3), -1.0, **F64), torch.tensor([1.0, -0.5], **F64), mask)
    assert w.tolist() == [[1.0, 1.0, 1.0], [1.0, 1.0, 1.0]]           # equal log-probs: covariance 0


def test_group_scope_by_hand():
    logp = torch.tensor([[0.9, 0.5], [0.2, 0.4], [0.7, 0.1], [0.3, 0.6]], **F64).log()
    adv = torch.tensor([0.7, -0.7, 0.7, -0.7], **F64)
    mask = torch.tensor([[1.0, 1.0], [1.0, 1.0], [1.0, 0.0], [1.0, 1.0]], **F64)
    w = cw_grpo_weights(logp, adv, mask, scope="group", group_size=2)
    assert valid(w, mask) == [pytest.approx([0.1554170957, 1.8161509298], abs=1e-9),
                              pytest.approx([0.1058880011, 1.9225439733], abs=1e-9),
                              pytest.approx([0.3979774312], abs=1e-9),
                              pytest.approx([0.7780519418, 1.8239706269], abs=1e-9)]
    for rows in (slice(0, 2), slice(2, 4)):                            # mean 1 within each group
        assert (w[rows] * mask[rows]).sum().item() == pytest.approx(mask[rows].sum().item(), abs=1e-12)
    batch = cw_grpo_weights(logp, adv, mask)                           # batch statistics differ
    assert batch[0, 0].item() == pytest.approx(0.1323280910, abs=1e-9)


def test_weights_carry_no_gradient():
    logp, adv, mask = example()
    w = cw_grpo_weights(logp.requires_grad_(), adv, mask)
    assert not w.requires_grad and w[0, 0].item() == pytest.approx(1.3806726824, abs=1e-9)


def test_bad_scope_and_group_size_are_refused():
    logp, adv, mask = example()
    assert cw_grpo_weights(logp, adv, mask, scope="group", group_size=2)[0, 0].item() == \
        pytest.approx(1.3806726824, abs=1e-9)                         # one group = the batch
    with pytest.raises(ValueError, match="scope"):
        cw_grpo_weights(logp, adv, mask, scope="row")
    with pytest.raises(ValueError, match="group_size"):
        cw_grpo_weights(logp, adv, mask, scope="group")
    with pytest.raises(ValueError, match="group_size"):
        cw_grpo_weights(logp, adv, mask, scope="group", group_size=3)
