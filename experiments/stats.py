"""How far a handful of seeds can carry a conclusion: intervals, tests and seed counts over seeds.

The unit is the seed. Every function here takes one number per run (per seed): a run's final
held-out accuracy, its entropy at the end, its mean gradient norm. Never one number per step:
the steps of one run are not independent draws (each starts from the model the last one made),
and the noise within a run is smaller than the spread between runs, so counting steps as
samples would make intervals look far narrower than the evidence is.

What each quantity means, for a reader who is not a statistician:

- ``mean_ci``: the mean over seeds and its 95% interval: a range built so that, if the whole
  experiment were repeated on fresh seeds, it would hold the arm's true mean (its mean over
  endlessly many seeds) 95 times in 100. It is a Student t interval with n - 1 degrees of
  freedom: with few seeds the spread itself is poorly known, and t widens the interval to pay
  for that (with 3 seeds the multiplier is 4.30 standard errors, not the 1.96 of a normal curve).
- ``diff_ci``: the difference of two arms' means (a - b) and its 95% interval (Welch's t: each
  arm keeps its own spread). A difference is *resolved* when its interval excludes 0. An interval
  that contains 0 does not show the arms are equal: it shows the seeds cannot tell them apart.
- ``permutation_p``: if the arm made no difference, the labels "a" and "b" would be arbitrary.
  Relabel the pooled runs in every possible way, and count how often a difference at least as
  large (either sign) as the observed one comes out: that share is the exact two-sided p. It
  needs no assumption about the shape of the spread, which is why it is the p the tables quote.
  With 3 seeds against 3 there are C(6, 3) = 20 relabellings, and the observed one and its
  mirror image (the arms swapped) are always among the most extreme, so p >= 2/20 = 0.10 even
  when every run of one arm beats every run of the other. Three seeds per arm can never reach
  p < 0.05 this way; 5 against 5 can (2/252 = 0.008 at best). The t interval, which assumes a
  normal spread, can exclude 0 while this p is 0.10: the two disagree exactly where three seeds
  leave the shape of the spread unknown.
- ``seeds_needed``: how many seeds per arm a two-sided t-test would need to detect the observed
  difference, at the observed spread, 80% of the time. A rough guide to what a further
  experiment would cost, not a promise: both the difference and the spread are themselves
  estimated from few seeds.

Same seed, different arms: every arm run on seed s sees the same first batch, but sampling makes
the runs diverge within a step or two. The arms are compared as
independent groups (``diff_ci``, Welch) by default; ``paired_diff_ci`` pairs runs by seed, for a
reader who wants to check whether the shared start matters (pairing costs degrees of freedom: with
3 seeds a paired interval has 2, Welch's up to 4).

Only the standard library: the Student t distribution is computed here (``t_cdf``,
``t_quantile``) from the regularized incomplete beta function, and tested against printed tables.
"""
import itertools
import math
import statistics
from collections.abc import Mapping
from dataclasses import dataclass
from typing import NamedTuple

MINUS = "\u2212"      # a typographic minus sign: "−0.05" reads as a number, "-0.05" as a dash


# ----------------------------------------------------------------------------------------
# Student's t distribution, from the regularized incomplete beta function

def _continued_fraction(a, b, x):
    """The continued fraction of I_x(a, b) (Numerical Recipes, betacf), by the modified Lentz
    method; converges quickly for x < (a + 1) / (a + b + 2)."""
    tiny = 1e-300
    c, d = 1.0, 1.0 - (a + b) * x / (a + 1)
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 1000):
        for numerator in (m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),                # even step
                          -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1))):    # odd step
            d = 1.0 + numerator * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + numerator / c
            c = c if abs(c) > tiny else tiny
            h *= d * c
        if abs(d * c - 1.0) < 1e-15:
            return h
    raise ArithmeticError(f"incomplete beta: no convergence for a={a}, b={b}, x={x}")


def incomplete_beta(a, b, x):
    """I_x(a, b) = B(x; a, b) / B(a, b), the regularized incomplete beta function, for a, b > 0."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b)
                     + a * math.log(x) + b * math.log1p(-x))
    if x < (a + 1) / (a + b + 2):
        return front * _continued_fraction(a, b, x) / a
    return 1.0 - front * _continued_fraction(b, a, 1.0 - x) / b      # I_x(a, b) = 1 - I_{1-x}(b, a)


def t_cdf(t, df):
    """P(T <= t) for Student's t with `df` degrees of freedom (any real df > 0: Welch's is not
    an integer). The tail beyond |t| is I_{df / (df + t^2)}(df / 2, 1 / 2) / 2. Past 10^7 degrees of
    freedom t is the normal distribution to within 1e-7, and the normal's is returned (the
    continued fraction would need millions of terms there)."""
    if df <= 0:
        raise ValueError(f"t_cdf: degrees of freedom must be > 0, got {df}")
    if df > 1e7:
        return statistics.NormalDist().cdf(t)
    tail = 0.5 * incomplete_beta(df / 2, 0.5, df / (df + t * t))
    return 1.0 - tail if t > 0 else tail


def t_quantile(p, df):
    """The t with P(T <= t) = p, by bisection on ``t_cdf`` (to about 1e-12): t_quantile(0.975, 2)
    = 4.3027, the multiplier of a 95% interval from 3 seeds."""
    if not 0.0 < p < 1.0:
        raise ValueError(f"t_quantile: p must be strictly between 0 and 1, got {p}")
    if p < 0.5:
        return -t_quantile(1.0 - p, df)
    lo, hi = 0.0, 1.0
    while t_cdf(hi, df) < p:          # bracket: double until the quantile lies below hi
        lo, hi = hi, 2.0 * hi
    while hi - lo > 1e-12 * hi:
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if t_cdf(mid, df) < p else (lo, mid)
    return 0.5 * (lo + hi)


# ----------------------------------------------------------------------------------------
# Intervals over seeds

class Interval(NamedTuple):
    """An estimate and its two-sided interval. lo and hi are None where the seeds cannot give
    one (a single seed); df is the t distribution's degrees of freedom (None likewise)."""
    value: float
    lo: float | None
    hi: float | None
    df: float | None


def _seeds(values, name="values"):
    """The values as a list of floats, one per seed; a clear error for a missing or non-finite one."""
    values = [float(v) for v in values]
    bad = [v for v in values if not math.isfinite(v)]
    if bad:
        raise ValueError(f"{name}: every seed's value must be a finite number, got {bad}")
    return values


def _check_level(level):
    if not 0.0 < level < 1.0:
        raise ValueError(f"level must be strictly between 0 and 1 (0.95 for a 95% interval), got {level}")


def mean_ci(values, level=0.95):
    """The mean over seeds with its two-sided t interval:
    mean ± t_{(1+level)/2, n-1} · s / sqrt(n), s the sample standard deviation (n - 1).

    One seed gives the mean and no interval (lo = hi = None: no spread to measure); no seed
    at all is a ValueError (there is no mean to report). The interval is not clipped to the
    metric's range: an accuracy interval reaching past 1 says the seeds are too few, or too spread,
    for the normal shape the t interval assumes."""
    _check_level(level)
    values = _seeds(values)
    n = len(values)
    if n == 0:
        raise ValueError("mean_ci: no values (no seed has this number)")
    mean = statistics.fmean(values)
    if n == 1:
        return Interval(mean, None, None, None)
    half = t_quantile((1 + level) / 2, n - 1) * statistics.stdev(values) / math.sqrt(n)
    return Interval(mean, mean - half, mean + half, n - 1)


def _welch(a, b):
    """(difference of means, its standard error, Welch–Satterthwaite df) of two lists of >= 2 seeds."""
    va, vb = statistics.variance(a) / len(a), statistics.variance(b) / len(b)   # squared standard errors
    if va + vb == 0.0:
        return statistics.fmean(a) - statistics.fmean(b), 0.0, len(a) + len(b) - 2
    df = (va + vb) ** 2 / (va ** 2 / (len(a) - 1) + vb ** 2 / (len(b) - 1))
    return statistics.fmean(a) - statistics.fmean(b), math.sqrt(va + vb), df


def diff_ci(a, b, level=0.95):
    """The difference of means, mean(a) - mean(b), with Welch's t interval for two independent
    groups of seeds: diff ± t_{(1+level)/2, df} · se, where se^2 = s_a^2/n_a + s_b^2/n_b and df is
    Welch–Satterthwaite's, se^4 / ((s_a^2/n_a)^2/(n_a - 1) + (s_b^2/n_b)^2/(n_b - 1)).

    A group with one seed has no spread to measure: no interval (None bounds). When neither group
    varies at all the interval is the difference itself (df taken as n_a + n_b - 2)."""
    _check_level(level)
    a, b = _seeds(a, "a"), _seeds(b, "b")
    if not a or not b:
        raise ValueError(f"diff_ci: each group needs at least one seed (got {len(a)} and {len(b)})")
    if len(a) < 2 or len(b) < 2:
        return Interval(statistics.fmean(a) - statistics.fmean(b), None, None, None)
    diff, se, df = _welch(a, b)
    half = t_quantile((1 + level) / 2, df) * se
    return Interval(diff, diff - half, diff + half, df)


def welch_p(a, b):
    """The two-sided p of Welch's t-test, the test that goes with ``diff_ci``: below 1 - level
    exactly when that interval excludes 0. It assumes a normal spread; the tables quote the
    assumption-free ``permutation_p`` instead. None with one seed in an arm."""
    a, b = _seeds(a, "a"), _seeds(b, "b")
    if len(a) < 2 or len(b) < 2:
        return None
    diff, se, df = _welch(a, b)
    if se == 0.0:
        return 1.0 if diff == 0.0 else 0.0
    return 2.0 * t_cdf(-abs(diff) / se, df)


def paired_diff_ci(a, b, level=0.95):
    """The mean of the per-seed differences a[i] - b[i] with its t interval (n - 1 degrees of
    freedom): for runs paired by seed, a[i] and b[i] from the same seed (pass them in the same
    seed order). Not the default here: see the module docstring."""
    a, b = _seeds(a, "a"), _seeds(b, "b")
    if len(a) != len(b):
        raise ValueError(f"paired_diff_ci: pairs need as many seeds in a as in b (got {len(a)} and {len(b)})")
    return mean_ci([x - y for x, y in zip(a, b)], level)


# ----------------------------------------------------------------------------------------
# A test and a seed count

def permutation_p(a, b, max_relabellings=5_000_000):
    """The exact two-sided permutation p of the difference in means: the share of all
    C(n_a + n_b, n_a) ways to split the pooled values into groups of n_a and n_b whose
    |mean difference| is at least the observed one (the observed split included, so p > 0).
    Differences within a rounding error (1e-9 of the values' scale) of the observed one count as
    ties, i.e. as at least as large. Fully separated groups of 3 and 3 give 2/20 = 0.10; identical
    groups give 1.

    Exact enumeration is for a few seeds per arm (5 against 5: 252 splits); past
    `max_relabellings` splits this raises a ValueError rather than run for minutes."""
    a, b = _seeds(a, "a"), _seeds(b, "b")
    if not a or not b:
        raise ValueError(f"permutation_p: each group needs at least one seed (got {len(a)} and {len(b)})")
    pooled, na, nb = a + b, len(a), len(b)
    splits = math.comb(na + nb, na)
    if splits > max_relabellings:
        raise ValueError(f"permutation_p: {na} against {nb} seeds has {splits} relabellings, more than "
                         f"max_relabellings={max_relabellings}; exact enumeration is meant for a few seeds")
    total = math.fsum(pooled)

    def difference(sum_a):   # with the total fixed, a split's difference depends on its first group's sum
        return sum_a / na - (total - sum_a) / nb
    observed = abs(difference(math.fsum(a)))
    tolerance = 1e-9 * max(1.0, max(abs(v) for v in pooled))
    extreme = sum(abs(difference(math.fsum(group))) >= observed - tolerance
                  for group in itertools.combinations(pooled, na))
    return extreme / splits


def pooled_sd(a, b):
    """The pooled standard deviation, sqrt(((n_a - 1) s_a^2 + (n_b - 1) s_b^2) / (n_a + n_b - 2));
    None when there is no spread to measure (one seed in each group)."""
    a, b = _seeds(a, "a"), _seeds(b, "b")
    if len(a) + len(b) < 3 or not a or not b:
        return None
    squares = sum((v - statistics.fmean(g)) ** 2 for g in (a, b) for v in g)
    return math.sqrt(squares / (len(a) + len(b) - 2))


def seeds_needed(a, b, power=0.8, alpha=0.05):
    """Seeds per arm for a two-sided two-sample t-test at level `alpha` to detect the observed
    difference d = mean(a) - mean(b) with probability `power`, if the spread is the observed
    pooled standard deviation sd.

    The normal approximation n = 2 ((z_{1-alpha/2} + z_power) sd / d)^2 gives 15.7 for d = sd; a
    t-test with that few seeds has less power than a z-test, so the normal quantiles are replaced
    by t quantiles with the test's 2n - 2 degrees of freedom and the smallest whole n with
    n >= 2 ((t_{1-alpha/2, 2n-2} + t_{power, 2n-2}) sd / d)^2 is returned: 17 for d = sd, 64 for
    d = sd / 2, as in Cohen's tables (which come from the exact noncentral t).

    math.inf when the difference is exactly 0 (no number of seeds detects it); None when the
    spread cannot be measured (one seed in each arm); 2 when the seeds do not vary at all."""
    if not 0.0 < alpha < 1.0 or not 0.0 < power < 1.0:
        raise ValueError(f"seeds_needed: power and alpha must be strictly between 0 and 1, "
                         f"got power={power}, alpha={alpha}")
    a, b = _seeds(a, "a"), _seeds(b, "b")
    sd = pooled_sd(a, b)
    if sd is None:
        return None
    d = abs(statistics.fmean(a) - statistics.fmean(b))
    if d == 0.0:
        return math.inf
    if sd == 0.0:
        return 2
    z = statistics.NormalDist()
    n = max(2, math.ceil(2 * ((z.inv_cdf(1 - alpha / 2) + z.inv_cdf(power)) * sd / d) ** 2))
    # t's quantiles exceed z's, so the answer is at least the normal one: count up from there.
    while n < 2 * ((t_quantile(1 - alpha / 2, 2 * n - 2) + t_quantile(power, 2 * n - 2)) * sd / d) ** 2:
        n += 1
    return n


# ----------------------------------------------------------------------------------------
# One comparison, and the table cells

@dataclass(frozen=True)
class Comparison:
    """Arm a against arm b, over seeds: diff = mean(a) - mean(b) with its Welch interval [lo, hi]
    (None bounds with one seed in an arm), the exact permutation p, the seeds per arm 80% power at
    this difference would need, and resolved: whether the interval excludes 0."""
    diff: float
    lo: float | None
    hi: float | None
    p: float
    n_needed: float | None
    resolved: bool
    n_a: int
    n_b: int


def compare(a, b, level=0.95, power=0.8):
    """Everything the tables say about arm a against arm b (one value per seed each)."""
    a, b = _seeds(a, "a"), _seeds(b, "b")
    interval = diff_ci(a, b, level)
    resolved = interval.lo is not None and (interval.lo > 0 or interval.hi < 0)
    return Comparison(interval.value, interval.lo, interval.hi, permutation_p(a, b),
                      seeds_needed(a, b, power, 1 - level), resolved, len(a), len(b))


def signed(x, digits):
    """'+0.067', '−0.050' (a typographic minus): a difference, with its sign always shown; one
    that rounds to 0 is '+0.00'."""
    text = f"{abs(x):.{digits}f}"
    return f"{MINUS if x < 0 and float(text) != 0 else '+'}{text}"


def format_p(p):
    """'0.40', '0.10'; two significant digits below 0.01 ('0.0079')."""
    return f"{p:.2f}" if p >= 0.01 else f"{p:.2g}"


def format_mean(values, level=0.95, digits=3):
    """A table cell for one arm: '0.645 (0.55–0.74)', the mean over seeds and its t interval (one
    digit fewer); the mean alone for one seed, '–' for none. A negative bound is written with
    ' to ' instead of a dash, which a minus sign would make ambiguous."""
    values = list(values)
    if not values:
        return "–"
    m = mean_ci(values, level)

    def number(x, d):              # no minus on a bound that rounds to 0: "0.00", not "−0.00"
        text = f"{abs(x):.{d}f}"
        return f"{MINUS if x < 0 and float(text) != 0 else ''}{text}"
    if m.lo is None:
        return number(m.value, digits)
    lo = number(m.lo, digits - 1)
    dash = " to " if lo.startswith(MINUS) else "–"
    return f"{number(m.value, digits)} ({lo}{dash}{number(m.hi, digits - 1)})"


def format_comparison(c, digits=3):
    """A table cell for a difference: '+0.067 (−0.05 to +0.19), p = 0.40, ~18 seeds': the
    difference, its interval (one digit fewer), the permutation p and the seeds per arm 80% power
    would need ('no difference' where the means are equal)."""
    cell = signed(c.diff, digits)
    if c.lo is not None:
        cell += f" ({signed(c.lo, digits - 1)} to {signed(c.hi, digits - 1)})"
    cell += f", p = {format_p(c.p)}"
    if c.n_needed == math.inf:
        cell += ", no difference"
    elif c.n_needed is not None:
        cell += f", ~{c.n_needed} seeds"
    return cell


# ----------------------------------------------------------------------------------------
# A band for figures

def band(values_by_seed_per_step, level=0.95):
    """The mean over seeds and its t interval at every step, for a figure's band:
    returns (steps, mean, lo, hi), four lists in step order.

    `values_by_seed_per_step` has one entry per seed: a mapping {step: value}, or a pair
    (steps, values) as plots.py collects them (a dict {seed: ...} of either works too). Each step
    counts the seeds that logged it (a run still going or stopped early simply drops out); lo and
    hi are NaN where a single seed has the step (matplotlib leaves a gap in the band). These are
    intervals step by step: 95% at each step, not for the whole curve at once."""
    series = values_by_seed_per_step
    if isinstance(series, Mapping):
        series = series.values()
    runs = [s if isinstance(s, Mapping) else dict(zip(*s)) for s in series]
    steps = sorted({step for run in runs for step in run})
    mean, lo, hi = [], [], []
    for step in steps:
        m = mean_ci([run[step] for run in runs if step in run], level)
        mean.append(m.value)
        lo.append(math.nan if m.lo is None else m.lo)
        hi.append(math.nan if m.hi is None else m.hi)
    return steps, mean, lo, hi
