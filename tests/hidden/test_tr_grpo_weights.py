"""Hidden: tr_grpo_weights (losses.py) on random probabilities and parameters, against math."""
import math

import pytest
import torch

from losses import tr_grpo_weights

from . import generator, rng

pytestmark = pytest.mark.part("tr_grpo_weights")


def expected(p, alpha, tau, mu, w_min, w_max):
    return min(max(alpha * (1 / (1 + math.exp(-p / tau)) - mu), w_min), w_max)


def test_default_weights_on_random_probabilities():
    gen = generator("defaults")
    for shape in [(37,), (3, 11), (2, 4, 6)]:
        p = torch.rand(shape, generator=gen, dtype=torch.float64) * 0.999 + 0.001
        w = tr_grpo_weights(p.log())
        assert w.shape == shape
        assert w.flatten().tolist() == pytest.approx([expected(v, 2.0, 1 / 9, 0.25, 1.0, 1.4)
                                                      for v in p.flatten().tolist()], abs=1e-9)


def test_random_parameters():
    gen, r = generator("params"), rng("params")
    for _ in range(30):
        alpha, tau, mu = r.uniform(0.5, 4), r.uniform(0.05, 2), r.uniform(-0.5, 0.5)
        w_min = r.uniform(-1, 1.2)
        w_max = w_min + r.uniform(0.05, 2)
        p = torch.rand(r.randint(1, 20), generator=gen, dtype=torch.float64) * 0.999 + 0.001
        w = tr_grpo_weights(p.log(), alpha=alpha, tau=tau, mu=mu, w_min=w_min, w_max=w_max)
        assert w.tolist() == pytest.approx([expected(v, alpha, tau, mu, w_min, w_max) for v in p.tolist()],
                                           abs=1e-9)
        positional = tr_grpo_weights(p.log(), alpha, tau, mu, w_min, w_max)      # the signature's order
        assert torch.allclose(positional, w, atol=1e-12)


def test_no_gradient_and_monotone_in_p():
    gen = generator("grad")
    logp = (torch.rand(4, 9, generator=gen, dtype=torch.float64) * -5).requires_grad_()
    w = tr_grpo_weights(logp)
    assert not w.requires_grad
    order = logp.detach().flatten().argsort()
    flat = w.flatten()[order]
    assert (flat[1:] >= flat[:-1]).all() and flat[-1] > flat[0] - 1e-12
    assert w.flatten().tolist() == pytest.approx([expected(math.exp(v), 2.0, 1 / 9, 0.25, 1.0, 1.4)
                                                  for v in logp.detach().flatten().tolist()], abs=1e-9)
