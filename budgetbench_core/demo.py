"""``budgetbench demo``: what budgets do to memory strategies, in minutes, on the embedded model.

Two runs on synthetic-memory histories of about 3,000 tokens, so every tier binds:

- ``prompts/``: a prompts-only run (no model call) of truncation, checkpoint, rag and
  full_context at 512, 1024 and 2048 tokens over enough items that evidence recall separates
  the strategies at the smallest tier, and full_context's violations show;
- ``answered/``: a small run on the embedded 135M model at the smallest tier, for quality
  and the served-count audit (the server's prompt count against ours).

rag is a plugin (budgetbench-strategy-rag); without it the demo runs the others and says so.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from .plugins import Registry
from .runner import RunConfig

STRATEGIES = ("truncation", "checkpoint", "rag", "full_context")
BUDGETS = (512, 1024, 2048)
HISTORY_TOKENS = 3000
PROMPT_ITEMS = 60  # 48 with evidence (abstention items have none): Wilson intervals of +-0.1 or less
ANSWERED_ITEMS = 5


def available_strategies(registry: Registry) -> tuple[list[str], list[str]]:
    """(strategies the demo can run, the ones missing from this installation)."""
    names = set(registry.names("strategy"))
    return [s for s in STRATEGIES if s in names], [s for s in STRATEGIES if s not in names]


def demo_configs(out: Path, items: int, answered: int, max_concurrency: int, strategies: list[str]) -> list[RunConfig]:
    """The prompts-only run and the answered run, in that order (``answered`` 0: no answered run)."""
    common: dict[str, Any] = {"task": "synthetic-memory", "strategies": strategies, "max_concurrency": max_concurrency}
    configs = [
        RunConfig(
            out=Path(out) / "prompts",
            budgets=list(BUDGETS),
            limit=items,
            prompts_only=True,
            controls=True,  # no memory and evidence only: the floor and the ceiling of every curve
            task_options={"items": items, "history_tokens": HISTORY_TOKENS},
            **common,
        )
    ]
    if answered:
        configs.append(
            RunConfig(
                out=Path(out) / "answered",
                budgets=[BUDGETS[0]],
                limit=answered,
                task_options={"items": answered, "history_tokens": HISTORY_TOKENS},
                **common,
            )
        )
    return configs


def _interval(row: dict[str, Any], prefix: str) -> str:
    value = row.get(prefix)
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    return f"{value:.2f} [{row[prefix + '_low']:.2f}, {row[prefix + '_high']:.2f}]"


def summary_lines(out: Path) -> list[str]:
    """What the demo showed, read back from its run directories."""
    from .report.data import ReportError, load_run
    from .report.writer import build_context

    lines = []
    try:
        prompts = build_context(load_run(Path(out) / "prompts", with_prompts=False))
    except ReportError as exc:
        return [f"demo: no prompts-only rows to summarise ({exc})"]
    smallest = min(r["budget"] for r in prompts["summary"])
    lines.append(
        f"Evidence recall at {smallest} tokens (share of items whose prompt kept all the evidence, 95%; "
        f"prompts only, no model call):"
    )
    for row in (r for r in prompts["summary"] if r["budget"] == smallest):
        lines.append(
            f"  {row['strategy']:<14} {_interval(row, 'evidence_all')}  over {row['evidence_all_n']} items, "
            f"violation rate {row['violation_rate']:.2f}"
        )
    for grid in prompts["pivot"]:
        lines.append(f"  best at {smallest}: {grid['best'][smallest]['text']}")
    answered_dir = Path(out) / "answered"
    if (answered_dir / "manifest.json").exists():
        try:
            answered = build_context(load_run(answered_dir, with_prompts=False))
        except ReportError as exc:
            return [*lines, f"answered run: nothing to summarise ({exc})"]
        lines.append(f"Answered run on the embedded model at {smallest} tokens (quality, violations = 0, 95%):")
        for row in answered["summary"]:
            lines.append(
                f"  {row['strategy']:<14} {_interval(row, 'quality_all')}  over {row['quality_all_n']} items, "
                f"violation rate {row['violation_rate']:.2f}"
            )
        lines.append(
            f"  served-count audit: {answered['served_checked']} prompts checked, "
            f"{len(answered['served_mismatches'])} differ from our count"
        )
    lines.append(
        f"reports: {Path(out) / 'prompts' / 'report' / 'index.html'}"
        + (f" and {answered_dir / 'report' / 'index.html'}" if answered_dir.exists() else "")
    )
    return lines
