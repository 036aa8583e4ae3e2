"""Tests for experiments/stats.py: the t distribution against printed tables and closed forms,
intervals and p-values worked by hand, properties (symmetry, shifts), and the seed counts against
Cohen's tables and an exact noncentral-t power computed here by numerical integration."""
import itertools
import math
import statistics

import pytest

from experiments import stats
from experiments.stats import (band, compare, diff_ci, format_comparison, format_mean, mean_ci,
                               paired_diff_ci, permutation_p, seeds_needed, t_cdf, t_quantile, welch_p)


# ----------------------------------------------------------------------------------------
# Student's t

@pytest.mark.parametrize("df, table", [(1, 12.7062), (2, 4.3027), (4, 2.7764), (8, 2.3060), (30, 2.0423)])
def test_t_quantile_matches_the_printed_table(df, table):
    assert round(t_quantile(0.975, df), 4) == table


@pytest.mark.parametrize("p", [0.6, 0.8, 0.9, 0.975, 0.995, 0.9995])
def test_t_quantile_matches_the_closed_forms_of_one_and_two_degrees_of_freedom(p):
    # df = 1 is the Cauchy distribution: t = tan(pi (p - 1/2)); df = 2: t = (2p - 1) / sqrt(2 p (1 - p)).
    assert t_quantile(p, 1) == pytest.approx(math.tan(math.pi * (p - 0.5)), rel=1e-9)
    assert t_quantile(p, 2) == pytest.approx((2 * p - 1) / math.sqrt(2 * p * (1 - p)), rel=1e-9)


@pytest.mark.parametrize("df", [1, 2.9411764705882355, 7.5, 100])
def test_t_quantile_inverts_t_cdf_and_is_symmetric(df):
    for p in (0.01, 0.2, 0.5, 0.8, 0.975):
        assert t_cdf(t_quantile(p, df), df) == pytest.approx(p, abs=1e-12)
        assert t_quantile(1 - p, df) == pytest.approx(-t_quantile(p, df), abs=1e-9)
    assert t_cdf(0.0, df) == 0.5


def test_t_tends_to_the_normal_with_many_degrees_of_freedom():
    z = statistics.NormalDist().inv_cdf(0.975)
    assert t_quantile(0.975, 1e5) == pytest.approx(z, abs=3e-5)
    assert t_quantile(0.975, 1e7) == pytest.approx(z, abs=1e-6)        # the last df computed as t
    assert t_quantile(0.975, 1.01e7) == pytest.approx(z, abs=1e-9)     # past it: the normal itself


def test_t_rejects_impossible_arguments():
    with pytest.raises(ValueError, match="strictly between 0 and 1"):
        t_quantile(1.0, 3)
    with pytest.raises(ValueError, match="degrees of freedom"):
        t_cdf(1.0, 0)


# ----------------------------------------------------------------------------------------
# Intervals

def test_mean_ci_worked_by_hand():
    # 0.60, 0.65, 0.70: mean 0.65; deviations -0.05, 0, +0.05, so s^2 = 0.005 / 2 = 0.0025, s = 0.05;
    # se = 0.05 / sqrt(3) = 0.0288675; t_{0.975, 2} = 4.302653; half-width 0.124207;
    # the interval is 0.525793 to 0.774207.
    m = mean_ci([0.60, 0.65, 0.70])
    assert m.value == pytest.approx(0.65)
    assert (m.lo, m.hi) == (pytest.approx(0.525793, abs=1e-6), pytest.approx(0.774207, abs=1e-6))
    assert m.df == 2


def test_mean_ci_of_one_seed_has_no_interval_and_of_none_is_an_error():
    assert mean_ci([0.7]) == (0.7, None, None, None)
    with pytest.raises(ValueError, match="no values"):
        mean_ci([])
    with pytest.raises(ValueError, match="finite"):
        mean_ci([0.5, math.nan])
    with pytest.raises(ValueError, match="level"):
        mean_ci([1, 2], level=95)


def test_a_wider_level_gives_a_wider_interval_around_the_same_mean():
    values = [0.3, 0.5, 0.45, 0.6]
    narrow, wide = mean_ci(values, 0.8), mean_ci(values, 0.99)
    assert narrow.value == wide.value
    assert wide.lo < narrow.lo < narrow.value < narrow.hi < wide.hi


def test_diff_ci_worked_by_hand():
    # a = 1, 2, 3 and b = 4, 5, 6: diff = 2 - 5 = -3; each s^2 = 1, so se^2 = 1/3 + 1/3, se = 0.816497.
    # Welch's df = (2/3)^2 / ((1/3)^2 / 2 + (1/3)^2 / 2) = (4/9) / (1/9) = 4; t_{0.975, 4} = 2.776445;
    # half-width 2.266958: the interval is -5.266958 to -0.733042.
    d = diff_ci([1, 2, 3], [4, 5, 6])
    assert d.value == -3 and d.df == pytest.approx(4)
    assert (d.lo, d.hi) == (pytest.approx(-5.266958, abs=1e-6), pytest.approx(-0.733042, abs=1e-6))


def test_diff_ci_uses_welchs_degrees_of_freedom_for_unequal_spreads():
    # a = 1, 2, 3 (s^2 = 1), b = 2, 4, 6 (s^2 = 4): se^2 = 1/3 + 4/3 = 5/3;
    # df = (5/3)^2 / ((1/3)^2 / 2 + (4/3)^2 / 2) = (25/9) / (17/18) = 50/17 = 2.94.
    d = diff_ci([1, 2, 3], [2, 4, 6])
    assert d.df == pytest.approx(50 / 17)
    assert d.hi - d.value == pytest.approx(t_quantile(0.975, 50 / 17) * math.sqrt(5 / 3))


def test_diff_ci_edge_cases():
    assert diff_ci([0.5], [0.2, 0.3]) == (pytest.approx(0.25), None, None, None)
    assert diff_ci([1, 1], [0, 0, 0]) == (1, 1, 1, 3)          # no spread at all: the difference itself
    with pytest.raises(ValueError, match="at least one seed"):
        diff_ci([], [1, 2])


def test_welch_p_goes_with_the_interval():
    a, b = [0.765, 0.695, 0.675], [0.695, 0.695, 0.545]
    d = diff_ci(a, b)
    half = t_quantile(0.975, d.df)
    assert welch_p(a, b) == pytest.approx(2 * t_cdf(-d.value / ((d.hi - d.value) / half), d.df))
    for shift in (0.0, 0.05, 0.1, 0.2, 0.3):         # resolved by the interval <=> p < 0.05
        d = diff_ci([x + shift for x in a], b)
        assert (d.lo > 0) == (welch_p([x + shift for x in a], b) < 0.05)
    assert welch_p([1], [2, 3]) is None


def test_paired_diff_ci_is_the_interval_of_the_per_seed_differences():
    a, b = [0.7, 0.6, 0.8], [0.65, 0.5, 0.7]       # differences 0.05, 0.1, 0.1
    assert paired_diff_ci(a, b) == pytest.approx(mean_ci([0.05, 0.1, 0.1]), abs=1e-12)
    with pytest.raises(ValueError, match="as many seeds"):
        paired_diff_ci([1, 2], [1, 2, 3])


# ----------------------------------------------------------------------------------------
# The permutation test

def test_permutation_p_of_fully_separated_groups():
    assert permutation_p([1, 2, 3], [4, 5, 6]) == 2 / 20          # the floor of 3 against 3: 0.10
    assert permutation_p([0.1, 0.2, 0.3, 0.4, 0.5], [1, 2, 3, 4, 5]) == 2 / 252
    assert permutation_p([1, 2, 3], [4, 5, 6]) == 0.1


def test_permutation_p_worked_by_hand():
    # a = 0, 1 and b = 2, 3, 5: pooled sum 11, so a split whose first group sums to s has
    # diff = s/2 - (11 - s)/3 = (5s - 22)/6; observed s = 1: |diff| = 17/6. The 10 pairs sum to
    # 1, 2, 3, 5, 3, 4, 6, 5, 7, 8, and |5s - 22| >= 17 for s = 1 and s = 8 only: p = 2/10.
    assert permutation_p([0, 1], [2, 3, 5]) == pytest.approx(0.2)


def test_permutation_p_against_plain_enumeration_with_ties():
    a, b = [0.765, 0.695, 0.675, 0.7], [0.695, 0.695, 0.545]     # 0.695 in both groups
    pooled, observed = a + b, abs(statistics.mean(a) - statistics.mean(b))
    count = 0
    for chosen in itertools.combinations(range(7), 4):
        x = [pooled[i] for i in chosen]
        y = [pooled[i] for i in range(7) if i not in chosen]
        count += abs(statistics.mean(x) - statistics.mean(y)) >= observed - 1e-12
    assert permutation_p(a, b) == count / 35


def test_permutation_p_properties():
    a, b = [0.3, 0.55, 0.41, 0.62], [0.2, 0.35, 0.5]
    p = permutation_p(a, b)
    assert 0 < p <= 1
    assert permutation_p(b, a) == p                                        # symmetric in a and b
    assert permutation_p([x + 7.25 for x in a], [x + 7.25 for x in b]) == p    # a shift of both
    assert permutation_p([x * 3 for x in a], [x * 3 for x in b]) == p          # a change of units
    assert permutation_p(a, a) == 1.0 and permutation_p([0.5] * 3, [0.5] * 3) == 1.0
    assert permutation_p([0.1, 0.7, 0.3], [0.3, 0.1, 0.7]) == 1.0          # the same seeds reordered


def test_permutation_p_refuses_a_count_it_cannot_enumerate():
    with pytest.raises(ValueError, match="max_relabellings"):
        permutation_p(range(20), range(20))


# ----------------------------------------------------------------------------------------
# Seeds needed

def exact_power(n, effect, alpha=0.05, points=4000):
    """The power of the two-sided two-sample t-test with n seeds per arm at effect size d / sd, from
    the noncentral t: T = (Z + delta) / sqrt(V / df) with delta = effect sqrt(n / 2), df = 2n - 2,
    V chi-square. P(|T| > c) = E_V[P(Z > c u - delta) + P(Z < -c u - delta)], u = sqrt(V / df),
    integrated over V by Simpson's rule."""
    df, z = 2 * n - 2, statistics.NormalDist()
    c, delta = t_quantile(1 - alpha / 2, df), effect * math.sqrt(n / 2)
    log_norm = -(df / 2) * math.log(2) - math.lgamma(df / 2)

    def density(v):          # chi-square with df degrees of freedom
        return math.exp(log_norm + (df / 2 - 1) * math.log(v) - v / 2) if v > 0 else 0.0
    top = df + 40 * math.sqrt(2 * df)
    h = top / points
    total = 0.0
    for i in range(points + 1):
        v = i * h
        u = math.sqrt(v / df)
        rejects = 1 - z.cdf(c * u - delta) + z.cdf(-c * u - delta)
        total += (1 if i in (0, points) else 4 if i % 2 else 2) * density(v) * rejects
    return total * h / 3


def test_exact_power_reproduces_a_known_value():
    # Cohen's table: d = 1 with 17 per arm has power 0.81, with 16 about 0.78.
    assert exact_power(17, 1.0) == pytest.approx(0.807, abs=0.002)
    assert exact_power(16, 1.0) == pytest.approx(0.781, abs=0.002)


def test_seeds_needed_worked_by_hand():
    # d = sd: the normal formula gives 2 (1.959964 + 0.841621)^2 = 15.70, so 16; the t correction
    # (n = 17: df = 32, t_{0.975} = 2.0369, t_{0.8} = 0.8530, 2 (2.8899)^2 = 16.70 <= 17) gives 17.
    assert 2 * (1.959964 + 0.841621) ** 2 == pytest.approx(15.70, abs=0.01)
    a, b = [1, 2, 3], [0, 1, 2]          # d = 1, pooled sd = 1
    assert stats.pooled_sd(a, b) == 1
    assert seeds_needed(a, b) == 17


@pytest.mark.parametrize("effect, cohen", [(1.0, 17), (0.8, 26), (0.5, 64)])
def test_seeds_needed_matches_cohens_table_and_the_exact_power(effect, cohen):
    a, b = [effect + x for x in (-1, 0, 1)], [-1, 0, 1]
    n = seeds_needed(a, b)
    assert n == cohen
    assert exact_power(n, effect) >= 0.8 > exact_power(n - 1, effect)


def test_seeds_needed_edge_cases():
    assert seeds_needed([1, 2, 3], [3, 2, 1]) == math.inf         # no difference: never detected
    assert seeds_needed([1], [2]) is None                          # no spread to measure
    assert seeds_needed([1, 1], [2, 2]) == 2                       # no spread at all
    assert seeds_needed([1, 2, 3], [0, 1, 2], power=0.9) > 17      # more power costs more seeds
    assert seeds_needed([2, 3, 4], [0, 1, 2]) < 17                 # a larger difference costs fewer
    # A tiny difference needs the normal formula's count, 2 (2.8016 / 1e-6)^2 = 1.57e13 seeds.
    tiny = [x + 1e-6 for x in (0, 1, 2)]
    assert seeds_needed(tiny, [0, 1, 2]) == pytest.approx(2 * (2.801585 / 1e-6) ** 2, rel=1e-5)


# ----------------------------------------------------------------------------------------
# compare, the cells, the band

def test_compare_gathers_the_quantities_and_is_antisymmetric():
    a, b = [0.765, 0.695, 0.675], [0.695, 0.695, 0.545]
    c, r = compare(a, b), compare(b, a)
    d = diff_ci(a, b)
    assert (c.diff, c.lo, c.hi) == (d.value, d.lo, d.hi)
    assert (c.p, c.n_needed) == (permutation_p(a, b), seeds_needed(a, b))
    assert (c.resolved, c.n_a, c.n_b) == (False, 3, 3)
    assert (r.diff, r.lo, r.hi) == (pytest.approx(-c.diff), pytest.approx(-c.hi), pytest.approx(-c.lo))
    assert (r.p, r.n_needed) == (c.p, c.n_needed)
    assert compare([1, 2, 3], [4, 5, 6]).resolved                  # the interval excludes 0 (p is 0.10)
    assert not compare([0.5], [0.1, 0.2]).resolved                 # no interval: nothing resolved


def test_the_cells():
    assert format_mean([0.60, 0.65, 0.70]) == "0.650 (0.53–0.77)"
    assert format_mean([0.7]) == "0.700" and format_mean([]) == "–"
    assert format_mean([-0.1, 0.1, 0.05]) == "0.017 (−0.24 to 0.28)"     # a minus sign: no dash
    c = compare([0.765, 0.695, 0.675], [0.695, 0.695, 0.545])
    # +0.067 over seeds, Welch interval -0.107 to +0.240, 12 of the 20 splits as extreme, 19 seeds.
    assert format_comparison(c) == "+0.067 (−0.11 to +0.24), p = 0.60, ~19 seeds"
    same = compare([1, 2, 3], [3, 2, 1])
    assert format_comparison(same) == "+0.000 (−2.27 to +2.27), p = 1.00, no difference"
    assert format_comparison(compare([0.5], [0.1])) == "+0.400, p = 1.00"
    # 5 against 5 fully separated: p = 2/252; d = 2.9, pooled sd = sqrt(10/8) = 1.118: 4 seeds
    # (n = 3: 2 ((2.776 + 0.941) 1.118 / 2.9)^2 = 4.1 > 3; n = 4: 2 ((2.447 + 0.906) 0.3855)^2 = 3.3 <= 4).
    far = compare([0.1] * 5, [1, 2, 3, 4, 5])
    assert format_comparison(far, digits=2) == "−2.90 (−4.9 to −0.9), p = 0.0079, ~4 seeds"


def test_band_is_mean_ci_step_by_step_over_the_seeds_present():
    seed0 = {0: 0.5, 1: 0.6, 2: 0.7}
    seed1 = {0: 0.4, 1: 0.5, 2: 0.9, 3: 1.0}      # one seed went further
    seed2 = {0: 0.6, 1: 0.4}                      # and one stopped early
    steps, mean, lo, hi = band([seed0, seed1, seed2])
    assert steps == [0, 1, 2, 3]
    for i, values in enumerate([[0.5, 0.4, 0.6], [0.6, 0.5, 0.4], [0.7, 0.9]]):
        assert (mean[i], lo[i], hi[i]) == mean_ci(values)[:3]
    assert mean[3] == 1.0 and math.isnan(lo[3]) and math.isnan(hi[3])      # one seed: no band
    pairs = [(list(s), list(s.values())) for s in (seed0, seed1, seed2)]    # (steps, values), as plots.py
    for same in (band(pairs), band({0: seed0, 1: seed1, 2: seed2})):      # or a dict keyed by seed
        assert same[:2] == (steps, mean) and same[2][:3] == lo[:3] and same[3][:3] == hi[:3]


def test_a_bound_that_rounds_to_zero_has_no_minus_sign():
    """−0.001 at two digits is "0.00": a minus sign on a zero would read as a real negative bound."""
    assert format_mean([0.0, 0.001, 0.002], digits=3).endswith("(0.00–0.00)")
    assert stats.signed(-0.0004, 3) == "+0.000" and stats.signed(-0.004, 2) == "+0.00"
    assert stats.signed(-0.006, 2) == "\u22120.01"
