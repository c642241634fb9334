"""The embedded demo: the harness's share of wall time, then resuming the finished run.

Runs the demo's configuration (synthetic-memory, truncation + recency + checkpoint, tiers
512 1024 2048 unless --budgets says otherwise, 3000-token histories) on the embedded model (``--model local``,
SmolLM2-135M on llama.cpp, exact ``server`` tokenizer) at concurrency 1, so every
second is either the model's (``latency_s`` of each call) or the harness's. Then runs
the same command on the finished directory: it must make no model call and take a
small fraction of the original wall time.

    .venv/bin/python benchmarks/bench_embedded.py [--items 4] [--budgets "512 1024 2048"]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from _common import machine, write_result

from budgetbench_core import RunConfig, run
from budgetbench_core.runlog import final_rows, iter_events


def config(out: Path, items: int, budgets: list[int]) -> RunConfig:
    return RunConfig(
        task="synthetic-memory",
        strategies=["truncation", "recency", "checkpoint"],
        budgets=budgets,
        out=out,
        model="local",
        limit=items,
        max_concurrency=1,
        timeout_s=900,
        task_options={"items": items, "history_tokens": 3000},
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--items", type=int, default=4)
    parser.add_argument(
        "--budgets",
        default="512 1024 2048",
        help="smaller tiers give an upper bound on the harness share (less model time per call)",
    )
    args = parser.parse_args()
    budgets = [int(b) for b in args.budgets.split()]
    start = machine()
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "demo"
        marks: dict[str, float] = {}
        finished: list[float] = []
        began = time.perf_counter()
        summary = run(
            config(out, args.items, budgets),
            on_start=lambda total, per, final=False: marks.setdefault("cells", time.perf_counter()),
            progress=lambda name, n: finished.append(time.perf_counter()),
        )
        wall = time.perf_counter() - began
        events = list(iter_events(out))
        model_s = sum(e.get("latency_s") or 0.0 for e in events if e["event"] in ("result", "aux_call"))
        cells_s = finished[-1] - marks["cells"]
        share = {
            "wall_s": round(wall, 2),
            "setup_s": round(marks["cells"] - began, 2),
            "cells_s": round(cells_s, 2),
            "model_s": round(model_s, 2),
            "harness_s": round(cells_s - model_s, 2),
            "harness_share_of_cells": round((cells_s - model_s) / cells_s, 4),
            "harness_share_of_wall": round((wall - model_s) / wall, 4),
            "cells": summary.cells_total,
            "results": summary.results,
            "violations": summary.violations,
            "errors": summary.errors,
            "model_calls": summary.model_calls,
        }
        print(
            f"demo: {summary.cells_total} cells in {wall:.1f} s ({marks['cells'] - began:.1f} s setup), model "
            f"{model_s:.1f} s, harness {share['harness_s']:.2f} s = {share['harness_share_of_cells']:.1%} of the "
            f"cell phase (target < 3%)"
        )
        rows_before = {k: (r["event"], r.get("prediction")) for k, r in final_rows(out).items()}
        began = time.perf_counter()
        again = run(config(out, args.items, budgets))
        resume_s = time.perf_counter() - began
        unchanged = {k: (r["event"], r.get("prediction")) for k, r in final_rows(out).items()} == rows_before
        resume = {
            "wall_s": round(resume_s, 3),
            "model_calls": again.model_calls,
            "cells_skipped": again.cells_skipped,
            "rows_unchanged": unchanged,
            "ratio_to_original": round(resume_s / wall, 4),
        }
        print(
            f"resume: {again.model_calls} model calls, {resume_s:.2f} s = {resume['ratio_to_original']:.1%} of the "
            f"original (target: 0 calls, < 2%)"
        )
    write_result(
        "embedded",
        {
            "machine": start,
            "items": args.items,
            "budgets": budgets,
            "demo": share,
            "resume": resume,
            "targets": {
                "harness_share_of_cells": "< 0.03",
                "resume": "0 model calls and < 2% of the original wall time",
            },
            "met": {
                "harness_share": share["harness_share_of_cells"] < 0.03,
                "resume": resume["model_calls"] == 0 and resume["ratio_to_original"] < 0.02,
            },
        },
    )


if __name__ == "__main__":
    main()
