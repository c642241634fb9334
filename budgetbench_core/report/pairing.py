"""Cells named on the command line (``STRATEGY@BUDGET``) and the items two cells share.

``gate``, ``plan`` and ``compare`` all pair two cells the way the report's paired table
does: per-item values with violations scored 0 and errors left out, items a memory system
lost at ingest dropped from both sides, and the items only one side has listed.
"""

from __future__ import annotations

from dataclasses import dataclass

from .data import RunData
from .tables import item_values

Cell = tuple[str, str, int]  # task, strategy, budget


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
    candidate_rows: list[dict], reference_rows: list[dict], dropped: frozenset[str] | set[str] = frozenset()
) -> Pair:
    """Pair two cells' item values over the items both scored (``dropped`` items left out)."""
    cand = {k: v for k, v in item_values(candidate_rows).items() if k not in dropped}
    ref = {k: v for k, v in item_values(reference_rows).items() if k not in dropped}
    seen = {str(r["item_id"]) for r in candidate_rows + reference_rows} - set(dropped)
    shared = sorted(set(cand) & set(ref))
    return Pair(
        [cand[i] for i in shared], [ref[i] for i in shared], shared, sorted(seen - set(cand)), sorted(seen - set(ref))
    )


def pair_cells(data: RunData, candidate: Cell, reference: Cell) -> Pair:
    cells = data.cells()
    dropped = set(data.ingest_losses().get(candidate[0], {}))
    return pair_values(cells[candidate], cells[reference], dropped)
