"""The report's tables as lists of plain dicts: summary, categories, paired deltas, errors.

How rows are scored (stated in every output):
- a ``result`` row scores its quality, a ``violation`` row scores 0;
- an ``error`` the strategy under test caused (phases ``PLUGIN_PHASES``: its reset, apply,
  ingest or retrieve failed) scores 0 like a violation, so a strategy cannot raise its number
  by failing on the items it would lose;
- any other ``error`` (the harness, the server, the task or grader) is not scored: the cell is
  *incomplete* until a resume finishes it, and the headline says so;
- an item's value is the mean over its scored repeats; intervals are over items.
"quality (all)" counts violations and the strategy's errors as 0; "quality (scored)" leaves the
strategy's errors out; "quality (admitted)" uses result rows only.
"""

from __future__ import annotations

import itertools
import math
from collections import Counter, defaultdict
from collections.abc import Iterable
from typing import Any

import numpy as np

from . import stats
from .curve import is_control
from .data import RunData
from .evidence import PLUGIN_PHASES, prompts_only_summary
from .power import detectable_effect, pair_spread

ERROR_POLICY = (
    "An error the strategy under test caused (its reset, apply, ingest or retrieve failed) is a "
    "failure: 'quality (all)' scores it 0, like a violation, over every item; 'quality (scored)' "
    "leaves it out. Any other error (harness, server, task or grader) is never scored: its cell "
    "is incomplete until a resume finishes it. Every error is counted per cell with its cause and "
    "listed. 'quality (admitted)' averages items that had a result row (prompt within budget)."
)


def plugin_failure(row: dict[str, Any]) -> bool:
    """An error row the strategy under test caused (scored 0), as opposed to one of the harness."""
    return row["event"] == "error" and row.get("phase") in PLUGIN_PHASES


def _scored(row: dict[str, Any], with_failures: bool) -> float | None:
    if row["event"] == "result":
        return float(row["quality"])
    if row["event"] == "violation" or (with_failures and plugin_failure(row)):
        return 0.0
    return None


def item_values(
    rows: Iterable[dict[str, Any]], admitted_only: bool = False, with_failures: bool = True
) -> dict[str, float]:
    """item_id -> mean scored value over its repeats: the strategy's own errors 0 unless not
    ``with_failures``, other errors skipped, items with nothing scored left out."""
    per_item: dict[str, list[float]] = defaultdict(list)
    for row in rows:
        if admitted_only and row["event"] != "result":
            continue
        value = _scored(row, with_failures)
        if value is not None:
            per_item[str(row["item_id"])].append(value)
    return {item: float(np.mean(values)) for item, values in per_item.items()}


def _mean(values: list[float]) -> float:
    return float(np.mean(values)) if values else math.nan


def _max(values: list[float]) -> float:
    return float(np.max(values)) if values else math.nan


def error_causes(rows: Iterable[dict[str, Any]]) -> str:
    """ "phase: count" per error phase, most frequent first."""
    counts = Counter(row.get("phase") or "unknown" for row in rows if row["event"] == "error")
    return "; ".join(f"{phase}: {n}" for phase, n in counts.most_common())


def _quality_columns(prefix: str, value: stats.Estimate) -> dict[str, Any]:
    return {f"{prefix}": value.mean, f"{prefix}_low": value.low, f"{prefix}_high": value.high, f"{prefix}_n": value.n}


def cell_summary(rows: list[dict[str, Any]], binary: bool, budget: int) -> dict[str, Any]:
    results = [r for r in rows if r["event"] == "result"]
    violations = [r for r in rows if r["event"] == "violation"]
    errors = [r for r in rows if r["event"] == "error"]
    failures = sum(plugin_failure(r) for r in errors)
    scored = len(results) + len(violations)
    all_items = stats.estimate(list(item_values(rows).values()), binary)
    scored_items = stats.estimate(list(item_values(rows, with_failures=False).values()), binary)
    admitted = stats.estimate(list(item_values(rows, admitted_only=True).values()), binary)
    used = [float(r["prompt_tokens"]) for r in results]
    costs = [r["cost"] for r in results if r.get("cost") is not None]
    served = [r["served_prompt_tokens"] for r in results if r.get("served_prompt_tokens") is not None]
    completion = [r["completion_tokens"] for r in results if r.get("completion_tokens") is not None]
    # A cache hit carries the original call's latency: counting it again would weigh one call twice.
    called = [r for r in results if not r.get("cached")]
    sent_over = [r for r in violations if r.get("phase") == "served" and r.get("cached") is False]
    return {
        "n_items": len({str(r["item_id"]) for r in rows}),
        "repeats": len({int(r["repeat"]) for r in rows}),
        "rows": len(rows),
        "results": len(results),
        "violations": len(violations),
        "errors": len(errors),
        "plugin_errors": failures,
        "harness_errors": len(errors) - failures,
        "incomplete": len(errors) > failures,
        "error_causes": error_causes(rows),
        "violation_rate": len(violations) / scored if scored else math.nan,
        **_quality_columns("quality_all", all_items),
        **_quality_columns("quality_scored", scored_items),
        **_quality_columns("quality_admitted", admitted),
        "interval": all_items.method,
        "used_tokens_mean": _mean(used),
        "used_tokens_max": _max(used),
        "utilisation_mean": _mean(used) / budget if used else math.nan,
        "utilisation_max": _max(used) / budget if used else math.nan,
        "model_calls": len(called) + len(sent_over),  # a served violation was a call too
        "cache_hits": len(results) - len(called),
        "latency_p50_s": stats.percentile([r.get("latency_s") for r in called], 50),
        "latency_p95_s": stats.percentile([r.get("latency_s") for r in called], 95),
        "strategy_p50_s": stats.percentile([r.get("strategy_s") for r in rows], 50),
        "strategy_p95_s": stats.percentile([r.get("strategy_s") for r in rows], 95),
        "served_prompt_tokens": int(sum(served)) if served else None,  # None: not reported
        "served_prompt_rows": len(served),
        "completion_tokens": int(sum(completion)),
        "aux_calls": int(sum(r.get("aux_calls") or 0 for r in rows)),
        "aux_prompt_tokens": int(sum(r.get("aux_prompt_tokens") or 0 for r in rows)),
        "aux_completion_tokens": int(sum(r.get("aux_completion_tokens") or 0 for r in rows)),
        "cost": float(sum(costs)) if costs else None,
        **episode_columns(rows, binary),
    }


END_REASONS = ("done", "max_turns", "violation", "error")


def episode_columns(rows: list[dict[str, Any]], binary: bool) -> dict[str, Any]:
    """Agent episodes (rows with ``episode``): the reward with the report's interval (over items,
    an item's value its mean over repeats; violations 0, errors left out as in quality), per-episode
    means of turns, calls and tool errors, the largest prompt of any call, and how the episodes
    ended (``end_<reason>`` counts, errors included). Empty for other tasks."""
    every = [r for r in rows if isinstance(r.get("episode"), dict)]
    if not every:
        return {}
    ends = Counter(str(r["episode"].get("end_reason")) for r in every)
    scored = [r for r in every if r["event"] != "error"]
    episodes = [r["episode"] for r in scored]
    per_item: dict[str, list[float]] = defaultdict(list)
    for row in scored:
        per_item[str(row["item_id"])].append(float(row["episode"].get("reward") or 0.0))
    reward = stats.estimate([float(np.mean(v)) for v in per_item.values()], binary)
    return {
        "episodes": len(every),
        **{f"reward{k}": v for k, v in _quality_columns("", reward).items()},
        "turns_mean": _mean([float(e.get("turns") or 0) for e in episodes]),
        "calls_mean": _mean([float(e.get("calls") or 0) for e in episodes]),
        "peak_prompt_tokens_max": _max([float(e.get("peak_prompt_tokens") or 0) for e in episodes]),
        "tool_errors_mean": _mean([float(e.get("tool_errors") or 0) for e in episodes]),
        **{f"end_{reason}": ends.get(reason, 0) for reason in END_REASONS},
        "end_reasons": "; ".join(f"{k} {v}" for k, v in sorted(ends.items())),
    }


def summarise(
    rows: Iterable[dict[str, Any]], binary: bool, prompts_only: bool = False
) -> dict[tuple[str, str, int], dict[str, Any]]:
    """(task, strategy, budget) -> the cell's summary, from terminal rows: the one computation
    behind the report's summary table and the terminal summary printed at the end of ``run``.

    Each value is ``cell_summary`` (``prompts_only``: ``prompts_only_summary``, no quality)
    plus ``estimate``, the headline quality (all) as a ``stats.Estimate`` (None when nothing
    was scored)."""
    grouped: dict[tuple[str, str, int], list[dict[str, Any]]] = defaultdict(list)
    for row in rows:
        grouped[(str(row["task"]), str(row["strategy"]), int(row["budget"]))].append(row)
    cells = {}
    for (task, strategy, budget), cell_rows in grouped.items():
        if prompts_only:
            cells[(task, strategy, budget)] = {**prompts_only_summary(cell_rows, budget), "estimate": None}
            continue
        summary = cell_summary(cell_rows, binary, budget)
        estimate = stats.Estimate(
            summary["quality_all"],
            summary["quality_all_low"],
            summary["quality_all_high"],
            summary["quality_all_n"],
            summary["interval"],
        )
        cells[(task, strategy, budget)] = {**summary, "estimate": estimate if estimate.n else None}
    return cells


def summary_table(data: RunData) -> list[dict[str, Any]]:
    approximate = data.approximate
    summaries = summarise(data.rows.values(), data.binary)
    table = []
    for task, strategy, budget in data.cells():
        regime = (data.manifest.get("strategies", {}).get(strategy) or {}).get("regime")
        summary = {k: v for k, v in summaries[(task, strategy, budget)].items() if k != "estimate"}
        table.append(
            {
                "task": task,
                "strategy": strategy,
                "regime": regime,
                "budget": budget,
                **summary,
                "approximate_counts": approximate,
            }
        )
    return table


def category_table(data: RunData) -> list[dict[str, Any]]:
    approximate = data.approximate
    table = []
    for (task, strategy, budget), rows in data.cells().items():
        by_category: dict[str, list[dict[str, Any]]] = defaultdict(list)
        for row in rows:
            by_category[row.get("category") or "(none)"].append(row)
        for category, category_rows in sorted(by_category.items()):
            summary = cell_summary(category_rows, data.binary, budget)
            keep = (
                "n_items",
                "results",
                "violations",
                "errors",
                "violation_rate",
                "quality_all",
                "quality_all_low",
                "quality_all_high",
                "quality_all_n",
                "quality_admitted",
                "quality_admitted_low",
                "quality_admitted_high",
                "quality_admitted_n",
                "interval",
            )
            table.append(
                {
                    "task": task,
                    "category": category,
                    "strategy": strategy,
                    "budget": budget,
                    **{k: summary[k] for k in keep},
                    "approximate_counts": approximate,
                }
            )
    return sorted(table, key=lambda r: (r["task"], r["category"]))


def parse_reference(reference: str | None) -> tuple[str | None, int | None]:
    """``STRATEGY@BUDGET`` (one reference cell) or ``STRATEGY`` (that strategy at each budget)."""
    if not reference:
        return None, None
    strategy, sep, budget = reference.partition("@")
    if not strategy:
        raise ValueError(f"--reference: expected STRATEGY or STRATEGY@BUDGET, got {reference!r}")
    if not sep:
        return strategy, None
    try:
        return strategy, int(budget)
    except ValueError:
        raise ValueError(f"--reference: budget must be an integer, got {budget!r} in {reference!r}") from None


def comparisons(data: RunData, reference: str | None) -> list[tuple[tuple[str, str, int], tuple[str, str, int]]]:
    """(candidate cell, reference cell) pairs. Default reference: the first strategy at each budget.
    A control (``control:``) is never a candidate, nor the default reference."""
    cells = data.cells()
    strategy, budget = parse_reference(reference)
    strategy = strategy or next((s for s in data.strategy_order() if not is_control(s)), None)
    if strategy is None:
        return []
    if not any(c[1] == strategy for c in cells):
        raise ValueError(f"--reference: strategy {strategy!r} has no rows; strategies: {data.strategy_order()}")
    pairs = []
    for task, cand_strategy, cand_budget in cells:
        ref = (task, strategy, budget if budget is not None else cand_budget)
        if ref not in cells:
            if budget is not None:
                raise ValueError(f"--reference: no cell {strategy}@{budget} for task {task!r}")
            continue
        if ref != (task, cand_strategy, cand_budget) and not is_control(cand_strategy):
            pairs.append(((task, cand_strategy, cand_budget), ref))
    return pairs


def paired_table(data: RunData, reference: str | None) -> list[dict[str, Any]]:
    """Candidate minus reference over the same items; missing and ingest-dropped items listed."""
    cells = data.cells()
    lost = data.ingest_losses()
    table = []
    for cand, ref in comparisons(data, reference):
        dropped = set(lost.get(cand[0], {}))
        cand_values = {k: v for k, v in item_values(cells[cand]).items() if k not in dropped}
        ref_values = {k: v for k, v in item_values(cells[ref]).items() if k not in dropped}
        seen = {str(r["item_id"]) for r in cells[cand] + cells[ref]}
        shared = sorted(set(cand_values) & set(ref_values))
        missing_cand = sorted(seen - dropped - set(cand_values))
        missing_ref = sorted(seen - dropped - set(ref_values))
        cand_shared, ref_shared = [cand_values[i] for i in shared], [ref_values[i] for i in shared]
        delta = stats.paired_delta(cand_shared, ref_shared)
        table.append(
            {
                "task": cand[0],
                "strategy": cand[1],
                "budget": cand[2],
                "reference": f"{ref[1]}@{ref[2]}",
                "paired_items": delta.n,
                "candidate_quality": float(np.mean([cand_values[i] for i in shared])) if shared else math.nan,
                "reference_quality": float(np.mean([ref_values[i] for i in shared])) if shared else math.nan,
                "delta": delta.mean,
                "delta_low": delta.low,
                "delta_high": delta.high,
                "interval": delta.method,
                "result": delta.verdict,
                "needed_items": delta.needed_n,
                "sign_test_p": delta.p_value,
                "mde": detectable_effect(*pair_spread(cand_shared, ref_shared), delta.n),
                "missing_in_candidate": len(missing_cand),
                "missing_in_reference": len(missing_ref),
                "missing_items": " ".join(sorted(set(missing_cand) | set(missing_ref))),
                "dropped_ingest_loss": len(dropped & seen),
                "approximate_counts": data.approximate,
            }
        )
    return table


def error_table(data: RunData) -> list[dict[str, Any]]:
    return [
        {
            "task": k[0],
            "strategy": k[1],
            "budget": k[2],
            "repeat": k[3],
            "item_id": k[4],
            "phase": row.get("phase"),
            "cause": row.get("cause"),
        }
        for k, row in sorted(data.rows.items())
        if row["event"] == "error"
    ]


def crossovers(grids: list[dict[str, Any]]) -> list[str]:
    """Findings from the best-at-each-budget grids (``pivot.best_at_each_budget``).

    A crossover is two consecutive budgets whose best strategies differ *and* are each
    distinguished from every other strategy; a tie or a cell with too few items is named as
    such, never ranked; a strategy that exceeded the budget is never called best.
    """
    notes = []
    for grid in grids:
        task, best = grid["task"], grid["best"]
        budgets = [b for b in grid["budgets"] if best[b]["status"] != "none" or best[b].get("excluded")]
        for b1, b2 in itertools.pairwise(budgets):
            first, second = best[b1], best[b2]
            if first["status"] == second["status"] == "best" and first["strategies"] != second["strategies"]:
                notes.append(
                    f"{task}: crossover, the best strategy changes from {first['strategies'][0]} at budget "
                    f"{b1} to {second['strategies'][0]} at budget {b2} (each distinguished from every other "
                    "strategy by paired deltas)."
                )
        for status, words in (
            ("tied", "tie (not distinguished, no best strategy)"),
            ("too few items", "too few items to separate"),
        ):
            where = [f"{b} ({', '.join(best[b]['strategies'])})" for b in budgets if best[b]["status"] == status]
            if where:
                notes.append(f"{task}: {words} at budget {'; '.join(where)}.")
        excluded = [f"{b} ({', '.join(best[b]['excluded'])})" for b in budgets if best[b].get("excluded")]
        if excluded:
            notes.append(
                f"{task}: never called best because they exceeded the budget: at budget {'; '.join(excluded)}."
            )
    if not any("crossover" in note for note in notes):
        notes.insert(0, "No crossover: no two budgets have different strategies each distinguished best.")
    return notes


def non_monotone(summary: list[dict[str, Any]]) -> list[str]:
    """Strategies whose quality drops when the budget grows."""
    notes = []
    for task, strategy in sorted({(r["task"], r["strategy"]) for r in summary}):
        curve = sorted((r["budget"], r) for r in summary if r["task"] == task and r["strategy"] == strategy)
        for (b1, r1), (b2, r2) in itertools.pairwise(curve):
            if r2["quality_all"] < r1["quality_all"]:
                overlap = r2["quality_all_high"] >= r1["quality_all_low"]
                notes.append(
                    f"{task}: {strategy} drops from {r1['quality_all']:.3f} at budget {b1} to "
                    f"{r2['quality_all']:.3f} at budget {b2}"
                    + (" (intervals overlap: not distinguished)." if overlap else " (intervals do not overlap).")
                )
    return notes


def monotone_note(summary: list[dict[str, Any]]) -> list[str]:
    """The non-monotone findings, or that every curve is non-decreasing: said only when some
    strategy has a quality at two budgets (a run that scored nothing claims nothing)."""
    notes = non_monotone(summary)
    curves: dict[tuple[str, str], int] = Counter(
        (r["task"], r["strategy"]) for r in summary if not math.isnan(r["quality_all"])
    )
    if notes or not any(n >= 2 for n in curves.values()):
        return notes
    return ["Every strategy's quality is non-decreasing in the budget."]


def incomplete_cells(summary: list[dict[str, Any]]) -> list[str]:
    """Cells whose harness or server errors left items unscored, for the headline."""
    short = [f"{r['strategy']}@{r['budget']} ({r['harness_errors']})" for r in summary if r.get("incomplete")]
    if not short:
        return []
    return [
        f"INCOMPLETE: {len(short)} cells have errors of the harness or server (not scored, not the "
        f"strategy's fault) and stay incomplete until a resume finishes them: {', '.join(short)}."
    ]


def completeness(data: RunData, summary: list[dict[str, Any]]) -> list[str]:
    """Items the run selected but has no row for, and cells with rows for fewer items.

    The selection is the manifest's ``selected_items`` (ids per task, written by the runner);
    a run made before it was recorded falls back to the items seen in any row, which cannot
    see an item whose every cell failed before writing a row.
    """
    notes = []
    selected = data.manifest.get("selected_items") or {}
    for task in sorted({r["task"] for r in summary} | set(selected)):
        seen = {k[4] for k in data.rows if k[0] == task}
        recorded = (selected.get(task) or {}).get("ids")
        expected = {str(i) for i in recorded} if recorded is not None else seen
        source = "selected (manifest)" if recorded is not None else "seen in any row"
        partial = recorded is not None and (selected.get(task) or {}).get("complete") is False
        missing = sorted(expected - seen)
        if missing:
            notes.append(
                f"{task}: {len(missing)} of the {len(expected)} selected items have no row at all "
                f"(missing): {', '.join(missing)}."
            )
        if partial:
            notes.append(
                f"{task}: the run stopped while its items were still being read: {len(expected)} were "
                "selected so far, more may follow when it resumes."
            )
        short = [
            f"{r['strategy']}@{r['budget']} ({r['n_items']})"
            for r in summary
            if r["task"] == task and r["n_items"] < len(expected)
        ]
        if short:
            notes.append(
                f"{task}: incomplete run, these cells have rows for fewer than the {len(expected)} items "
                f"{source} (run the same command again to finish): {', '.join(short)}."
            )
    return notes
