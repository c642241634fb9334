"""The coverage simulation behind the budget-curve intervals (``curve``): known curves, many runs.

Each case draws ``reps`` runs of n items over a curve of known per-tier means, runs the
report's own vectorised functions on all of them at once, and records how often the interval
contains the truth: the effective-budget range the true effective tier, the area interval the
true area, the paired area delta the true difference (and, with no difference, how often a
verdict is given anyway). ``tests/test_report_curve_coverage.py`` asserts the tolerances;
``python -m budgetbench_core.report.curve_coverage`` prints the table in
docs/reading-a-report.md.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np
from scipy import special

from . import curve, stats

NS = (4, 5, 10, 30, 100, 500)
THREE = (512, 1024, 2048)
FIVE = (512, 1024, 2048, 4096, 8192)
# (name, budgets, per-tier means): rising, one tier exactly at 85% of the best, flat, near 0
# and near 1, a dip (non-monotone), and five tiers.
CURVES = (
    ("rising", THREE, (0.2, 0.5, 0.9)),
    ("at the threshold", THREE, (0.3, 0.765, 0.9)),
    ("flat", THREE, (0.9, 0.95, 0.97)),
    ("near 0", THREE, (0.02, 0.05, 0.1)),
    ("near 1", THREE, (0.97, 0.98, 0.99)),
    ("dips", THREE, (0.5, 0.9, 0.6)),
    ("five tiers", FIVE, (0.1, 0.3, 0.6, 0.8, 0.85)),
)
# How an item's values across tiers are drawn: one uniform per item compared with every
# tier's mean (an item kept from some budget on, like truncation), independent draws per
# tier, the mean of two such repeats, and a continuous score (logit-normal, one latent per item).
FAMILIES = ("nested 0/1", "independent 0/1", "two repeats", "logit-normal")
SPREAD = 1.5

COVERAGE_FLOOR = 0.92  # every case: 95% - 3 points
VERDICT_CEILING = 0.05  # paired areas, no difference: share given a verdict


@dataclass
class Row:
    case: str  # "effective budget", "area", "paired area"
    family: str
    curve: str
    n: int
    coverage: float
    shown: float | None = None  # effective budget: share of runs whose range has a high end
    exact: float | None = None  # effective budget: share of runs whose range is the true tier alone
    verdicts: float | None = None  # paired area, no difference: share given higher/lower


def _draw(rng, family: str, means, n: int, reps: int, latent=None) -> np.ndarray:
    """(reps, n, k) item values; ``latent`` (reps, n) couples two strategies' items."""
    p = np.asarray(means, dtype=float)
    if family == "independent 0/1":
        return (rng.random((reps, n, p.size)) < p).astype(float)
    if family == "two repeats":
        return (_draw(rng, "nested 0/1", p, n, reps, latent) + _draw(rng, "nested 0/1", p, n, reps)) / 2
    u = rng.random((reps, n)) if latent is None else latent
    if family == "nested 0/1":
        return (u[..., None] < p).astype(float)
    z = special.ndtri(u)  # logit-normal: the item's latent as a standard normal
    return special.expit(special.logit(p) + SPREAD * z[..., None])


def true_means(family: str, means) -> np.ndarray:
    if family != "logit-normal":
        return np.asarray(means, dtype=float)
    nodes, weights = np.polynomial.hermite_e.hermegauss(120)
    values = special.expit(special.logit(np.asarray(means))[:, None] + SPREAD * nodes[None, :])
    return (values * weights).sum(1) / np.sqrt(2 * np.pi)


def true_effective_tier(truth: np.ndarray, share: float = curve.DEFAULT_SHARE) -> int:
    return int(np.argmax(truth >= share * truth.max() - 1e-9))


def effective_and_area(ns=NS, reps: int = 2000, seed: int = 11) -> list[Row]:
    rng = np.random.default_rng(seed)
    rows = []
    for family in FAMILIES:
        for name, budgets, means in CURVES:
            truth = true_means(family, means)
            tier, area = true_effective_tier(truth), float(curve.log_weights(budgets) @ truth)
            for n in ns:
                values = _draw(rng, family, means, n, reps)
                _, low, high = curve.effective_tiers(values)
                covered = (low <= tier) & ((high < 0) | (high >= tier))
                exact = float(np.mean((low == tier) & (high == tier)))
                rows.append(
                    Row("effective budget", family, name, n, float(covered.mean()), float((high >= 0).mean()), exact)
                )
                a_low, a_high = curve.area_bounds(curve.item_areas(values, budgets))
                rows.append(Row("area", family, name, n, float(np.mean((a_low <= area) & (area <= a_high)))))
    return rows


PAIRS = (
    ("rising vs at the threshold", (0.2, 0.5, 0.9), (0.3, 0.765, 0.9)),
    ("near 0 vs rising", (0.02, 0.05, 0.1), (0.2, 0.5, 0.9)),
    ("no difference", (0.2, 0.5, 0.9), (0.2, 0.5, 0.9)),
    ("no difference near 1", (0.97, 0.98, 0.99), (0.97, 0.98, 0.99)),
)


def paired_areas(ns=NS, reps: int = 2000, seed: int = 12) -> list[Row]:
    """Two strategies' areas over the same items, independent or coupled by a shared latent."""
    rng = np.random.default_rng(seed)
    rows = []
    for family in FAMILIES:
        for coupling in ("independent", "coupled"):
            for name, first, second in PAIRS:
                truth = float(curve.log_weights(THREE) @ (true_means(family, first) - true_means(family, second)))
                for n in ns:
                    shared = rng.random((reps, n)) if coupling == "coupled" else None
                    d = curve.item_areas(_draw(rng, family, first, n, reps, shared), THREE) - curve.item_areas(
                        _draw(rng, family, second, n, reps, shared), THREE
                    )
                    low, high, code = stats.graded_verdicts(d.sum(-1), (d * d).sum(-1), n)
                    rows.append(
                        Row(
                            "paired area",
                            f"{family}, {coupling}",
                            name,
                            n,
                            float(np.mean((low <= truth + 1e-12) & (truth - 1e-12 <= high))),
                            verdicts=float(np.mean(np.abs(code) == 1)) if truth == 0 else None,
                        )
                    )
    return rows


def simulate(reps: int = 2000) -> list[dict]:
    return [asdict(r) for r in effective_and_area(reps=reps) + paired_areas(reps=reps)]


def markdown(rows: list[dict]) -> str:
    """Coverage % per case and n: worst / mean over the families and curves."""
    lines = ["| interval | " + " | ".join(f"n={n}" for n in NS) + " |", "|---|" + "---|" * len(NS)]
    for case in ("effective budget", "area", "paired area"):
        cells = []
        for n in NS:
            cov = [r["coverage"] for r in rows if r["case"] == case and r["n"] == n]
            cells.append(f"{100 * min(cov):.1f} / {100 * float(np.mean(cov)):.1f}")
        lines.append(f"| {case} | " + " | ".join(cells) + " |")
    shown = [
        f"{100 * float(np.mean([r['shown'] for r in rows if r['case'] == 'effective budget' and r['n'] == n])):.0f}"
        for n in NS
    ]
    lines.append("| effective budget: runs whose range has a high end, mean % | " + " | ".join(shown) + " |")
    exact = [
        f"{100 * float(np.mean([r['exact'] for r in rows if r['case'] == 'effective budget' and r['n'] == n])):.0f}"
        for n in NS
    ]
    lines.append("| effective budget: runs whose range is the true tier alone, mean % | " + " | ".join(exact) + " |")
    verdicts = [r["verdicts"] for r in rows if r["verdicts"] is not None]
    lines.append("")
    lines.append(f"Paired areas with no difference: at most {100 * max(verdicts):.1f}% of runs get a verdict.")
    return "\n".join(lines)


if __name__ == "__main__":
    print(markdown(simulate(reps=20000)))
