"""Hidden: tepo_sequence_ratio and tepo_kl_mask (losses.py) on random inputs, against loops."""
import math

import pytest
import torch

from losses import tepo_kl_mask, tepo_sequence_ratio

from . import generator, random_mask, rng

pytestmark = pytest.mark.part("tepo")
F64 = torch.float64


def example(gen, r, empty_rows=0):
    rows, cols = r.randint(1, 7), r.randint(1, 9)
    mask = random_mask(gen, rows, cols, empty_rows=min(empty_rows, rows))
    logp = (torch.rand(rows, cols, generator=gen, dtype=F64) * -5 - 0.01).requires_grad_()
    log_ratio = torch.randn(rows, cols, generator=gen, dtype=F64) * 0.4
    log_ratio = torch.where(mask > 0, log_ratio, torch.full_like(log_ratio, 800.0))    # garbage on padding
    return logp, logp.detach() - log_ratio, mask


def sequence_ratios(logp, old, mask):
    """s_i = exp(mean over the row's valid tokens of (logp - old_logp)); 1 for a row without any."""
    out = []
    for lp, o, m in zip(logp.tolist(), old.tolist(), mask.tolist()):
        diffs = [a - b for a, b, v in zip(lp, o, m) if v]
        out.append(math.exp(sum(diffs) / len(diffs)) if diffs else 1.0)
    return out


def test_sequence_ratio_value_on_random_rows():
    gen, r = generator("value"), rng("value")
    for _ in range(30):
        logp, old, mask = example(gen, r, empty_rows=r.choice([0, 0, 1]))
        s = tepo_sequence_ratio(logp, old, mask)
        assert s.shape == logp.shape
        for i, want in enumerate(sequence_ratios(logp, old, mask)):
            valid = mask[i] > 0
            assert s[i][valid].tolist() == pytest.approx([want] * int(valid.sum()), rel=1e-10)
            if not valid.any():
                assert s[i].tolist() == pytest.approx([1.0] * mask.shape[1], abs=1e-12)


def test_each_token_gets_its_sequence_ratio_as_gradient_and_nothing_else():
    gen, r = generator("grad"), rng("grad")
    for _ in range(20):
        logp, old, mask = example(gen, r)
        upstream = torch.randn(logp.shape, generator=gen, dtype=F64) * mask
        (tepo_sequence_ratio(logp, old, mask) * upstream).sum().backward()
        want = torch.tensor(sequence_ratios(logp, old, mask), dtype=F64)[:, None] * upstream
        assert torch.isfinite(logp.grad).all()
        assert torch.allclose(logp.grad, want, rtol=1e-9, atol=1e-12)


def test_kl_mask_on_random_tokens():
    gen, r = generator("mask"), rng("mask")
    for dtype in (torch.float32, F64):
        for _ in range(20):
            rows, cols = r.randint(1, 6), r.randint(1, 9)
            mask = random_mask(gen, rows, cols).to(dtype)
            logp = (torch.rand(rows, cols, generator=gen, dtype=dtype) * -4).requires_grad_()
            entropy = torch.rand(rows, cols, generator=gen, dtype=dtype) * 4
            adv = torch.randn(rows, generator=gen, dtype=dtype)
            adv[r.randrange(rows)] = 0.0                            # A = 0 is not > 0
            m = tepo_kl_mask(logp, entropy, adv, mask)
            assert m.dtype == dtype and m.shape == (rows, cols) and not m.requires_grad
            total = logp.detach() + entropy                          # in the inputs' dtype, as the code sums
            want = [[float(adv[i] > 0 and total[i, t] > 0 and mask[i, t] > 0) for t in range(cols)]
                    for i in range(rows)]
            assert m.tolist() == want
