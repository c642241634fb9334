"""Plugin isolation: what running strategies in confined worker processes costs per cell.

The same prompts-only run (synthetic-memory, truncation and checkpoint at four tiers, counted
with tiktoken) is made with ``--isolation process`` and ``--isolation none``; the difference in
wall time, divided by the cells, is the isolation overhead per cell (worker start-up, once per
thread and strategy, included), and the difference in the harness process's CPU time, divided
by the cells, what isolation costs the harness itself. Figures that do not move with the
machine's speed come from one more, instrumented run per mode: characters the harness's
tokenizer tokenised (after its caches) and, under isolation, the requests each strategy's
worker made per cell (round trips).

    .venv/bin/python benchmarks/bench_isolation.py [--items 200] [--repeats 3]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from collections import Counter
from pathlib import Path

from _common import chars_tokenised, machine, median, write_result

from budgetbench_core import RunConfig, run

TIERS = [256, 512, 1024, 2048]
STRATEGIES = ["truncation", "checkpoint"]


def one_run(items: int, isolation: str, workers: int) -> tuple[float, float, int]:
    with tempfile.TemporaryDirectory() as tmp:
        config = RunConfig(
            task="synthetic-memory",
            task_options={"items": items, "history_tokens": 3000},
            strategies=STRATEGIES,
            budgets=TIERS,
            out=Path(tmp) / "run",
            tokenizer="tiktoken:cl100k_base",
            prompts_only=True,
            max_concurrency=workers,
            isolation=isolation,
        )
        cpu, began = time.process_time(), time.perf_counter()
        summary = run(config)
        return time.perf_counter() - began, time.process_time() - cpu, summary.cells_total


def counted_run(items: int, isolation: str, workers: int) -> dict[str, float]:
    """One run, instrumented: characters tokenised per cell and requests per cell and strategy."""
    from budgetbench_core.host.remote import RemoteStrategy

    requests: Counter[str] = Counter()
    answer = RemoteStrategy._answer

    def counting_answer(self, request, context):
        requests[self.name] += 1
        return answer(self, request, context)

    RemoteStrategy._answer = counting_answer
    try:
        with chars_tokenised() as tokenised:
            _, _, cells = one_run(items, isolation, workers)
    finally:
        RemoteStrategy._answer = answer
    per_strategy = cells / len(STRATEGIES)
    return {
        "chars_tokenised_per_cell": round(tokenised[0] / cells),
        **{f"round_trips_per_cell_{name}": round(requests[name] / per_strategy, 2) for name in STRATEGIES},
    }


def worker_starts(starts: int = 5) -> dict[str, float]:
    """One truncation worker started and created ``starts`` times, one after another: wall time
    to a created strategy, and the worker's CPU (after its guard's fork: creation included)."""
    from budgetbench_core.host.pool import PluginHost
    from budgetbench_core.plugins import Registry
    from budgetbench_core.testing import tokenizer_for

    source = {"entry_points": Registry.discover().entry_points_for("strategy", "truncation")}
    wall, cpu = [], []
    with tempfile.TemporaryDirectory() as tmp:
        host = PluginHost(tokenizer_for("tiktoken:cl100k_base").info.to_dict(), Path(tmp))
        try:
            for _ in range(starts):
                began = time.perf_counter()
                strategy = host.new_strategy("truncation", {}, 0.0, source)
                wall.append(time.perf_counter() - began)
                cpu.append(strategy._cpu_clock() if strategy._cpu_clock else float("nan"))
                strategy.close()
        finally:
            host.close()
    return {"start_wall_ms": round(median(wall) * 1e3, 1), "worker_cpu_ms": round(median(cpu) * 1e3, 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--items", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    start = machine()
    figures: dict[str, dict[str, float]] = {}
    for isolation in ("none", "process"):
        runs = [one_run(args.items, isolation, args.workers) for _ in range(args.repeats)]
        cells = runs[0][2]
        figures[isolation] = {
            "cells": cells,
            "wall_s": round(median([w for w, _, _ in runs]), 3),
            "harness_cpu_s": round(median([c for _, c, _ in runs]), 3),
        }
        print(f"{isolation:>8}: {figures[isolation]}")
    for isolation in ("none", "process"):
        figures[isolation].update(counted_run(args.items, isolation, args.workers))
        print(f"{isolation:>8}, counted: {figures[isolation]}")
    starts = worker_starts()
    print(f"one worker start (median of 5): {starts}")
    cells = figures["none"]["cells"]
    wall = (figures["process"]["wall_s"] - figures["none"]["wall_s"]) / cells * 1000
    cpu = (figures["process"]["harness_cpu_s"] - figures["none"]["harness_cpu_s"]) / cells * 1000
    print(
        f"isolation overhead per cell: {wall:.2f} ms of wall time (worker start-up included), {cpu:.2f} ms of "
        f"the harness's CPU (target <= 1 ms); load average {os.getloadavg()[0]:.2f}"
    )
    write_result(
        "isolation",
        {
            "machine": start,
            "items": args.items,
            "tiers": TIERS,
            "strategies": STRATEGIES,
            "workers": args.workers,
            **figures,
            "wall_overhead_per_cell_ms": round(wall, 3),
            "harness_cpu_overhead_per_cell_ms": round(cpu, 3),
            "worker_start": starts,
            "load_average_end": round(os.getloadavg()[0], 2),
            "target": "isolation overhead per cell <= 1 ms",
            "met": wall <= 1.0,
        },
    )


if __name__ == "__main__":
    main()
