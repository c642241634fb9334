"""A release gate on a finished run: violations, errors, item counts and non-inferiority.

Each check has a figure and passes or fails; the gate passes only when every check does.
With ``--candidate`` the per-cell checks cover that cell only (a reference such as
full_context may violate the budget by design); without it they cover every cell.
A check on too few items fails and says how many are needed. ``metric`` picks what the
non-inferiority check compares: quality, or evidence recall (``--metric evidence``: the
model-free figure of a prompts-only run).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

from . import stats
from .data import RunData
from .evidence import GATED  # result, violation, and a prompts-only run's admitted rows
from .pairing import Cell, check_metric, find_cell, pair_cells
from .plan import plan_pair


@dataclass(frozen=True)
class Check:
    name: str
    cell: str
    passed: bool
    figure: str
    needed_items: int | None = None


@dataclass
class GateResult:
    run_dir: str
    checks: list[Check] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return bool(self.checks) and all(c.passed for c in self.checks)

    def to_dict(self) -> dict[str, Any]:
        return {"run_dir": self.run_dir, "passed": self.passed, "checks": [asdict(c) for c in self.checks]}


def _label(cell: Cell) -> str:
    return f"{cell[1]}@{cell[2]}"


def _cell_checks(
    cell: Cell, rows: list[dict[str, Any]], max_violation_rate: float, max_error_rate: float, min_items: int | None
) -> list[Check]:
    violations = sum(r["event"] == "violation" for r in rows)
    errors = sum(r["event"] == "error" for r in rows)
    scored = sum(r["event"] in GATED for r in rows)
    checks = []
    if scored:
        rate = violations / scored
        checks.append(
            Check(
                "violation rate",
                _label(cell),
                rate <= max_violation_rate,
                f"{rate:.3f} ({violations} of {scored} rows) "
                f"{'<=' if rate <= max_violation_rate else '>'} {max_violation_rate:.3f}",
            )
        )
    else:
        checks.append(Check("violation rate", _label(cell), False, f"no scored rows ({errors} errors)"))
    error_rate = errors / len(rows) if rows else 0.0
    checks.append(
        Check(
            "error rate",
            _label(cell),
            error_rate <= max_error_rate,
            f"{error_rate:.3f} ({errors} of {len(rows)} rows) "
            f"{'<=' if error_rate <= max_error_rate else '>'} {max_error_rate:.3f}",
        )
    )
    if min_items is not None:
        items = len({str(r["item_id"]) for r in rows if r["event"] in GATED})
        ok = items >= min_items
        checks.append(
            Check(
                "items",
                _label(cell),
                ok,
                f"{items} scored items {'>=' if ok else '<'} --min-items {min_items}"
                + ("" if ok else f": needs {min_items - items} more"),
                None if ok else min_items,
            )
        )
    return checks


def _non_inferiority(
    data: RunData, candidate: Cell, reference: Cell, margin: float, min_items: int | None, metric: str
) -> Check:
    name = "non-inferiority" + (" (evidence recall)" if metric == "evidence" else "")
    label = f"{_label(candidate)} vs {_label(reference)}"
    pair = pair_cells(data, candidate, reference, metric)
    delta = stats.paired_delta(pair.candidate, pair.reference)
    missing = len(pair.missing_in_candidate) + len(pair.missing_in_reference)
    note = (
        f" ({missing} items unpaired: {' '.join(sorted(set(pair.missing_in_candidate + pair.missing_in_reference)))})"
        if missing
        else ""
    )
    plan = plan_pair(pair.candidate, pair.reference, margin=margin)
    needed = max(plan.needed or 0, min_items or 0) or None
    if delta.verdict == stats.TOO_FEW or math.isnan(delta.low):
        want = max(needed or 0, delta.needed_n or 0, delta.min_n)
        return Check(
            name,
            label,
            False,
            f"{delta.n} paired items: too few items for an interval; needs at least {want}{note}",
            want,
        )
    figure = (
        f"delta {delta.mean:+.3f} [{delta.low:+.3f}, {delta.high:+.3f}] over {delta.n} paired items; "
        f"lower bound {delta.low:+.3f} {'>' if delta.low > -margin else '<='} -margin {-margin:+.3f}{note}"
    )
    if min_items is not None and delta.n < min_items:
        return Check(
            name,
            label,
            False,
            figure + f"; {delta.n} paired items < --min-items {min_items}: needs {min_items - delta.n} more",
            needed,
        )
    if delta.low > -margin:
        return Check(name, label, True, figure)
    if plan.needed is None:
        return Check(name, label, False, figure + f"; {plan.reason}")
    if plan.needed > delta.n:
        return Check(
            name,
            label,
            False,
            figure + f"; too few items: about {needed} paired items needed for "
            f"80% power at this margin (budgetbench plan)",
            needed,
        )
    return Check(name, label, False, figure)


def gate(
    data: RunData,
    max_violation_rate: float = 0.0,
    max_error_rate: float = 0.0,
    reference: str | None = None,
    candidate: str | None = None,
    margin: float | None = None,
    min_items: int | None = None,
    metric: str = "quality",
) -> GateResult:
    """Every check of the gate on ``data``; options as the ``budgetbench gate`` command."""
    if margin is not None and (reference is None or candidate is None):
        raise ValueError("--margin needs both --reference and --candidate (STRATEGY@BUDGET)")
    if margin is not None and margin < 0:
        raise ValueError(f"--margin must be >= 0, got {margin}")
    if reference is not None and (candidate is None or margin is None):
        raise ValueError("--reference needs --candidate and --margin (--margin 0: not worse at all)")
    cells = data.cells()
    result = GateResult(str(data.run_dir))
    cand_cell = find_cell(data, candidate, "--candidate") if candidate else None
    ref_cell = find_cell(data, reference, "--reference") if reference else None
    if ref_cell is not None and cand_cell is not None and ref_cell[0] != cand_cell[0]:
        raise ValueError(f"--reference {reference} and --candidate {candidate} belong to different tasks")
    for cell in [cand_cell] if cand_cell else list(cells):
        result.checks += _cell_checks(cell, cells[cell], max_violation_rate, max_error_rate, min_items)
    if margin is not None and cand_cell is not None and ref_cell is not None:  # both given: checked above
        check_metric(data, metric, "gate")
        result.checks.append(_non_inferiority(data, cand_cell, ref_cell, margin, min_items, metric))
    return result
