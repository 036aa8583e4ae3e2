"""Hidden: token_logprobs (losses.py) on random logits and temperatures, against a float64
softmax written out."""
import pytest
import torch

from losses import token_logprobs

from . import generator, rng

pytestmark = pytest.mark.part("token_logprobs")


def by_hand(logits, tokens, temperature):
    """(log p of each token, entropy, softmax) in float64: x = logits / T, p = e^x / sum e^x."""
    x = logits.double() / temperature
    x = x - x.max(-1, keepdim=True).values
    p = x.exp() / x.exp().sum(-1, keepdim=True)
    logp = p.log().gather(-1, tokens[..., None])[..., 0]
    return logp, -(p * p.log()).sum(-1), p


def random_case(gen, r, scale=3.0):
    b, t, v = r.randint(1, 3), r.randint(1, 5), r.randint(2, 40)
    logits = torch.randn(b, t, v, generator=gen) * scale
    tokens = torch.randint(0, v, (b, t), generator=gen)
    return logits, tokens, r.choice([1.0, r.uniform(0.3, 2.0)])


def test_random_logits_against_a_softmax_by_hand():
    gen, r = generator("values"), rng("values")
    for _ in range(40):
        logits, tokens, temperature = random_case(gen, r)
        logp, entropy = token_logprobs(logits, tokens, temperature)
        want_logp, want_entropy, _ = by_hand(logits, tokens, temperature)
        assert logp.shape == entropy.shape == tokens.shape
        assert logp.dtype == entropy.dtype == torch.float32
        assert torch.allclose(logp.double(), want_logp, atol=2e-5), temperature
        assert torch.allclose(entropy.double(), want_entropy, atol=2e-5), temperature


def test_the_gradient_is_onehot_minus_softmax_over_the_temperature():
    gen, r = generator("grad"), rng("grad")
    for _ in range(20):
        logits, tokens, temperature = random_case(gen, r)
        logits.requires_grad_()
        logp, entropy = token_logprobs(logits, tokens, temperature)
        assert not entropy.requires_grad
        upstream = torch.randn(tokens.shape, generator=gen)
        (logp * upstream).sum().backward()
        _, _, p = by_hand(logits.detach(), tokens, temperature)
        onehot = torch.nn.functional.one_hot(tokens, p.shape[-1]).double()
        want = (onehot - p) / temperature * upstream.double()[..., None]
        assert torch.allclose(logits.grad.double(), want, atol=2e-5)


def test_shifted_and_large_logits_and_bf16():
    """A constant added to a row changes nothing, even a large one; bf16 logits give float32
    results equal to those of the same values in float32."""
    gen, r = generator("shift"), rng("shift")
    for _ in range(15):
        logits, tokens, temperature = random_case(gen, r)
        shift = torch.rand(logits.shape[:-1] + (1,), generator=gen) * 400 - 200
        logp, entropy = token_logprobs(logits + shift, tokens, temperature)
        want_logp, want_entropy, _ = by_hand(logits, tokens, temperature)
        assert torch.allclose(logp.double(), want_logp, atol=1e-3) and torch.isfinite(entropy).all()
        assert torch.allclose(entropy.double(), want_entropy, atol=1e-3)
        half = logits.to(torch.bfloat16)
        logp, entropy = token_logprobs(half, tokens, temperature)
        assert logp.dtype == entropy.dtype == torch.float32
        want_logp, want_entropy, _ = by_hand(half.float(), tokens, temperature)
        assert torch.allclose(logp.double(), want_logp, atol=2e-5)
        assert torch.allclose(entropy.double(), want_entropy, atol=2e-5)
