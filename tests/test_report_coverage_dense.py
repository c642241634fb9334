"""A binary cell's interval covers p at every n up to 400, near 0 and 1 included: exact
binomial coverage over a dense grid (``coverage.dense_binary_coverage``, a few seconds), not
only at the simulation's chosen n and p. The table in docs/reading-a-report.md is
``benchmarks/coverage_dense.py``'s."""

from __future__ import annotations

import pytest

from budgetbench_core.report import coverage, stats


@pytest.fixture(scope="module")
def dense():
    return coverage.dense_binary_coverage()


def _worst(rows, **where):
    chosen = [r for r in rows if all(r[k] == v for k, v in where.items())]
    return min(chosen, key=lambda r: r["coverage"])


def test_the_grid_is_dense(dense):
    assert {r["n"] for r in dense} == set(range(1, 401))
    edge = {r["p"] for r in dense if r["edge"]}
    assert {0.001, 0.002, 0.05, 0.95, 0.999} <= edge and len(edge) == 100


def test_coverage_near_0_and_1_holds_above_100_items(dense):
    """Old code switched the small-count fix off above 100 items: 83.9% at n = 176, p = 0.001."""
    rows = [r for r in dense if r["n"] >= 5 and r["edge"]]
    worst = min(rows, key=lambda r: r["coverage"])
    assert worst["coverage"] >= coverage.DENSE_EDGE_FLOOR, worst
    assert _worst(dense, n=176, p=0.001)["coverage"] >= 0.95


def test_coverage_floor_everywhere(dense):
    for r in dense:
        floor = coverage.DENSE_SMALL_FLOOR if r["n"] < 5 else coverage.DENSE_FLOOR
        assert r["coverage"] >= floor, r


def test_the_grid_catches_plain_wilson_near_the_boundary():
    """The test has teeth: without the fix Wilson falls far below the floor above 100 items."""
    plain = coverage.dense_binary_coverage(stats.wilson_bounds, ns=range(150, 201))
    assert min(r["coverage"] for r in plain if r["edge"]) < 0.85
