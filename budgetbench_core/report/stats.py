"""Intervals and verdicts for a report, each with coverage checked by simulation.

Every interval here is computed over per-item values (an item's mean over its repeats), never
by averaging per-repeat bounds, and every one was checked by ``tests/test_report_coverage.py``
(binary and graded, paired and unpaired, n from 2 to 500, means near 0, 0.5 and 1; the table is
in docs/reading-a-report.md, produced by ``scripts/coverage_table.py``):

- binary cell: the Wilson score interval, with Brown, Cai & DasGupta's (2001) Poisson lower
  (upper) bound for 1-3 successes (failures), which removes Wilson's coverage dip near 0 and 1;
- graded cell: a t-interval over the values plus one pseudo-item at each end of the range
  ("bounded t"): never zero-width (three items all 0 no longer give [0, 0]), and it keeps its
  coverage on 0/1-like values near 0 and 1, where the plain t-interval and the bootstraps
  fall to a few percent;
- paired binary delta: Newcombe's (1998) hybrid score interval for paired proportions, widened
  to include 0 unless the exact sign test on the discordant items gives p < 0.05 (so
  [1, 1, 1, 0] against zeros, p = 0.25, is not a result, and a verdict is exactly "the
  interval excludes 0");
- paired graded delta: the bounded t over the per-item differences (range [-1, 1]).

The pure functions are vectorised (numpy arrays in, arrays out) so the coverage simulation
runs the report's own code on many samples at once.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy import stats

CONFIDENCE = 0.95
ALPHA = 1 - CONFIDENCE
Z = float(stats.norm.ppf(1 - ALPHA / 2))
# Pseudo-items of the bounded t, half at each end of the range. The simulation's 0/1-valued
# graded case needs about 2 (with 1, coverage at p = 0.02 and n = 100 falls to 87%).
PSEUDO = 2.0

# Fewest paired items with an interval and a verdict. Chosen by the coverage simulation:
# at 3 items the paired binary interval covers only 89% when the two arms are negatively
# coupled (and at 2 Newcombe's interval alone calls [1, 1] vs [0, 0] "higher").
MIN_PAIRED_ITEMS = 4

HIGHER, LOWER, TIE, TOO_FEW = "higher", "lower", "not distinguished", "too few items"
# Enough items for an interval, but too few for any outcome to be a result (0/4 against 4/4:
# the sign test cannot reach p < 0.05 on 4 discordant items), so "not distinguished" would say
# more than the data can.
UNSEPARABLE = "too few items to separate"
NO_VERDICT = (TOO_FEW, UNSEPARABLE)


@dataclass(frozen=True)
class Estimate:
    """A mean with its 95% interval and how the interval was computed."""

    mean: float
    low: float
    high: float
    n: int
    method: str

    @classmethod
    def empty(cls) -> Estimate:
        return cls(math.nan, math.nan, math.nan, 0, "none")


@dataclass(frozen=True)
class PairedDelta:
    """Candidate minus reference over the same items: the one object gate, plan and compare use.

    ``mean``, ``low``, ``high``: the mean per-item difference and its 95% interval (nan with no
    items, and below ``min_n``). ``n``: paired items. ``method``: ``newcombe+sign`` (every value 0 or 1) or
    ``bounded-t`` (:func:`paired_method`). ``verdict``: ``higher`` / ``lower`` (a result),
    ``not distinguished``, ``too few items`` (n < ``min_n``: no interval, no verdict) or ``too
    few items to separate`` (an interval, but at this n no outcome could be a result:
    :func:`separating_n`). ``needed_n``: for the last two the smallest n a verdict needs (at
    least :func:`separating_n`); for ``not distinguished`` with a non-zero observed difference,
    the smallest n at which the same observed proportions (binary) or the same mean and spread
    (graded) would be a result, found by an exhaustive scan; None when the observed difference
    is 0. It is a point estimate, not a power calculation (80% power needs more; ``budgetbench
    plan``). ``p_value``: the exact sign test on discordant items (binary only).
    """

    mean: float
    low: float
    high: float
    n: int
    method: str
    verdict: str
    needed_n: int | None
    min_n: int
    p_value: float | None = None


# --- vectorised interval functions (also what the coverage simulation runs) ---------------


def wilson_bounds(successes, n, confidence: float = CONFIDENCE):
    """Plain Wilson score bounds for arrays of successes out of n (n > 0)."""
    x, n = np.asarray(successes, dtype=float), np.asarray(n, dtype=float)
    z = float(stats.norm.ppf(1 - (1 - confidence) / 2))
    p = x / n
    centre = (x + z * z / 2) / (n + z * z)
    half = z * np.sqrt(n) / (n + z * z) * np.sqrt(p * (1 - p) + z * z / (4 * n))
    return np.clip(centre - half, 0.0, 1.0), np.clip(centre + half, 0.0, 1.0)


def modified_wilson_bounds(successes, n, confidence: float = CONFIDENCE):
    """Wilson with Brown-Cai-DasGupta's boundary fix: for 1..x* successes (x* = 2 up to 50 items,
    3 above) the lower bound is the one-sided Poisson bound chi2(alpha; 2x) / 2n, and
    symmetrically for failures. The fix stays on at every n: without it Wilson covers 84% at
    n = 176, p = 0.001 (exact coverage, ``tests/test_report_coverage_dense.py``)."""
    x, n = np.asarray(successes, dtype=float), np.asarray(n, dtype=float)
    low, high = wilson_bounds(x, n, confidence)
    alpha = 1 - confidence
    top = np.where(n <= 50, 2, 3)
    with np.errstate(divide="ignore", invalid="ignore"):
        poisson_low = stats.chi2.ppf(alpha, 2 * np.maximum(x, 1)) / (2 * n)
        poisson_high = 1 - stats.chi2.ppf(alpha, 2 * np.maximum(n - x, 1)) / (2 * n)
    low = np.where((x >= 1) & (x <= top), np.minimum(low, poisson_low), low)
    high = np.where((n - x >= 1) & (n - x <= top), np.maximum(high, poisson_high), high)
    return low, high


def bounded_t_bounds(
    total, total_sq, n, lo: float = 0.0, hi: float = 1.0, confidence: float = CONFIDENCE, pseudo: float = PSEUDO
):
    """t-interval of a mean of values in [lo, hi] from their sum, sum of squares and count,
    with ``pseudo`` pseudo-items added, half at lo and half at hi; nan for n < 2."""
    s, q, n = (np.asarray(v, dtype=float) for v in (total, total_sq, n))
    k = pseudo
    weight = n + k
    mean = (s + k / 2 * (lo + hi)) / weight
    var = np.maximum((q + k / 2 * (lo * lo + hi * hi) - weight * mean * mean) / (weight - 1), 0.0)
    with np.errstate(invalid="ignore"):
        t = stats.t.ppf(1 - (1 - confidence) / 2, np.where(n >= 2, n - 1, np.nan))
    half = t * np.sqrt(var / weight)
    return np.clip(mean - half, lo, hi), np.clip(mean + half, lo, hi)


def newcombe_paired_bounds(both, cand_only, ref_only, neither, confidence: float = CONFIDENCE):
    """Newcombe's (1998, method 10) hybrid score interval for p(candidate) - p(reference) from the
    paired 2x2 counts: items right in both, only in the candidate, only in the reference, neither."""
    a, b, c, d = (np.asarray(v, dtype=float) for v in (both, cand_only, ref_only, neither))
    n = a + b + c + d
    p1, p2 = (a + b) / n, (a + c) / n
    l1, u1 = wilson_bounds(a + b, n, confidence)
    l2, u2 = wilson_bounds(a + c, n, confidence)
    product = (a + b) * (c + d) * (a + c) * (b + d)
    cross = a * d - b * c
    corrected = np.where(cross > n / 2, cross - n / 2, np.where(cross < 0, cross, 0.0))
    with np.errstate(divide="ignore", invalid="ignore"):
        phi = np.where(product > 0, corrected / np.sqrt(product), 0.0)
    delta = p1 - p2
    low = delta - np.sqrt(np.maximum((p1 - l1) ** 2 - 2 * phi * (p1 - l1) * (u2 - p2) + (u2 - p2) ** 2, 0.0))
    high = delta + np.sqrt(np.maximum((u1 - p1) ** 2 - 2 * phi * (u1 - p1) * (p2 - l2) + (p2 - l2) ** 2, 0.0))
    return np.clip(low, -1.0, 1.0), np.clip(high, -1.0, 1.0)


def sign_test_p(cand_only, ref_only):
    """Exact two-sided sign (McNemar) test on the discordant items; 1 when there are none."""
    b, c = np.asarray(cand_only, dtype=float), np.asarray(ref_only, dtype=float)
    m = b + c
    return np.where(m > 0, np.minimum(1.0, 2 * stats.binom.cdf(np.minimum(b, c), np.maximum(m, 1), 0.5)), 1.0)


def paired_binary_verdicts(both, cand_only, ref_only, neither, min_n: int = MIN_PAIRED_ITEMS):
    """(low, high, verdict code) arrays: +1 higher, -1 lower, 0 not distinguished, -2 too few
    (then no interval: nan). Newcombe's interval is widened to 0 unless the sign test rejects."""
    low, high = newcombe_paired_bounds(both, cand_only, ref_only, neither)
    n = np.asarray(both) + np.asarray(cand_only) + np.asarray(ref_only) + np.asarray(neither)
    significant = sign_test_p(cand_only, ref_only) < ALPHA
    low, high = np.where(significant, low, np.minimum(low, 0.0)), np.where(significant, high, np.maximum(high, 0.0))
    code = np.where(low > 0, 1, np.where(high < 0, -1, 0))
    few = n < min_n
    return np.where(few, np.nan, low), np.where(few, np.nan, high), np.where(few, -2, code)


def graded_verdicts(total, total_sq, n, min_n: int = MIN_PAIRED_ITEMS):
    """(low, high, verdict code) arrays for per-item differences in [-1, 1], codes as above."""
    low, high = bounded_t_bounds(total, total_sq, n, -1.0, 1.0)
    code = np.where(low > 0, 1, np.where(high < 0, -1, 0))
    few = np.asarray(n) < min_n
    return np.where(few, np.nan, low), np.where(few, np.nan, high), np.where(few, -2, code)


# --- the report's scalar API ------------------------------------------------------------


def wilson(successes: int, n: int, confidence: float = CONFIDENCE) -> tuple[float, float]:
    """Wilson score interval (not Wald, defect 9) with the boundary fix, for successes of n."""
    low, high = modified_wilson_bounds(int(successes), int(n), confidence)
    return float(low), float(high)


def bounded_t(values: Sequence[float] | np.ndarray, lo: float = 0.0, hi: float = 1.0) -> tuple[float, float]:
    """Bounded-t interval of the mean of values in [lo, hi]; (nan, nan) below 2 values."""
    data = np.asarray(values, dtype=float)
    low, high = bounded_t_bounds(data.sum(), (data * data).sum(), data.size, lo, hi)
    return float(low), float(high)


def estimate(values: Sequence[float], binary: bool) -> Estimate:
    """Mean of per-item values with Wilson (binary grader, every value 0 or 1) or bounded t."""
    data = np.asarray(values, dtype=float)
    if data.size == 0:
        return Estimate.empty()
    mean = float(data.mean())
    if binary and np.all((data == 0) | (data == 1)):
        low, high = wilson(int(data.sum()), int(data.size))
        return Estimate(mean, low, high, int(data.size), "wilson")
    low, high = bounded_t(data)
    return Estimate(mean, low, high, int(data.size), "bounded-t")


_CODES = {1: HIGHER, -1: LOWER, 0: TIE, -2: TOO_FEW}
BINARY_METHOD, GRADED_METHOD = "newcombe+sign", "bounded-t"


def paired_method(candidate: Sequence[float] | np.ndarray, reference: Sequence[float] | np.ndarray) -> str:
    """The one paired method per kind of score, chosen from the values alone: ``newcombe+sign``
    when every value on both sides is 0 or 1 (whatever the grader declares: a graded grader's 0/1
    values are Bernoulli outcomes too), ``bounded-t`` otherwise (an item averaged over repeats,
    0.5, is not one). The paired table, the grid, gate, compare and plan all pair through it, so
    one report never calls the same pair both a tie and a result."""
    a, b = np.asarray(candidate, dtype=float), np.asarray(reference, dtype=float)
    zero_one = bool(np.all((a == 0) | (a == 1)) and np.all((b == 0) | (b == 1)))
    return BINARY_METHOD if zero_one else GRADED_METHOD


def _smallest_n(distinguished, start: int, limit: int = 1_000_000) -> int | None:
    """Smallest N >= start with distinguished(N), by an exhaustive scan (``distinguished`` takes
    an array of sizes; blocks of doubling width): the verdict is not monotone in N (rounded
    counts, the t quantile), so a bisection overshoots, by up to 30% here."""
    low = max(start, 1)
    width = max(low, 64)
    while low <= limit:
        sizes = np.arange(low, min(low + width, limit + 1))
        hits = np.flatnonzero(distinguished(sizes))
        if hits.size:
            return int(sizes[hits[0]])
        low, width = low + width, width * 2
    return None


def separating_n(method: str, min_n: int = MIN_PAIRED_ITEMS) -> int:
    """Fewest paired items at which some outcome is a result: with fewer, even every item
    going one way (0/4 against 4/4) is "too few items to separate", never a tie."""

    def extreme(sizes: np.ndarray) -> np.ndarray:
        zero = np.zeros_like(sizes)
        if method == BINARY_METHOD:
            return paired_binary_verdicts(zero, sizes, zero, zero, min_n=min_n)[2] == 1
        return graded_verdicts(sizes, sizes, sizes, min_n=min_n)[2] == 1

    found = _smallest_n(extreme, min_n)
    assert found is not None  # every item one way is a result from a few items on
    return found


def paired_delta(
    candidate: Sequence[float],
    reference: Sequence[float],
    min_n: int = MIN_PAIRED_ITEMS,
    method: str | None = None,
) -> PairedDelta:
    """Candidate minus reference over the same items (same order), with interval and verdict.

    The method is :func:`paired_method`'s, unless the score is graded by construction whatever
    its values (``method=GRADED_METHOD``: the budget curve's per-item areas). See :class:`PairedDelta` for the fields; ``verdict``
    is what the report, gate and compare print.
    """
    a, b = np.asarray(candidate, dtype=float), np.asarray(reference, dtype=float)
    if a.shape != b.shape:
        raise ValueError(f"paired values need the same items: {a.size} candidate vs {b.size} reference")
    n = int(a.size)
    if n == 0:
        return PairedDelta(math.nan, math.nan, math.nan, 0, "none", TOO_FEW, min_n, min_n)
    method = method or paired_method(a, b)
    differences = a - b
    mean = float(differences.mean())
    p_value = None
    if method == BINARY_METHOD:
        counts = np.array(
            [
                np.sum((a == 1) & (b == 1)),
                np.sum((a == 1) & (b == 0)),
                np.sum((a == 0) & (b == 1)),
                np.sum((a == 0) & (b == 0)),
            ],
            dtype=float,
        )
        both, cand_only, ref_only, neither = counts
        low, high, code = (float(v) for v in paired_binary_verdicts(both, cand_only, ref_only, neither, min_n=min_n))
        p_value = float(sign_test_p(counts[1], counts[2]))

        def distinguished(sizes: np.ndarray) -> np.ndarray:
            scaled = np.round(np.outer(sizes, counts) / n)
            both, cand_only, ref_only, neither = scaled.T
            return np.isin(paired_binary_verdicts(both, cand_only, ref_only, neither, min_n=min_n)[2], (1, -1))
    else:
        total, total_sq = float(differences.sum()), float((differences * differences).sum())
        low, high, code = (float(v) for v in graded_verdicts(total, total_sq, n, min_n=min_n))

        def distinguished(sizes: np.ndarray) -> np.ndarray:
            return np.isin(graded_verdicts(total * sizes / n, total_sq * sizes / n, sizes, min_n=min_n)[2], (1, -1))

    verdict = _CODES[int(code)]
    separating = separating_n(method, min_n)
    if verdict == TIE and n < separating:
        verdict = UNSEPARABLE
    if verdict in (HIGHER, LOWER):
        needed = None
    elif mean == 0:
        needed = separating if verdict in NO_VERDICT else None
    else:
        needed = _smallest_n(distinguished, max(n, separating))
    return PairedDelta(mean, low, high, n, method, verdict, needed, min_n, p_value)


def verdict(delta: PairedDelta) -> str:
    """The delta's verdict: a difference is a result only where its interval (and, for binary
    values, the exact sign test) excludes no difference, and only from ``min_n`` items."""
    return delta.verdict


def percentile(values: Sequence[float | None], q: float) -> float:
    data = np.asarray([v for v in values if v is not None], dtype=float)
    return float(np.percentile(data, q)) if data.size else math.nan
