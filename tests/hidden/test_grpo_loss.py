"""Hidden: clipped_surrogate, k3 and grpo_loss (losses.py) on random inputs, against the
formulas written out in float64. As in the visible tests, ``losses.aggregate`` (another
part) is replaced by a sum over valid tokens that records what it was given."""
import math

import pytest
import torch

import losses
from losses import clipped_surrogate, grpo_loss, k3

from . import generator, random_mask, rng

pytestmark = pytest.mark.part("grpo_loss")
F64 = torch.float64


def nonzero_advantages(gen, n):
    a = torch.randn(n, generator=gen, dtype=F64)
    return torch.where(a.abs() < 0.05, torch.full_like(a, 0.5), a)


def test_clipped_surrogate_on_random_ratios():
    gen, r = generator("surrogate"), rng("surrogate")
    for _ in range(30):
        eps, rows, cols = r.uniform(0.05, 0.5), r.randint(1, 6), r.randint(1, 8)
        ratio = (torch.rand(rows, cols, generator=gen, dtype=F64) * 1.6 + 0.3).requires_grad_()
        adv = nonzero_advantages(gen, rows)[:, None]
        objective, clipped = clipped_surrogate(ratio, adv, eps)
        for i in range(rows):
            a = adv[i, 0].item()
            for t in range(cols):
                q = ratio[i, t].item()
                plain, cut = q * a, min(max(q, 1 - eps), 1 + eps) * a
                assert objective[i, t].item() == pytest.approx(min(plain, cut), abs=1e-12)
                assert bool(clipped[i, t]) == (cut < plain)
        objective.sum().backward()
        assert torch.allclose(ratio.grad, torch.where(clipped, 0.0, adv.expand(rows, cols)), atol=1e-12)


def test_k3_on_random_log_probs():
    gen = generator("k3")
    logp = (torch.rand(50, generator=gen, dtype=F64) * -6).requires_grad_()
    ref = logp.detach() + torch.randn(50, generator=gen, dtype=F64)
    kl = k3(logp, ref)
    d = (ref - logp.detach()).tolist()
    assert kl.tolist() == pytest.approx([math.exp(x) - x - 1 for x in d], abs=1e-12)
    assert (kl >= 0).all()
    kl.sum().backward()
    assert logp.grad.tolist() == pytest.approx([1 - math.exp(x) for x in d], abs=1e-12)


@pytest.fixture
def calls(monkeypatch):
    seen = []

    def sum_over_valid_tokens(x, mask, agg, max_tokens=None):
        seen.append(dict(x=x.detach().clone(), mask=mask, agg=agg, max_tokens=max_tokens))
        return (x * mask).sum()

    monkeypatch.setattr(losses, "aggregate", sum_over_valid_tokens)
    return seen


def random_example(gen, r):
    rows, cols = r.randint(1, 6), r.randint(1, 8)
    mask = random_mask(gen, rows, cols)
    logp = (torch.rand(rows, cols, generator=gen, dtype=F64) * -4 - 0.01).requires_grad_()
    log_ratio = torch.randn(rows, cols, generator=gen, dtype=F64) * 0.3
    # Garbage on padding.
    old = torch.where(mask > 0, logp.detach() - log_ratio, torch.full_like(log_ratio, -900.0))
    ref = torch.where(mask > 0, logp.detach() + torch.randn(rows, cols, generator=gen, dtype=F64) * 0.5,
                      torch.full_like(log_ratio, 900.0))
    return logp, old, ref, nonzero_advantages(gen, rows), mask


def objective_by_hand(logp, old, ref, adv, mask, eps, beta):
    """(per-token objective, d objective / d logp, clipped, ratio, k3) on valid tokens, from the formulas."""
    ratio = torch.exp(logp.detach() - old)
    plain, cut = ratio * adv[:, None], ratio.clamp(1 - eps, 1 + eps) * adv[:, None]
    clipped = cut < plain
    d = ref - logp.detach()
    kl = torch.exp(d) - d - 1
    objective = torch.minimum(plain, cut) - beta * kl
    grad = torch.where(clipped, 0.0, adv[:, None] * ratio) - beta * (1 - torch.exp(d))
    valid = mask > 0
    return objective[valid], grad[valid], clipped[valid], ratio[valid], kl[valid]


def test_random_batches_against_the_formula(calls):
    gen, r = generator("loss"), rng("loss")
    for _ in range(30):
        logp, old, ref, adv, mask = random_example(gen, r)
        eps, beta = r.uniform(0.05, 0.4), r.choice([0.0, r.uniform(0.01, 0.5)])
        agg, max_tokens = (r.choice(["seq-mean-token-mean", "token-mean", "seq-mean-token-sum-norm"]),
                           r.randint(1, 99))
        logp.grad = None
        loss, info = grpo_loss(logp, old, ref, adv, mask, clip_eps=eps, beta=beta, agg=agg,
                               max_tokens=max_tokens)
        objective, grad, clipped, ratio, kl = objective_by_hand(logp, old, ref, adv, mask, eps, beta)
        seen = calls[-1]
        assert seen["agg"] == agg and seen["max_tokens"] == max_tokens and torch.equal(seen["mask"], mask)
        assert torch.allclose(seen["x"][mask > 0], objective, atol=1e-10)
        assert loss.item() == pytest.approx(-objective.sum().item(), abs=1e-9)
        loss.backward()
        assert torch.isfinite(logp.grad).all()
        assert torch.allclose(logp.grad[mask > 0], -grad, atol=1e-10)
        assert (logp.grad[mask == 0] == 0).all()
        n = mask.sum().item()
        assert info["clip_frac"].item() == pytest.approx(clipped.double().sum().item() / n, abs=1e-12)
        assert info["ratio_mean"].item() == pytest.approx(ratio.sum().item() / n, abs=1e-10)
        assert info["kl"].item() == pytest.approx(kl.sum().item() / n, abs=1e-10)
        assert torch.equal(info["weights"], torch.ones_like(logp.detach()))
        assert not any(v.requires_grad for v in info.values())


def test_without_a_reference_beta_must_be_zero(calls):
    gen, r = generator("noref"), rng("noref")
    for _ in range(5):
        logp, old, _, adv, mask = random_example(gen, r)
        loss, info = grpo_loss(logp, old, None, adv, mask, beta=0.0)
        objective = objective_by_hand(logp, old, logp.detach(), adv, mask, 0.2, 0.0)[0]
        assert loss.item() == pytest.approx(-objective.sum().item(), abs=1e-9) and info["kl"].item() == 0.0
        with pytest.raises(ValueError, match="ref_logp"):
            grpo_loss(logp, old, None, adv, mask, beta=r.uniform(0.01, 1))
