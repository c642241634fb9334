"""Writes the coverage table of the report's intervals (docs/reading-a-report.md cites it).

    .venv/bin/python scripts/coverage_table.py    # a few minutes on 2 cores
    -> benchmarks/results/coverage.json and the Markdown tables on stdout
    .venv/bin/python scripts/coverage_table.py --render   # the tables from the JSON only

The same simulation as tests/test_report_coverage.py, with 10x the samples (less Monte-Carlo
noise), plus the comparison of graded methods the bounded t was chosen from.
"""

from __future__ import annotations

import json
import math
import sys
from collections import defaultdict
from pathlib import Path

from budgetbench_core.report import coverage, stats

OUT = Path(__file__).resolve().parent.parent / "benchmarks" / "results" / "coverage.json"
SHOWN = (2, 3, 4, 5, 10, 30, 100, 500)  # columns of the table (the JSON has every n)


def _without_nan(value):
    """No interval (nan) becomes null: JSON has no NaN."""
    if isinstance(value, float) and math.isnan(value):
        return None
    if isinstance(value, dict):
        return {k: _without_nan(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_without_nan(v) for v in value]
    return value


def _dumps(body: dict) -> str:
    """One JSON line per simulated case, so a rerun's diff shows which figures moved."""
    lines = []
    for key, value in body.items():
        if isinstance(value, list):
            rows = ",\n  ".join(json.dumps(v, allow_nan=False) for v in value)
            lines.append(f" {json.dumps(key)}: [\n  {rows}\n ]")
        else:
            lines.append(f" {json.dumps(key)}: {json.dumps(value, allow_nan=False)}")
    return "{\n" + ",\n".join(lines) + "\n}\n"


def _pct(value) -> str:
    return "–" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{100 * value:.1f}"


def markdown(rows: list[dict], methods: list[dict]) -> str:
    """Worst and mean coverage per case and n over every tested distribution (the JSON has each)."""
    by_case: dict[str, dict[int, list[float]]] = defaultdict(lambda: defaultdict(list))
    verdicts: dict[str, list[float]] = defaultdict(list)
    for r in rows:
        if r["truth"] == "mean over p":
            continue
        if r["coverage"] is not None and not math.isnan(r["coverage"]):
            by_case[r["case"]][r["n"]].append(r["coverage"])
        if r["verdicts"] is not None:
            verdicts[r["case"]].append(r["verdicts"])
    lines = ["| interval | " + " | ".join(f"n={n}" for n in SHOWN) + " |", "|---|" + "---|" * len(SHOWN)]
    for case, per_n in by_case.items():
        cells = [
            f"{_pct(min(per_n[n]))} / {_pct(sum(per_n[n]) / len(per_n[n]))}" if per_n.get(n) else "–" for n in SHOWN
        ]
        lines.append(f"| {case} | " + " | ".join(cells) + " |")
    lines += ["", "| paired verdicts under no effect | largest share, % | distributions |", "|---|---|---|"]
    for case, rates in verdicts.items():
        lines.append(f"| {case} | {_pct(max(rates))} | {len(rates)} (n x distribution) |")
    names = ["t", "percentile bootstrap", "BCa bootstrap", "bounded t"]
    lines += ["", "| graded values | n | " + " | ".join(names) + " |", "|---|---|" + "---|" * len(names)]
    worst: dict[tuple, dict[str, float]] = defaultdict(lambda: defaultdict(lambda: 1.0))
    for r in methods:
        for name in names:
            worst[(r["family"], r["n"])][name] = min(worst[(r["family"], r["n"])][name], r[name])
    for (family, n), by_name in worst.items():
        lines.append(f"| {family} | {n} | " + " | ".join(_pct(by_name[name]) for name in names) + " |")
    return "\n".join(lines)


def main() -> None:
    if "--render" in sys.argv:  # the tables again from the committed JSON, without simulating
        body = json.loads(OUT.read_text(encoding="utf-8"))
        sys.stdout.write(markdown(body["rows"], body["graded_methods"]) + "\n")
        return
    rows = coverage.simulate(reps_scale=10)
    methods = coverage.graded_methods()
    OUT.parent.mkdir(parents=True, exist_ok=True)
    body = {
        "tolerances": {
            "coverage_floor": coverage.COVERAGE_FLOOR,
            "small_binary_floor": coverage.SMALL_BINARY_FLOOR,
            "binary_mean_band": coverage.BINARY_MEAN_BAND,
            "verdict_ceiling": coverage.VERDICT_CEILING,
        },
        "min_paired_items": stats.MIN_PAIRED_ITEMS,
        "pseudo_items": stats.PSEUDO,
        "rows": rows,
        "graded_methods": methods,
    }
    OUT.write_text(_dumps(_without_nan(body)), encoding="utf-8")
    sys.stdout.write(markdown(rows, methods) + "\n")


if __name__ == "__main__":
    main()
