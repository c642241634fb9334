"""The report plots, drawn with matplotlib's Agg backend (no display needed).

Quality vs budget (95% interval bands), violation rate vs budget, quality vs median model
latency with the Pareto front (no other cell is both better and faster) marked, and quality
vs budget per item category. A prompts-only run plots evidence recall where quality would be.
A cell with nothing scored is left out of a curve; an empty axis says so.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (the backend must be chosen first)

from .curve import is_control  # noqa: E402

PLOTS = {
    "quality": "quality_vs_budget.png",
    "violations": "violations_vs_budget.png",
    "pareto": "quality_vs_latency.png",
    "cost": "score_vs_cost.png",
    "categories": "quality_by_category.png",
}


def _by_strategy(summary: list[dict[str, Any]], task: str) -> dict[str, list[dict[str, Any]]]:
    curves: dict[str, list[dict[str, Any]]] = {}
    for row in summary:
        if row["task"] == task:
            curves.setdefault(row["strategy"], []).append(row)
    return {s: sorted(rows, key=lambda r: r["budget"]) for s, rows in curves.items()}


def _figure(tasks: list[str]):
    figure, axes = plt.subplots(1, len(tasks), figsize=(6.4 * len(tasks), 4.4), squeeze=False)
    return figure, list(axes[0])


def _budget_axis(axis, budgets: list[int]) -> None:
    """Log-2 budget axis with explicit limits, so an axis with nothing to draw (every cell
    errored) still has a valid log scale instead of matplotlib's default (0, 1)."""
    axis.set_xscale("log", base=2)
    if budgets:
        axis.set_xlim(min(budgets) / 1.25, max(budgets) * 1.25)
    axis.minorticks_off()
    axis.set_xticks(budgets)
    axis.set_xticklabels([str(b) for b in budgets])
    axis.set_xlabel("budget (input tokens)")
    axis.grid(alpha=0.3)


def pareto_front(points: list[tuple[float, float]]) -> list[int]:
    """Indices of (latency, quality) points that no other point beats on both (lower, higher)."""
    front = []
    for i, (lat, q) in enumerate(points):
        dominated = any((l2 <= lat and q2 >= q) and (l2 < lat or q2 > q) for j, (l2, q2) in enumerate(points) if j != i)
        if not dominated:
            front.append(i)
    return front


METRIC_LABELS = {
    "quality_all": "quality, all items (violations, strategy errors = 0)",
    "evidence_all": "evidence recall (all evidence kept; violations = none)",
}


def _finite(value: Any) -> bool:
    return value is not None and not (isinstance(value, float) and math.isnan(value))


def _curves(axis, rows_by_strategy: dict[str, list[dict[str, Any]]], metric: str) -> bool:
    """One line per strategy with its 95% band; cells without the metric are left out. True if any drawn."""
    drawn = False
    for strategy, rows in rows_by_strategy.items():
        rows = [r for r in rows if _finite(r.get(metric))]
        if not rows:
            continue
        budgets = [r["budget"] for r in rows]
        if is_control(strategy):  # a reference line (the floor or the ceiling), never a contender
            style = ":" if strategy.endswith("no_memory") else "--"  # the floor dotted, the ceiling dashed
            axis.plot(budgets, [r[metric] for r in rows], linestyle=style, color="0.3", label=f"{strategy} (control)")
            drawn = True
            continue
        line = axis.plot(budgets, [r[metric] for r in rows], marker="o", label=strategy)[0]
        lows, highs = [r.get(f"{metric}_low") for r in rows], [r.get(f"{metric}_high") for r in rows]
        if all(_finite(v) for v in lows + highs):
            axis.fill_between(budgets, lows, highs, color=line.get_color(), alpha=0.15)
        drawn = True
    return drawn


def _empty_note(axis, drawn: bool, text: str = "nothing scored: every cell errored") -> None:
    if drawn:
        axis.legend(fontsize=8)
    else:
        axis.text(0.5, 0.5, text, ha="center", transform=axis.transAxes)


def quality_vs_budget(summary, tasks, title_note, path: Path, metric: str = "quality_all") -> None:
    figure, axes = _figure(tasks)
    for axis, task in zip(axes, tasks):
        drawn = _curves(axis, _by_strategy(summary, task), metric)
        _budget_axis(axis, sorted({r["budget"] for r in summary if r["task"] == task}))
        axis.set_ylim(-0.02, 1.02)
        axis.set_ylabel(METRIC_LABELS.get(metric, metric))
        axis.set_title(
            f"{task}: {METRIC_LABELS.get(metric, metric).split(',')[0].split(' (')[0]} vs budget, "
            f"95% bands{title_note}",
            fontsize=10,
        )
        _empty_note(axis, drawn)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def by_category(categories, title_note, path: Path, metric: str = "quality_all") -> None:
    """Small multiples: one panel per (task, category), a line per strategy over the budgets."""
    panels = sorted({(r["task"], r["category"]) for r in categories}) or [("(no rows)", "")]
    columns = min(len(panels), 3)
    rows_count = math.ceil(len(panels) / columns)
    figure, axes = plt.subplots(rows_count, columns, figsize=(4.6 * columns, 3.4 * rows_count), squeeze=False)
    flat = list(axes.flat)
    for axis, (task, category) in zip(flat, panels):
        rows = [r for r in categories if r["task"] == task and r["category"] == category]
        drawn = _curves(axis, _by_strategy(rows, task), metric)
        _budget_axis(axis, sorted({r["budget"] for r in rows}))
        axis.set_ylim(-0.02, 1.02)
        axis.set_title(
            f"{task}: {category} (n = {max((r['n_items'] for r in rows), default=0)}){title_note}", fontsize=9
        )
        _empty_note(axis, drawn)
    for axis in flat[len(panels) :]:
        axis.set_visible(False)
    flat[0].set_ylabel(METRIC_LABELS.get(metric, metric))
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)


def violations_vs_budget(summary, tasks, title_note, path: Path) -> None:
    figure, axes = _figure(tasks)
    for axis, task in zip(axes, tasks):
        for strategy, rows in _by_strategy(summary, task).items():
            rows = [r for r in rows if _finite(r["violation_rate"])]
            if rows:
                axis.plot([r["budget"] for r in rows], [r["violation_rate"] for r in rows], marker="o", label=strategy)
        _budget_axis(axis, sorted({r["budget"] for r in summary if r["task"] == task}))
        axis.set_ylim(-0.02, 1.02)
        axis.set_ylabel("violation rate")
        axis.set_title(f"{task}: budget violations{title_note}", fontsize=10)
        _empty_note(axis, any(_finite(r["violation_rate"]) for r in summary if r["task"] == task))
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def _pareto_plot(summary, tasks, title_note, path: Path, x: str, x_label: str, metric: str = "quality_all") -> None:
    """``metric`` against ``x`` per cell (labels: budget), controls left out, the Pareto front
    (lower ``x``, higher ``metric``) dashed."""
    figure, axes = _figure(tasks)
    for axis, task in zip(axes, tasks):
        cells = [
            r
            for r in summary
            if r["task"] == task and not is_control(r["strategy"]) and _finite(r.get(x)) and _finite(r.get(metric))
        ]
        points = [(r[x], r[metric]) for r in cells]
        front = pareto_front(points)
        for strategy, rows in _by_strategy(cells, task).items():
            axis.scatter([r[x] for r in rows], [r[metric] for r in rows], label=strategy)
            for r in rows:
                axis.annotate(
                    str(r["budget"]), (r[x], r[metric]), fontsize=7, xytext=(3, 3), textcoords="offset points"
                )
        if front:
            ordered = sorted(points[i] for i in front)
            axis.plot(
                [p[0] for p in ordered],
                [p[1] for p in ordered],
                color="black",
                linestyle="--",
                linewidth=1,
                label="Pareto front",
            )
        label = METRIC_LABELS.get(metric, metric)
        axis.set_xlabel(x_label)
        axis.set_ylabel(label)
        axis.set_ylim(-0.02, 1.02)
        axis.grid(alpha=0.3)
        axis.set_title(
            f"{task}: {label.split(',')[0].split(' (')[0]} vs {x_label} (labels: budget){title_note}", fontsize=10
        )
        if cells:
            axis.legend(fontsize=8)
        else:
            axis.text(0.5, 0.5, f"no cell has both figures ({x})", ha="center", transform=axis.transAxes)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def quality_vs_latency(summary, tasks, title_note, path: Path) -> None:
    _pareto_plot(summary, tasks, title_note, path, "latency_p50_s", "median model latency (s)")


def score_vs_cost(summary, tasks, title_note, path: Path, metric: str = "quality_all") -> None:
    """Against $ per question where every cell has a price, else tokens per question (the ledger's)."""
    priced = [r for r in summary if not is_control(r["strategy"])]
    if priced and all(_finite(r.get("cost_per_question")) for r in priced):
        _pareto_plot(summary, tasks, title_note, path, "cost_per_question", "$ per question", metric)
    else:
        _pareto_plot(summary, tasks, title_note, path, "tokens_per_question", "tokens per question", metric)


def write_plots(
    summary: list[dict[str, Any]],
    out_dir: Path,
    approximate: bool,
    categories: list[dict[str, Any]] | None = None,
    metric: str = "quality_all",
) -> dict[str, Path]:
    """Every plot into ``out_dir``; ``metric`` is evidence_all for a prompts-only run (no latency plot)."""
    tasks = sorted({r["task"] for r in summary})
    note = " (approximate counts)" if approximate else ""
    paths = {name: out_dir / filename for name, filename in PLOTS.items()}
    quality_vs_budget(summary, tasks, note, paths["quality"], metric)
    violations_vs_budget(summary, tasks, note, paths["violations"])
    if metric == "quality_all":
        quality_vs_latency(summary, tasks, note, paths["pareto"])
    else:
        del paths["pareto"]
    score_vs_cost(summary, tasks, note, paths["cost"], metric)
    by_category(categories or [], note, paths["categories"], metric)
    return paths
