"""Cells named on the command line (``STRATEGY@BUDGET``) and the items two cells share.

``gate``, ``plan`` and ``compare`` all pair two cells the way the report's paired table
does: per-item values (quality: violations and the strategy's own errors scored 0, other
errors left out; or evidence recall, ``--metric evidence``, the model-free figure of a
prompts-only run), items a memory system lost at ingest dropped from both sides, and the items
only one side has listed.
"""

from __future__ import annotations

from dataclasses import dataclass

from .data import ReportError, RunData
from .evidence import has_evidence, item_evidence
from .tables import item_values

Cell = tuple[str, str, int]  # task, strategy, budget
METRICS = ("quality", "evidence")  # --metric of gate and plan
NOISE_METRIC = {"quality": "quality_all", "evidence": "evidence_all"}  # the report's column of each


def metric_values(rows: list[dict], metric: str) -> dict[str, float]:
    """item -> value: quality (``tables.item_values``) or evidence recall, all evidence kept
    (marked items only)."""
    if metric == "evidence":
        return item_evidence(rows)[0]
    return item_values(rows)


def check_metric(data: RunData, metric: str, command: str) -> None:
    """Refuse a metric the run cannot give, saying which one it can."""
    if metric not in METRICS:
        raise ValueError(f"--metric: expected one of {', '.join(METRICS)}, got {metric!r}")
    if metric == "evidence" and not has_evidence(data.rows.values()):
        raise ReportError(f"{data.run_dir}: the task marks no evidence, so {command} --metric evidence has nothing")
    prompts_only = bool(data.manifest.get("config", {}).get("prompts_only")) or any(
        r["event"] == "admitted" for r in data.rows.values()
    )
    if metric == "quality" and prompts_only:
        raise ReportError(
            f"{data.run_dir} is a prompts-only run: it has no quality; {command} it on evidence recall "
            "with --metric evidence"
        )


@dataclass(frozen=True)
class Pair:
    """Per-item values of two cells over their shared items, in item order."""

    candidate: list[float]
    reference: list[float]
    items: list[str]
    missing_in_candidate: list[str]
    missing_in_reference: list[str]


def parse_cell(text: str, option: str) -> tuple[str, int]:
    """``STRATEGY@BUDGET`` -> (strategy, budget); anything else is a ValueError naming the option."""
    strategy, sep, budget = (text or "").partition("@")
    if not strategy or not sep:
        raise ValueError(f"{option}: expected STRATEGY@BUDGET, got {text!r}")
    try:
        return strategy, int(budget)
    except ValueError:
        raise ValueError(f"{option}: budget must be an integer, got {budget!r} in {text!r}") from None


def find_cell(data: RunData, text: str, option: str) -> Cell:
    """The run's cell for ``STRATEGY@BUDGET``; the error lists the cells there are."""
    strategy, budget = parse_cell(text, option)
    cells = data.cells()
    matches = [c for c in cells if c[1] == strategy and c[2] == budget]
    if len(matches) > 1:
        raise ValueError(f"{option}: {text} exists for several tasks ({sorted(c[0] for c in matches)})")
    if not matches:
        known = ", ".join(f"{c[1]}@{c[2]}" for c in cells)
        raise ValueError(f"{option}: no cell {text} in {data.run_dir}; cells: {known}")
    return matches[0]


def pair_values(
    candidate_rows: list[dict],
    reference_rows: list[dict],
    dropped: frozenset[str] | set[str] = frozenset(),
    metric: str = "quality",
) -> Pair:
    """Pair two cells' item values over the items both scored (``dropped`` items left out); for
    evidence recall only the items the task marks evidence for are paired or missing."""
    cand = {k: v for k, v in metric_values(candidate_rows, metric).items() if k not in dropped}
    ref = {k: v for k, v in metric_values(reference_rows, metric).items() if k not in dropped}
    rows = candidate_rows + reference_rows
    if metric == "evidence":
        rows = [r for r in rows if (r.get("evidence") or {}).get("marked")]
    seen = {str(r["item_id"]) for r in rows} - set(dropped)
    shared = sorted(set(cand) & set(ref))
    return Pair(
        [cand[i] for i in shared], [ref[i] for i in shared], shared, sorted(seen - set(cand)), sorted(seen - set(ref))
    )


def pair_cells(data: RunData, candidate: Cell, reference: Cell, metric: str = "quality") -> Pair:
    cells = data.cells()
    dropped = set(data.ingest_losses().get(candidate[0], {}))
    return pair_values(cells[candidate], cells[reference], dropped, metric)
