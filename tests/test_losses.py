"""Tests for losses.py: hand-computed values, properties, gradients, and an independent
re-implementation of docs/METHODS.md written with plain per-token loops."""
import math

import pytest
import torch

import losses
from losses import (AGGREGATIONS, LOSSES, cw_grpo_loss, cw_grpo_weights, grpo_loss,
                    group_advantages, microbatch_scale, tepo_loss, token_logprobs,
                    token_logprobs_plain, tr_grpo_loss, tr_grpo_weights)



@pytest.fixture(autouse=True)
def float64():
    """Every test in this file computes in float64 (restored afterwards: other files need float32)."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    yield
    torch.set_default_dtype(previous)
ALL = list(LOSSES)


# ----------------------------------------------------------------------------------------
# The 2x3 example used by the hand-computed tests. Row 0 has 3 tokens, row 1 has 2 (+1 pad).
#   p       row0 = [0.5, 0.25, 0.8]   row1 = [0.1, 0.6, (pad)]
#   ratio   row0 = [1.5, 1.0,  0.5]   row1 = [1.25, 0.9, (pad)]      (old_logp = logp - log ratio)
#   ref     ref_logp - logp = d:  row0 = [0, ln 2, 0]  row1 = [0, -ln 2, (pad)]
#   A = [+1, -0.5],   eps = 0.2
K3_LN2 = 2 - math.log(2) - 1          # k3 when ref - logp = ln 2: e^d - d - 1 = 0.30685
K3_MLN2 = 0.5 + math.log(2) - 1       # k3 when ref - logp = -ln 2: 0.19315


def example():
    p = torch.tensor([[0.5, 0.25, 0.8], [0.1, 0.6, 0.3]])
    ratio = torch.tensor([[1.5, 1.0, 0.5], [1.25, 0.9, 7.0]])
    d = torch.tensor([[0.0, math.log(2), 0.0], [0.0, -math.log(2), 3.0]])
    logp = p.log().requires_grad_()
    old_logp = p.log() - ratio.log()
    ref_logp = p.log() + d
    adv = torch.tensor([1.0, -0.5])
    mask = torch.tensor([[1.0, 1, 1], [1, 1, 0]])
    entropy = torch.tensor([[0.5, 2.0, 0.1], [3.0, 3.0, 3.0]])
    return logp, old_logp, ref_logp, adv, mask, entropy


def agg_by_hand(rows, agg):
    """rows: per-token objectives of the valid tokens of each row (plain python lists)."""
    if agg == "seq-mean-token-mean":
        return sum(sum(r) / len(r) for r in rows) / len(rows)
    if agg == "token-mean":
        return sum(sum(r) for r in rows) / sum(len(r) for r in rows)
    return sum(sum(r) for r in rows) / (len(rows) * 3)        # B * max_tokens, T = 3


# GRPO per-token clipped surrogate, by hand:
#   row 0, A = +1:   min(1.5, 1.2) = 1.2    min(1.0, 1.0) = 1.0    min(0.5, 0.8) = 0.5
#   row 1, A = -0.5: min(-0.625, -0.6) = -0.625                    min(-0.45, -0.45) = -0.45
SURR = [[1.2, 1.0, 0.5], [-0.625, -0.45]]
KL = [[0.0, K3_LN2, 0.0], [0.0, K3_MLN2]]


@pytest.mark.parametrize("agg", AGGREGATIONS)
@pytest.mark.parametrize("beta", [0.0, 0.04])
def test_grpo_by_hand(agg, beta):
    logp, old, ref, adv, mask, _ = example()
    loss, info = grpo_loss(logp, old, ref, adv, mask, beta=beta, agg=agg)
    rows = [[s - beta * k for s, k in zip(sr, kr)] for sr, kr in zip(SURR, KL)]
    assert loss.item() == pytest.approx(-agg_by_hand(rows, agg), abs=1e-12)
    # e.g. seq-mean-token-mean, beta = 0: -((1.2 + 1 + 0.5)/3 + (-0.625 - 0.45)/2)/2 = -0.18125
    assert info["clip_frac"].item() == pytest.approx(1 / 5)     # only row 0, token 0 is clipped
    assert info["clip_high_frac"].item() == pytest.approx(1 / 5)  # ... on the high side: 1.5 > 1.2, A > 0
    assert info["clip_low_frac"].item() == 0.0                   # 0.5 < 0.8, but A > 0: not clipped
    assert info["ratio_mean"].item() == pytest.approx((1.5 + 1 + 0.5 + 1.25 + 0.9) / 5)
    assert info["abs_log_ratio"].item() == pytest.approx(
        (math.log(1.5) + 0 + math.log(2) + math.log(1.25) + math.log(1 / 0.9)) / 5)
    assert info["kl"].item() == pytest.approx((K3_LN2 + K3_MLN2) / 5)
    assert torch.equal(info["weights"], torch.ones(2, 3))


def test_grpo_by_hand_literal_numbers():
    logp, old, ref, adv, mask, _ = example()
    assert grpo_loss(logp, old, ref, adv, mask, beta=0.0)[0].item() == pytest.approx(-0.18125)
    assert grpo_loss(logp, old, ref, adv, mask, beta=0.0, agg="token-mean")[0].item() == pytest.approx(-0.325)
    assert grpo_loss(logp, old, ref, adv, mask, beta=0.0, agg="seq-mean-token-sum-norm")[0].item() \
        == pytest.approx(-1.625 / 6)
    assert grpo_loss(logp, old, ref, adv, mask, beta=0.0, agg="seq-mean-token-sum-norm",
                     max_tokens=4)[0].item() == pytest.approx(-1.625 / 8)


def tr_w(p):
    """TR-GRPO weight by hand: clamp(2 * (sigmoid(9 p) - 0.25), 1.0, 1.4)."""
    return min(max(2 * (1 / (1 + math.exp(-9 * p)) - 0.25), 1.0), 1.4)


@pytest.mark.parametrize("agg", AGGREGATIONS)
@pytest.mark.parametrize("beta", [0.0, 0.04])
def test_tr_grpo_by_hand(agg, beta):
    logp, old, ref, adv, mask, _ = example()
    # w(0.5) = 1.4 (clamped from 1.478), w(0.25) = 2 * (sigmoid(2.25) - 0.25) = 1.3093,
    # w(0.8) = 1.4, w(0.1) = 1.0 (clamped from 0.922), w(0.6) = 1.4
    W = [[tr_w(0.5), tr_w(0.25), tr_w(0.8)], [tr_w(0.1), tr_w(0.6)]]
    assert W[0][1] == pytest.approx(1.30930, abs=1e-5) and W[1][0] == 1.0 and W[0][0] == 1.4
    loss, info = tr_grpo_loss(logp, old, ref, adv, mask, beta=beta, agg=agg)
    rows = [[w * s - beta * k for w, s, k in zip(wr, sr, kr)] for wr, sr, kr in zip(W, SURR, KL)]
    assert loss.item() == pytest.approx(-agg_by_hand(rows, agg), abs=1e-12)
    assert info["weights"][0].tolist() == pytest.approx(W[0])
    assert info["weights"][1, :2].tolist() == pytest.approx(W[1])


def cw_by_hand(scope):
    """CW-GRPO's weights for example(), written out with python floats (1 group of 2 rows)."""
    l = [[math.log(0.5), math.log(0.25), math.log(0.8)], [math.log(0.1), math.log(0.6)]]
    a = [1.0, -0.5]
    if scope == "group":                                      # the authors': per sequence, rows once
        mean_l = [sum(row) / len(row) for row in l]
        mean_a = sum(a) / 2
    else:                                                     # batch scope: over the 5 tokens
        mean_l = [sum(sum(r) for r in l) / 5] * 2
        mean_a = (3 * 1.0 + 2 * -0.5) / 5                     # A_i counted once per token
    c = [[(x - mean_l[i]) * (a[i] - mean_a) for x in row] for i, row in enumerate(l)]
    flat = [x for row in c for x in row]
    sigma = math.sqrt(sum((x - sum(flat) / 5) ** 2 for x in flat) / 5) + 1e-8   # population std + 1e-8
    w = [[math.exp(-x * x / (2 * sigma ** 2)) for x in row] for row in c]
    norm = 5 / sum(x for row in w for x in row)
    return [[x * norm for x in row] for row in w]


@pytest.mark.parametrize("agg", AGGREGATIONS)
@pytest.mark.parametrize("beta", [0.0, 0.04])
@pytest.mark.parametrize("scope", ["group", "batch"])
def test_cw_grpo_by_hand(agg, beta, scope):
    logp, old, ref, adv, mask, _ = example()
    W = cw_by_hand(scope)
    loss, info = cw_grpo_loss(logp, old, ref, adv, mask, beta=beta, agg=agg, scope=scope)
    rows = [[wt * s - beta * k for wt, s, k in zip(wr, sr, kr)] for wr, sr, kr in zip(W, SURR, KL)]
    assert loss.item() == pytest.approx(-agg_by_hand(rows, agg), abs=1e-12)
    assert info["weights"][0].tolist() == pytest.approx(W[0], abs=1e-12)
    assert info["weights"][1].tolist() == pytest.approx(W[1] + [0.0], abs=1e-12)


def test_cw_grpo_by_hand_literal_weights():
    # Per-sequence centring gives a 2-token row two opposite c's, so equal weights.
    logp, old, ref, adv, mask, _ = example()
    w = cw_grpo_loss(logp, old, ref, adv, mask)[1]["weights"]
    assert w.tolist() == [pytest.approx([1.5489074990, 1.0259312100, 1.1275562939], abs=1e-9),
                          pytest.approx([0.6488024985, 0.6488024985, 0.0], abs=1e-9)]


@pytest.mark.parametrize("agg", AGGREGATIONS)
@pytest.mark.parametrize("beta", [0.0, 0.04])
def test_tepo_by_hand(agg, beta):
    logp, old, ref, adv, mask, entropy = example()
    # Sequence ratios: geometric means of the token ratios.
    s0 = (1.5 * 1.0 * 0.5) ** (1 / 3)       # 0.9086: inside [0.8, 1.2], A = +1 -> s0
    s1 = (1.25 * 0.9) ** (1 / 2)            # 1.0607: A = -0.5 -> min(-0.530, -0.530) = -0.530
    # KL mask: A > 0 only in row 0; log p + H = [ln .5 + .5, ln .25 + 2, ln .8 + .1]
    #        = [-0.19, +0.61, -0.12] -> M = [0, 1, 0]; row 1 has A < 0 -> all 0.
    M = [[0.0, 1.0, 0.0], [0.0, 0.0]]
    rows = [[s0 - beta * m * k for m, k in zip(M[0], KL[0])],
            [-0.5 * s1 - beta * m * k for m, k in zip(M[1], KL[1])]]
    loss, info = tepo_loss(logp, old, ref, adv, mask, entropy, beta=beta, agg=agg)
    assert loss.item() == pytest.approx(-agg_by_hand(rows, agg), abs=1e-12)
    assert info["kl_mask"].tolist() == [[0.0, 1.0, 0.0], [0.0, 0.0, 0.0]]
    assert torch.equal(info["weights"], torch.ones(2, 3))
    assert info["ratio_mean"].item() == pytest.approx((3 * s0 + 2 * s1) / 5)


def test_tepo_default_aggregation_is_token_mean():
    logp, old, ref, adv, mask, entropy = example()
    a = tepo_loss(logp, old, ref, adv, mask, entropy)[0]
    b = tepo_loss(logp, old, ref, adv, mask, entropy, agg="token-mean")[0]
    c = tepo_loss(logp, old, ref, adv, mask, entropy, agg="seq-mean-token-mean")[0]
    assert a.item() == b.item() and a.item() != pytest.approx(c.item())


def test_tepo_needs_entropy_and_beta_needs_ref():
    logp, old, ref, adv, mask, _ = example()
    with pytest.raises(ValueError, match="entropy"):
        tepo_loss(logp, old, ref, adv, mask)
    with pytest.raises(ValueError, match="ref_logp"):
        grpo_loss(logp, old, None, adv, mask, beta=0.04)
    assert torch.isfinite(grpo_loss(logp, old, None, adv, mask, beta=0.0)[0])
    with pytest.raises(ValueError, match="aggregation"):
        grpo_loss(logp, old, ref, adv, mask, agg="mean")


# ----------------------------------------------------------------------------------------
# group_advantages

def test_group_advantages_by_hand_and_grouping_order():
    # Rows are [g0 g0 g0 g1 g1 g1]: consecutive rows form a group.
    adv = group_advantages(torch.tensor([1.0, 2.0, 3.0, 10.0, 20.0, 30.0]), group_size=3)
    # g0: mean 2, sample std 1;  g1: mean 20, sample std 10
    expected = [-1 / 1.0001, 0.0, 1 / 1.0001, -10 / 10.0001, 0.0, 10 / 10.0001]
    assert adv.tolist() == pytest.approx(expected, abs=1e-12)
    # Sample (N-1) std, not population: rewards [1, 0] -> std = 0.7071, A = +-0.5 / 0.7072
    adv = group_advantages(torch.tensor([1.0, 0.0]), group_size=2)
    assert adv.tolist() == pytest.approx([0.5 / (math.sqrt(0.5) + 1e-4), -0.5 / (math.sqrt(0.5) + 1e-4)])


def test_group_advantages_zero_std_is_exactly_zero():
    rewards = torch.tensor([0.1, 0.1, 0.1, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0], dtype=torch.float32)
    adv = group_advantages(rewards, group_size=3)
    assert torch.isfinite(adv).all()
    assert adv[:3].tolist() == [0.0, 0.0, 0.0]    # 0.1 * 3 / 3 != 0.1 in floating point: still 0
    assert adv[6:].tolist() == [0.0, 0.0, 0.0]
    assert adv[3] > 0 > adv[4]


def test_group_advantages_dr_grpo_and_errors():
    adv = group_advantages(torch.tensor([1.0, 0.0, 0.0, 0.0]), group_size=4, scale_std=False)
    assert adv.tolist() == pytest.approx([0.75, -0.25, -0.25, -0.25])
    with pytest.raises(ValueError, match="multiple"):
        group_advantages(torch.zeros(7), group_size=3)
    with pytest.raises(ValueError, match=">= 2"):
        group_advantages(torch.zeros(4), group_size=1)


# ----------------------------------------------------------------------------------------
# Properties from docs/METHODS.md "What the tests must pin down"

def random_batch(B=8, T=6, seed=0, off_policy=True):
    """A random off-policy batch. The advantages are drawn from {-1, 0, +1}, not computed with
    group_advantages: a test of a loss must not depend on another function under test."""
    g = torch.Generator().manual_seed(seed)
    logp = torch.log(torch.rand(B, T, generator=g) * 0.98 + 0.01)
    old = logp + (0.3 * torch.randn(B, T, generator=g) if off_policy else 0)
    ref = logp + 0.3 * torch.randn(B, T, generator=g)
    entropy = torch.rand(B, T, generator=g) * 3
    adv = torch.randint(0, 3, (B,), generator=g).double() - 1
    lengths = torch.randint(1, T + 1, (B,), generator=g)
    mask = (torch.arange(T)[None] < lengths[:, None]).double()
    return logp.requires_grad_(), old, ref, adv, mask, entropy


def loss_and_grad(fn, logp, *args, **kw):
    x = logp.detach().clone().requires_grad_()
    loss, info = fn(x, *args, **kw)
    loss.backward()
    return loss.detach(), x.grad, info


@pytest.mark.parametrize("agg", AGGREGATIONS)
def test_tr_grpo_with_unit_weights_is_grpo(agg):
    logp, old, ref, adv, mask, _ = random_batch()
    a = loss_and_grad(grpo_loss, logp, old, ref, adv, mask, agg=agg)
    b = loss_and_grad(tr_grpo_loss, logp, old, ref, adv, mask, agg=agg, w_min=1.0, w_max=1.0)
    assert torch.allclose(a[0], b[0], atol=1e-12) and torch.allclose(a[1], b[1], atol=1e-12)


@pytest.mark.parametrize("agg", AGGREGATIONS)
@pytest.mark.parametrize("detach", [True, False])
def test_cw_grpo_with_zero_sigma_is_grpo(agg, detach):
    logp, old, ref, _, mask, _ = random_batch()
    adv = torch.full((8,), 0.7)            # all advantages equal -> covariance 0 -> sigma = 0
    a = loss_and_grad(grpo_loss, logp, old, ref, adv, mask, agg=agg)
    b = loss_and_grad(cw_grpo_loss, logp, old, ref, adv, mask, agg=agg, group_size=4, detach=detach)
    assert torch.equal(b[2]["weights"], mask)                 # 1 on every valid token, exactly
    assert torch.isfinite(b[1]).all()                         # no 0 * inf through sigma = sqrt(0)
    assert torch.allclose(a[0], b[0], atol=1e-12) and torch.allclose(a[1], b[1], atol=1e-12)


def test_tepo_one_token_beta0_is_grpo():
    logp, old, ref, adv, _, entropy = random_batch(T=1)
    mask = torch.ones(8, 1)
    a = loss_and_grad(grpo_loss, logp, old, ref, adv, mask, beta=0.0)
    b = loss_and_grad(tepo_loss, logp, old, ref, adv, mask, entropy, beta=0.0)
    assert torch.allclose(a[0], b[0], atol=1e-12) and torch.allclose(a[1], b[1], atol=1e-12)


def test_tepo_beta0_is_sequence_ratio_surrogate_alone():
    logp, old, ref, adv, mask, entropy = random_batch()
    loss, _ = tepo_loss(logp, old, ref, adv, mask, entropy, beta=0.0)
    s = torch.exp(((logp - old) * mask).sum(-1) / mask.sum(-1))           # [B]
    surr = torch.minimum(s * adv, s.clamp(0.8, 1.2) * adv)                # per sequence
    expected = -(surr * mask.sum(-1)).sum() / mask.sum()                  # token-mean
    assert loss.item() == pytest.approx(expected.item(), abs=1e-12)


def test_tepo_mask_selects_positive_advantage_entropy_lowering_tokens():
    logp, old, ref, adv, mask, entropy = random_batch(B=16, T=8, seed=3)
    _, info = tepo_loss(logp, old, ref, adv, mask, entropy)
    expected = (adv[:, None] > 0) & (logp.detach() + entropy > 0) & (mask > 0)
    assert torch.equal(info["kl_mask"] > 0, expected)
    assert 0 < expected.sum() < (mask > 0).sum()       # the example is not degenerate


@pytest.mark.parametrize("name", ALL)
@pytest.mark.parametrize("agg", AGGREGATIONS)
def test_on_policy_ratio_is_one_loss_is_weighted_advantage(name, agg):
    logp, _, ref, adv, mask, entropy = random_batch()
    loss, grad, info = loss_and_grad(LOSSES[name], logp, logp.detach(), ref, adv, mask, entropy,
                                     beta=0.0, agg=agg)
    assert info["ratio_mean"].item() == 1.0 and info["clip_frac"].item() == 0.0
    x, n = info["weights"] * adv[:, None] * mask, mask.sum(-1)       # every row has a token
    # not aggregate(): it is under test too
    expected = -{"seq-mean-token-mean": (x.sum(-1) / n).mean(), "token-mean": x.sum() / n.sum(),
                 "seq-mean-token-sum-norm": x.sum() / x.numel()}[agg]
    assert loss.item() == pytest.approx(expected.item(), abs=1e-12)
    assert grad.abs().sum() > 0         # the value is "just A", but the gradient is not zero


def test_on_policy_with_beta_0_tepo_is_grpo_with_token_mean():
    """TEPO's two mechanisms need the setting to act: on policy the sequence ratio has value 1
    and gradient d logp, as GRPO's token ratio does, and with beta = 0 its KL mask multiplies
    nothing. There TEPO *is* GRPO with agg="token-mean": the same loss and gradient, bit for bit."""
    logp, _, ref, adv, mask, entropy = random_batch(B=16, T=8, seed=2)
    for reference in (None, ref):
        grpo = loss_and_grad(grpo_loss, logp, logp.detach(), reference, adv, mask, beta=0.0, agg="token-mean")
        tepo = loss_and_grad(tepo_loss, logp, logp.detach(), reference, adv, mask, entropy, beta=0.0)
        assert torch.equal(grpo[0], tepo[0]) and torch.equal(grpo[1], tepo[1])
    assert tepo[2]["kl_mask"].sum() > 0                       # the mask is there; it multiplies 0
    # Either mechanism acting makes them differ: a KL term (beta > 0), or an old policy (off policy).
    old = logp.detach() + 0.3 * torch.randn(logp.shape, generator=torch.Generator().manual_seed(0))
    for old_logp, beta in ((logp.detach(), 0.04), (old, 0.0)):
        grpo = loss_and_grad(grpo_loss, logp, old_logp, ref, adv, mask, beta=beta, agg="token-mean")
        tepo = loss_and_grad(tepo_loss, logp, old_logp, ref, adv, mask, entropy, beta=beta)
        assert not torch.allclose(grpo[1], tepo[1], atol=1e-6), beta


def test_tepo_parts_each_swap_puts_back_one_part_of_grpo():
    """experiments/benchmarks/tepo_parts.py: --swap ratio is TEPO with GRPO's token ratio, --swap kl is TEPO
    with GRPO's KL on every token. Each is the loss it claims where the other part cannot act,
    and differs from TEPO where its own part does."""
    from experiments.benchmarks.tepo_parts import tepo_with
    swap_ratio, swap_kl = tepo_with("ratio"), tepo_with("kl")
    logp, old, ref, adv, mask, entropy = random_batch(B=16, T=8, seed=5)
    on = logp.detach()

    def same(f, g, old_logp, beta, **kw):
        a = loss_and_grad(f, logp, old_logp, ref, adv, mask, entropy, beta=beta, **kw)
        b = loss_and_grad(g, logp, old_logp, ref, adv, mask, entropy, beta=beta)
        return torch.allclose(a[0], b[0], atol=1e-12) and torch.allclose(a[1], b[1], atol=1e-12)

    grpo = lambda *a, **kw: grpo_loss(*a[:5], **kw, agg="token-mean")        # GRPO takes no entropy
    assert same(grpo, swap_ratio, old, 0.0)         # no KL: only the ratio is left, GRPO's
    assert same(tepo_loss, swap_ratio, on, 0.04)    # on policy the two ratios are one
    assert same(grpo, swap_kl, on, 0.04)            # on policy: only the KL is left, GRPO's
    assert same(tepo_loss, swap_kl, old, 0.0)       # no KL: only the ratio is left, TEPO's
    assert not same(tepo_loss, swap_ratio, old, 0.0)
    assert not same(tepo_loss, swap_kl, on, 0.04)
    _, info = swap_kl(logp, old, ref, adv, mask, entropy)
    assert torch.equal(info["kl_mask"], mask)                                  # logged as a full mask
    with pytest.raises(ValueError, match="--swap"):
        tepo_with("entropy")


@pytest.mark.parametrize("name", ALL)
def test_clip_frac_is_the_low_side_plus_the_high_side(name):
    """The clip acts on the high side where A > 0 and ratio > 1 + eps, on the low side where
    A < 0 and ratio < 1 - eps; abs_log_ratio is the mean |log ratio| over valid tokens, of the
    ratio the loss clips (TEPO's: the sequence ratio)."""
    logp, old, ref, adv, mask, entropy = random_batch(B=32, T=8, seed=4)
    old = logp.detach() + 3 * (old - logp.detach())            # far off policy: both sides clip
    _, info = LOSSES[name](logp, old, ref, adv, mask, entropy, clip_eps=0.2)
    if name == "tepo":
        ratio = losses.tepo_sequence_ratio(logp.detach(), old, mask)
    else:
        ratio = torch.exp((logp.detach() - old) * mask)
    valid, n = mask > 0, mask.sum()
    low = (adv[:, None] < 0) & (ratio < 0.8) & valid
    high = (adv[:, None] > 0) & (ratio > 1.2) & valid
    assert low.any() and high.any()
    assert info["clip_low_frac"].item() == pytest.approx(low.sum().item() / n.item())
    assert info["clip_high_frac"].item() == pytest.approx(high.sum().item() / n.item())
    assert info["clip_frac"].item() == pytest.approx((low | high).sum().item() / n.item())
    assert info["abs_log_ratio"].item() == pytest.approx(((ratio.log().abs() * mask).sum() / n).item())


def test_grpo_gradient_by_hand_on_policy():
    # On-policy, beta = 0, seq-mean-token-mean: loss = -1/B sum_i 1/|o_i| sum_t A_i * exp(logp - sg(logp))
    # so d loss / d logp[i, t] = -A_i * mask[i, t] / |o_i| / B.
    logp, _, _, adv, mask, _ = random_batch()
    _, grad, _ = loss_and_grad(grpo_loss, logp, logp.detach(), None, adv, mask, beta=0.0)
    expected = -adv[:, None] * mask / mask.sum(-1, keepdim=True) / mask.shape[0]
    assert torch.allclose(grad, expected, atol=1e-15)


def test_tepo_gradient_by_hand():
    # beta = 0, token-mean, all sequence ratios inside the clip range:
    # d loss / d logp[i, t] = -A_i * s_i * mask[i, t] / N   (every token carries the sequence ratio)
    logp, _, ref, adv, mask, entropy = random_batch()
    old = logp.detach() + 0.05 * torch.randn(logp.shape, generator=torch.Generator().manual_seed(1))
    _, grad, _ = loss_and_grad(tepo_loss, logp, old, ref, adv, mask, entropy, beta=0.0)
    s = torch.exp(((logp.detach() - old) * mask).sum(-1) / mask.sum(-1))
    assert ((s > 0.8) & (s < 1.2)).all()
    assert torch.allclose(grad, -adv[:, None] * s[:, None] * mask / mask.sum(), atol=1e-15)


# ----------------------------------------------------------------------------------------
# Gradients: torch.autograd.gradcheck in float64.

@pytest.mark.parametrize("agg", AGGREGATIONS)
def test_gradcheck_grpo(agg):
    logp, old, ref, adv, mask, _ = random_batch(B=4, T=5)
    assert torch.autograd.gradcheck(lambda x: grpo_loss(x, old, ref, adv, mask, agg=agg)[0], (logp,))


@pytest.mark.parametrize("agg", AGGREGATIONS)
def test_gradcheck_tr_grpo(agg):
    # The weight is a stop-gradient function of p; finite differences would see it move. Pick
    # probabilities where it is flat (p < 0.1 -> w = 1.0, p > 0.5 -> w = 1.4) so both agree.
    logp, old, ref, adv, mask, _ = random_batch(B=4, T=5)
    p = torch.where(torch.rand(4, 5, generator=torch.Generator().manual_seed(2)) < 0.5,
                    torch.full((4, 5), 0.05), torch.full((4, 5), 0.7))
    x = (p + 0.02 * torch.rand(4, 5)).log().requires_grad_()
    w = tr_grpo_weights(x)
    assert set(w.flatten().tolist()) == {1.0, 1.4}
    assert torch.autograd.gradcheck(lambda x: tr_grpo_loss(x, old, ref, adv, mask, agg=agg)[0], (x,))


@pytest.mark.parametrize("agg", AGGREGATIONS)
def test_gradcheck_cw_grpo(agg):
    # Detached weights are held fixed during the step (finite differences would see them move):
    # pass them precomputed.
    logp, old, ref, adv, mask, _ = random_batch(B=4, T=5)
    w = cw_grpo_weights(logp.detach(), adv, mask, 2)
    assert torch.autograd.gradcheck(lambda x: cw_grpo_loss(x, old, ref, adv, mask, agg=agg, weights=w)[0],
                                    (logp,))


@pytest.mark.parametrize("agg", AGGREGATIONS)
@pytest.mark.parametrize("scope", ["group", "batch"])
@pytest.mark.parametrize("normalise", ["valid", "padded"])
def test_gradcheck_cw_grpo_through_the_weights(agg, scope, normalise):
    # detach=False: the weights move with logp, through c (and the row means), sigma and sum(w).
    logp, old, ref, _, mask, _ = random_batch(B=4, T=5)
    adv = torch.tensor([1.0, -0.5, 0.3, -1.2])
    f = lambda x: cw_grpo_loss(x, old, ref, adv, mask, agg=agg, group_size=2, scope=scope,
                               normalise=normalise, detach=False)[0]
    assert torch.autograd.gradcheck(f, (logp,))
    fixed = loss_and_grad(cw_grpo_loss, logp, old, ref, adv, mask, agg=agg, group_size=2, scope=scope,
                          normalise=normalise)
    x = logp.detach().clone().requires_grad_()
    f(x).backward()
    assert not torch.allclose(x.grad, fixed[1])             # the path through the weights is not zero


@pytest.mark.parametrize("agg", AGGREGATIONS)
def test_gradcheck_tepo(agg):
    # s = exp(sg(log s_i) + logp - sg(logp)) gives every token the gradient s_i. Finite
    # differences see the plain sequence ratio instead (d s_i / d logp_t = s_i / |o_i|), but
    # all |o_i| tokens of the row carry s_i, so the totals agree: gradcheck applies as is.
    logp, old, ref, adv, mask, entropy = random_batch(B=4, T=5)
    assert torch.autograd.gradcheck(lambda x: tepo_loss(x, old, ref, adv, mask, entropy, agg=agg)[0], (logp,))


# ----------------------------------------------------------------------------------------
# TR-GRPO and CW-GRPO weights

def test_tr_grpo_weight_shape():
    p = torch.linspace(0, 1, 1001)
    w = tr_grpo_weights(p.log())
    assert (w[1:] >= w[:-1]).all()                       # monotone non-decreasing in p
    assert w[0].item() == 1.0 and w[-1].item() == pytest.approx(1.4)
    assert tr_grpo_weights(torch.tensor(0.2).log()).item() == pytest.approx(1.216, abs=1e-3)
    assert tr_grpo_weights(torch.tensor(0.1).log()).item() == 1.0 and w.max().item() == pytest.approx(1.4)


def test_cw_grpo_weights_mean_one_per_group_and_extreme_gets_smallest():
    logp, _, _, adv, mask, _ = random_batch(B=16, T=8, seed=5)
    w = cw_grpo_weights(logp, adv, mask, 4)
    l, valid = logp.detach(), mask > 0
    for g in range(4):
        rows = slice(4 * g, 4 * g + 4)
        m, lg, a = valid[rows], l[rows], adv[rows]
        assert w[rows][m].mean().item() == pytest.approx(1.0, abs=1e-12)
        if a.unique().numel() == 1:                       # no spread in this group: all weights 1
            assert torch.equal(w[rows], mask[rows])
            continue
        row_mean = (lg * mask[rows]).sum(1, keepdim=True) / mask[rows].sum(1, keepdim=True)
        c = (lg - row_mean) * (a - a.mean())[:, None]
        extreme = c.abs().masked_fill(~m, -1).argmax()
        assert w[rows].flatten()[extreme] == w[rows][m].min()
    assert (w[~valid] == 0).all()


def test_cw_grpo_padded_normalisation_is_the_valid_one_scaled():
    # "padded": sum over a group = rows x its longest completion, the count the authors' padded
    # tensors give; the same kernel otherwise, so the two differ by one factor per group.
    logp, _, _, adv, mask, _ = random_batch(B=12, T=7, seed=6)
    valid = cw_grpo_weights(logp, adv, mask, 3)
    padded = cw_grpo_weights(logp, adv, mask, 3, normalise="padded")
    for g in range(4):
        rows = slice(3 * g, 3 * g + 3)
        n, longest = mask[rows].sum(), mask[rows].sum(1).max()
        assert (padded[rows] * mask[rows]).sum().item() == pytest.approx(3 * longest.item(), abs=1e-12)
        assert torch.allclose(padded[rows], valid[rows] * 3 * longest / n, atol=1e-14, rtol=0)
    assert not torch.allclose(padded, valid)


def test_cw_grpo_scope_batch_is_our_other_reading():
    logp, _, _, _, mask, _ = random_batch(B=8, T=6, seed=7)
    adv = torch.tensor([-1.5, 0.5, 0.5, 0.5, -0.5, -0.5, -0.5, 1.5]) / 0.5001   # rewards [0 1 1 1 | 0 0 0 1]
    with torch.no_grad():
        logp[4:] -= 2.0                  # the second group is much less confident than the first
    wb = cw_grpo_weights(logp, adv, mask, 4, scope="batch")
    wg = cw_grpo_weights(logp, adv, mask, 4)
    assert not torch.allclose(wb, wg)
    # batch scope: log-probs and advantages centred over every valid token of the batch
    l, m, n = logp.detach(), mask > 0, mask.sum()
    c = ((l - l[m].mean()) * (adv - (adv * mask.sum(1)).sum() / n)[:, None]) * mask
    raw = torch.exp(-c ** 2 / (2 * (c[m].std(correction=0) + 1e-8) ** 2)) * mask
    assert torch.allclose(wb, raw * n / raw.sum(), atol=1e-14, rtol=0)
    assert wb[m].mean().item() == pytest.approx(1.0)     # mean 1 over the batch, not per group
    a = cw_grpo_loss(logp, logp.detach(), None, adv, mask, beta=0.0, scope="batch")
    assert torch.equal(a[1]["weights"], wb)


def test_cw_grpo_refuses_bad_options():
    logp, old, _, adv, mask, _ = random_batch(B=6, T=4)
    with pytest.raises(ValueError, match="group_size"):
        cw_grpo_weights(logp, adv, mask, 4)
    with pytest.raises(ValueError, match="scope"):
        cw_grpo_loss(logp, old, None, adv, mask, beta=0.0, scope="token")
    with pytest.raises(ValueError, match="normalise"):
        cw_grpo_loss(logp, old, None, adv, mask, beta=0.0, normalise="mean")
    with pytest.raises(ValueError, match="weights"):       # precomputed weights carry no live gradient
        cw_grpo_loss(logp, old, None, adv, mask, beta=0.0, detach=False, weights=torch.ones_like(mask))


# ----------------------------------------------------------------------------------------
# Padding and micro-batching

@pytest.mark.parametrize("name", ALL)
@pytest.mark.parametrize("agg", AGGREGATIONS)
def test_padding_changes_nothing(name, agg):
    logp, old, ref, adv, mask, entropy = random_batch()
    g = torch.Generator().manual_seed(11)
    junk = lambda: 30 * torch.randn(8, 5, generator=g)             # arbitrary finite values
    pad = lambda t: torch.cat([t.detach(), junk()], dim=1)
    kw = dict(agg=agg, max_tokens=20)             # sum-norm needs a fixed max_tokens to compare
    a = loss_and_grad(LOSSES[name], logp, old, ref, adv, mask, entropy, **kw)
    mask2 = torch.cat([mask, torch.zeros(8, 5)], dim=1)
    b = loss_and_grad(LOSSES[name], pad(logp), pad(old), pad(ref), adv, mask2, pad(entropy), **kw)
    assert torch.isfinite(b[0]) and torch.isfinite(b[1]).all()
    assert b[0].item() == pytest.approx(a[0].item(), abs=1e-12)
    assert torch.allclose(b[1][:, :6], a[1], atol=1e-14) and (b[1][:, 6:] == 0).all()
    # garbage inside the original width, under mask 0, changes nothing either
    inside = lambda t: torch.where(mask > 0, t.detach(), 30 * torch.randn(8, 6, generator=g))
    c = loss_and_grad(LOSSES[name], inside(logp), inside(old), inside(ref), adv, mask, inside(entropy), **kw)
    assert c[0].item() == pytest.approx(a[0].item(), abs=1e-12)
    assert torch.allclose(c[1], a[1], atol=1e-14)


@pytest.mark.parametrize("name", ALL)
@pytest.mark.parametrize("agg", AGGREGATIONS)
def test_micro_batches_accumulate_to_the_full_batch_gradient(name, agg):
    logp, old, ref, adv, mask, entropy = random_batch(B=12, T=7, seed=4)
    full_loss, full_grad, _ = loss_and_grad(LOSSES[name], logp, old, ref, adv, mask, entropy, agg=agg)
    x = logp.detach().clone().requires_grad_()
    extra = {}
    if name == "cw_grpo":                # statistics of groups that these micro-batches cut: computed once
        extra_w = cw_grpo_weights(old, adv, mask, 4)
    total = 0.0
    for rows in (slice(0, 5), slice(5, 6), slice(6, 12)):   # uneven micro-batches
        if name == "cw_grpo":
            extra = {"weights": extra_w[rows]}
        loss, _ = LOSSES[name](x[rows], old[rows], ref[rows], adv[rows], mask[rows], entropy[rows],
                               agg=agg, max_tokens=7, **extra)
        loss = loss * microbatch_scale(agg, mask[rows], mask)
        loss.backward()
        total += loss.item()
    if name == "cw_grpo":   # the whole-batch call computes weights from logp, not old: use the same
        full_loss, full_grad, _ = loss_and_grad(cw_grpo_loss, logp, old, ref, adv, mask, agg=agg,
                                                weights=extra_w)
    assert total == pytest.approx(full_loss.item(), abs=1e-12)
    assert torch.allclose(x.grad, full_grad, atol=1e-14)


def trim(t, m):
    """Cut a micro-batch to its own longest completion, as train.py's micro_batches does."""
    return t[:, :int(m.sum(1).max())]


@pytest.mark.parametrize("agg", AGGREGATIONS)
@pytest.mark.parametrize("normalise", ["valid", "padded"])
@pytest.mark.parametrize("detach", [True, False])
def test_cw_group_weights_are_split_invariant_over_whole_groups(agg, normalise, detach):
    # Weights of whole groups depend on nothing else: micro-batches of whole groups, each cut to its
    # own width, give the same weights and accumulate to the same gradient, with the weights
    # computed inside each micro-batch's loss (detach=False: the only way to get their gradient).
    logp, old, ref, adv, mask, _ = random_batch(B=12, T=7, seed=4)
    opts = dict(agg=agg, max_tokens=7, group_size=3, normalise=normalise, detach=detach)
    full_loss, full_grad, full_info = loss_and_grad(cw_grpo_loss, logp, old, ref, adv, mask, **opts)
    x, total = logp.detach().clone().requires_grad_(), 0.0
    for rows in (slice(0, 3), slice(3, 9), slice(9, 12)):       # 1, 2 and 1 groups
        m = trim(mask[rows], mask[rows])
        loss, info = cw_grpo_loss(trim(x[rows], m), trim(old[rows], m), trim(ref[rows], m), adv[rows], m,
                                  **opts)
        assert torch.allclose(info["weights"], full_info["weights"][rows, :m.shape[1]], atol=1e-14, rtol=0)
        loss = loss * microbatch_scale(agg, m, mask)
        loss.backward()
        total += loss.item()
    assert total == pytest.approx(full_loss.item(), abs=1e-12)
    assert torch.allclose(x.grad, full_grad, atol=1e-14)


def test_cw_weights_per_micro_batch_would_be_wrong():
    # The bug the interface exists to prevent: statistics of part of a group (or, in batch scope,
    # of part of the batch) are not the group's (the batch's).
    logp, _, _, adv, mask, _ = random_batch(B=8, T=6, seed=9)
    adv = torch.tensor([1.0, -1.0, 0.5, -0.5, 1.0, 0.0, -1.0, 0.0])
    halves = lambda **kw: torch.cat([cw_grpo_weights(logp[:4], adv[:4], mask[:4], **kw),
                                     cw_grpo_weights(logp[4:], adv[4:], mask[4:], **kw)])
    assert not torch.allclose(cw_grpo_weights(logp, adv, mask, scope="batch"), halves(scope="batch"))
    assert not torch.allclose(cw_grpo_weights(logp, adv, mask, 8), halves())     # halves of one group of 8
    assert torch.allclose(cw_grpo_weights(logp, adv, mask, 4), halves(), atol=1e-14, rtol=0)   # whole groups


# ----------------------------------------------------------------------------------------
# CW-GRPO as its authors compute it (their compute_loss with use_ours: true), written here from
# the description in docs/METHODS.md: one call of their loss holds one group, padded to the
# group's longest completion; no clip, the gradient flowing through the weights.

def authors_group_loss(logp, ref, adv, mask, beta):
    """Their loss on one group, already cut to its longest completion: (loss, weights)."""
    mean_l = (logp * mask).sum(1, keepdim=True) / mask.sum(1, keepdim=True)   # each sequence's own
    c = (logp - mean_l) * mask * (adv - adv.mean())[:, None]                   # advantages: each row once
    sigma = c[mask > 0].std(correction=0) + 1e-8
    w = torch.exp(-c ** 2 / (2 * sigma ** 2)) * mask
    w = w * mask.numel() / w.sum()                                             # rows x width: padding counts
    d = ref - logp
    per_token = w * torch.exp(logp - logp.detach()) * adv[:, None] - beta * (torch.exp(d) - d - 1)
    return -((per_token * mask).sum(1) / mask.sum(1)).mean(), w


@pytest.mark.parametrize("beta", [0.0, 0.04])
def test_cw_grpo_with_their_two_options_is_the_authors_loss(beta):
    B, G, T = 12, 4, 9
    for seed in range(3):
        g = torch.Generator().manual_seed(200 + seed)
        logp = torch.log(torch.rand(B, T, generator=g) * 0.98 + 0.01)
        ref = logp + 0.3 * torch.randn(B, T, generator=g)
        adv = torch.randn(B, generator=g)
        mask = (torch.arange(T)[None] < torch.randint(1, T, (B, 1), generator=g)).double()   # ragged
        garbage = torch.where(mask > 0, logp, 30 * torch.randn(B, T, generator=g))          # at padding
        opts = dict(beta=beta, group_size=G, normalise="padded", detach=False)
        got, grad, info = loss_and_grad(cw_grpo_loss, garbage, garbage, ref, adv, mask, **opts)   # on policy
        y, theirs, weights = logp.clone().requires_grad_(), [], torch.zeros(B, T)
        for first in range(0, B, G):      # one call per group, each group as wide as its longest completion
            rows, width = slice(first, first + G), int(mask[first:first + G].sum(1).max())
            loss, w = authors_group_loss(y[rows, :width], ref[rows, :width], adv[rows], mask[rows, :width],
                                         beta)
            theirs.append(loss)
            weights[rows, :width] = w.detach()
        want = torch.stack(theirs).mean()  # = the batch's seq-mean-token-mean: every group has G rows
        want.backward()
        assert got.item() == pytest.approx(want.item(), rel=1e-12)
        assert torch.allclose(grad, y.grad, rtol=1e-10, atol=1e-13)
        assert torch.allclose(info["weights"], weights, rtol=1e-12, atol=0)
        # ...and each of the two options matters (so this test can fail).
        ours = loss_and_grad(cw_grpo_loss, logp, logp, ref, adv, mask, beta=beta, group_size=G, detach=False)
        assert got.item() != pytest.approx(ours[0].item(), rel=1e-6)
        ours = loss_and_grad(cw_grpo_loss, logp, logp, ref, adv, mask, beta=beta, group_size=G,
                             normalise="padded")
        assert ours[0].item() == pytest.approx(got.item(), rel=1e-12)    # the value: w is the same
        assert not torch.allclose(ours[1], grad, rtol=1e-6)               # the gradient: w's own path is gone


# ----------------------------------------------------------------------------------------
# An independent implementation of docs/METHODS.md, one token at a time, compared on random
# off-policy batches: values, gradients, weights and the TEPO mask.

def reference_loss(name, logp, old, ref, adv, mask, entropy, beta, agg, group=None, mean_one=False,
                   full_kl_beta=0.0, inside_clip=False, token_ratio=False):
    B, T = logp.shape
    valid = [[mask[i, t].item() > 0 for t in range(T)] for i in range(B)]
    toks = [(i, t) for i in range(B) for t in range(T) if valid[i][t]]
    N = len(toks)
    n_i = [sum(valid[i]) for i in range(B)]
    w = {k: torch.tensor(1.0) for k in toks}
    M = {k: 0.0 for k in toks}
    if name == "tr_grpo":
        for i, t in toks:
            p = math.exp(logp[i, t].item())
            w[i, t] = torch.tensor(min(max(2.0 * (1 / (1 + math.exp(-9 * p)) - 0.25), 1.0), 1.4))
        if mean_one:                   # the control: each row's weights divided by their mean
            row_mean = {i: sum(w[i, t].item() for t in range(T) if valid[i][t]) / n_i[i] for i in range(B)}
            w = {(i, t): v / row_mean[i] for (i, t), v in w.items()}
    if name == "cw_grpo":              # per group of `group` rows (None: all rows), the weights detached
        G = group or B
        for first in range(0, B, G):
            rows = range(first, first + G)
            own = [(i, t) for i, t in toks if i in rows]
            ml = {i: sum(logp[i, t].item() for t in range(T) if valid[i][t]) / n_i[i] for i in rows}
            ma = sum(adv[i].item() for i in rows) / G                       # each row once
            c = {(i, t): (logp[i, t].item() - ml[i]) * (adv[i].item() - ma) for i, t in own}
            mc = sum(c.values()) / len(own)
            sd = math.sqrt(sum((v - mc) ** 2 for v in c.values()) / len(own)) + 1e-8
            raw = {k: math.exp(-v * v / (2 * sd * sd)) for k, v in c.items()}
            z = sum(raw.values())
            w.update({k: torch.tensor(v * len(own) / z) for k, v in raw.items()})
    obj = {}
    for i, t in toks:
        lp, A = logp[i, t], adv[i].item()
        if name == "tepo" and not token_ratio:
            log_s = sum(logp[i, u].item() - old[i, u].item() for u in range(T) if valid[i][u]) / n_i[i]
            r = math.exp(log_s) * torch.exp(lp - lp.detach())
        else:
            r = torch.exp(lp - old[i, t])
        if name == "tepo":
            M[i, t] = 1.0 if (A > 0 and lp.item() + entropy[i, t].item() > 0) else 0.0
        d = ref[i, t] - lp
        if inside_clip:                # the weight times the ratio, inside the clip; KL of w pi_ref / pi
            surr = torch.minimum(w[i, t] * r * A, torch.clamp(w[i, t] * r, 0.8, 1.2) * A)
            d = d + torch.log(w[i, t])
        else:
            surr = torch.minimum(r * w[i, t] * A, torch.clamp(r, 0.8, 1.2) * w[i, t] * A)
        kl = torch.exp(d) - d - 1
        obj[i, t] = surr - beta * (M[i, t] if name == "tepo" else 1.0) * kl - full_kl_beta * kl
    if agg == "seq-mean-token-mean":
        total = sum(sum(obj[i, t] for t in range(T) if valid[i][t]) / n_i[i] for i in range(B)) / B
    elif agg == "token-mean":
        total = sum(obj.values()) / N
    else:
        total = sum(obj.values()) / (B * T)
    return -total, w, M


@pytest.mark.parametrize("name", ALL)
@pytest.mark.parametrize("agg", AGGREGATIONS)
@pytest.mark.parametrize("beta", [0.0, 0.04])
def test_matches_independent_implementation(name, agg, beta):
    for seed in range(3):
        logp, old, ref, adv, mask, entropy = random_batch(B=6, T=5, seed=100 + seed)
        x = logp.detach().clone().requires_grad_()
        group = {"cw_grpo": 3}.get(name)                # two groups of 3 rows
        want, w, M = reference_loss(name, x, old, ref, adv, mask, entropy, beta, agg, group)
        want.backward()
        extra = {"group_size": group} if group else {}
        got, grad, info = loss_and_grad(LOSSES[name], logp, old, ref, adv, mask, entropy, beta=beta, agg=agg,
                                        **extra)
        assert got.item() == pytest.approx(want.item(), rel=1e-6, abs=1e-12)
        assert torch.allclose(grad, x.grad, rtol=1e-6, atol=1e-12)
        for (i, t), v in w.items():
            assert info["weights"][i, t].item() == pytest.approx(float(v), rel=1e-6)
        if name == "tepo":
            for (i, t), v in M.items():
                assert info["kl_mask"][i, t].item() == v


# ----------------------------------------------------------------------------------------
# Log-probs and entropy from logits

def naive(logits, tokens, temperature):
    logsm = torch.log_softmax(logits / temperature, dim=-1)
    return logsm.gather(-1, tokens[..., None]).squeeze(-1), -(logsm.exp() * logsm).sum(-1)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_token_logprobs_and_entropy_match_naive_formula(temperature, monkeypatch):
    monkeypatch.setattr(losses, "CHUNK_ELEMENTS", 3 * 50)         # force several chunks
    g = torch.Generator().manual_seed(0)
    logits = (3 * torch.randn(2, 7, 50, generator=g, dtype=torch.float32)).requires_grad_()
    tokens = torch.randint(0, 50, (2, 7), generator=g)
    want_lp, want_h = naive(logits.double(), tokens, temperature)
    got_lp, got_h = token_logprobs(logits, tokens, temperature)
    assert got_lp.dtype == torch.float32 and got_h.dtype == torch.float32
    assert torch.allclose(got_lp.double(), want_lp, atol=1e-5)
    assert torch.allclose(got_h.double(), want_h, atol=1e-5)
    assert not got_h.requires_grad
    upstream = torch.randn(2, 7, generator=g)                     # any weighting of the tokens
    (grad_got,) = torch.autograd.grad((got_lp * upstream).sum(), logits)
    (grad_want,) = torch.autograd.grad((want_lp * upstream).sum(), logits)
    assert torch.allclose(grad_got, grad_want, atol=1e-5)


def test_entropy_is_accurate_for_large_logits_over_a_large_vocabulary():
    """Real logits span +-35 over 49,152 words: logsumexp(x) - sum p x cancels (1e-3 nats of
    float32 error when computed unshifted); the entropy must stay within 1e-5 of float64."""
    g = torch.Generator().manual_seed(4)
    logits = (12 * torch.randn(6, 49152, generator=g, dtype=torch.float32)).clamp(-35, 35)
    logits[:, :3] += 25                                           # a few dominant words, as in real logits
    tokens = torch.randint(0, 49152, (6,), generator=g)
    want_lp, want_h = naive(logits.double(), tokens, 0.7)
    got_lp, got_h = token_logprobs(logits, tokens, 0.7)
    assert torch.allclose(got_h.double(), want_h, atol=1e-5)
    assert torch.allclose(got_lp.double(), want_lp, atol=1e-5)


def test_the_written_out_gradient_passes_gradcheck():
    """d log p(token) / d logits = (onehot - softmax) / T, checked against finite differences,
    with a token repeated in a row of the batch and several chunks."""
    g = torch.Generator().manual_seed(3)
    logits = torch.randn(5, 11, dtype=torch.float64, generator=g).requires_grad_()
    tokens = torch.tensor([0, 3, 3, 10, 7])
    f = lambda x: losses._TokenLogprobs.apply(x, tokens, 0.7)[0]
    assert torch.autograd.gradcheck(f, (logits,))
    bf16 = logits.detach().to(torch.bfloat16).requires_grad_()
    losses._TokenLogprobs.apply(bf16, tokens, 1.0)[0].sum().backward()
    assert bf16.grad.dtype == torch.bfloat16             # the gradient comes back in the logits' dtype


@pytest.mark.parametrize("dtype, tol", [(torch.float64, 1e-12), (torch.float32, 1e-5)])
def test_token_logprobs_equals_the_plain_autograd_computation(dtype, tol, monkeypatch):
    """The default path (the _TokenLogprobs device, in row chunks) and token_logprobs_plain
    (what --plain scores with: log_softmax, gather, no custom autograd) agree on values,
    entropies, dtypes and gradients, at a temperature other than 1."""
    monkeypatch.setattr(losses, "CHUNK_ELEMENTS", 4 * 40)        # several chunks
    g = torch.Generator().manual_seed(6)
    logits = (4 * torch.randn(3, 5, 40, generator=g, dtype=dtype)).requires_grad_()
    tokens = torch.randint(0, 40, (3, 5), generator=g)
    upstream = torch.randn(3, 5, generator=g, dtype=dtype)        # any weighting of the tokens
    results = []
    for fn in (token_logprobs, token_logprobs_plain):
        logp, entropy = fn(logits, tokens, 0.7)
        assert logp.dtype == entropy.dtype == dtype and not entropy.requires_grad
        (grad,) = torch.autograd.grad((logp * upstream).sum(), logits)
        results.append((logp.detach(), entropy, grad))
    for fast, plain in zip(*results):
        assert torch.allclose(fast, plain, rtol=0, atol=tol)
    assert results[0][2].abs().sum() > 0
    bf16 = logits.detach().to(torch.bfloat16)                     # bf16 logits: both score in float32
    fast, plain = token_logprobs(bf16, tokens, 0.7), token_logprobs_plain(bf16, tokens, 0.7)
    assert fast[0].dtype == plain[0].dtype == torch.float32
    assert torch.allclose(fast[0], plain[0], atol=1e-5) and torch.allclose(fast[1], plain[1], atol=1e-5)


def test_temperature_matters_and_entropy_is_of_the_full_distribution():
    logits = torch.tensor([[[2.0, 1.0, 0.0, -1.0]]])
    tokens = torch.tensor([[0]])
    assert (token_logprobs(logits, tokens, 1.0)[0].item()
            != pytest.approx(token_logprobs(logits, tokens, 0.5)[0].item()))
    p = torch.softmax(logits[0, 0], -1)
    logp, h = token_logprobs(logits, tokens)
    assert h.item() == pytest.approx(-(p * p.log()).sum().item(), abs=1e-6)
    assert h.item() != pytest.approx(-logp.item(), abs=1e-3)        # not the sampled token's surprise


def test_bf16_logits_are_scored_in_float32():
    g = torch.Generator().manual_seed(1)
    logits = torch.randn(1, 4, 1000, generator=g)
    tokens = torch.randint(0, 1000, (1, 4), generator=g)
    got, _ = token_logprobs(logits.to(torch.bfloat16), tokens)
    want, _ = naive(logits.to(torch.bfloat16).double(), tokens, 1.0)
    assert got.dtype == torch.float32
    assert torch.allclose(got.double(), want, atol=1e-4)


# ----------------------------------------------------------------------------------------
# The controls of docs/METHODS.md: TR-GRPO with mean-1 weights, TEPO with GRPO's full KL beneath
# its masked one. Each off by default (the shipped numbers come from the defaults).

CONTROLS = [("tr_grpo", {"mean_one": True}), ("tepo", {"full_kl_beta": 0.03}),
            ("tr_grpo", {"inside_clip": True}), ("tepo", {"token_ratio": True}),
            ("tr_grpo", {"inside_clip": True, "mean_one": True})]


def test_tr_grpo_mean_one_weights_by_hand():
    logp, old, ref, adv, mask, _ = example()
    W = [[tr_w(0.5), tr_w(0.25), tr_w(0.8)], [tr_w(0.1), tr_w(0.6)]]
    W = [[w / (sum(row) / len(row)) for w in row] for row in W]       # each row's mean: 1
    assert W[1] == pytest.approx([1 / 1.2, 1.4 / 1.2]) and min(W[0]) < 1 < max(W[0])   # some go down
    for agg in AGGREGATIONS:
        loss, info = tr_grpo_loss(logp, old, ref, adv, mask, beta=0.04, agg=agg, mean_one=True)
        rows = [[w * s - 0.04 * k for w, s, k in zip(wr, sr, kr)] for wr, sr, kr in zip(W, SURR, KL)]
        assert loss.item() == pytest.approx(-agg_by_hand(rows, agg), abs=1e-12)
        assert info["weights"][0].tolist() == pytest.approx(W[0], abs=1e-12)
        assert info["weights"][1, :2].tolist() == pytest.approx(W[1], abs=1e-12)


def test_tepo_full_kl_beta_by_hand():
    logp, old, ref, adv, mask, entropy = example()
    s0, s1 = (1.5 * 1.0 * 0.5) ** (1 / 3), (1.25 * 0.9) ** (1 / 2)
    M = [[0.0, 1.0, 0.0], [0.0, 0.0]]
    for agg in AGGREGATIONS:
        loss, info = tepo_loss(logp, old, ref, adv, mask, entropy, beta=0.04, agg=agg, full_kl_beta=0.1)
        rows = [[s0 - 0.04 * m * k - 0.1 * k for m, k in zip(M[0], KL[0])],      # the masked token pays both
                [-0.5 * s1 - 0.04 * m * k - 0.1 * k for m, k in zip(M[1], KL[1])]]
        assert loss.item() == pytest.approx(-agg_by_hand(rows, agg), abs=1e-12)
        assert info["kl_mask"].tolist() == [[0.0, 1.0, 0.0], [0.0, 0.0, 0.0]]


def test_tepo_full_kl_beta_alone_is_grpos_kl_term():
    # With beta = 0 (no mask) the control's KL is GRPO's: the same k3 on every token.
    logp, old, ref, adv, mask, entropy = random_batch(seed=3)
    kw = dict(agg="token-mean")
    with_kl = loss_and_grad(tepo_loss, logp, old, ref, adv, mask, entropy, beta=0.0, full_kl_beta=0.04, **kw)
    without = loss_and_grad(tepo_loss, logp, old, ref, adv, mask, entropy, beta=0.0, **kw)
    grpo_kl = (loss_and_grad(grpo_loss, logp, old, ref, adv, mask, beta=0.04, **kw)[0]
               - loss_and_grad(grpo_loss, logp, old, ref, adv, mask, beta=0.0, **kw)[0])
    assert (with_kl[0] - without[0]).item() == pytest.approx(grpo_kl.item(), abs=1e-12)
    assert not torch.allclose(with_kl[1], without[1])
    with pytest.raises(ValueError, match="ref_logp"):
        tepo_loss(logp, old, None, adv, mask, entropy, beta=0.0, full_kl_beta=0.04)


@pytest.mark.parametrize("name", ALL)
def test_the_controls_are_off_by_default(name):
    # Bit for bit: the default arguments give what the shipped runs were trained with.
    logp, old, ref, adv, mask, entropy = random_batch(seed=5)
    off = {"tr_grpo": {"mean_one": False, "inside_clip": False},
           "tepo": {"full_kl_beta": 0.0, "token_ratio": False}}.get(name, {})
    a = loss_and_grad(LOSSES[name], logp, old, ref, adv, mask, entropy)
    b = loss_and_grad(LOSSES[name], logp, old, ref, adv, mask, entropy, **off)
    assert a[0].item() == b[0].item() and torch.equal(a[1], b[1])


@pytest.mark.parametrize("name,options", CONTROLS)
@pytest.mark.parametrize("agg", AGGREGATIONS)
def test_controls_match_independent_implementation(name, options, agg):
    for seed in range(3):
        logp, old, ref, adv, mask, entropy = random_batch(B=6, T=5, seed=200 + seed)
        x = logp.detach().clone().requires_grad_()
        want, w, _ = reference_loss(name, x, old, ref, adv, mask, entropy, 0.04, agg, **options)
        want.backward()
        got, grad, info = loss_and_grad(LOSSES[name], logp, old, ref, adv, mask, entropy, beta=0.04, agg=agg,
                                        **options)
        assert got.item() == pytest.approx(want.item(), rel=1e-6, abs=1e-12)
        assert torch.allclose(grad, x.grad, rtol=1e-6, atol=1e-12)
        for (i, t), v in w.items():
            assert info["weights"][i, t].item() == pytest.approx(float(v), rel=1e-6)
        if options.get("mean_one"):    # mean 1 over each row's valid tokens
            means = (info["weights"] * mask).sum(1) / mask.sum(1)
            assert torch.allclose(means, torch.ones(6), atol=1e-12)


@pytest.mark.parametrize("name,options", CONTROLS)
@pytest.mark.parametrize("agg", AGGREGATIONS)
def test_controls_are_exact_under_micro_batching_and_padding(name, options, agg):
    # Row statistics only: any split into micro-batches, each cut to its own width, and any padding
    # give the full batch's loss and gradient.
    logp, old, ref, adv, mask, entropy = random_batch(B=12, T=7, seed=4)
    kw = dict(agg=agg, max_tokens=7, **options)
    full_loss, full_grad, _ = loss_and_grad(LOSSES[name], logp, old, ref, adv, mask, entropy, **kw)
    x, total = logp.detach().clone().requires_grad_(), 0.0
    for rows in (slice(0, 5), slice(5, 6), slice(6, 12)):
        m = trim(mask[rows], mask[rows])
        loss, _ = LOSSES[name](trim(x[rows], m), trim(old[rows], m), trim(ref[rows], m), adv[rows], m,
                               trim(entropy[rows], m), **kw)
        loss = loss * microbatch_scale(agg, m, mask)
        loss.backward()
        total += loss.item()
    assert total == pytest.approx(full_loss.item(), abs=1e-12)
    assert torch.allclose(x.grad, full_grad, atol=1e-14)
    junk = 30 * torch.randn(12, 3, generator=torch.Generator().manual_seed(1))
    pad = lambda t: torch.cat([t.detach(), junk], 1)
    padded = loss_and_grad(LOSSES[name], pad(logp), pad(old), pad(ref), adv,
                           torch.cat([mask, torch.zeros(12, 3)], 1), pad(entropy), **kw)
    assert padded[0].item() == pytest.approx(full_loss.item(), abs=1e-12)
    assert torch.allclose(padded[1][:, :7], full_grad, atol=1e-14) and (padded[1][:, 7:] == 0).all()


@pytest.mark.parametrize("agg", AGGREGATIONS)
def test_gradcheck_controls(agg):
    logp, old, ref, adv, mask, entropy = random_batch(B=4, T=5)
    assert torch.autograd.gradcheck(
        lambda x: tepo_loss(x, old, ref, adv, mask, entropy, agg=agg, full_kl_beta=0.04)[0], (logp,))
    # TR-GRPO's weights are a stop-gradient function of p (see test_gradcheck_tr_grpo): flat regions only.
    p = torch.where(torch.rand(4, 5, generator=torch.Generator().manual_seed(2)) < 0.5,
                    torch.full((4, 5), 0.05), torch.full((4, 5), 0.7))
    x = (p + 0.02 * torch.rand(4, 5)).log().requires_grad_()
    f = lambda x: tr_grpo_loss(x, old, ref, adv, mask, agg=agg, mean_one=True)[0]
    assert torch.autograd.gradcheck(f, (x,))
    f = lambda x: tr_grpo_loss(x, old, ref, adv, mask, agg=agg, inside_clip=True)[0]
    assert torch.autograd.gradcheck(f, (x,))
    assert torch.autograd.gradcheck(
        lambda x: tepo_loss(x, old, ref, adv, mask, entropy, agg=agg, token_ratio=True)[0], (logp,))


def test_tr_grpo_inside_clip_by_hand():
    """min(w r A, clip(w r) A) - beta k3(w pi_ref / pi): on the example's tokens, by hand. On policy
    (r = 1) a positive-advantage token with w > 1 + eps is clipped: its surrogate is (1 + eps) A,
    a constant, and only the KL term reaches its gradient."""
    logp, old, ref, adv, mask, _ = example()
    W = [[tr_w(0.5), tr_w(0.25), tr_w(0.8)], [tr_w(0.1), tr_w(0.6)]]
    R = [[1.5, 1.0, 0.5], [1.25, 0.9]]                                 # the example's ratios
    A = [1.0, -0.5]
    rows = []
    for i in range(2):
        row = []
        for t in range(len(W[i])):
            wr = W[i][t] * R[i][t]
            surr = min(wr * A[i], min(max(wr, 0.8), 1.2) * A[i])
            d = math.log(W[i][t]) + ref[i, t].item() - logp[i, t].item()
            row.append(surr - 0.04 * (math.exp(d) - d - 1))
        rows.append(row)
    for agg in AGGREGATIONS:
        loss, info = tr_grpo_loss(logp, old, ref, adv, mask, beta=0.04, agg=agg, inside_clip=True)
        assert loss.item() == pytest.approx(-agg_by_hand(rows, agg), abs=1e-6)
        assert info["kl"].item() == pytest.approx(                      # the diagnostic: k3 against pi_ref
            grpo_loss(logp, old, ref, adv, mask, beta=0.04)[1]["kl"].item(), rel=1e-6)
    # On policy: which tokens are clipped is which have A > 0 and w > 1.2.
    x = logp.detach().clone().requires_grad_()
    loss, info = tr_grpo_loss(x, x.detach(), None, adv, mask, beta=0.0, inside_clip=True)
    loss.backward()
    w = info["weights"]
    want = (w > 1.2) & (adv[:, None] > 0) & (mask > 0)
    assert want.any() and not want.all()
    assert info["clip_frac"].item() == pytest.approx(want.sum().item() / mask.sum().item())
    assert info["clip_high_frac"].item() == info["clip_frac"].item()
    assert (x.grad[want] == 0).all() and (x.grad[~want & (mask > 0)] != 0).all()


def test_tepo_token_ratio_is_tepo_with_grpos_ratio():
    """With the per-token ratio, TEPO is GRPO's token-mean surrogate with TEPO's masked KL: with
    beta = 0, its loss and gradient are GRPO's (token-mean) exactly, on policy or off. On policy the
    sequence ratio gives the same (value 1, gradient 1 per token); off policy it does not."""
    for off_policy in (False, True):
        logp, old, ref, adv, mask, entropy = random_batch(seed=2, off_policy=off_policy)
        ours = loss_and_grad(tepo_loss, logp, old, ref, adv, mask, entropy, beta=0.0, token_ratio=True)
        grpo = loss_and_grad(grpo_loss, logp, old, ref, adv, mask, beta=0.0, agg="token-mean")
        assert ours[0].item() == pytest.approx(grpo[0].item(), abs=1e-12) and torch.allclose(ours[1], grpo[1])
        assert ours[1].abs().sum() > 0
        seq = loss_and_grad(tepo_loss, logp, old, ref, adv, mask, entropy, beta=0.0)
        assert torch.allclose(seq[0], ours[0]) != off_policy
