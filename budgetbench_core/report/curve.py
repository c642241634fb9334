"""Reading a strategy's budget curve: its effective budget and the area under it.

A strategy's curve is its score at each budget tier of the task, over the items it scored at
every tier (an item's value its mean over repeats, violations and the strategy's errors 0, other errors left out), so tiers
are compared on the same items.

- **Effective budget** (after NoLiMa and RULER's "effective length"): the smallest tier whose
  score keeps at least ``share`` (default 85%) of the strategy's best score over the tiers.
  Its 95% interval is a range of tiers found by test inversion on paired differences: tier t
  keeps the share iff, for every other tier u, mean(v_t - share * v_u) >= 0 over items. The
  low end is the smallest tier not shown to fall short (no u whose bounded-t upper bound of
  that difference is below 0); the high end the smallest tier shown to keep it (every
  lower bound above 0), or none when no tier run shows it. "not reached" when the strategy
  scores 0 at every tier; "too few items" below ``MIN_ITEMS``.
- **Area under the curve** (after LongMemEval's accuracy over a log-uniform budget axis): the
  score integrated over log(budget) from the smallest to the largest tier run (trapezoids
  between tiers), divided by that width, so it lies in [0, 1]. It is linear in the item
  values, so each item has its own area a_i = sum_t w_t v_(i,t) and the curve's area is
  their mean: its interval is the report's bounded t over the a_i, and two strategies'
  areas are compared by the paired graded delta over the items both scored.

Strategies named ``control:...`` (harness controls, ``budgetbench_core.controls``) get a
curve but are never ranked; items ``control:no_memory`` answers correctly at a tier are
flagged "answerable without memory" and every cell's score is also given without them.
Both intervals have their coverage checked by ``tests/test_report_curve_coverage.py``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

from ..controls import (
    EVIDENCE_ONLY,
    NO_MEMORY,
    is_control,  # the engine's own test: a harness control is never ranked
)
from . import stats
from .power import detectable_effect

DEFAULT_SHARE = 0.85
MIN_ITEMS = stats.MIN_PAIRED_ITEMS

Values = Callable[[tuple[str, str, int]], dict[str, float]]


# --- vectorised (also what the coverage simulation runs) ---------------------------------


def log_weights(budgets) -> np.ndarray:
    """Trapezoid weights over log(budget) summing to 1: area = weights @ scores."""
    x = np.log(np.asarray(budgets, dtype=float))
    if x.size == 1:
        return np.ones(1)
    gaps = np.diff(x)
    weights = np.zeros(x.size)
    weights[:-1] += gaps / 2
    weights[1:] += gaps / 2
    return weights / (x[-1] - x[0])


def item_areas(values, budgets) -> np.ndarray:
    """Per-item areas: ``values`` (..., n items, k tiers) -> (..., n)."""
    return np.asarray(values, dtype=float) @ log_weights(budgets)


def area_bounds(areas):
    """Bounded-t 95% bounds of the mean area from per-item areas (..., n)."""
    a = np.asarray(areas, dtype=float)
    return stats.bounded_t_bounds(a.sum(-1), (a * a).sum(-1), a.shape[-1])


def effective_tiers(values, share: float = DEFAULT_SHARE):
    """(point, low, high) tier indexes from ``values`` (..., n items, k tiers); -1 is none.

    point: the smallest tier whose mean keeps ``share`` of the best mean (-1: every mean 0).
    low/high: the test-inversion bounds of the module docstring (high -1: no tier shown).
    """
    v = np.asarray(values, dtype=float)
    n, k = v.shape[-2], v.shape[-1]
    means = v.mean(-2)
    best = means.max(-1, keepdims=True)
    keeps = means >= share * best - 1e-12
    point = np.where(best[..., 0] > 0, keeps.argmax(-1), -1)
    sums = v.sum(-2)
    cross = np.einsum("...it,...iu->...tu", v, v)
    squares = np.diagonal(cross, axis1=-2, axis2=-1)
    total = sums[..., :, None] - share * sums[..., None, :]  # sum over items of v_t - share * v_u
    total_sq = squares[..., :, None] - 2 * share * cross + share**2 * squares[..., None, :]
    low, high = stats.bounded_t_bounds(total, total_sq, n, -share, 1.0)
    other = ~np.eye(k, dtype=bool)
    falls_short = np.any((high < 0) & other, -1)
    shown = np.all((low > 0) | ~other, -1) & (means > 0)
    lower = (~falls_short).argmax(-1)
    upper = np.where(shown.any(-1), shown.argmax(-1), -1)
    upper = np.where((upper >= 0) & (point >= 0), np.maximum(upper, point), upper)
    return point, lower, upper


# --- the report's tables -------------------------------------------------------------------


def _finite(value: Any) -> bool:
    return value is not None and not (isinstance(value, float) and math.isnan(value))


def _effective_text(row: dict[str, Any]) -> str:
    status = row["effective_status"]
    if status != "reached":
        return status
    low, high = row["effective_low"], row["effective_high"]
    text = str(row["effective_budget"])
    if row["effective_budget"] == row["budgets"][0]:
        text += " (the smallest tier run: may be lower)"
    return f"{text} [{low}, {high if high is not None else 'not shown within the tiers run'}]"


def curve_rows(
    summary: list[dict[str, Any]], values: Values, metric: str, share: float = DEFAULT_SHARE
) -> tuple[list[dict[str, Any]], dict[tuple[str, str], dict[str, float]]]:
    """One row per (task, strategy), and (task, strategy) -> item -> the item's area."""
    rows, areas = [], {}
    for task in sorted({r["task"] for r in summary}):
        budgets = sorted({r["budget"] for r in summary if r["task"] == task})
        for strategy in dict.fromkeys(r["strategy"] for r in summary if r["task"] == task):
            own = {r["budget"] for r in summary if r["task"] == task and r["strategy"] == strategy}
            per_tier = [values((task, strategy, b)) if b in own else {} for b in budgets]
            items = sorted(set.intersection(*(set(v) for v in per_tier)))
            matrix = np.array([[v[i] for v in per_tier] for i in items], dtype=float).reshape(len(items), len(budgets))
            row: dict[str, Any] = {
                "task": task,
                "strategy": strategy,
                "control": is_control(strategy),
                "metric": metric,
                "budgets": budgets,
                "n_items": len(items),
                "scores": [float(m) for m in matrix.mean(0)] if items else [math.nan] * len(budgets),
                "share": share,
            }
            missing = sorted(set(budgets) - own)
            if missing or not items:
                why = f"not run at {', '.join(map(str, missing))}" if missing else "no item scored at every tier"
                rows.append(row | _empty(why))
                continue
            item_area = item_areas(matrix, budgets)
            areas[(task, strategy)] = dict(zip(items, item_area.tolist()))
            row |= {"best_score": float(matrix.mean(0).max()), "auc": float(item_area.mean())}
            if len(items) < MIN_ITEMS:
                few = f"too few items ({len(items)} < {MIN_ITEMS})"
                rows.append(row | {"auc_low": math.nan, "auc_high": math.nan} | _effective(few))
                continue
            low, high = area_bounds(item_area)
            point, lower, upper = (int(x) for x in effective_tiers(matrix, share))
            row |= {"auc_low": float(low), "auc_high": float(high)}
            if point < 0:
                row |= _effective("not reached (the score is 0 at every tier)")
            else:
                row |= {
                    "effective_budget": budgets[point],
                    "effective_low": budgets[lower],
                    "effective_high": budgets[upper] if upper >= 0 else None,
                    "effective_status": "reached",
                }
            rows.append(row | {"effective_text": _effective_text(row)})
    return rows, areas


def _sd(a: list[float], b: list[float]) -> float:
    """The sd of per-item area differences (the paired area delta is always graded)."""
    d = np.asarray(a, dtype=float) - np.asarray(b, dtype=float)
    return float(np.std(d, ddof=1)) if d.size > 1 else math.nan


def _effective(status: str) -> dict[str, Any]:
    return {
        "effective_budget": None,
        "effective_low": None,
        "effective_high": None,
        "effective_status": status,
        "effective_text": status,
    }


def _empty(status: str) -> dict[str, Any]:
    return {"best_score": math.nan, "auc": math.nan, "auc_low": math.nan, "auc_high": math.nan} | _effective(status)


def auc_ranking(curves: list[dict[str, Any]], areas: dict[tuple[str, str], dict[str, float]]) -> list[dict[str, Any]]:
    """Strategies (not controls) of each task by area, each compared with the next one down
    by the paired graded delta of per-item areas over the items both scored."""
    ranking = []
    for task in sorted({c["task"] for c in curves}):
        ranked = sorted(
            (c for c in curves if c["task"] == task and not c["control"] and _finite(c["auc"])),
            key=lambda c: -c["auc"],
        )
        for place, (row, below) in enumerate(zip(ranked, [*ranked[1:], None]), start=1):
            entry = {
                "task": task,
                "rank": place,
                "strategy": row["strategy"],
                "auc": row["auc"],
                "auc_low": row["auc_low"],
                "auc_high": row["auc_high"],
                "n_items": row["n_items"],
                "next": below["strategy"] if below else None,
            }
            if below:
                mine, theirs = areas[(task, row["strategy"])], areas[(task, below["strategy"])]
                shared = sorted(set(mine) & set(theirs))
                delta = stats.paired_delta(
                    [mine[i] for i in shared], [theirs[i] for i in shared], method=stats.GRADED_METHOD
                )
                a, b = [mine[i] for i in shared], [theirs[i] for i in shared]
                entry |= {
                    "delta_next": delta.mean,
                    "delta_next_low": delta.low,
                    "delta_next_high": delta.high,
                    "paired_items": delta.n,
                    "result": delta.verdict,
                    "mde": detectable_effect(_sd(a, b), "sd", delta.n),
                }
            ranking.append(entry)
    return ranking


def ranking_findings(ranking: list[dict[str, Any]], curves: list[dict[str, Any]]) -> list[str]:
    """The headline: each task's strategies by area under the budget curve, in words."""
    notes = []
    for task in sorted({r["task"] for r in ranking}):
        rows = [r for r in ranking if r["task"] == task]
        budgets = next(c["budgets"] for c in curves if c["task"] == task)
        parts = []
        for r in rows:
            text = f"{r['strategy']} {r['auc']:.3f}"
            if _finite(r["auc_low"]):
                text += f" [{r['auc_low']:.3f}, {r['auc_high']:.3f}]"
            if r["next"]:
                sign = ">" if r["result"] == stats.HIGHER else "~"
                text += f" {sign}"
            parts.append(text)
        words = {stats.HIGHER: "distinguished", stats.TIE: "not distinguished", stats.TOO_FEW: "too few items"}
        gaps = [f"{r['strategy']} vs {r['next']}: {words.get(r['result'], r['result'])}" for r in rows if r["next"]]
        span = f"{budgets[0]}-{budgets[-1]}" if len(budgets) > 1 else f"{budgets[0]} only"
        notes.append(
            f"{task}: ranked by area under the budget curve (score integrated over log budget {span}, "
            f"normalised to [0, 1], violations 0): {' '.join(parts)}"
            + (f" ({'; '.join(gaps)}; '>' marks a paired difference that excludes 0)." if gaps else ".")
        )
    for c in curves:
        if c["effective_status"] == "reached" and not c["control"]:
            notes.append(
                f"{c['task']}: {c['strategy']} keeps {c['share']:.0%} of its best score "
                f"({c['best_score']:.3f}) from budget {c['effective_text']}."
            )
    return notes


# --- controls -------------------------------------------------------------------------------


def answerable_without_memory(
    summary: list[dict[str, Any]], values: Values, binary: bool
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Items ``control:no_memory`` answers correctly, per tier, and every cell's score without them.

    An item is *answerable without memory* at a tier when the no-memory control (system prompt
    and query alone) scores it 1 there (on every scored repeat). Returns (one row per task and
    tier the control ran at, with the flagged ids; one row per other cell at that tier, with
    its score over all its items and over the items not flagged, with the 95% interval).
    """
    flagged, remaining = [], []
    for task in sorted({r["task"] for r in summary}):
        here = [r for r in summary if r["task"] == task]
        for budget in sorted({r["budget"] for r in here if r["strategy"] == NO_MEMORY}):
            control = values((task, NO_MEMORY, budget))
            answerable = sorted(i for i, v in control.items() if v >= 1.0)
            flagged.append(
                {
                    "task": task,
                    "budget": budget,
                    "answerable": len(answerable),
                    "control_items": len(control),
                    "items": " ".join(answerable),
                }
            )
            skip = set(answerable)
            for row in here:
                if row["budget"] != budget or row["strategy"] == NO_MEMORY:
                    continue
                own = values((task, row["strategy"], budget))
                rest = stats.estimate([v for i, v in sorted(own.items()) if i not in skip], binary)
                remaining.append(
                    {
                        "task": task,
                        "strategy": row["strategy"],
                        "control": is_control(row["strategy"]),
                        "budget": budget,
                        "score_all": float(np.mean(list(own.values()))) if own else math.nan,
                        "n_all": len(own),
                        "score_remaining": rest.mean,
                        "score_remaining_low": rest.low,
                        "score_remaining_high": rest.high,
                        "n_remaining": rest.n,
                        "left_out": len(skip & set(own)),
                    }
                )
    return flagged, remaining


def control_findings(
    curves: list[dict[str, Any]], flagged: list[dict[str, Any]], remaining: list[dict[str, Any]]
) -> list[str]:
    """Controls in words: their curves (reference lines) and the items answerable without memory."""
    notes = []
    for c in curves:
        if not c["control"]:
            continue
        scores = ", ".join(f"{b}: {s:.3f}" for b, s in zip(c["budgets"], c["scores"]) if _finite(s))
        what = {
            NO_MEMORY: "the system prompt and question alone",
            EVIDENCE_ONLY: "the gold evidence alone, fitted to the budget: the ceiling at each budget",
        }.get(c["strategy"], "a harness control")
        notes.append(
            f"{c['task']}: control {c['strategy']} ({what}; a reference line, never ranked) scores "
            f"{scores or 'nothing'} over {c['n_items']} items."
        )
    for f in flagged:
        if not f["answerable"]:
            notes.append(f"{f['task']}: at budget {f['budget']} {NO_MEMORY} answers no item correctly.")
            continue
        rows = [r for r in remaining if r["task"] == f["task"] and r["budget"] == f["budget"] and not r["control"]]
        scores = "; ".join(
            f"{r['strategy']} {r['score_all']:.3f} on all, {r['score_remaining']:.3f} without them" for r in rows
        )
        notes.append(
            f"{f['task']}: at budget {f['budget']}, {f['answerable']} of {f['control_items']} items are answerable "
            f"without memory ({NO_MEMORY} answers them correctly): {f['items']}"
            + (f". Scores: {scores}." if scores else ".")
        )
    return notes
