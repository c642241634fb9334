"""The coverage simulation behind the report's intervals (``stats``): known truths, many samples.

Each case draws ``reps`` samples of n items from a distribution whose mean (or paired
difference) is known, runs the report's own vectorised interval functions on all of them at
once, and records how often the interval contains the truth (coverage) and, where there is no
effect, how often a paired verdict ("higher"/"lower") is given anyway. Binary cells are exact
(binomial probabilities, no sampling). ``tests/test_report_coverage.py`` checks the figures
against the tolerances below; ``scripts/coverage_table.py`` writes the documented table.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass

import numpy as np
from scipy import special, stats as scipy_stats

from . import stats

NS = (2, 3, 4, 5, 6, 8, 10, 15, 20, 30, 50, 100, 200, 500)
MEANS = (0.02, 0.5, 0.98)  # "near 0, 0.5 and 1" for binary and k-part values
LOCATIONS = (-4.5, 0.0, 4.5)  # logit-normal locations: means 0.030, 0.5, 0.970
SPREAD = 1.5
DEPENDENCE = 0.5  # share of items whose two arms are coupled (positively or negatively)

# Tolerances the test asserts (docs/reading-a-report.md states them):
COVERAGE_FLOOR = 0.92  # every case with n >= the minimum: coverage >= 95% - 3 points
SMALL_BINARY_FLOOR = 0.875  # binary cells below 5 items: Wilson at n = 4, p = 0.5 misses 0/4 and 4/4
BINARY_MEAN_BAND = 0.01  # binary cells: coverage averaged over p within 95% +- 1 point
VERDICT_CEILING = 0.05  # no effect: share of samples given a verdict <= 5%


# Graded values: 0/1 outcomes a graded grader may give, an item's mean over two binary repeats,
# four-part partial credit, and a continuous skewed score.
PARTS = {"0/1 values": 1, "two repeats": 2, "partial credit": 4}
GRADED_FAMILIES = (*PARTS, "logit-normal")


@dataclass
class Row:
    case: str  # "binary cell", "graded cell", "paired binary", "paired graded"
    family: str  # distribution of the values
    truth: str  # what is estimated (p, mean, delta) and how the arms depend
    n: int
    coverage: float  # share of samples whose interval contains the truth (nan: no interval)
    verdicts: float | None = None  # paired, no effect: share given higher/lower
    effect: bool = False


def _covers(low, high, truth) -> float:
    low, high = np.asarray(low), np.asarray(high)
    return float(np.mean((low <= truth + 1e-12) & (truth - 1e-12 <= high)))


def binary_cells(ns: Iterable[int] = NS, means: Iterable[float] = MEANS) -> list[Row]:
    """Exact coverage of the Wilson interval at each p, and averaged over p in (0, 1)."""
    rows = []
    grid = np.linspace(0.005, 0.995, 199)
    for n in ns:
        x = np.arange(n + 1)
        low, high = stats.modified_wilson_bounds(x, np.full(n + 1, n))
        for p in means:
            pmf = scipy_stats.binom.pmf(x, n, p)
            rows.append(Row("binary cell", "Bernoulli", f"p={p}", n, float(pmf[(low <= p) & (p <= high)].sum())))
        pmf = scipy_stats.binom.pmf(x[:, None], n, grid[None, :])
        inside = (low[:, None] <= grid) & (grid <= high[:, None])
        rows.append(Row("binary cell", "Bernoulli", "mean over p", n, float((pmf * inside).sum(0).mean())))
    return rows


def _logit_normal_mean(location: float, spread: float = SPREAD) -> float:
    nodes, weights = np.polynomial.hermite_e.hermegauss(120)
    return float(np.sum(weights * special.expit(location + spread * nodes)) / np.sqrt(2 * np.pi))


def _draw_pair(rng, family: str, level: float, shifted: float, n: int, reps: int, coupling: str):
    """(candidate, reference) arrays of shape (reps, n); coupling: independent/positive/negative."""
    coupled = rng.random((reps, n)) < DEPENDENCE if coupling != "independent" else np.zeros((reps, n), bool)
    if family in PARTS:  # equally weighted parts (sub-answers, repeats), each right with prob. mean
        u_ref = rng.random((reps, n, PARTS[family]))
        u_other = rng.random((reps, n, PARTS[family]))
        tied = (1 - u_ref) if coupling == "negative" else u_ref
        u_cand = np.where(coupled[..., None], tied, u_other)
        return (u_cand < shifted).mean(-1), (u_ref < level).mean(-1)
    z_ref, z_other = rng.standard_normal((reps, n)), rng.standard_normal((reps, n))
    z_cand = np.where(coupled, -z_ref if coupling == "negative" else z_ref, z_other)
    return special.expit(shifted + SPREAD * z_cand), special.expit(level + SPREAD * z_ref)


def _graded_levels(family: str) -> list[tuple[float, float, float, float]]:
    """(level, shifted level, mean, shifted mean) per "near 0 / 0.5 / 1" setting."""
    if family in PARTS:
        return [(m, m + (0.1 if m < 0.9 else -0.1), m, m + (0.1 if m < 0.9 else -0.1)) for m in MEANS]
    return [
        (
            loc,
            loc + (1.0 if loc < 1 else -1.0),
            _logit_normal_mean(loc),
            _logit_normal_mean(loc + (1.0 if loc < 1 else -1.0)),
        )
        for loc in LOCATIONS
    ]


def graded_cells(ns: Iterable[int] = NS, reps: int = 2000, seed: int = 1) -> list[Row]:
    rng = np.random.default_rng(seed)
    rows = []
    for family in GRADED_FAMILIES:
        for level, _, mean, _ in _graded_levels(family):
            for n in ns:
                values, _ = _draw_pair(rng, family, level, level, n, reps, "independent")
                low, high = stats.bounded_t_bounds(values.sum(1), (values * values).sum(1), n)
                rows.append(Row("graded cell", family, f"mean={mean:.3f}", n, _covers(low, high, mean)))
    return rows


def _joint(p_cand: float, p_ref: float, coupling: str) -> np.ndarray:
    """Probabilities of (both right, candidate only, reference only, neither)."""
    if coupling == "positive":
        both = DEPENDENCE * min(p_cand, p_ref) + (1 - DEPENDENCE) * p_cand * p_ref
    elif coupling == "negative":
        both = DEPENDENCE * max(0.0, p_cand + p_ref - 1) + (1 - DEPENDENCE) * p_cand * p_ref
    else:
        both = p_cand * p_ref
    probs = np.array([both, p_cand - both, p_ref - both, 1 - p_cand - p_ref + both])
    return np.clip(probs, 0, 1) / np.clip(probs, 0, 1).sum()


COUPLINGS = ("independent", "positive", "negative")


def paired_binary(
    ns: Iterable[int] = NS, reps: int = 4000, seed: int = 2, min_n: int = stats.MIN_PAIRED_ITEMS
) -> list[Row]:
    rng = np.random.default_rng(seed)
    rows = []
    for p in MEANS:
        for effect in (False, True):
            q = p if not effect else p + (0.1 if p < 0.9 else -0.1)
            for coupling in COUPLINGS:
                probs = _joint(q, p, coupling)
                for n in ns:
                    counts = rng.multinomial(n, probs, size=reps).T
                    both, cand_only, ref_only, neither = counts
                    low, high, code = stats.paired_binary_verdicts(both, cand_only, ref_only, neither, min_n=min_n)
                    shown = n >= min_n
                    rows.append(
                        Row(
                            "paired binary",
                            coupling,
                            f"p={p}->{q:.2f}",
                            n,
                            _covers(low, high, q - p) if shown else float("nan"),
                            None if effect else float(np.mean(np.abs(code) == 1)),
                            effect,
                        )
                    )
    return rows


def paired_graded(
    ns: Iterable[int] = NS, reps: int = 2000, seed: int = 3, min_n: int = stats.MIN_PAIRED_ITEMS
) -> list[Row]:
    rng = np.random.default_rng(seed)
    rows = []
    for family in GRADED_FAMILIES:
        for level, shifted, mean, shifted_mean in _graded_levels(family):
            for effect in (False, True):
                target = shifted if effect else level
                truth = (shifted_mean - mean) if effect else 0.0
                for coupling in ("independent", "positive"):
                    for n in ns:
                        cand, ref = _draw_pair(rng, family, level, target, n, reps, coupling)
                        d = cand - ref
                        low, high, code = stats.graded_verdicts(d.sum(1), (d * d).sum(1), n, min_n=min_n)
                        shown = n >= min_n
                        rows.append(
                            Row(
                                "paired graded",
                                f"{family}, {coupling}",
                                f"mean={mean:.3f} delta={truth:+.3f}",
                                n,
                                _covers(low, high, truth) if shown else float("nan"),
                                None if effect else float(np.mean(np.abs(code) == 1)),
                                effect,
                            )
                        )
    return rows


def simulate(reps_scale: float = 1.0) -> list[dict]:
    """Every case; ``reps_scale`` > 1 for the documented table (less Monte-Carlo noise)."""
    rows = binary_cells()
    rows += graded_cells(reps=int(2000 * reps_scale))
    rows += paired_binary(reps=int(4000 * reps_scale))
    rows += paired_graded(reps=int(2000 * reps_scale))
    return [asdict(r) for r in rows]


def _bootstrap_bounds(values: np.ndarray, rng, resamples: int, bca: bool):
    """Percentile or BCa bootstrap bounds of the mean for each row of ``values`` (reps, n)."""
    reps, n = values.shape
    lows, highs = np.empty(reps), np.empty(reps)
    alpha = stats.ALPHA / 2
    for start in range(0, reps, 50):
        chunk = values[start : start + 50]
        picks = rng.integers(0, n, size=(chunk.shape[0], resamples, n))
        means = np.take_along_axis(chunk[:, None, :], picks, axis=2).mean(-1)
        levels = np.tile([alpha, 1 - alpha], (chunk.shape[0], 1))
        if bca:
            observed = chunk.mean(1, keepdims=True)
            with np.errstate(divide="ignore", invalid="ignore"):
                z0 = scipy_stats.norm.ppf(np.mean(means < observed, axis=1))
                jack = (chunk.sum(1, keepdims=True) - chunk) / (n - 1)
                dev = jack.mean(1, keepdims=True) - jack
                accel = (dev**3).sum(1) / (6 * ((dev**2).sum(1)) ** 1.5)
                z = scipy_stats.norm.ppf([alpha, 1 - alpha])[None, :]
                levels = scipy_stats.norm.cdf(
                    z0[:, None] + (z0[:, None] + z) / (1 - accel[:, None] * (z0[:, None] + z))
                )
            levels = np.where(np.isfinite(levels), levels, np.tile([alpha, 1 - alpha], (chunk.shape[0], 1)))
        ordered = np.sort(means, axis=1)
        index = np.clip((levels * (resamples - 1)).round().astype(int), 0, resamples - 1)
        lows[start : start + 50] = np.take_along_axis(ordered, index[:, :1], 1)[:, 0]
        highs[start : start + 50] = np.take_along_axis(ordered, index[:, 1:], 1)[:, 0]
    return lows, highs


def graded_methods(
    ns: Iterable[int] = (3, 5, 10, 30, 100), reps: int = 400, resamples: int = 500, seed: int = 4
) -> list[dict]:
    """Coverage of the candidate graded intervals side by side (the bounded t was chosen from this):
    plain t, percentile bootstrap, BCa bootstrap and the bounded t, on every graded family."""
    rng = np.random.default_rng(seed)
    rows = []
    for family in GRADED_FAMILIES:
        for level, _, mean, _ in _graded_levels(family):
            for n in ns:
                values, _ = _draw_pair(rng, family, level, level, n, reps, "independent")
                total, total_sq = values.sum(1), (values * values).sum(1)
                found = {
                    "bounded t": stats.bounded_t_bounds(total, total_sq, n),
                    "t": stats.bounded_t_bounds(total, total_sq, n, pseudo=0.0),
                    "percentile bootstrap": _bootstrap_bounds(values, rng, resamples, bca=False),
                    "BCa bootstrap": _bootstrap_bounds(values, rng, resamples, bca=True),
                }
                rows.append(
                    {
                        "family": family,
                        "mean": round(mean, 3),
                        "n": n,
                        **{name: _covers(low, high, mean) for name, (low, high) in found.items()},
                    }
                )
    return rows


# --- binary cells over a dense grid, exact --------------------------------------------------

DENSE_NS = range(1, 401)  # every n up to 400
# p every 0.001 near the boundaries, where Wilson needs its small-count fix, every 0.01 between.
DENSE_EDGE = tuple(np.round(np.concatenate([np.arange(0.001, 0.0505, 0.001), np.arange(0.95, 0.9995, 0.001)]), 4))
DENSE_MIDDLE = tuple(np.round(np.arange(0.06, 0.945, 0.01), 3))
DENSE_EDGE_FLOOR = 0.915  # near 0 or 1, from 5 items on (plain Wilson: 84% at n = 176, p = 0.001)
DENSE_FLOOR = 0.905  # anywhere, from 5 items on: Wilson's own oscillation (90.9% at n = 6, p = 0.43)
DENSE_SMALL_FLOOR = 0.87  # under 5 items: 0/4 and 4/4 both miss p near 0.5 (87.5% at n = 4)


def dense_binary_coverage(bounds=stats.modified_wilson_bounds, ns: Iterable[int] = DENSE_NS) -> list[dict]:
    """Exact coverage of a binary cell's interval at every (n, p) of the dense grid: the sum of
    the binomial probabilities of the successes whose interval holds p (no sampling)."""
    ps = np.asarray(DENSE_EDGE + DENSE_MIDDLE)
    edge = np.isin(ps, DENSE_EDGE)
    rows = []
    for n in ns:
        x = np.arange(n + 1)
        low, high = bounds(x, np.full(n + 1, n))
        pmf = scipy_stats.binom.pmf(x[None, :], n, ps[:, None])
        covered = (low[None, :] <= ps[:, None] + 1e-12) & (ps[:, None] <= high[None, :] + 1e-12)
        coverage = (pmf * covered).sum(axis=1)
        rows += [{"n": n, "p": float(p), "edge": bool(e), "coverage": float(c)} for p, e, c in zip(ps, edge, coverage)]
    return rows
