"""Graded: tr_grpo_weights (losses.py). Literal probabilities, the weights written out."""
import pytest
import torch

from losses import tr_grpo_weights

pytestmark = pytest.mark.part("tr_grpo_weights")
F64 = dict(dtype=torch.float64)


def test_default_weights_by_hand():
    # w(p) = clamp(2 * (sigmoid(9 p) - 0.25), 1.0, 1.4): e.g. p = 0.25 -> 2 * (sigmoid(2.25) - 0.25)
    p = torch.tensor([0.05, 0.1, 0.12, 0.2, 0.25, 0.3, 0.5, 0.8, 1.0], **F64)
    w = tr_grpo_weights(p.log())
    assert w.tolist() == pytest.approx(
        [1.0, 1.0, 1.0, 1.2162978702, 1.3093010702, 1.3740532879, 1.4, 1.4, 1.4], abs=1e-9)


def test_parameters_are_used():
    # alpha = 1, tau = 0.5, mu = 0, no effective clamp: w = sigmoid(2 p)
    p = torch.tensor([0.1, 0.5, 0.9], **F64)
    w = tr_grpo_weights(p.log(), alpha=1.0, tau=0.5, mu=0.0, w_min=0.0, w_max=10.0)
    assert w.tolist() == pytest.approx([0.5498339973, 0.7310585786, 0.8581489351], abs=1e-9)
    w = tr_grpo_weights(p.log(), w_min=0.5, w_max=1.3)                 # the clamp bounds move
    assert w.tolist() == pytest.approx([0.9218990, 1.3, 1.3], abs=1e-6)


def test_shape_kept_monotone_and_no_gradient():
    logp = torch.linspace(0.001, 1.0, 60, **F64).log().view(3, 4, 5).requires_grad_()
    w = tr_grpo_weights(logp)
    assert w.shape == (3, 4, 5)
    flat = w.flatten()
    assert (flat[1:] >= flat[:-1]).all()                               # non-decreasing in p
    assert flat[0].item() == 1.0 and flat[-1].item() == pytest.approx(1.4) and 1.0 < flat[13].item() < 1.4
    assert not w.requires_grad                                         # a constant for the loss
