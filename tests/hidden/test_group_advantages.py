"""Hidden: group_advantages (losses.py) on random rewards, against plain Python statistics."""
import statistics

import pytest
import torch

from losses import group_advantages

from . import rng

pytestmark = pytest.mark.part("group_advantages")


def expected(rewards, group_size, scale_std=True):
    """The specification in plain Python: per group of consecutive rows, (r - mean) / (sample std
    + 1e-4), or r - mean without the std; exactly 0 for a group whose rewards are all equal."""
    out = []
    for start in range(0, len(rewards), group_size):
        group = rewards[start:start + group_size]
        if len(set(group)) == 1:
            out += [0.0] * group_size
            continue
        mean = statistics.fmean(group)
        scale = statistics.stdev(group) + 1e-4 if scale_std else 1.0
        out += [(r - mean) / scale for r in group]
    return out


def random_rewards(r, n):
    """Rewards as train.py makes them (0, 0.1, 1, 1.1) or any real number, mixed."""
    if r.random() < 0.5:
        return [r.choice([0.0, 0.1, 1.0, 1.1]) for _ in range(n)]
    return [round(r.uniform(-3, 3), 6) for _ in range(n)]


@pytest.mark.parametrize("scale_std", [True, False])
def test_random_groups_against_plain_python(scale_std):
    r = rng(f"groups-{scale_std}")
    for _ in range(40):
        group_size, groups = r.randint(2, 9), r.randint(1, 6)
        rewards = random_rewards(r, group_size * groups)
        if r.random() < 0.3:                                     # a group whose rewards are all equal
            k = r.randrange(groups)
            rewards[k * group_size:(k + 1) * group_size] = [r.choice([0.0, 1.0, 0.7])] * group_size
        adv = group_advantages(torch.tensor(rewards, dtype=torch.float64), group_size, scale_std=scale_std)
        assert adv.shape == (len(rewards),)
        assert adv.tolist() == pytest.approx(expected(rewards, group_size, scale_std), abs=1e-9), \
            (rewards, group_size)


def test_equal_groups_are_exactly_zero_in_float32():
    """0.1 * 3 / 3 != 0.1 in float32: a rounding residue divided by 1e-4 is not 0, nor is 0 / 0."""
    r = rng("equal")
    for _ in range(30):
        group_size, groups = r.randint(2, 8), r.randint(2, 5)
        rewards = random_rewards(r, group_size * groups)
        equal = r.randrange(groups)
        rewards[equal * group_size:(equal + 1) * group_size] = [r.choice([0.1, 1.1, 0.3, 0.0])] * group_size
        other = (equal + 1) % groups
        rewards[other * group_size] = rewards[other * group_size + 1] + 1.0      # a group with spread
        adv = group_advantages(torch.tensor(rewards, dtype=torch.float32), group_size)
        assert adv[equal * group_size:(equal + 1) * group_size].tolist() == [0.0] * group_size
        assert torch.isfinite(adv).all()
        want = expected(rewards, group_size)[other * group_size:(other + 1) * group_size]
        assert (adv[other * group_size:(other + 1) * group_size].tolist()
                == pytest.approx(want, rel=1e-4, abs=1e-5))


def test_properties_of_group_relative_advantages():
    """Permuting a group permutes its advantages; shifting a group's rewards changes nothing;
    another group's rewards do not matter; with the std, scaling a group's rewards changes nothing."""
    r = rng("properties")
    for _ in range(20):
        group_size, groups = r.randint(3, 8), r.randint(2, 4)
        rewards = torch.tensor([r.uniform(-2, 2) for _ in range(group_size * groups)], dtype=torch.float64)
        adv = group_advantages(rewards, group_size)
        assert adv.tolist() == pytest.approx(expected(rewards.tolist(), group_size), abs=1e-9)
        perm = torch.randperm(group_size, generator=torch.Generator().manual_seed(r.randrange(10 ** 6)))
        permuted = rewards.clone()
        permuted[:group_size] = rewards[:group_size][perm]
        assert group_advantages(permuted, group_size)[:group_size].tolist() == \
            pytest.approx(adv[:group_size][perm].tolist(), abs=1e-9)
        moved = rewards.clone()
        moved[:group_size] = 3.0 * rewards[:group_size] + r.uniform(-5, 5)
        moved[-group_size:] = torch.tensor([r.uniform(-2, 2) for _ in range(group_size)], dtype=torch.float64)
        new = group_advantages(moved, group_size)
        assert new[:group_size].tolist() == pytest.approx(adv[:group_size].tolist(), abs=1e-3)  # (std + 1e-4)
        if groups > 2:
            assert new[group_size:-group_size].tolist() == pytest.approx(
                adv[group_size:-group_size].tolist(), abs=1e-12)
        assert group_advantages(rewards, group_size).sum().item() == pytest.approx(0.0, abs=1e-9)


def test_bad_inputs_are_refused():
    r = rng("errors")
    for _ in range(10):
        group_size = r.randint(2, 7)
        assert group_advantages(torch.tensor([1.0, 0.0] * group_size), group_size).shape == (2 * group_size,)
        with pytest.raises(ValueError, match="multiple"):
            group_advantages(torch.zeros(group_size * r.randint(1, 4) + r.randint(1, group_size - 1)),
                             group_size)
        with pytest.raises(ValueError, match="multiple"):
            group_advantages(torch.zeros(r.randint(1, 3), group_size), group_size)
        with pytest.raises(ValueError, match=">= 2"):
            group_advantages(torch.zeros(group_size), r.choice([0, 1]))
