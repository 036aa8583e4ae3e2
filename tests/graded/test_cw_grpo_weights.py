"""Graded: cw_grpo_weights (losses.py). Literal log-probs and advantages, literal weights."""
import pytest
import torch

from losses import cw_grpo_weights

pytestmark = pytest.mark.part("cw_grpo_weights")
F64 = dict(dtype=torch.float64)


def example():
    # One group: 2 completions of 3 positions; row 1 has 2 valid tokens and a pad.
    p = torch.tensor([[0.5, 0.25, 0.8], [0.1, 0.6, 0.3]], **F64)
    return p.log(), torch.tensor([1.0, -0.5], **F64), torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]], **F64)


def two_groups():
    # Two groups of 2 rows (G = 2), 3 positions; rows of 3, 2, 1 and 3 valid tokens.
    p = torch.tensor([[0.9, 0.5, 0.2], [0.2, 0.4, 0.9], [0.7, 0.1, 0.5], [0.3, 0.6, 0.05]], **F64)
    mask = torch.tensor([[1.0, 1, 1], [1, 1, 0], [1, 0, 0], [1, 1, 1]], **F64)
    return p.log(), torch.tensor([0.7, -0.7, 1.0, -1.0], **F64), mask


def valid(w, mask):
    return [[round(v, 9) for v, m in zip(row, mrow) if m] for row, mrow in zip(w.tolist(), mask.tolist())]


ONE_GROUP = [pytest.approx([1.5489074990, 1.0259312100, 1.1275562939], abs=1e-9),
             pytest.approx([0.6488024985, 0.6488024985], abs=1e-9)]


def test_one_group_by_hand():
    # Each row's log-probs centred on the row's own mean: mean(ln .5, ln .25, ln .8) = -0.767528,
    # mean(ln .1, ln .6) = -1.406705. Advantages centred on the plain mean of the rows: 0.25.
    # c = [[0.055786, -0.464074, 0.408289], [0.671910, -0.671910]], sigma = std(c) + 1e-8 = 0.507563,
    # w = exp(-c^2 / (2 sigma^2)), then scaled so that the 5 valid weights sum to 5.
    logp, adv, mask = example()
    w = cw_grpo_weights(logp, adv, mask)
    assert w.shape == (2, 3)
    assert valid(w, mask) == ONE_GROUP
    assert (w * mask).sum().item() == pytest.approx(5.0, abs=1e-12)
    assert w[1, 2].item() == 0.0                                       # padding weighs 0


def test_groups_by_hand():
    # Group 0: c = [[0.488102, 0.076651, -0.564753], [0.242602, -0.242602]], sigma = 0.368992.
    # Group 1: row 2 has one token, so its centred log-prob is 0 (c = 0, weight exp(0) before scaling);
    # c = [[0], [-0.366204, -1.059351, 1.425555]], sigma = 0.906716. Each group sums to its own tokens.
    logp, adv, mask = two_groups()
    w = cw_grpo_weights(logp, adv, mask, group_size=2)
    assert valid(w, mask) == [pytest.approx([0.6284764340, 1.4753040734, 0.4672838012], abs=1e-9),
                              pytest.approx([1.2144678457, 1.2144678457], abs=1e-9),
                              pytest.approx([1.4718924106], abs=1e-9),
                              pytest.approx([1.3566109470, 0.7438187196, 0.4276779228], abs=1e-9)]
    for rows in (slice(0, 2), slice(2, 4)):                            # mean 1 within each group
        assert (w[rows] * mask[rows]).sum().item() == pytest.approx(mask[rows].sum().item(), abs=1e-12)
    alone = cw_grpo_weights(logp[2:], adv[2:], mask[2:])               # a group is computed alone
    assert torch.allclose(alone, w[2:], atol=1e-14, rtol=0)


def test_the_most_extreme_token_weighs_least():
    logp, adv, mask = two_groups()
    w = cw_grpo_weights(logp, adv, mask, group_size=2)
    # |c| = 0.565, largest of group 0
    assert w[0, 2].item() < min(w[0, 0].item(), w[0, 1].item(), w[1, 0].item())
    # |c| = 1.426, largest of group 1
    assert w[3, 2].item() < min(w[2, 0].item(), w[3, 0].item(), w[3, 1].item())


def test_padded_normalisation_by_hand():
    # The same kernel, scaled so that the valid weights sum to rows x the longest completion:
    # 2 x 3 = 6 for the example (mean 6/5 over its 5 tokens), 2 x 3 = 6 for each group of two_groups().
    logp, adv, mask = example()
    w = cw_grpo_weights(logp, adv, mask, normalise="padded")
    assert valid(w, mask) == [pytest.approx([1.8586889988, 1.2311174520, 1.3530675527], abs=1e-9),
                              pytest.approx([0.7785629982, 0.7785629982], abs=1e-9)]
    assert (w * mask).sum().item() == pytest.approx(6.0, abs=1e-12)
    logp, adv, mask = two_groups()
    w = cw_grpo_weights(logp, adv, mask, group_size=2, normalise="padded")
    assert valid(w, mask)[2:] == [pytest.approx([2.2078386159], abs=1e-9),
                                  pytest.approx([2.0349164205, 1.1157280794, 0.6415168842], abs=1e-9)]
    # The width comes from the mask, not from the tensor: extra padded columns change nothing.
    wide = cw_grpo_weights(torch.cat([logp, torch.zeros(4, 2, **F64)], 1), adv,
                           torch.cat([mask, torch.zeros(4, 2, **F64)], 1), group_size=2, normalise="padded")
    assert torch.allclose(wide[:, :3], w, atol=1e-14, rtol=0) and (wide[:, 3:] == 0).all()


def test_padding_values_change_no_weight():
    logp, adv, mask = example()
    garbage = logp.clone()
    garbage[1, 2] = -50.0
    w = cw_grpo_weights(garbage, adv, mask)
    assert valid(w, mask) == ONE_GROUP and w[1, 2].item() == 0.0


def test_no_spread_gives_unit_weights():
    logp, adv, mask = example()
    assert cw_grpo_weights(logp, adv, mask)[0, 0].item() == pytest.approx(1.5489074990, abs=1e-9)  # spread
    w = cw_grpo_weights(logp, torch.tensor([0.5, 0.5], **F64), mask)   # equal advantages: c = 0
    assert w.tolist() == [[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]]
    rows = torch.tensor([[-1.0, -1.0, -1.0], [-3.0, -3.0, 7.0]], **F64)   # each row constant: c = 0
    assert cw_grpo_weights(rows, adv, mask).tolist() == [[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]]


def test_batch_scope_by_hand():
    # Our earlier reading: log-probs centred on the mean of all 5 valid tokens, advantages on their
    # token-weighted mean ((3 * 1 - 2 * 0.5) / 5 = 0.4), sigma over all tokens: row 1's two tokens differ.
    logp, adv, mask = example()
    w = cw_grpo_weights(logp, adv, mask, scope="batch")
    assert valid(w, mask) == [pytest.approx([1.3806726728, 1.3628980090, 1.0223232274], abs=1e-9),
                              pytest.approx([0.1828062598, 1.0512998310], abs=1e-9)]
    logp, adv, mask = two_groups()                                     # group_size plays no part
    w = cw_grpo_weights(logp, adv, mask, group_size=2, scope="batch")
    assert valid(w, mask)[3] == pytest.approx([1.4510497747, 1.0637110369, 0.0636490693], abs=1e-9)


def test_weights_are_differentiable_in_logp():
    # detach=False in cw_grpo_loss sends the gradient through the weights: c, sigma and the sum.
    logp, adv, mask = two_groups()
    x = logp.clone().requires_grad_()
    assert torch.autograd.gradcheck(lambda t: cw_grpo_weights(t, adv, mask, group_size=2), (x,))
    assert torch.autograd.gradcheck(
        lambda t: cw_grpo_weights(t, adv, mask, group_size=2, normalise="padded"), (x,))
    assert not cw_grpo_weights(x.detach(), adv, mask, group_size=2).requires_grad


def test_bad_scope_normalise_and_group_size_are_refused():
    logp, adv, mask = example()
    assert cw_grpo_weights(logp, adv, mask, group_size=2)[0, 0].item() == \
        pytest.approx(1.5489074990, abs=1e-9)                         # one group of 2 = all rows
    with pytest.raises(ValueError, match="scope"):
        cw_grpo_weights(logp, adv, mask, scope="row")
    with pytest.raises(ValueError, match="normalise"):
        cw_grpo_weights(logp, adv, mask, normalise="tokens")
    with pytest.raises(ValueError, match="group_size"):
        cw_grpo_weights(logp, adv, mask, group_size=3)
