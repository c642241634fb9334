"""``budgetbench demo``: what budgets do to memory strategies, in minutes, on the embedded model.

Two runs on synthetic-memory histories of about 3,000 tokens, so every tier binds:

- ``prompts/``: a prompts-only run (no model call) of truncation, checkpoint, rag and
  full_context at 512, 1024 and 2048 tokens over enough items that evidence recall separates
  the strategies at the smallest tier, and full_context's violations show;
- ``answered/``: a small run on the embedded 135M model at the smallest tier, for quality
  and the served-count audit (the server's prompt count against ours).

The closing lines (also written to ``LESSON.md`` in the demo's folder) state what the runs
showed, computed from their rows: each strategy's evidence recall at the smallest tier
against truncation's, paired over the same items with its interval; and, when the answered
run scores near 0, that the 135M model cannot answer even with the evidence in its prompt,
and what to run for real quality.

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
BASELINE = "truncation"  # the naive strategy every other one is paired with
LOW_QUALITY = 0.2  # an answered run whose every cell scores below this says why
REAL_QUALITY = (
    "budgetbench run -t synthetic-memory -s truncation -s checkpoint -s rag -b 512 -n 60 "
    "-m openai/gpt-4o-mini -o runs/real   (any capable model: a litellm model string with its key in the "
    "environment, or --api-base for your own server; a larger GGUF with -m local:<file.gguf>)"
)


ANSWERED_NOTE = (
    "the embedded SmolLM2-135M cannot answer these questions: its quality is near 0 for every strategy, "
    "even where the prompt kept all the evidence, so this run shows that the pipeline and the served-count "
    "audit work, not which strategy is better. Evidence recall (the prompts-only report) is the "
    "model-independent comparison; for quality run a capable model, e.g. budgetbench run -t synthetic-memory "
    "-s truncation -s checkpoint -s rag -m ollama_chat/qwen2.5:7b --tokenizer hf:Qwen/Qwen2.5-7B-Instruct"
)


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
                notes=[ANSWERED_NOTE],
                **common,
            )
        )
    return configs


def _interval(row: dict[str, Any], prefix: str) -> str:
    value = row.get(prefix)
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    return f"{value:.2f} [{row[prefix + '_low']:.2f}, {row[prefix + '_high']:.2f}]"


def _paired_evidence(data: Any, budget: int) -> list[str]:
    """Each strategy's all-evidence-kept against the baseline's, over the same items at ``budget``."""
    from .report.evidence import item_evidence
    from .report.stats import paired_delta

    cells = {(s, b): rows for (_, s, b), rows in data.cells().items()}
    if (BASELINE, budget) not in cells:
        return []
    base = item_evidence(cells[(BASELINE, budget)])[0]
    lines = []
    for (strategy, at), rows in sorted(cells.items()):
        if at != budget or strategy == BASELINE or strategy.startswith("control"):
            continue
        values = item_evidence(rows)[0]
        shared = sorted(set(values) & set(base))
        if not shared:
            continue
        delta = paired_delta([values[i] for i in shared], [base[i] for i in shared])
        cand, ref = sum(values[i] for i in shared) / len(shared), sum(base[i] for i in shared) / len(shared)
        if delta.verdict in ("higher", "lower"):
            verdict = f"keeps all the evidence for {'more' if delta.verdict == 'higher' else 'fewer'} items (a result)"
        else:
            verdict = f"{delta.verdict} (no ranking claim)"
        interval = "" if math.isnan(delta.low) else f" [{delta.low:+.2f}, {delta.high:+.2f}]"
        over = sum(r["event"] == "violation" for r in rows)
        if over:
            verdict += f"; {over} of {len(rows)} prompts over the budget (a violation keeps nothing)"
        lines.append(
            f"  {strategy} {cand:.2f} vs {BASELINE} {ref:.2f} over {delta.n} paired items: "
            f"{delta.mean:+.2f}{interval} ({delta.method}), {verdict}"
        )
    return lines


def _why_low(answered: dict[str, Any], data: Any) -> list[str]:
    """When every answered cell is near 0: the model, not the prompts, is what fails (evidence kept, answer wrong)."""
    means = [r["quality_all"] for r in answered["summary"] if not math.isnan(r.get("quality_all", math.nan))]
    if not means or max(means) >= LOW_QUALITY:
        return []
    kept = [
        r
        for r in data.rows.values()
        if r["event"] == "result"
        and r.get("evidence")
        and len(r["evidence"].get("kept") or []) == r["evidence"]["marked"]
    ]
    right = sum(float(r.get("quality") or 0) for r in kept)
    evidence = (
        f" even on the {len(kept)} answers whose prompt kept all the evidence ({right:g} correct)" if kept else ""
    )
    return [
        f"Why quality is near 0: every cell scores below {LOW_QUALITY}{evidence}. The embedded model "
        "(SmolLM2-135M) is too small to answer these questions: this run checks the plumbing (budget gate, "
        "served-count audit), not the strategies. For real quality run a capable model:",
        f"  {REAL_QUALITY}",
    ]


def summary_lines(out: Path) -> list[str]:
    """What the demo showed, read back from its run directories; also written to ``LESSON.md``."""
    lines = _summary(Path(out))
    if Path(out).is_dir():
        lines.append(f"these lines: {Path(out) / 'LESSON.md'}")
        (Path(out) / "LESSON.md").write_text(
            "# What the demo showed\n\n```\n" + "\n".join(lines) + "\n```\n", encoding="utf-8"
        )
    return lines


def _summary(out: Path) -> list[str]:
    from .report.data import ReportError, load_run
    from .report.writer import build_context

    lines = []
    try:
        prompts_data = load_run(out / "prompts", with_prompts=False)
        prompts = build_context(prompts_data)
    except ReportError as exc:
        return [f"demo: no prompts-only rows to summarise ({exc})"]
    smallest = min(r["budget"] for r in prompts["summary"])
    lines.append(
        f"Evidence recall at {smallest} tokens (share of items whose prompt kept all the evidence, 95%; "
        f"prompts only, no model call):"
    )
    for row in (r for r in prompts["summary"] if r["budget"] == smallest):
        lines.append(
            f"  {row['strategy']:<22} {_interval(row, 'evidence_all')}  over {row['evidence_all_n']} items, "
            f"violation rate {row['violation_rate']:.2f}"
        )
    for grid in prompts["pivot"]:
        lines.append(f"  best at {smallest}: {grid['best'][smallest]['text']}")
    paired = _paired_evidence(prompts_data, smallest)
    if paired:
        lines.append(
            f"The lesson, paired over the same items at {smallest} tokens: what a strategy keeps decides whether "
            f"the answer's evidence reaches the model at all (all evidence kept, strategy vs {BASELINE}, 95%):"
        )
        lines += paired
    answered_dir = out / "answered"
    if (answered_dir / "manifest.json").exists():
        try:
            answered_data = load_run(answered_dir, with_prompts=False)
            answered = build_context(answered_data)
        except ReportError as exc:
            return [*lines, f"answered run: nothing to summarise ({exc})"]
        lines.append(f"Answered run on the embedded model at {smallest} tokens (quality, violations = 0, 95%):")
        for row in answered["summary"]:
            lines.append(
                f"  {row['strategy']:<22} {_interval(row, 'quality_all')}  over {row['quality_all_n']} items, "
                f"violation rate {row['violation_rate']:.2f}"
            )
        lines.append(
            f"  served-count audit: {answered['served_checked']} prompts checked, "
            f"{len(answered['served_mismatches'])} differ from our count"
        )
        lines += _why_low(answered, answered_data)
    lines.append(
        f"reports: {out / 'prompts' / 'report' / 'index.html'}"
        + (f" and {answered_dir / 'report' / 'index.html'}" if answered_dir.exists() else "")
    )
    return lines
