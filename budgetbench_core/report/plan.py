"""Sample sizes for paired comparisons, planned from a pilot run.

For two cells compared over the same items, the per-item difference d = candidate - reference
is what the report's paired interval is built on. The planner asks how many items make that
95% interval exclude zero (to *detect* a delta) or stay above ``-margin`` (to show
*non-inferiority*) in 80% of runs:

- binary quality (every item value 0 or 1): d is -1, 0 or +1, so only discordant items carry
  information. With discordance psi = P(d != 0) from the pilot and effect delta,
  n = (z_a * sqrt(psi0) + z_b * sqrt(psi - delta**2))**2 / effect**2 (Connor 1987, the
  McNemar power formula), where psi0 is the variance at the null boundary (psi for
  detection, psi - margin**2 for non-inferiority); for detection, whose verdict also needs
  the exact sign test, with Fleiss' continuity correction n/4 * (1 + sqrt(1 + 2/(n*effect)))**2;
- graded quality: the smallest n at which the report's bounded-t interval (a t-interval with
  z**2 pseudo-items at -1 and +1) clears the boundary with the given power, taking the
  pilot's sd of d and the assumed delta as the truth.

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
from scipy import stats as scipy_stats

from . import stats
from .data import RunData
from .pairing import pair_cells

POWER = 0.80
CONFIDENCE = 0.95


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


def _z(confidence: float, power: float) -> tuple[float, float]:
    return float(scipy_stats.norm.ppf(1 - (1 - confidence) / 2)), float(scipy_stats.norm.ppf(power))


def binary_items_needed(
    discordance: float, delta: float, margin: float | None = None, confidence: float = CONFIDENCE, power: float = POWER
) -> float:
    """Items for a paired binary comparison (Connor's formula); ``inf`` when it cannot succeed.

    ``delta`` is the true difference assumed; with ``margin`` the goal is a lower bound above
    ``-margin``, else an interval that excludes zero on the side of ``delta``.
    """
    z_a, z_b = _z(confidence, power)
    boundary = -margin if margin is not None else 0.0
    effect = abs(delta - boundary) if margin is None else delta - boundary
    if effect <= 0:
        return math.inf
    psi = max(discordance, abs(delta), abs(boundary))
    null_var = psi - boundary**2
    alt_var = max(psi - delta**2, 0.0)
    n = (z_a * math.sqrt(null_var) + z_b * math.sqrt(alt_var)) ** 2 / effect**2
    if margin is None:  # the verdict also needs the exact sign test: Fleiss' continuity correction
        n = n / 4 * (1 + math.sqrt(1 + 2 / (n * effect))) ** 2
    return n


def graded_items_needed(
    sd: float, delta: float, margin: float | None = None, confidence: float = CONFIDENCE, power: float = POWER
) -> float:
    """Items for a paired graded comparison with the report's bounded-t interval.

    The bounded t adds k = z**2 pseudo-items, half at -1 and half at +1, to the per-item
    differences: the centre shrinks to n*delta/(n+k) and the spread grows, which matters at
    the n a pilot suggests (a plain t formula is 25-35% short there). The smallest n whose
    expected bound clears the boundary with the given power is found by bisection.
    """
    effect = abs(delta) if margin is None else delta + margin
    if effect <= 0 or sd <= 0:
        return math.inf
    delta = abs(delta) if margin is None else delta
    boundary = 0.0 if margin is None else -margin
    k = stats.PSEUDO
    z_b = float(scipy_stats.norm.ppf(power))

    def enough(n: int) -> bool:
        weight = n + k
        centre = n * delta / weight
        var = max((n * (sd * sd + delta * delta) + k - weight * centre * centre) / (weight - 1), 0.0)
        t_a = scipy_stats.t.ppf(1 - (1 - confidence) / 2, n - 1)
        return centre - t_a * math.sqrt(var / weight) - boundary >= z_b * sd * math.sqrt(n) / weight

    low, high = 2, 2
    while not enough(high):
        low, high = high, high * 2
        if high > 10_000_000:
            return math.inf
    while low < high:
        middle = (low + high) // 2
        low, high = (low, middle) if enough(middle) else (middle + 1, high)
    return float(high)


def is_binary(values: Sequence[float] | np.ndarray) -> bool:
    return all(v in (0.0, 1.0) for v in values)


def plan_pair(
    candidate: Sequence[float],
    reference: Sequence[float],
    binary: bool,
    delta: float | None = None,
    margin: float | None = None,
    assume_delta: float | None = None,
    confidence: float = CONFIDENCE,
    power: float = POWER,
) -> Plan:
    """Plan from pilot values of two cells over the same items.

    Detect: ``delta`` (default: the pilot's observed delta). Non-inferiority (``margin``):
    the true delta is assumed to be ``assume_delta`` (default: the observed delta).
    """
    a, b = np.asarray(candidate, dtype=float), np.asarray(reference, dtype=float)
    d = a - b
    n_pilot = int(d.size)
    observed = float(d.mean()) if n_pilot else math.nan
    binary = binary and is_binary(a) and is_binary(b)
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
) -> list[dict[str, Any]]:
    """One row per pair of strategies at each budget tier (earlier strategy as reference)."""
    cells = data.cells()
    order = data.strategy_order()
    table = []
    for task, budget in sorted({(c[0], c[2]) for c in cells}):
        here = [s for s in order if (task, s, budget) in cells]
        for ref, cand in combinations(here, 2):
            pair = pair_cells(data, (task, cand, budget), (task, ref, budget))
            plan = plan_pair(
                pair.candidate, pair.reference, data.binary, delta, margin, assume_delta, confidence, power
            )
            table.append({"task": task, "budget": budget, "candidate": cand, "reference": ref, **asdict(plan)})
    return table
