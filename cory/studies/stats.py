"""The statistics of the study reports, in one place: spreads over seeds, the t interval of a mean (and of a geometric
mean), the seeds a t interval of a given width needs, Welch's interval of a difference of means, and the paired test
(with McNemar's exact test) of two evaluations of the same problems.

- `spread`: mean, s.d. (n − 1), min, max over seeds.
- `t_quantile`: t(df), the (1 + level)/2 quantile of Student's t with df degrees of freedom: what a two-sided
  interval of that level multiplies its standard error by (t(7) = 2.365 at 95 %).
- `t_interval`: the mean of n values with its t interval, s.d./√n · t(n − 1) (the claim studies' paired per-seed
  differences).
- `ratio_interval`: the geometric mean of n positive ratios with its t interval, exp(m ± s/√n · t(n − 1)) for m and
  s the mean and s.d. of the ratios' logs (the second claim study's per-seed KL ratios: a ratio's spread is
  multiplicative, and the interval of a ratio and of its inverse are each other's inverses).
- `seeds_needed`: the fewest n whose t interval of a mean, ± t(n − 1) · s.d./√n, is at most a given half-width
  for a given s.d. (the sizing of a study from a previous one's spread).
- `welch`: mean(a) − mean(b) with s.e. = √(s_a²/n_a + s_b²/n_b) and Welch–Satterthwaite degrees of freedom
  (the family table: independent seeds of two algorithms).
- `paired_test`: two evaluations A and B on the same n problems, with x_i, y_i their outcomes on problem i: the
  difference of accuracies is the mean of d_i = x_i − y_i, with standard error √(Var(d)/n) (population variance,
  as the logged √(p(1−p)/n)) and the normal 95 % interval ± 1.96 s.e.; for 0/1 outcomes with b problems right in
  A only and c right in B only, that is (b − c)/n ± 1.96 · √((b + c − (b − c)²/n)/n²).
- `mcnemar_exact`: McNemar's exact test (McNemar 1947, in its exact binomial form): under equal accuracy each
  discordant problem is A's or B's with probability 1/2, so b ~ Binomial(b + c, 1/2) and the two-sided
  p = min(1, 2 · P(X ≤ min(b, c))). The concordant problems carry no information on the difference, which is why
  the paired test is sharper than comparing two unpaired standard errors.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

Z95 = 1.959963984540054  # the standard normal's 97.5 % quantile


def t_quantile(df: float, level: float = 0.95) -> float:
    """Student's t quantile of `df` degrees of freedom at (1 + level)/2: the factor by which a two-sided `level`
    interval scales its standard error (2.365 for 7 degrees of freedom at 95 %)."""
    from scipy import stats

    return float(stats.t.ppf(0.5 + level / 2, df))


def spread(values: Sequence[float]) -> dict | None:
    """mean, s.d. (n − 1; 0 for one value), min, max and n of `values`; None when there are none."""
    if not values:
        return None
    sd = statistics.stdev(values) if len(values) > 1 else 0.0
    return {
        "mean": statistics.fmean(values),
        "sd": sd,
        "min": min(values),
        "max": max(values),
        "n": len(values),
        "values": list(values),
    }


def t_interval(values: Sequence[float], level: float = 0.95) -> tuple[float, float, float]:
    """(mean, low, high): the t interval of the mean over `values` (n − 1 degrees of freedom); n < 2 gives NaNs."""
    n = len(values)
    mean = sum(values) / n if n else math.nan
    if n < 2:
        return mean, math.nan, math.nan
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))
    half = t_quantile(n - 1, level) * sd / math.sqrt(n)
    return mean, mean - half, mean + half


def ratio_interval(ratios: Sequence[float], level: float = 0.95) -> tuple[float, float, float]:
    """(geometric mean, low, high) of positive `ratios`: `t_interval` of their logs, exponentiated (module
    docstring); no ratio gives NaNs, one gives the ratio with NaN bounds."""
    if any(not r > 0 for r in ratios):
        raise ValueError(f"a geometric mean needs positive ratios (got {[r for r in ratios if not r > 0]})")
    mean, low, high = t_interval([math.log(r) for r in ratios], level)
    return math.exp(mean), math.exp(low), math.exp(high)  # exp(NaN) is NaN: an undefined bound stays undefined


def seeds_needed(sd: float, half_width: float, level: float = 0.95, most: int = 1000) -> int:
    """The fewest seeds n ≥ 2 whose t interval of a mean, ± t(n − 1) · sd/√n, is at most `half_width` wide on each
    side, for values of s.d. `sd`; `most` when even that many are not enough."""
    for n in range(2, most + 1):
        if t_quantile(n - 1, level) * sd / math.sqrt(n) <= half_width:
            return n
    return most


def welch(a: Sequence[float], b: Sequence[float], level: float = 0.95) -> dict | None:
    """mean(a) − mean(b) with its Welch t interval: s.e. = √(s_a²/n_a + s_b²/n_b), degrees of freedom by
    Welch–Satterthwaite; None unless both sides have two values or more. With no spread on either side the interval
    is the difference itself."""
    if len(a) < 2 or len(b) < 2:
        return None
    va, vb = statistics.variance(a) / len(a), statistics.variance(b) / len(b)
    diff, se = statistics.fmean(a) - statistics.fmean(b), math.sqrt(va + vb)
    if se == 0:
        return {"diff": diff, "se": 0.0, "df": math.inf, "ci95": [diff, diff]}
    df = (va + vb) ** 2 / (va**2 / (len(a) - 1) + vb**2 / (len(b) - 1))
    half = t_quantile(df, level) * se
    return {"diff": diff, "se": se, "df": df, "ci95": [diff - half, diff + half]}


@dataclass(frozen=True)
class PairedTest:
    """Two evaluations of one statistic on the same n problems (A − B); `p` is None unless both are 0/1."""

    n: int
    mean_a: float
    mean_b: float
    difference: float
    se: float
    low: float  # the normal 95 % interval of the difference
    high: float
    b: int | None  # problems right in A only (0/1 outcomes)
    c: int | None  # problems right in B only
    p: float | None  # McNemar's exact two-sided p


def mcnemar_exact(b: int, c: int) -> float:
    """Two-sided exact McNemar p-value: min(1, 2 · P(X ≤ min(b, c))), X ~ Binomial(b + c, 1/2); 1 when b = c = 0."""
    m = b + c
    tail = sum(math.comb(m, i) for i in range(min(b, c) + 1))
    return min(1.0, 2 * tail / 2**m)  # integers until the one division: exact for any number of problems


def paired_test(x: Sequence[float], y: Sequence[float]) -> PairedTest:
    """Paired comparison of outcomes x (A) and y (B) on the same problems, in the same order (module docstring)."""
    if len(x) != len(y) or not x:
        raise ValueError(f"paired outcomes need equal, non-zero lengths (got {len(x)} and {len(y)})")
    n = len(x)
    d = [a - b for a, b in zip(x, y)]
    diff = sum(d) / n
    se = math.sqrt(max(0.0, sum(v * v for v in d) / n - diff * diff) / n)
    binary = all(v in (0, 1) for v in (*x, *y))
    b = sum(1 for u, v in zip(x, y) if u == 1 and v == 0) if binary else None
    c = sum(1 for u, v in zip(x, y) if u == 0 and v == 1) if binary else None
    p = mcnemar_exact(b, c) if b is not None and c is not None else None
    return PairedTest(n, sum(x) / n, sum(y) / n, diff, se, diff - Z95 * se, diff + Z95 * se, b, c, p)
