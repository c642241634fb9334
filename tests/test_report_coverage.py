"""The report is honest: every interval it prints covers a known truth about 95% of the time.

Simulated known effects (binary and graded, paired and unpaired, n from 2 to 500, means near
0, 0.5 and 1) through the report's own interval code. Tolerances (docs/reading-a-report.md):
coverage never below 92% from the minimum number of items on (binary cells under 5 items:
87.5%, Wilson's discreteness); binary cells averaged over p
within 95% +- 1 point; under no effect at most 5% of samples get a verdict (plus 3 Monte-Carlo
standard errors); at n >= 200, mid-range cells and paired deltas from 0.5 within 95% +- 2.5
points (graded paired deltas under no effect excepted: conservative).
"""

from __future__ import annotations

import math

import pytest

from budgetbench_core.report import coverage, stats


@pytest.fixture(scope="module")
def rows():
    return coverage.simulate()


def _fails(rows, case):
    selected = [r for r in rows if r["case"] == case]
    assert {r["n"] for r in selected} == set(coverage.NS)
    floor = {
        n: coverage.SMALL_BINARY_FLOOR if case == "binary cell" and n < 5 else coverage.COVERAGE_FLOOR
        for n in coverage.NS
    }
    return [r for r in selected if not math.isnan(r["coverage"]) and r["coverage"] < floor[r["n"]]]


@pytest.mark.parametrize("case", ["binary cell", "graded cell", "paired binary", "paired graded"])
def test_coverage_never_below_the_floor(rows, case):
    assert _fails(rows, case) == []


def test_binary_cells_average_95_percent_over_p(rows):
    for r in rows:
        if r["case"] == "binary cell" and r["truth"] == "mean over p" and r["n"] >= 10:
            assert abs(r["coverage"] - 0.95) <= coverage.BINARY_MEAN_BAND, r


@pytest.mark.parametrize("case,reps", [("paired binary", 4000), ("paired graded", 2000)])
def test_no_effect_gets_a_verdict_at_most_5_percent_of_the_time(rows, case, reps):
    slack = 3 * math.sqrt(0.05 * 0.95 / reps)
    rates = [r["verdicts"] for r in rows if r["case"] == case and not r["effect"]]
    assert rates and max(rates) <= coverage.VERDICT_CEILING + slack


def test_paired_intervals_start_at_the_minimum_and_are_close_to_95_at_large_n(rows):
    for r in rows:
        if r["case"].startswith("paired"):
            assert math.isnan(r["coverage"]) == (r["n"] < stats.MIN_PAIRED_ITEMS), r
        if r["n"] >= 200 and ("0.5" in r["truth"] and "delta=+0.000" not in r["truth"] or r["truth"] == "p=0.5"):
            assert abs(r["coverage"] - 0.95) <= 0.025, r


def test_the_minimum_is_where_the_simulation_puts_it():
    """One item fewer than MIN_PAIRED_ITEMS and the worst tested case falls below the floor."""
    below = coverage.paired_binary(ns=[stats.MIN_PAIRED_ITEMS - 1], reps=4000, min_n=1)
    assert min(r.coverage for r in below) < coverage.COVERAGE_FLOOR
