"""Hidden: aggregate and microbatch_scale (losses.py) on random batches, against loops."""
import pytest
import torch

from losses import aggregate, microbatch_scale

from . import generator, random_mask, rng

pytestmark = pytest.mark.part("aggregation")
AGGS = ("seq-mean-token-mean", "token-mean", "seq-mean-token-sum-norm")


def expected(x, mask, agg, max_tokens=None):
    """The three aggregations as loops over rows and valid tokens, in plain Python."""
    rows = [[v for v, m in zip(xr, mr) if m] for xr, mr in zip(x.tolist(), mask.tolist())]
    if agg == "seq-mean-token-mean":
        return sum(sum(r) / len(r) if r else 0.0 for r in rows) / len(rows)
    if agg == "token-mean":
        n = sum(len(r) for r in rows)
        return sum(sum(r) for r in rows) / n if n else 0.0
    return sum(sum(r) for r in rows) / (len(rows) * (max_tokens or x.shape[1]))


def batch(gen, r):
    rows, cols = r.randint(1, 9), r.randint(1, 12)
    mask = random_mask(gen, rows, cols, empty_rows=r.choice([0, 0, 1]) if rows > 1 else 0)
    x = torch.randn(rows, cols, generator=gen, dtype=torch.float64) * 3
    x = torch.where(mask > 0, x, torch.full_like(x, 1e6))           # finite garbage on padding
    return x, mask


@pytest.mark.parametrize("agg", AGGS)
def test_random_batches_against_loops(agg):
    gen, r = generator(f"value-{agg}"), rng(f"value-{agg}")
    for _ in range(40):
        x, mask = batch(gen, r)
        max_tokens = r.choice([None, x.shape[1] + r.randint(0, 20)])
        got = aggregate(x, mask, agg, max_tokens)
        assert got.dim() == 0
        assert got.item() == pytest.approx(expected(x, mask, agg, max_tokens), rel=1e-9, abs=1e-12)


@pytest.mark.parametrize("agg", AGGS)
def test_gradient_is_the_derivative_of_the_loop(agg):
    """d aggregate / d x[i, t]: 1 / (|o_i| B), 1 / N or 1 / (B T) on valid tokens, 0 on padding."""
    gen, r = generator(f"grad-{agg}"), rng(f"grad-{agg}")
    for _ in range(15):
        x, mask = batch(gen, r)
        max_tokens = r.choice([None, x.shape[1] + 3])
        x.requires_grad_()
        aggregate(x, mask, agg, max_tokens).backward()
        lengths, n, (rows, cols) = mask.sum(1), mask.sum(), mask.shape
        if agg == "seq-mean-token-mean":
            want = mask / (lengths.clamp(min=1)[:, None] * rows)
        elif agg == "token-mean":
            want = mask / n.clamp(min=1)
        else:
            want = mask / (rows * (max_tokens or cols))
        assert torch.allclose(x.grad, want, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("agg", AGGS)
def test_random_micro_batches_add_up_to_the_full_batch(agg):
    gen, r = generator(f"micro-{agg}"), rng(f"micro-{agg}")
    for _ in range(30):
        rows, cols = r.randint(2, 12), r.randint(1, 10)
        mask = random_mask(gen, rows, cols)
        x = torch.randn(rows, cols, generator=gen, dtype=torch.float64)
        cuts = sorted(r.sample(range(1, rows), r.randint(1, min(4, rows - 1))))
        pieces = [slice(a, b) for a, b in zip([0] + cuts, cuts + [rows])]
        scales = [microbatch_scale(agg, mask[p], mask) for p in pieces]
        if agg == "token-mean":
            assert scales == pytest.approx([mask[p].sum().item() / mask.sum().item() for p in pieces],
                                           rel=1e-12)
        else:
            assert scales == pytest.approx([(p.stop - p.start) / rows for p in pieces], rel=1e-12)
        total = sum(aggregate(x[p], mask[p], agg, cols).item() * s for p, s in zip(pieces, scales))
        assert total == pytest.approx(aggregate(x, mask, agg, cols).item(), rel=1e-9, abs=1e-12)
        assert total == pytest.approx(expected(x, mask, agg, cols), rel=1e-9, abs=1e-12)


def test_any_other_aggregation_is_refused_by_both():
    r = rng("unknown")
    x, mask = torch.ones(2, 3), torch.ones(2, 3)
    for name in ["mean", "sum", "token_mean", "seq-mean", "TOKEN-MEAN", "seq-mean-token-sum",
                 "".join(r.choice("abcdefgh-") for _ in range(10))]:
        with pytest.raises(ValueError, match="unknown aggregation"):
            aggregate(x, mask, name)
        with pytest.raises(ValueError, match="unknown aggregation"):
            microbatch_scale(name, mask, mask)
    assert (aggregate(x, mask, "token-mean").item() == 1.0
            and microbatch_scale("token-mean", mask[:1], mask) == 0.5)
