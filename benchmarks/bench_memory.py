"""Peak RSS over a LongMemEval_S run as items stream (default: all 56 questions, rag).

Drives the real runner on the LongMemEval task plugin's loader (falls back to the
benchmark's own item builder when the plugin is not installed) against an
instant-reply loopback server, five tiers, concurrency 1, and samples this process's
resident set size every 50 ms and after every finished item. Model weights (the
embedding model) are loaded by the first item, so growth is measured from there:
the least-squares slope of RSS over items, per 10 items.

    .venv/bin/python benchmarks/bench_memory.py [--strategy rag] [--items 56]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from _common import FakeOpenAI, RSSSampler, benchmark_registry, longmemeval_s_task, machine, require_data, write_result

from budgetbench_core import RunConfig, run

TIERS = [2048, 4096, 8192, 16384, 32768]
MB = 1024 * 1024


def slope(xs: list[float], ys: list[float]) -> float:
    mean_x, mean_y = sum(xs) / len(xs), sum(ys) / len(ys)
    return sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys)) / sum((x - mean_x) ** 2 for x in xs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--strategy", default="rag")
    parser.add_argument("--items", type=int, default=56)
    args = parser.parse_args()
    require_data()
    registry = benchmark_registry()
    task, options, grader = longmemeval_s_task(registry)
    start = machine()
    per_item: list[dict] = []
    cells = {"done": 0}
    with FakeOpenAI() as server, tempfile.TemporaryDirectory() as tmp, RSSSampler() as sampler:
        before = sampler.current()
        began = time.perf_counter()

        def progress(name: str, n: int) -> None:
            cells["done"] += n
            if cells["done"] % len(TIERS) == 0:
                per_item.append(
                    {
                        "item": cells["done"] // len(TIERS),
                        "rss_mb": sampler.current() / MB,
                        "peak_mb": sampler.peak / MB,
                        "t_s": time.perf_counter() - began,
                    }
                )

        config = RunConfig(
            task=task,
            task_options=options,
            grader=grader,
            strategies=[args.strategy],
            budgets=TIERS,
            out=Path(tmp) / "run",
            model="openai/bench",
            api_base=server.api_base,
            tokenizer="tiktoken:cl100k_base",
            limit=args.items,
            max_concurrency=1,
        )
        summary = run(config, registry, progress=progress)
    assert summary.errors == 0, f"{summary.errors} error rows"
    xs = [p["item"] for p in per_item[1:]]
    ys = [p["rss_mb"] for p in per_item[1:]]
    growth = slope(xs, ys) * 10 if len(xs) > 2 else None
    figures = {
        "strategy": args.strategy,
        "task": task,
        "items": len(per_item),
        "rss_before_mb": round(before / MB, 1),
        "rss_after_first_item_mb": round(per_item[0]["rss_mb"], 1),
        "peak_mb": round(sampler.peak / MB, 1),
        "rss_last_item_mb": round(per_item[-1]["rss_mb"], 1),
        "growth_mb_per_10_items": None if growth is None else round(growth, 2),
        "wall_s": round(per_item[-1]["t_s"], 1),
        "per_item": per_item,
    }
    print(
        f"{args.strategy} over {len(per_item)} items: RSS {figures['rss_before_mb']} MB before, "
        f"{figures['rss_after_first_item_mb']} MB after item 1 (items, encodings, any model loaded), "
        f"peak {figures['peak_mb']} MB, "
        f"growth {figures['growth_mb_per_10_items']} MB per 10 items"
    )
    write_result(f"memory_{args.strategy}", {"machine": start, "tiers": TIERS, **figures})


if __name__ == "__main__":
    main()
