"""The budget-curve intervals are honest: known curves, many simulated runs (``report.curve_coverage``).

Seven curves (rising, one tier exactly at 85% of the best, flat, near 0, near 1, a dip, five
tiers) x four ways of drawing an item's values across tiers (nested 0/1, independent 0/1,
the mean of two repeats, a continuous logit-normal score) x n = 4 ... 500, 2,000 runs each,
through the report's own vectorised functions (``curve.effective_tiers``,
``curve.area_bounds``, ``stats.graded_verdicts``). About 15 s on one core.

Tolerances (docs/reading-a-report.md, "Budget curves"): every interval's coverage at least
92%, the nominal 95% minus 3 points. With 2,000 runs a case's Monte-Carlo standard error is
at most 0.5 points, so an interval that really covers 95% falls under 92% with probability
below 1e-8 per case, while one that covers 90% (a one-sided slip at two comparisons) fails.
The area interval must also be close to nominal at n = 500 (mean over the cases within
95 +- 2.5 points), and the effective-budget range informative: at n = 500 it is the true
tier alone in at least 90% of runs, away from a tier exactly at the threshold (which no n
can decide). Paired areas with no difference get a verdict in at most 5% of runs plus 3
Monte-Carlo standard errors.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from budgetbench_core.report import curve_coverage

REPS = 2000


@pytest.fixture(scope="module")
def rows():
    return curve_coverage.simulate(reps=REPS)


def _case(rows, case):
    selected = [r for r in rows if r["case"] == case]
    assert {r["n"] for r in selected} == set(curve_coverage.NS)
    return selected


@pytest.mark.parametrize("case", ["effective budget", "area", "paired area"])
def test_coverage_never_below_the_floor(rows, case):
    selected = _case(rows, case)
    assert len(selected) >= 100
    assert [r for r in selected if r["coverage"] < curve_coverage.COVERAGE_FLOOR] == []


def test_the_area_interval_is_close_to_95_percent_at_large_n(rows):
    large = [r["coverage"] for r in _case(rows, "area") if r["n"] == 500]
    assert abs(float(np.mean(large)) - 0.95) <= 0.025, large


def test_the_effective_budget_range_is_informative_at_large_n(rows):
    decidable = [r for r in _case(rows, "effective budget") if r["n"] == 500 and r["curve"] != "at the threshold"]
    assert float(np.mean([r["exact"] for r in decidable])) >= 0.90
    assert all(r["shown"] >= 0.9 for r in decidable)  # a high end: the range is bounded on both sides
    # while a handful of items cannot pin it down, and the range then says so (no high end)
    assert float(np.mean([r["shown"] for r in _case(rows, "effective budget") if r["n"] == 4])) < 0.05


def test_paired_areas_with_no_difference_rarely_get_a_verdict(rows):
    rates = [r["verdicts"] for r in _case(rows, "paired area") if r["verdicts"] is not None]
    assert len(rates) == 2 * len(curve_coverage.FAMILIES) * 2 * len(curve_coverage.NS)
    assert max(rates) <= curve_coverage.VERDICT_CEILING + 3 * math.sqrt(0.05 * 0.95 / REPS)


def test_a_broken_interval_fails_the_floor():
    """The check can fail: the same simulation with a 90% area interval is under the floor."""
    from budgetbench_core.report import curve, stats

    rng = np.random.default_rng(5)
    truth = float(curve.log_weights(curve_coverage.THREE) @ np.array((0.2, 0.5, 0.9)))
    values = curve_coverage._draw(rng, "independent 0/1", (0.2, 0.5, 0.9), 500, REPS)
    areas = curve.item_areas(values, curve_coverage.THREE)
    low, high = stats.bounded_t_bounds(areas.sum(-1), (areas * areas).sum(-1), 500, confidence=0.90)
    assert float(np.mean((low <= truth) & (truth <= high))) < curve_coverage.COVERAGE_FLOOR
