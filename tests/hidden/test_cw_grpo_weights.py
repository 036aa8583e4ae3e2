"""Hidden: cw_grpo_weights (losses.py) on random groups, against the authors' computation
written out in plain Python: per group of ``group_size`` consecutive rows, log-probs centred
on their own sequence, advantages by the plain mean of the group's rows, c = lc * Ac,
sigma = the population std of c over the group's valid tokens + 1e-8,
w = exp(-c^2 / 2 sigma^2) scaled to mean 1 over the group's valid tokens."""
import math

import pytest
import torch

from losses import cw_grpo_weights

from . import generator, random_mask, rng

pytestmark = pytest.mark.part("cw_grpo_weights")
F64 = torch.float64


def by_hand(logp, adv, mask, group_size, normalise="valid"):
    """The weights of the valid tokens, row by row, as lists."""
    rows, out = len(logp), []
    size = group_size or rows
    for start in range(0, rows, size):
        l = [[v for v, m in zip(logp[i], mask[i]) if m] for i in range(start, start + size)]
        a = adv[start:start + size]
        mean_a = sum(a) / len(a)
        c = [[(v - sum(row) / len(row)) * (ai - mean_a) for v in row] for row, ai in zip(l, a)]
        flat = [x for row in c for x in row]
        mean_c = sum(flat) / len(flat)
        sigma = math.sqrt(sum((x - mean_c) ** 2 for x in flat) / len(flat)) + 1e-8
        w = [[math.exp(-x * x / (2 * sigma * sigma)) for x in row] for row in c]
        z = len(flat) if normalise == "valid" else size * max(len(row) for row in l)
        total = sum(x for row in w for x in row)
        out += [[x * z / total for x in row] for row in w]
    return out


def random_batch(gen, r):
    group_size, groups, cols = r.randint(2, 6), r.randint(1, 4), r.randint(1, 8)
    rows = group_size * groups
    mask = random_mask(gen, rows, cols)
    logp = torch.rand(rows, cols, generator=gen, dtype=F64) * -4 - 0.01
    logp = torch.where(mask > 0, logp, torch.full_like(logp, -500.0))            # garbage on padding
    adv = torch.randn(rows, generator=gen, dtype=F64)
    return logp, adv, mask, group_size


def valid(w, mask):
    return [[v for v, m in zip(row, mrow) if m] for row, mrow in zip(w.tolist(), mask.tolist())]


def test_random_groups_against_the_computation_by_hand():
    gen, r = generator("groups"), rng("groups")
    for _ in range(40):
        logp, adv, mask, group_size = random_batch(gen, r)
        w = cw_grpo_weights(logp, adv, mask, group_size)
        assert w.shape == logp.shape
        want = by_hand(logp.tolist(), adv.tolist(), mask.tolist(), group_size)
        for got_row, want_row in zip(valid(w, mask), want):
            assert got_row == pytest.approx(want_row, rel=1e-7, abs=1e-9)


def test_one_group_when_group_size_is_none_and_groups_are_independent():
    gen, r = generator("none"), rng("none")
    for _ in range(20):
        logp, adv, mask, group_size = random_batch(gen, r)
        whole = cw_grpo_weights(logp, adv, mask)
        want = by_hand(logp.tolist(), adv.tolist(), mask.tolist(), None)
        for got_row, want_row in zip(valid(whole, mask), want):
            assert got_row == pytest.approx(want_row, rel=1e-7, abs=1e-9)
        w = cw_grpo_weights(logp, adv, mask, group_size)
        changed = logp.clone()
        changed[group_size:] = changed[group_size:] - 1.0 * torch.rand(len(logp) - group_size, logp.shape[1],
                                                                           generator=gen, dtype=F64)
        first = cw_grpo_weights(changed, adv, mask, group_size)[:group_size]     # other groups do not matter
        assert torch.allclose(first * mask[:group_size], w[:group_size] * mask[:group_size],
                              rtol=1e-12, atol=1e-12)
        for rows in range(0, len(logp), group_size):                            # mean 1 per group
            part = slice(rows, rows + group_size)
            assert (w[part] * mask[part]).sum().item() == pytest.approx(mask[part].sum().item(), rel=1e-9)


def test_no_spread_gives_unit_weights_and_padded_normalisation():
    gen, r = generator("flat"), rng("flat")
    for _ in range(15):
        logp, adv, mask, group_size = random_batch(gen, r)
        equal = torch.full_like(adv, r.uniform(-1, 1))                           # equal advantages: c = 0
        assert valid(cw_grpo_weights(logp, equal, mask, group_size), mask) == \
            [[pytest.approx(1.0, abs=1e-12)] * int(m.sum()) for m in mask]
        w = cw_grpo_weights(logp, adv, mask, group_size, normalise="padded")
        want = by_hand(logp.tolist(), adv.tolist(), mask.tolist(), group_size, normalise="padded")
        for got_row, want_row in zip(valid(w, mask), want):
            assert got_row == pytest.approx(want_row, rel=1e-7, abs=1e-9)


def test_bad_arguments_are_refused():
    r = rng("errors")
    for _ in range(5):
        group_size = r.randint(3, 6)
        logp, adv, mask = (torch.zeros(group_size + 1, 3), torch.zeros(group_size + 1),
                           torch.ones(group_size + 1, 3))
        with pytest.raises(ValueError, match="group_size"):
            cw_grpo_weights(logp, adv, mask, group_size)
        with pytest.raises(ValueError, match="scope"):
            cw_grpo_weights(logp, adv, mask, scope=r.choice(["row", "token", "groups"]))
        assert cw_grpo_weights(logp, adv, mask).shape == logp.shape
