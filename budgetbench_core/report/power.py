"""Items needed for a paired comparison, and its inverse, the smallest detectable effect.

For two cells compared over the same items, the per-item difference d = candidate - reference
is what the report's paired interval is built on. How many items make that 95% interval
exclude zero (to *detect* a delta) or stay above ``-margin`` (to show *non-inferiority*) in
80% of runs:

- binary quality (every item value 0 or 1): d is -1, 0 or +1, so only discordant items
  carry information. With discordance psi = P(d != 0) and effect delta,
  n = (z_a * sqrt(psi0) + z_b * sqrt(psi - delta**2))**2 / effect**2 (Connor 1987, the
  McNemar power formula), where psi0 is the variance at the null boundary (psi for
  detection, psi - margin**2 for non-inferiority); for detection, whose verdict also needs
  the exact sign test, with Fleiss' continuity correction n/4 * (1 + sqrt(1 + 2/(n*effect)))**2;
- graded quality: the smallest n at which the report's bounded-t interval (a t-interval with
  z**2 pseudo-items at -1 and +1) clears the boundary with the given power, taking the sd of
  d and the assumed delta as the truth.

``detectable_effect`` turns the question round: at a given n and spread, the smallest delta
detected with that power (the "minimum detectable effect" printed next to every paired
comparison and the noise floor of a run with repeats). ``budgetbench plan`` uses both.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from scipy import stats as scipy_stats

from . import stats

POWER = 0.80
CONFIDENCE = 0.95


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


def detectable_effect(
    spread: float, kind: str, n: int, confidence: float = CONFIDENCE, power: float = POWER
) -> float | None:
    """Smallest delta in (0, 1] that ``n`` paired items detect with ``power``; None when none is.

    ``kind`` is ``discordance`` (binary values: ``spread`` is the share of discordant items
    apart from the effect itself) or ``sd`` (graded: the sd of the per-item differences).
    Found by bisection on the items-needed formulas above, so it agrees with ``plan``.
    """
    if n < stats.MIN_PAIRED_ITEMS or not math.isfinite(spread):
        return None
    if kind == "sd":  # no spread at all (every difference equal): the interval's own width still limits n
        spread = max(spread, 1e-9)

    def needed(delta: float) -> float:
        if kind == "discordance":
            return binary_items_needed(spread, delta, None, confidence, power)
        return graded_items_needed(spread, delta, None, confidence, power)

    if needed(1.0) > n:
        return None
    low, high = 0.0, 1.0
    for _ in range(30):
        middle = (low + high) / 2
        low, high = (low, middle) if needed(middle) <= n else (middle, high)
    return high


def pair_spread(candidate: Sequence[float], reference: Sequence[float]) -> tuple[float, str]:
    """(discordance, "discordance") for 0/1 values, else (sd of the differences, "sd"): the
    spread ``detectable_effect`` takes, from two cells' values over the same items."""
    a, b = np.asarray(candidate, dtype=float), np.asarray(reference, dtype=float)
    d = a - b
    if d.size < 2:
        return math.nan, "sd"
    if np.all((a == 0) | (a == 1)) and np.all((b == 0) | (b == 1)):
        return float(np.mean(d != 0)), "discordance"
    return float(np.std(d, ddof=1)), "sd"
