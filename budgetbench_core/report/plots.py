"""The three report plots, drawn with matplotlib's Agg backend (no display needed).

Quality vs budget (95% interval bands), violation rate vs budget, and quality vs median
model latency with the Pareto front (no other cell is both better and faster) marked.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (the backend must be chosen first)

PLOTS = {"quality": "quality_vs_budget.png", "violations": "violations_vs_budget.png",
         "pareto": "quality_vs_latency.png"}


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
    axis.set_xscale("log", base=2)
    axis.set_xticks(budgets)
    axis.set_xticklabels([str(b) for b in budgets])
    axis.set_xlabel("budget (input tokens)")
    axis.grid(alpha=0.3)


def pareto_front(points: list[tuple[float, float]]) -> list[int]:
    """Indices of (latency, quality) points that no other point beats on both (lower, higher)."""
    front = []
    for i, (lat, q) in enumerate(points):
        dominated = any(
            (l2 <= lat and q2 >= q) and (l2 < lat or q2 > q) for j, (l2, q2) in enumerate(points) if j != i
        )
        if not dominated:
            front.append(i)
    return front


def quality_vs_budget(summary, tasks, title_note, path: Path) -> None:
    figure, axes = _figure(tasks)
    for axis, task in zip(axes, tasks):
        curves = _by_strategy(summary, task)
        for strategy, rows in curves.items():
            budgets = [r["budget"] for r in rows]
            line = axis.plot(budgets, [r["quality_all"] for r in rows], marker="o", label=strategy)[0]
            axis.fill_between(budgets, [r["quality_all_low"] for r in rows], [r["quality_all_high"] for r in rows],
                              color=line.get_color(), alpha=0.15)
        _budget_axis(axis, sorted({r["budget"] for r in summary if r["task"] == task}))
        axis.set_ylim(-0.02, 1.02)
        axis.set_ylabel("quality, all items (violations = 0)")
        axis.set_title(f"{task}: quality vs budget, 95% bands{title_note}", fontsize=10)
        axis.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def violations_vs_budget(summary, tasks, title_note, path: Path) -> None:
    figure, axes = _figure(tasks)
    for axis, task in zip(axes, tasks):
        for strategy, rows in _by_strategy(summary, task).items():
            axis.plot([r["budget"] for r in rows], [r["violation_rate"] for r in rows], marker="o", label=strategy)
        _budget_axis(axis, sorted({r["budget"] for r in summary if r["task"] == task}))
        axis.set_ylim(-0.02, 1.02)
        axis.set_ylabel("violation rate")
        axis.set_title(f"{task}: budget violations{title_note}", fontsize=10)
        axis.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def quality_vs_latency(summary, tasks, title_note, path: Path) -> None:
    figure, axes = _figure(tasks)
    for axis, task in zip(axes, tasks):
        cells = [r for r in summary if r["task"] == task
                 and not math.isnan(r["latency_p50_s"]) and not math.isnan(r["quality_all"])]
        points = [(r["latency_p50_s"], r["quality_all"]) for r in cells]
        front = pareto_front(points)
        for strategy, rows in _by_strategy(cells, task).items():
            axis.scatter([r["latency_p50_s"] for r in rows], [r["quality_all"] for r in rows], label=strategy)
            for r in rows:
                axis.annotate(str(r["budget"]), (r["latency_p50_s"], r["quality_all"]), fontsize=7,
                              xytext=(3, 3), textcoords="offset points")
        if front:
            ordered = sorted(points[i] for i in front)
            axis.plot([p[0] for p in ordered], [p[1] for p in ordered], color="black", linestyle="--",
                      linewidth=1, label="Pareto front")
        axis.set_xlabel("median model latency (s)")
        axis.set_ylabel("quality, all items (violations = 0)")
        axis.set_ylim(-0.02, 1.02)
        axis.grid(alpha=0.3)
        axis.set_title(f"{task}: quality vs latency (labels: budget){title_note}", fontsize=10)
        if cells:
            axis.legend(fontsize=8)
        else:
            axis.text(0.5, 0.5, "no cell has a result row", ha="center", transform=axis.transAxes)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def write_plots(summary: list[dict[str, Any]], out_dir: Path, approximate: bool) -> dict[str, Path]:
    tasks = sorted({r["task"] for r in summary})
    note = " (approximate counts)" if approximate else ""
    paths = {name: out_dir / filename for name, filename in PLOTS.items()}
    quality_vs_budget(summary, tasks, note, paths["quality"])
    violations_vs_budget(summary, tasks, note, paths["violations"])
    quality_vs_latency(summary, tasks, note, paths["pareto"])
    return paths
