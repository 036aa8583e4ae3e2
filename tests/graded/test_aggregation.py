"""Graded: aggregate and microbatch_scale (losses.py). Literal inputs, values worked out by hand."""
import pytest
import torch

from losses import aggregate, microbatch_scale

pytestmark = pytest.mark.part("aggregation")
AGGS = ("seq-mean-token-mean", "token-mean", "seq-mean-token-sum-norm")


def example():
    # Row 0 has 3 valid tokens, row 1 has 2 (+1 pad holding garbage that must not count).
    x = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 1000.0]], dtype=torch.float64)
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]], dtype=torch.float64)
    return x, mask


@pytest.mark.parametrize("agg,expected", [
    ("seq-mean-token-mean", (6 / 3 + 9 / 2) / 2),      # mean over rows of each row's mean = 3.25
    ("token-mean", (6 + 9) / 5),                       # mean over the 5 valid tokens = 3.0
    ("seq-mean-token-sum-norm", (6 + 9) / (2 * 3)),    # sum / (B * T) = 2.5
])
def test_each_aggregation_by_hand(agg, expected):
    x, mask = example()
    assert aggregate(x, mask, agg).item() == pytest.approx(expected, abs=1e-12)


def test_sum_norm_divides_by_max_tokens_when_given():
    x, mask = example()
    assert aggregate(x, mask, "seq-mean-token-sum-norm", max_tokens=5).item() == pytest.approx(15 / 10)
    # the two mean modes ignore max_tokens
    assert aggregate(x, mask, "token-mean", max_tokens=5).item() == pytest.approx(3.0)
    assert aggregate(x, mask, "seq-mean-token-mean", max_tokens=5).item() == pytest.approx(3.25)


def test_a_row_without_valid_tokens_adds_zero_and_still_counts():
    x = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]], dtype=torch.float64)
    mask = torch.tensor([[1.0, 1.0, 1.0], [0.0, 0.0, 0.0]], dtype=torch.float64)
    assert aggregate(x, mask, "seq-mean-token-mean").item() == pytest.approx((2.0 + 0.0) / 2)
    assert aggregate(x, mask, "token-mean").item() == pytest.approx(6 / 3)
    assert aggregate(x, mask, "seq-mean-token-sum-norm").item() == pytest.approx(6 / 6)
    nothing = torch.zeros(2, 3, dtype=torch.float64)
    for agg in AGGS:
        assert aggregate(x, nothing, agg).item() == 0.0          # no 0 / 0 = NaN


@pytest.mark.parametrize("agg,expected", [
    # d aggregate / d x: 1 / (|o_i| B), 1 / N, 1 / (B T); 0 on padding
    ("seq-mean-token-mean", [[1 / 6, 1 / 6, 1 / 6], [1 / 4, 1 / 4, 0.0]]),
    ("token-mean", [[1 / 5, 1 / 5, 1 / 5], [1 / 5, 1 / 5, 0.0]]),
    ("seq-mean-token-sum-norm", [[1 / 6, 1 / 6, 1 / 6], [1 / 6, 1 / 6, 0.0]]),
])
def test_gradient_reaches_valid_tokens_only(agg, expected):
    x, mask = example()
    x.requires_grad_()
    aggregate(x, mask, agg).backward()
    assert x.grad.tolist() == [pytest.approx(row, abs=1e-12) for row in expected]


def test_microbatch_scale_by_hand():
    batch = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    first, last = batch[:2], batch[2:]
    assert microbatch_scale("token-mean", first, batch) == pytest.approx(5 / 6)     # tokens / all tokens
    assert microbatch_scale("token-mean", last, batch) == pytest.approx(1 / 6)
    for agg in ("seq-mean-token-mean", "seq-mean-token-sum-norm"):
        assert microbatch_scale(agg, first, batch) == pytest.approx(2 / 3)          # rows / all rows
        assert microbatch_scale(agg, last, batch) == pytest.approx(1 / 3)


@pytest.mark.parametrize("agg", AGGS)
def test_scaled_micro_batches_add_up_to_the_full_batch(agg):
    x = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 7.0], [-6.0, 0.5, 9.0], [2.0, 2.0, 2.0]],
                     dtype=torch.float64)
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0], [1.0, 0.0, 0.0], [1.0, 1.0, 0.0]],
                        dtype=torch.float64)
    full = {"seq-mean-token-mean": (6 / 3 + 9 / 2 - 6 + 4 / 2) / 4,     # 0.625
            "token-mean": (6 + 9 - 6 + 4) / 8,                          # 1.625
            "seq-mean-token-sum-norm": (6 + 9 - 6 + 4) / (4 * 3)}[agg]  # 1.0833
    assert aggregate(x, mask, agg, max_tokens=3).item() == pytest.approx(full, abs=1e-12)
    total = sum(aggregate(x[rows], mask[rows], agg, max_tokens=3).item()
                * microbatch_scale(agg, mask[rows], mask)
                for rows in (slice(0, 1), slice(1, 3), slice(3, 4)))    # uneven micro-batches
    assert total == pytest.approx(full, abs=1e-12)


def test_unknown_aggregation_is_refused_by_both():
    x, mask = example()
    assert aggregate(x, mask, "token-mean").item() == pytest.approx(3.0)
    assert microbatch_scale("token-mean", mask[:1], mask) == pytest.approx(3 / 5)
    with pytest.raises(ValueError, match="unknown aggregation"):
        aggregate(x, mask, "mean")
    with pytest.raises(ValueError, match="unknown aggregation"):
        microbatch_scale("mean", mask, mask)
