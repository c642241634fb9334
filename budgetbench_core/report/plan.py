"""Sample sizes for paired comparisons, planned from a pilot run (formulas in ``power``).

For every pair of strategies at each tier, the pilot's per-item values (an item's mean over
its repeats) give the spread, and ``power`` the items a run with the pilot's repeats needs.
A pilot with repeats also shows how often outcomes flip between repeats (``noise``): its
rows then carry the flip rate and the items a *single-repeat* run would need, planned from
single-repeat outcomes (repeat k of one cell against repeat k of the other), whose
discordance includes that repeat noise. Averaging repeats removes part of the noise, so
fewer items are needed with more repeats: the two figures show the trade.

The pilot's spread is taken as the truth, so a small pilot gives a rough plan; the tests
check the formulas against simulations of the report's own interval.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from itertools import combinations
from typing import Any

import numpy as np

from . import stats
from .curve import is_control
from .data import RunData
from .noise import cell_noise, repeat_values
from .pairing import NOISE_METRIC, check_metric, pair_cells
from .power import CONFIDENCE, POWER, binary_items_needed, graded_items_needed

__all__ = ["Plan", "binary_items_needed", "graded_items_needed", "plan_pair", "plan_table"]


@dataclass(frozen=True)
class Plan:
    """Items needed for one comparison, or ``None`` with the reason when it cannot be planned."""

    goal: str  # "detect" or "non-inferiority"
    effect: float  # delta to detect, or assumed delta + margin
    observed_delta: float
    spread: float  # discordance (binary) or sd of the differences (graded)
    spread_kind: str  # "discordance" or "sd"
    pilot_items: int
    needed: int | None
    reason: str = ""


def plan_pair(
    candidate: Sequence[float],
    reference: Sequence[float],
    delta: float | None = None,
    margin: float | None = None,
    assume_delta: float | None = None,
    confidence: float = CONFIDENCE,
    power: float = POWER,
) -> Plan:
    """Plan from pilot values of two cells over the same items.

    Detect: ``delta`` (default: the pilot's observed delta). Non-inferiority (``margin``):
    the true delta is assumed to be ``assume_delta`` (default: the observed delta). The
    formula follows the report's paired method for these values (``stats.paired_method``).
    """
    a, b = np.asarray(candidate, dtype=float), np.asarray(reference, dtype=float)
    d = a - b
    n_pilot = int(d.size)
    observed = float(d.mean()) if n_pilot else math.nan
    binary = stats.paired_method(a, b) == stats.BINARY_METHOD
    if binary:
        spread, kind = (float(np.mean(d != 0)) if n_pilot else math.nan), "discordance"
    else:
        spread, kind = (float(np.std(d, ddof=1)) if n_pilot > 1 else math.nan), "sd"
    goal = "detect" if margin is None else "non-inferiority"
    true_delta = (
        (delta if delta is not None else observed)
        if margin is None
        else (assume_delta if assume_delta is not None else observed)
    )
    effect = abs(true_delta) if margin is None else true_delta + margin

    def result(needed: int | None, reason: str = "") -> Plan:
        return Plan(goal, effect, observed, spread, kind, n_pilot, needed, reason)

    if n_pilot < 2:
        return result(None, f"the pilot has {n_pilot} paired item(s); at least 2 are needed to estimate the spread")
    if margin is None and true_delta == 0:
        return result(None, "no delta to detect (the pilot's delta is 0): give --delta")
    if margin is not None and effect <= 0:
        return result(
            None,
            f"the assumed delta {true_delta:+.3f} is not above -margin {-margin:+.3f}: "
            "no number of items shows non-inferiority",
        )
    if binary:
        n = binary_items_needed(spread, true_delta, margin, confidence, power)
    else:
        if spread == 0:
            return result(None, "the pilot's paired differences have no spread (all equal): pilot more items")
        n = graded_items_needed(spread, true_delta, margin, confidence, power)
    if not math.isfinite(n):
        return result(None, "cannot be reached")
    return result(max(stats.MIN_PAIRED_ITEMS, math.ceil(n)))


def plan_table(
    data: RunData,
    delta: float | None = None,
    margin: float | None = None,
    assume_delta: float | None = None,
    confidence: float = CONFIDENCE,
    power: float = POWER,
    metric: str = "quality",
) -> list[dict[str, Any]]:
    """One row per pair of strategies at each budget tier (earlier strategy as reference);
    controls (``control:`` strategies) are never paired. With repeats, also ``flip_rate`` (the
    larger of the two cells') and ``needed_one_repeat``. ``metric``: quality, or evidence
    recall (``--metric evidence``, what a prompts-only pilot has)."""
    check_metric(data, metric, "plan")
    cells = data.cells()
    order = [s for s in data.strategy_order() if not is_control(s)]
    table = []
    for task, budget in sorted({(c[0], c[2]) for c in cells}):
        here = [s for s in order if (task, s, budget) in cells]
        for ref, cand in combinations(here, 2):
            pair = pair_cells(data, (task, cand, budget), (task, ref, budget), metric)
            plan = plan_pair(pair.candidate, pair.reference, delta, margin, assume_delta, confidence, power)
            row = {"task": task, "budget": budget, "candidate": cand, "reference": ref, **asdict(plan)}
            noise = [cell_noise(cells[(task, s, budget)], NOISE_METRIC[metric]) for s in (cand, ref)]
            if all(noise):
                single = _single_repeat_pairs(
                    cells[(task, cand, budget)], cells[(task, ref, budget)], pair.items, NOISE_METRIC[metric]
                )
                one = plan_pair(*single, delta, margin, assume_delta, confidence, power)
                row |= {
                    "repeats": min(n["repeats"] for n in noise),
                    "flip_rate": max(n["flip_rate"] for n in noise),
                    "needed_one_repeat": one.needed,
                }
            else:
                row |= {"repeats": 1, "flip_rate": None, "needed_one_repeat": plan.needed}
            table.append(row)
    return table


def _single_repeat_pairs(candidate_rows, reference_rows, items, metric: str) -> tuple[list[float], list[float]]:
    """Repeat k of the candidate against repeat k of the reference, for every shared item and k."""
    cand, ref = repeat_values(candidate_rows, metric), repeat_values(reference_rows, metric)
    pairs = [
        (cand[i][k], ref[i][k]) for i in items if i in cand and i in ref for k in sorted(set(cand[i]) & set(ref[i]))
    ]
    return [p[0] for p in pairs], [p[1] for p in pairs]
