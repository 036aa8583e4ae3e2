"""Graded: clipped_surrogate, k3 and grpo_loss (losses.py). Literal inputs, values by hand.

grpo_loss reduces its per-token objective with ``aggregate``, which is another part. Here
``losses.aggregate`` is replaced by a stand-in that sums over valid tokens and remembers
what it was given, so this part is graded on its own whatever state ``aggregate`` is in.
"""
import math

import pytest
import torch

import losses
from losses import clipped_surrogate, grpo_loss, k3

pytestmark = pytest.mark.part("grpo_loss")
F64 = dict(dtype=torch.float64)
LN2 = math.log(2)


def test_clipped_surrogate_by_hand():
    ratio = torch.tensor([[1.5, 1.0, 0.5], [1.25, 0.9, 0.7]], **F64, requires_grad=True)
    adv = torch.tensor([[1.0], [-0.5]], **F64)
    objective, clipped = clipped_surrogate(ratio, adv, 0.2)
    # A = +1:   min(1.5, 1.2) = 1.2 (clipped)   min(1, 1) = 1       min(0.5, 0.8) = 0.5
    # A = -0.5: min(-0.625, -0.6) = -0.625      min(-0.45, -0.45)    min(-0.35, -0.4) = -0.4 (clipped)
    assert objective.tolist() == [pytest.approx([1.2, 1.0, 0.5]), pytest.approx([-0.625, -0.45, -0.4])]
    assert clipped.tolist() == [[True, False, False], [False, False, True]]
    objective.sum().backward()
    # the clipped branch carries no gradient; elsewhere d(ratio * A) / d ratio = A
    assert ratio.grad.tolist() == [pytest.approx([0.0, 1.0, 1.0]), pytest.approx([-0.5, -0.5, 0.0])]


def test_clipped_surrogate_uses_clip_eps():
    ratio = torch.tensor([[1.5, 0.5]], **F64)
    objective, clipped = clipped_surrogate(ratio, torch.tensor([[2.0]], **F64), 0.6)   # range [0.4, 1.6]
    assert objective.tolist() == [pytest.approx([3.0, 1.0])] and clipped.tolist() == [[False, False]]
    objective, clipped = clipped_surrogate(ratio, torch.tensor([[-2.0]], **F64), 0.1)  # range [0.9, 1.1]
    assert objective.tolist() == [pytest.approx([-3.0, -1.8])] and clipped.tolist() == [[False, True]]


def test_k3_by_hand():
    # k3 = e^d - d - 1 with d = ref_logp - logp: 0 at d = 0, 1 - ln 2 at d = ln 2,
    # ln 2 - 1/2 at d = -ln 2, e - 2 at d = 1. Gradient w.r.t. logp: 1 - e^d.
    logp = torch.tensor([-1.0, -2.0, -0.5, -3.0], **F64, requires_grad=True)
    ref = logp.detach() + torch.tensor([0.0, LN2, -LN2, 1.0], **F64)
    kl = k3(logp, ref)
    assert kl.tolist() == pytest.approx([0.0, 1 - LN2, LN2 - 0.5, math.e - 2], abs=1e-12)
    kl.sum().backward()
    assert logp.grad.tolist() == pytest.approx([0.0, -1.0, 0.5, 1 - math.e], abs=1e-12)


# The 2x3 example. Row 0 has 3 tokens, row 1 has 2 (+1 pad with garbage values).
#   p       row0 = [0.5, 0.25, 0.8]   row1 = [0.1, 0.6, (pad)]
#   ratio   row0 = [1.5, 1.0,  0.5]   row1 = [1.25, 0.9, (pad)]      (old_logp = logp - log ratio)
#   ref_logp - logp = d:  row0 = [0, ln 2, 0]  row1 = [0, -ln 2, (pad)]
#   A = [+1, -0.5],   eps = 0.2
def example(pad_garbage=2.0):
    p = torch.tensor([[0.5, 0.25, 0.8], [0.1, 0.6, 0.3]], **F64)
    log_ratio = torch.tensor([[1.5, 1.0, 0.5], [1.25, 0.9, 1.0]], **F64).log()
    log_ratio[1, 2] = pad_garbage
    d = torch.tensor([[0.0, LN2, 0.0], [0.0, -LN2, pad_garbage]], **F64)
    logp = p.log().requires_grad_()
    return (logp, p.log() - log_ratio, p.log() + d, torch.tensor([1.0, -0.5], **F64),
            torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]], **F64))


# per-token clipped surrogate (see test_clipped_surrogate_by_hand) and k3 on the valid tokens
SURROGATE = [[1.2, 1.0, 0.5], [-0.625, -0.45]]
K3 = [[0.0, 1 - LN2, 0.0], [0.0, LN2 - 0.5]]


@pytest.fixture
def calls(monkeypatch):
    """Replace losses.aggregate by a sum over valid tokens that records its arguments."""
    seen = []

    def sum_over_valid_tokens(x, mask, agg, max_tokens=None):
        seen.append(dict(x=x.detach().clone(), mask=mask, agg=agg, max_tokens=max_tokens))
        return (x * mask).sum()

    monkeypatch.setattr(losses, "aggregate", sum_over_valid_tokens)
    return seen


@pytest.mark.parametrize("beta", [0.0, 0.04])
def test_per_token_objective_is_surrogate_minus_beta_k3(calls, beta):
    logp, old, ref, adv, mask = example()
    loss, _ = grpo_loss(logp, old, ref, adv, mask, beta=beta, agg="token-mean", max_tokens=9)
    assert len(calls) == 1
    assert calls[0]["agg"] == "token-mean" and calls[0]["max_tokens"] == 9
    assert torch.equal(calls[0]["mask"], mask)
    x = calls[0]["x"]
    for i, row in enumerate(SURROGATE):
        want = [s - beta * k for s, k in zip(row, K3[i])]
        assert x[i, :len(row)].tolist() == pytest.approx(want, abs=1e-12)
    # the loss is minus the aggregate: -(1.2 + 1 + 0.5 - 0.625 - 0.45) + beta * (k3 sum = 0.5)
    assert loss.item() == pytest.approx(-1.625 + beta * 0.5, abs=1e-12)


def test_defaults_are_forwarded(calls):
    logp, old, ref, adv, mask = example()
    loss, _ = grpo_loss(logp, old, ref, adv, mask)
    assert calls[0]["agg"] == "seq-mean-token-mean" and calls[0]["max_tokens"] is None
    assert loss.item() == pytest.approx(-1.625 + 0.04 * 0.5, abs=1e-12)     # beta = 0.04, eps = 0.2
    grpo_loss(logp, old, ref, adv, mask, clip_eps=0.6, beta=0.0)
    assert calls[1]["x"][0, 0].item() == pytest.approx(1.5)                  # no clipping at 1.5 now


def test_gradient_by_hand(calls):
    logp, old, ref, adv, mask = example()
    loss, _ = grpo_loss(logp, old, ref, adv, mask, beta=0.04)
    loss.backward()
    # d loss / d logp = -A * ratio where the surrogate is not clipped (0 where it is),
    # plus beta * (1 - e^d) from k3; 0 on padding.
    expected = [[0.0, -1.0 - 0.04, -0.5],
                [0.5 * 1.25, 0.5 * 0.9 + 0.04 * 0.5, 0.0]]
    assert logp.grad.tolist() == [pytest.approx(row, abs=1e-12) for row in expected]


def test_info_holds_the_diagnostics(calls):
    logp, old, ref, adv, mask = example()
    _, info = grpo_loss(logp, old, ref, adv, mask, beta=0.0)
    assert {"weights", "clip_frac", "kl", "ratio_mean"} <= set(info)
    assert info["clip_frac"].item() == pytest.approx(1 / 5)                  # one clipped token of 5
    assert info["ratio_mean"].item() == pytest.approx((1.5 + 1.0 + 0.5 + 1.25 + 0.9) / 5)
    assert info["kl"].item() == pytest.approx(0.5 / 5)                       # mean k3, whatever beta
    assert torch.equal(info["weights"], torch.ones(2, 3, **F64))
    assert not any(v.requires_grad for v in info.values())


def test_garbage_on_padding_changes_nothing(calls):
    # exp(1000) = inf: 0 * inf = NaN if not zeroed first
    logp, old, ref, adv, mask = example(pad_garbage=1000.0)
    loss, _ = grpo_loss(logp, old, ref, adv, mask, beta=0.04)
    loss.backward()
    assert loss.item() == pytest.approx(-1.625 + 0.04 * 0.5, abs=1e-12)
    assert torch.isfinite(logp.grad).all() and logp.grad[1, 2].item() == 0.0


def test_reference_is_needed_only_when_beta_is_positive(calls):
    logp, old, _, adv, mask = example()
    with pytest.raises(ValueError, match="ref_logp"):
        grpo_loss(logp, old, None, adv, mask, beta=0.04)
    loss, info = grpo_loss(logp, old, None, adv, mask, beta=0.0)
    assert loss.item() == pytest.approx(-1.625, abs=1e-12) and info["kl"].item() == 0.0
