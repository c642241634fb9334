"""Exact coverage of a binary cell's interval over a dense grid of n and p (the table in
docs/reading-a-report.md):

    .venv/bin/python benchmarks/coverage_dense.py   # ~10 s -> benchmarks/results/coverage_dense.json

Every n from 1 to 400; p every 0.001 in [0.001, 0.05] and [0.95, 0.999], every 0.01 between.
Coverage is the binomial probability of the successes whose interval holds p (no sampling),
for the report's interval, plain Wilson, and the report's interval as it was before the
small-count fix stayed on above 100 items.
"""

from __future__ import annotations

import json

import numpy as np
from _common import RESULTS

from budgetbench_core.report import coverage, stats

BANDS = ((1, 4), (5, 10), (11, 30), (31, 100), (101, 200), (201, 400))


def _fix_off_above_100(successes, n):
    """The interval before this table: the boundary fix switched off above 100 items."""
    fixed, plain = stats.modified_wilson_bounds(successes, n), stats.wilson_bounds(successes, n)
    above = np.asarray(n) > 100
    return np.where(above, plain[0], fixed[0]), np.where(above, plain[1], fixed[1])


METHODS = {
    "report (Wilson + boundary fix)": stats.modified_wilson_bounds,
    "plain Wilson": stats.wilson_bounds,
    "fix off above 100 (before)": _fix_off_above_100,
}


def _band(rows: list[dict], low: int, high: int) -> dict:
    here = [r for r in rows if low <= r["n"] <= high]
    edge = min((r for r in here if r["edge"]), key=lambda r: r["coverage"])
    middle = min((r for r in here if not r["edge"]), key=lambda r: r["coverage"])
    return {
        "n": f"{low}-{high}",
        "worst_edge": round(edge["coverage"], 4),
        "worst_edge_at": [edge["n"], edge["p"]],
        "worst_middle": round(middle["coverage"], 4),
        "worst_middle_at": [middle["n"], middle["p"]],
        "mean": round(float(np.mean([r["coverage"] for r in here])), 4),
    }


def main() -> None:
    results = {
        name: [_band(coverage.dense_binary_coverage(bounds), *b) for b in BANDS] for name, bounds in METHODS.items()
    }
    (RESULTS / "coverage_dense.json").write_text(json.dumps(results, indent=1) + "\n")
    print("| interval | n | worst near 0 or 1 (n, p) | worst for 0.06 <= p <= 0.94 (n, p) | mean over the grid |")
    print("|---|---|---|---|---|")
    for name, bands in results.items():
        for b in bands:
            edge, middle = b["worst_edge_at"], b["worst_middle_at"]
            print(
                f"| {name} | {b['n']} | {100 * b['worst_edge']:.1f} ({edge[0]}, {edge[1]:g}) | "
                f"{100 * b['worst_middle']:.1f} ({middle[0]}, {middle[1]:g}) | {100 * b['mean']:.1f} |"
            )


if __name__ == "__main__":
    main()
