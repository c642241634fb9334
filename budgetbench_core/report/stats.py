"""Intervals for a report: Wilson for binary scores, seeded percentile bootstraps otherwise.

Intervals are always computed over per-item values (an item's mean over its repeats),
never by averaging the bounds of per-repeat intervals. A difference between two cells
is a paired bootstrap over the same items, so item difficulty cancels out.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy import stats

CONFIDENCE = 0.95
RESAMPLES = 10_000
SEED = 0


@dataclass(frozen=True)
class Estimate:
    """A mean with its 95% interval and how the interval was computed."""

    mean: float
    low: float
    high: float
    n: int
    method: str

    @classmethod
    def empty(cls) -> Estimate:
        return cls(math.nan, math.nan, math.nan, 0, "none")


def wilson(successes: int, n: int, confidence: float = CONFIDENCE) -> tuple[float, float]:
    """The Wilson score interval (not Wald) for ``successes`` out of ``n``."""
    interval = stats.binomtest(int(successes), int(n)).proportion_ci(confidence, method="wilson")
    return float(interval.low), float(interval.high)


def bootstrap_mean(values: Sequence[float], seed: int = SEED, confidence: float = CONFIDENCE) -> tuple[float, float]:
    """Seeded percentile bootstrap interval of the mean; a single value gives (nan, nan)."""
    data = np.asarray(values, dtype=float)
    if data.size < 2:
        return math.nan, math.nan
    if np.all(data == data[0]):
        return float(data[0]), float(data[0])
    result = stats.bootstrap((data,), np.mean, n_resamples=RESAMPLES, confidence_level=confidence,
                             method="percentile", rng=np.random.default_rng(seed))
    return float(result.confidence_interval.low), float(result.confidence_interval.high)


def estimate(values: Sequence[float], binary: bool, seed: int = SEED) -> Estimate:
    """Mean of per-item values with Wilson (binary grader, every value 0 or 1) or bootstrap."""
    data = np.asarray(values, dtype=float)
    if data.size == 0:
        return Estimate.empty()
    mean = float(data.mean())
    if binary and np.all((data == 0) | (data == 1)):
        low, high = wilson(int(data.sum()), int(data.size))
        return Estimate(mean, low, high, int(data.size), "wilson")
    low, high = bootstrap_mean(data, seed)
    return Estimate(mean, low, high, int(data.size), "bootstrap")


def paired_delta(candidate: Sequence[float], reference: Sequence[float], seed: int = SEED) -> Estimate:
    """Mean of candidate - reference over the same items, with a paired bootstrap interval.

    Resampling items and taking the mean difference of each resample is the same as
    bootstrapping the per-item differences, which is what is done here.
    """
    a, b = np.asarray(candidate, dtype=float), np.asarray(reference, dtype=float)
    if a.shape != b.shape:
        raise ValueError(f"paired values need the same items: {a.size} candidate vs {b.size} reference")
    if a.size == 0:
        return Estimate.empty()
    differences = a - b
    low, high = bootstrap_mean(differences, seed)
    return Estimate(float(differences.mean()), low, high, int(a.size), "paired bootstrap")


def verdict(delta: Estimate) -> str:
    """A difference is a result only when its interval excludes zero."""
    if delta.n < 2 or math.isnan(delta.low):
        return "not distinguished"
    if delta.low > 0:
        return "higher"
    if delta.high < 0:
        return "lower"
    return "not distinguished"


def percentile(values: Sequence[float], q: float) -> float:
    data = np.asarray([v for v in values if v is not None], dtype=float)
    return float(np.percentile(data, q)) if data.size else math.nan
