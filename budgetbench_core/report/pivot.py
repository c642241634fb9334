"""The "best at each budget" grid at the top of a report: strategy x budget, with the winner.

A strategy is called best at a budget only when every other strategy's paired delta against
it (same items) is distinguished as lower; strategies not distinguished from the top point
estimate are tied with it, and the grid says so rather than ranking them; when a comparison's
items are too few for any outcome to separate the two (0/4 against 4/4), the grid says "too
few items to separate", never "tie". Harness controls
(``control:`` strategies) have a row, marked, as a reference: they are never ranked.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from . import stats
from .curve import is_control

Values = Callable[[tuple[str, str, int]], dict[str, float]]


def _finite(value: Any) -> bool:
    return value is not None and not (isinstance(value, float) and math.isnan(value))


def best_at_each_budget(
    summary: list[dict[str, Any]],
    values: Values,
    metric: str = "quality_all",
) -> list[dict[str, Any]]:
    """One grid per task: ``cells[strategy][budget]`` (the summary row) and ``best[budget]``.

    ``values(cell)`` gives item -> value for the paired comparison with the top cell.
    """
    grids = []
    for task in sorted({r["task"] for r in summary}):
        rows = [r for r in summary if r["task"] == task]
        strategies = list(dict.fromkeys(r["strategy"] for r in rows))
        budgets = sorted({r["budget"] for r in rows})
        cells = {s: {r["budget"]: r for r in rows if r["strategy"] == s} for s in strategies}
        best = {}
        for budget in budgets:
            here = [
                r for r in rows if r["budget"] == budget and _finite(r.get(metric)) and not is_control(r["strategy"])
            ]
            excluded = [r["strategy"] for r in here if r.get("violations")]  # over budget: never best
            here = [r for r in here if not r.get("violations")]
            if not here:
                best[budget] = {
                    "status": "none",
                    "strategies": [],
                    "excluded": excluded,
                    "text": "every strategy exceeded the budget" if excluded else "nothing scored",
                }
                continue
            top = max(here, key=lambda r: r[metric])
            top_values = values((task, top["strategy"], budget))
            tied, too_few = [top["strategy"]], False
            for row in here:
                if row is top:
                    continue
                other = values((task, row["strategy"], budget))
                shared = sorted(set(top_values) & set(other))
                delta = stats.paired_delta([other[i] for i in shared], [top_values[i] for i in shared])
                if delta.verdict != stats.LOWER:
                    tied.append(row["strategy"])
                    too_few = too_few or delta.verdict in stats.NO_VERDICT
            if len(here) == 1:  # nobody to be best against: never a finding
                status, text = "only", f"{top['strategy']} (the only strategy scored within the budget)"
            elif len(tied) == 1:
                status, text = "best", f"{top['strategy']} (every other strategy distinguished lower)"
            elif too_few:
                status, text = "too few items", f"too few items to separate {', '.join(tied)}"
            else:
                status, text = "tied", f"tie: {', '.join(tied)} (not distinguished)"
            best[budget] = {"status": status, "strategies": tied, "excluded": excluded, "text": text}
        grids.append(
            {
                "task": task,
                "strategies": strategies,
                "controls": [s for s in strategies if is_control(s)],
                "budgets": budgets,
                "cells": cells,
                "best": best,
                "metric": metric,
            }
        )
    return grids
