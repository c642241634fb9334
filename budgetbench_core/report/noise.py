"""The noise floor of a run with repeats: how often an item's outcome flips between repeats.

With ``--repeats r`` (r >= 2) every cell answers each item r times. Per cell:

- ``flip_rate``: the share of items (scored on at least two repeats) whose outcome is not
  the same on every repeat;
- ``repeat_spread``: how much two single repeats of the same cell disagree, item by item:
  the share of items on which two repeats differ, averaged over the pairs of repeats (0/1
  outcomes, ``discordance``), or the root-mean-square of the per-item difference between
  two repeats (graded, ``sd``);
- ``noise_floor``: the smallest difference between two single-repeat results over the
  cell's n items that a paired comparison detects (95%, 80% power) when what they disagree
  on apart from it is this repeat noise (``power.detectable_effect``). A smaller difference
  between two strategies run once each cannot be told from re-running one of them.

An item's outcome in a repeat is its score in that repeat's row (violations 0, errors left
out), or for a prompts-only run whether that row's prompt kept all the marked evidence.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Iterable
from itertools import combinations
from typing import Any

import numpy as np

from .evidence import item_evidence
from .power import detectable_effect
from .tables import item_values

RowValues = Callable[[Iterable[dict[str, Any]]], dict[str, float]]


def row_scorer(metric: str) -> RowValues:
    """item -> value of the rows given, for the report's metric (quality or evidence recall)."""
    if metric == "evidence_all":
        return lambda rows: item_evidence(rows)[0]
    return item_values


def repeat_values(rows: Iterable[dict[str, Any]], metric: str = "quality_all") -> dict[str, dict[int, float]]:
    """item -> repeat -> the item's outcome in that repeat (unscored repeats left out)."""
    score = row_scorer(metric)
    per_item: dict[str, dict[int, float]] = defaultdict(dict)
    for row in rows:
        for item, value in score([row]).items():
            per_item[item][int(row["repeat"])] = value
    return dict(per_item)


def cell_noise(rows: list[dict[str, Any]], metric: str = "quality_all") -> dict[str, Any]:
    """The noise figures of one cell (see the module docstring); empty without two repeats."""
    outcomes = repeat_values(rows, metric)
    repeated = {item: r for item, r in outcomes.items() if len(r) >= 2}
    if not repeated:
        return {}
    flips = [len(set(r.values())) > 1 for r in repeated.values()]
    differences = [
        r[a] - r[b] for r in repeated.values() for a, b in combinations(sorted(r), 2)
    ]  # every pair of repeats of every item
    d = np.asarray(differences, dtype=float)
    binary = all(v in (0.0, 1.0) for r in repeated.values() for v in r.values())
    kind = "discordance" if binary else "sd"
    spread = float(np.mean(d != 0)) if binary else float(math.sqrt(np.mean(d * d)))
    n = len(repeated)
    return {
        "repeats": max(len(r) for r in repeated.values()),
        "items_repeated": n,
        "flip_rate": float(np.mean(flips)),
        "flipped_items": int(sum(flips)),
        "repeat_spread": spread,
        "spread_kind": kind,
        "noise_floor": detectable_effect(spread, kind, n),
    }


def noise_table(cells: dict[tuple[str, str, int], list[dict[str, Any]]], metric: str) -> list[dict[str, Any]]:
    """One row per cell answered on at least two repeats."""
    table = []
    for (task, strategy, budget), rows in cells.items():
        figures = cell_noise(rows, metric)
        if figures:
            table.append({"task": task, "strategy": strategy, "budget": budget, "metric": metric, **figures})
    return table
