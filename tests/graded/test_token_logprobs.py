"""Graded: token_logprobs (losses.py). Small literal logits, values worked out by hand.

softmax(log [0.1, 0.2, 0.3, 0.4]) = [0.1, 0.2, 0.3, 0.4]; at temperature 0.5 the logits
double, so the distribution becomes [1, 4, 9, 16] / 30.
"""
import math

import pytest
import torch

from losses import token_logprobs

pytestmark = pytest.mark.part("token_logprobs")
P = [0.1, 0.2, 0.3, 0.4]
Q = [1 / 30, 4 / 30, 9 / 30, 16 / 30]                  # P at temperature 0.5
H_P = 1.2798542258                                     # -sum p ln p
H_Q = 1.0784767751


def logits_of(*rows):
    return torch.tensor([[[math.log(v) for v in row] for row in rows]])


def test_logprob_of_the_token_and_entropy_of_the_whole_distribution():
    logits = logits_of(P, P, [0.25] * 4)               # [B=1, T=3, V=4]
    logp, entropy = token_logprobs(logits, torch.tensor([[1, 3, 0]]))
    assert logp.shape == entropy.shape == (1, 3)
    assert logp[0].tolist() == pytest.approx([math.log(0.2), math.log(0.4), math.log(0.25)], abs=1e-6)
    # the entropy of the distribution, the same whichever token was sampled (not -log p of it)
    assert entropy[0].tolist() == pytest.approx([H_P, H_P, math.log(4)], abs=1e-6)


def test_temperature_divides_the_logits():
    logp, entropy = token_logprobs(logits_of(P, P), torch.tensor([[1, 3]]), temperature=0.5)
    assert logp[0].tolist() == pytest.approx([math.log(4 / 30), math.log(16 / 30)], abs=1e-6)
    assert entropy[0].tolist() == pytest.approx([H_Q, H_Q], abs=1e-6)


def test_a_batch_of_rows():
    logits = torch.tensor([[[2.0, 1.0, 0.0, -1.0], [0.0, 0.0, 0.0, 0.0], [3.0, -2.0, 0.5, 1.0]],
                           [[-1.0, 4.0, 0.0, 2.0], [1.0, 1.0, -1.0, -1.0], [0.0, 5.0, 5.0, 0.0]]])
    logp, entropy = token_logprobs(logits, torch.tensor([[0, 3, 2], [1, 0, 3]]), temperature=0.5)
    assert logp.tolist() == [pytest.approx([-0.1450779390, -1.3862943611, -5.0247891795], abs=1e-5),
                             pytest.approx([-0.0185238703, -0.7112971085, -10.6931925795], abs=1e-5)]
    assert entropy.tolist() == [pytest.approx([0.4554286229, 1.3862943611, 0.1295656853], abs=1e-5),
                                pytest.approx([0.0935219249, 0.7832419483, 0.6936465581], abs=1e-5)]


def test_large_logits_stay_accurate():
    logits = torch.tensor([[[40.0, 39.0, -40.0, 0.0, 38.5]]])
    logp, entropy = token_logprobs(logits, torch.tensor([[1]]), temperature=0.7)
    assert logp.item() == pytest.approx(-1.7338258508, abs=1e-5)
    assert entropy.item() == pytest.approx(0.7428151258, abs=1e-5)


def test_gradient_of_the_logprob_is_onehot_minus_softmax_over_temperature():
    logits = logits_of(P, P).requires_grad_()
    logp, entropy = token_logprobs(logits, torch.tensor([[1, 3]]), temperature=0.5)
    assert logp.requires_grad and not entropy.requires_grad      # the entropy carries no gradient
    (logp * torch.tensor([[1.0, -2.0]])).sum().backward()
    # (onehot(token) - Q) / 0.5, times the upstream weight 1 or -2
    assert logits.grad[0, 0].tolist() == pytest.approx([-2 / 30, 2 * 26 / 30, -18 / 30, -32 / 30], abs=1e-6)
    assert logits.grad[0, 1].tolist() == pytest.approx([4 / 30, 16 / 30, 36 / 30, -2 * 2 * 14 / 30], abs=1e-6)


def test_bf16_logits_are_scored_in_float32():
    logits = torch.tensor([[[2.0, 1.0, 0.0, -1.0]]], dtype=torch.bfloat16)   # exact in bf16
    logp, entropy = token_logprobs(logits, torch.tensor([[0]]))
    assert logp.dtype == torch.float32 and entropy.dtype == torch.float32
    assert logp.item() == pytest.approx(-0.4401896986, abs=1e-6)              # not bf16's 3 digits
    logp, _ = token_logprobs(logits.float(), torch.tensor([[0]]))
    assert logp.dtype == torch.float32
