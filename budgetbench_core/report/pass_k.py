"""pass^k of a cell run with repeats: the chance that k independent trials of a task all succeed.

tau2-bench's leaderboard ranks by pass^1..pass^4, not by one trial's accuracy, because single
trials of the same agent differ by several points. The estimator is upstream's (Yao et al.,
arXiv:2406.12045, ``pass_hat_k`` in tau2's ``metrics/agent_metrics.py``): a task with ``c``
successes in its ``n`` trials contributes ``C(c, k) / C(n, k)``, and pass^k is the mean over
tasks. As upstream, a trial succeeds when its reward is 1 (within 1e-6), each task uses its
own trial count, and k runs up to the smallest trial count of any task (a task with fewer
trials lowers the largest k, it is not dropped). ``flip_rate`` is the share of tasks (with at
least two trials) that neither always nor never succeed.

The input is per task, per repeat, the reward: a violation is a 0 there, an error row is left
out (upstream also leaves out its infrastructure errors).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from .noise import repeat_values

PASS_K_INTRO = (
    "Per cell of a run with repeats: pass^k is the chance that k independent trials of an item all succeed "
    "(quality 1; a violation or the strategy's error is a failure, a harness error is left out), estimated as "
    "tau2-bench does, the mean over items of C(c, k) / C(n, k) for c successes in n trials; k runs up to the "
    "smallest trial count of any item. The flip rate is the share of items tried at least twice that neither "
    "always nor never succeed."
)
"""What the report's pass^k section says it shows (Markdown and HTML)."""

SUCCESS_TOLERANCE = 1e-6  # upstream's is_successful: reward within 1e-6 of 1


def succeeded(reward: float) -> bool:
    """Upstream's success test on one trial's reward."""
    return abs(float(reward) - 1.0) <= SUCCESS_TOLERANCE


def pass_hat_k(trials: int, successes: int, k: int) -> float:
    """The unbiased chance that k of the ``trials`` drawn without replacement all succeeded."""
    if not 1 <= k <= trials:
        raise ValueError(f"pass^k needs 1 <= k <= trials, got k={k} with {trials} trials")
    return math.comb(successes, k) / math.comb(trials, k)


def pass_k(rewards: Mapping[str, Mapping[int, float]], max_k: int | None = None) -> dict[str, Any]:
    """pass^1..pass^K over tasks (``rewards``: task -> repeat -> reward), K the smallest trial count
    (or ``max_k`` if smaller); also the trial counts and the flip rate. Empty without any trial."""
    counts = {task: (len(trials), sum(succeeded(r) for r in trials.values())) for task, trials in rewards.items()}
    counts = {task: nc for task, nc in counts.items() if nc[0] > 0}
    if not counts:
        return {}
    largest = min(n for n, _ in counts.values())
    if max_k is not None:
        largest = min(largest, max_k)
    repeated = [(n, c) for n, c in counts.values() if n >= 2]
    return {
        "tasks": len(counts),
        "trials": sorted({n for n, _ in counts.values()}),
        "pass_k": {
            k: sum(pass_hat_k(n, c, k) for n, c in counts.values()) / len(counts) for k in range(1, largest + 1)
        },
        "flip_rate": sum(0 < c < n for n, c in repeated) / len(repeated) if repeated else None,
        "flipped_tasks": sorted(task for task, (n, c) in counts.items() if n >= 2 and 0 < c < n),
    }


def pass_k_table(cells: Mapping[tuple[str, str, int], list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """One row per cell (task, strategy, budget) whose rows carry a quality: its :func:`pass_k`."""
    table = []
    for (task, strategy, budget), rows in cells.items():
        figures = pass_k(repeat_values(rows, "quality_all"))
        if figures:
            table.append({"task": task, "strategy": strategy, "budget": budget, **figures})
    return table


def pass_k_section(cells: Mapping[tuple[str, str, int], list[dict[str, Any]]]) -> dict[str, Any]:
    """The report's pass^k section: the cells whose items were tried at least twice (``run
    --repeats k``, k >= 2) with the ks any of them reaches; empty for a run without repeats."""
    rows = [row for row in pass_k_table(cells) if max(row["trials"]) >= 2]
    if not rows:
        return {}
    return {"k": sorted({k for row in rows for k in row["pass_k"]}), "cells": rows}
