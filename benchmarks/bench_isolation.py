"""Plugin isolation: what running strategies in confined worker processes costs per cell.

The same prompts-only run (synthetic-memory, truncation and checkpoint at four tiers, counted
with tiktoken) is made with ``--isolation process`` and ``--isolation none``; the difference in
wall time, divided by the cells, is the isolation overhead per cell. Worker start-up (a Python
process importing the core and its plugin, once per thread and strategy) is reported apart,
because it is paid once per run, not per cell. CPU time of the harness's process is also shown.

    .venv/bin/python benchmarks/bench_isolation.py [--items 200] [--repeats 3]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

from _common import machine, median, write_result

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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--items", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    start = machine()
    figures: dict[str, dict[str, float]] = {}
    for isolation in ("none", "process"):
        small = [one_run(2, isolation, args.workers) for _ in range(args.repeats)]  # start-up, almost no cells
        large = [one_run(args.items, isolation, args.workers) for _ in range(args.repeats)]
        cells, small_cells = large[0][2], small[0][2]
        per_cell = (median([w for w, _, _ in large]) - median([w for w, _, _ in small])) / (cells - small_cells)
        figures[isolation] = {
            "cells": cells,
            "wall_s": round(median([w for w, _, _ in large]), 3),
            "harness_cpu_s": round(median([c for _, c, _ in large]), 3),
            "startup_s": round(median([w for w, _, _ in small]), 3),
            "per_cell_ms": round(per_cell * 1000, 3),
        }
        print(f"{isolation:>8}: {figures[isolation]}")
    overhead = figures["process"]["per_cell_ms"] - figures["none"]["per_cell_ms"]
    startup = figures["process"]["startup_s"] - figures["none"]["startup_s"]
    print(
        f"isolation overhead: {overhead:.3f} ms per cell (target <= 1 ms), worker start-up {startup:.2f} s per run "
        f"({args.workers} threads x {len(STRATEGIES)} strategies); load average {os.getloadavg()[0]:.2f}"
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
            "overhead_per_cell_ms": round(overhead, 3),
            "startup_overhead_s": round(startup, 3),
            "load_average_end": round(os.getloadavg()[0], 2),
            "target": "isolation overhead per cell <= 1 ms",
            "met": overhead <= 1.0,
        },
    )


if __name__ == "__main__":
    main()
