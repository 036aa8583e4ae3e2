"""Hidden: completion_mask (train.py) on random token ids and EOS sets, against a loop."""
import pytest
import torch

from graded import load_alone

from . import generator, rng

pytestmark = pytest.mark.part("completion_mask")
completion_mask = load_alone("train").completion_mask    # train.py without losses.py and rewards.py


def by_hand(rows, eos):
    """(mask, truncated) by walking each row: 1 up to and including the first EOS id, 0 after."""
    masks, truncated = [], []
    for row in rows:
        first = next((t for t, token in enumerate(row) if token in eos), None)
        masks.append([1.0 if first is None or t <= first else 0.0 for t in range(len(row))])
        truncated.append(first is None)
    return masks, truncated


def test_random_completions_against_a_loop():
    gen, r = generator("rows"), rng("rows")
    for _ in range(40):
        vocab = r.randint(3, 60)
        eos = r.sample(range(vocab), r.randint(1, min(3, vocab - 1)))
        b, c = r.randint(1, 8), r.randint(1, 12)
        rows = torch.randint(0, vocab, (b, c), generator=gen)
        # As generation leaves them: padding (an EOS id) after the stop.
        for i in range(b):
            stop = r.choice([None, 0, c - 1, r.randrange(c)])
            if stop is None:
                rows[i][torch.isin(rows[i], torch.tensor(eos))] = r.choice(
                    [v for v in range(vocab) if v not in eos])
            else:
                rows[i][stop] = r.choice(eos)
                rows[i][stop + 1:] = eos[0]
        mask, truncated = completion_mask(rows, eos)
        want_mask, want_truncated = by_hand(rows.tolist(), set(eos))
        assert mask.shape == rows.shape and mask.dtype.is_floating_point and truncated.dtype == torch.bool
        assert mask.tolist() == want_mask, (rows.tolist(), eos)
        assert truncated.tolist() == want_truncated


def test_the_mask_never_depends_on_what_follows_the_first_eos():
    gen, r = generator("after"), rng("after")
    for _ in range(20):
        b, c, eos = r.randint(1, 6), r.randint(2, 10), [0, r.randint(1, 9)]
        rows = torch.randint(10, 20, (b, c), generator=gen)
        stops = [r.randrange(c) for _ in range(b)]
        for i, s in enumerate(stops):
            rows[i, s] = r.choice(eos)
        mask, truncated = completion_mask(rows, eos)
        noisy = rows.clone()
        for i, s in enumerate(stops):
            noisy[i, s + 1:] = torch.randint(0, 20, (c - s - 1,), generator=gen)
        assert torch.equal(completion_mask(noisy, eos)[0], mask) and not truncated.any()
        assert mask.sum(1).tolist() == [s + 1 for s in stops]
