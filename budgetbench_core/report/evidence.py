"""Evidence recall per cell, and the summary of a prompts-only run.

The runner records on each gated row ``evidence``: ``{"marked", "kept", "dropped"}`` (ids of
the pieces the task marked, see ``budgetbench_core.evidence``), or null for an item without
marks. Per cell:

- ``evidence_all``: the share of marked items whose prompt kept *all* their evidence
  (Wilson 95% interval over items);
- ``evidence_share``: the mean share of an item's evidence kept (bounded-t 95% interval);

both with violations counted as nothing kept (the model sees no prompt), errors left out,
and an item's value averaged over its repeats. A cell, or a task, with no marked item has
no evidence figures at all (never 0).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable
from typing import Any

import numpy as np

from . import stats

GATED = ("result", "violation", "admitted")  # rows whose prompt was built, counted and gated
# Error phases where the strategy (or memory system) under test is at fault (tables.plugin_failure).
PLUGIN_PHASES = frozenset({"reset", "strategy", "ingest", "retrieve"})


def item_evidence(rows: Iterable[dict[str, Any]]) -> tuple[dict[str, float], dict[str, float]]:
    """(item -> all-kept value, item -> share kept), means over repeats; unmarked items left out."""
    all_kept: dict[str, list[float]] = defaultdict(list)
    share: dict[str, list[float]] = defaultdict(list)
    for row in rows:
        outcome = row.get("evidence")
        if row["event"] not in GATED or not outcome or not outcome.get("marked"):
            continue
        item = str(row["item_id"])
        if row["event"] == "violation":
            all_kept[item].append(0.0)
            share[item].append(0.0)
        else:
            kept = len(outcome.get("kept") or [])
            all_kept[item].append(1.0 if kept == outcome["marked"] else 0.0)
            share[item].append(kept / outcome["marked"])
    return ({i: float(np.mean(v)) for i, v in all_kept.items()}, {i: float(np.mean(v)) for i, v in share.items()})


def has_evidence(rows: Iterable[dict[str, Any]]) -> bool:
    return any(row.get("evidence") for row in rows)


def evidence_columns(rows: list[dict[str, Any]]) -> dict[str, Any]:
    all_kept, share = item_evidence(rows)
    a = stats.estimate(list(all_kept.values()), binary=True)
    s = stats.estimate(list(share.values()), binary=False)
    return {
        "evidence_all": a.mean,
        "evidence_all_low": a.low,
        "evidence_all_high": a.high,
        "evidence_all_n": a.n,
        "evidence_share": s.mean,
        "evidence_share_low": s.low,
        "evidence_share_high": s.high,
        "evidence_share_n": s.n,
    }


def _mean(values: list[float]) -> float:
    return float(np.mean(values)) if values else math.nan


def prompts_only_summary(rows: list[dict[str, Any]], budget: int) -> dict[str, Any]:
    """A prompts-only cell: compliance, budget use and evidence; no quality (no model was called)."""
    admitted = [r for r in rows if r["event"] == "admitted"]
    violations = [r for r in rows if r["event"] == "violation"]
    errors = [r for r in rows if r["event"] == "error"]
    gated = len(admitted) + len(violations)
    used = [float(r["prompt_tokens"]) for r in admitted]
    failures = sum(r.get("phase") in PLUGIN_PHASES for r in errors)
    counts: dict[str, int] = defaultdict(int)
    for r in errors:
        counts[r.get("phase") or "unknown"] += 1
    return {
        "n_items": len({str(r["item_id"]) for r in rows}),
        "rows": len(rows),
        "admitted": len(admitted),
        "violations": len(violations),
        "errors": len(errors),
        "plugin_errors": failures,
        "harness_errors": len(errors) - failures,
        "incomplete": len(errors) > failures,
        "error_causes": "; ".join(f"{k}: {v}" for k, v in sorted(counts.items(), key=lambda kv: -kv[1])),
        "violation_rate": len(violations) / gated if gated else math.nan,
        "used_tokens_mean": _mean(used),
        "used_tokens_max": float(max(used)) if used else math.nan,
        "utilisation_mean": _mean(used) / budget if used else math.nan,
        "utilisation_max": max(used) / budget if used else math.nan,
        "strategy_p50_s": stats.percentile([r.get("strategy_s") for r in rows], 50),
        "strategy_p95_s": stats.percentile([r.get("strategy_s") for r in rows], 95),
        "aux_calls": int(sum(r.get("aux_calls") or 0 for r in rows)),
        **evidence_columns(rows),
    }
