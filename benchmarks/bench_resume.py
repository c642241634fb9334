"""Resume: re-running a finished run directory makes no model call and takes little time.

Runs truncation at five tiers over LongMemEval_S items (the LongMemEval task plugin when
installed) against a loopback server that answers after ``--delay`` seconds (default 1 s,
a fast model on a 2K-32K-token prompt), then runs the same configuration again on the
finished directory. The server counts the requests of the second run (must be 0); the
second run's wall time is compared with the first's, and split into loading the items
and reading the finished rows, the two costs that do not shrink with the original run.

    .venv/bin/python benchmarks/bench_resume.py [--items 8] [--delay 1.0]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from _common import FakeOpenAI, benchmark_registry, longmemeval_s_task, machine, require_data, write_result

from budgetbench_core import RunConfig, run
from budgetbench_core.runlog import final_rows

TIERS = [2048, 4096, 8192, 16384, 32768]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--items", type=int, default=8)
    parser.add_argument("--delay", type=float, default=1.0)
    args = parser.parse_args()
    require_data()
    registry = benchmark_registry()
    task, options, grader = longmemeval_s_task(registry)
    start = machine()
    with FakeOpenAI(delay_s=args.delay) as server, tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "run"
        config = RunConfig(
            task=task,
            task_options=options,
            grader=grader,
            strategies=["truncation"],
            budgets=TIERS,
            out=out,
            model="openai/bench",
            api_base=server.api_base,
            tokenizer="tiktoken:cl100k_base",
            limit=args.items,
            max_concurrency=4,
        )
        began = time.perf_counter()
        first = run(config, registry)
        original_s = time.perf_counter() - began
        server.reset()
        began = time.perf_counter()
        again = run(config, registry)
        resume_s = time.perf_counter() - began
        requests = server.stats()["requests"]
        began = time.perf_counter()
        list(registry.get("task", task).obj(**options).load(args.items, 0))
        load_s = time.perf_counter() - began
        began = time.perf_counter()
        rows = final_rows(out)
        rows_s = time.perf_counter() - began
        size = sum(p.stat().st_size for p in (out / "cells").rglob("*.jsonl"))
    figures = {
        "task": task,
        "items": args.items,
        "cells": first.cells_total,
        "delay_s": args.delay,
        "original_s": round(original_s, 2),
        "original_model_calls": first.model_calls,
        "resume_s": round(resume_s, 3),
        "resume_model_calls": again.model_calls,
        "resume_server_requests": requests,
        "cells_skipped": again.cells_skipped,
        "final_rows": len(rows),
        "ratio": round(resume_s / original_s, 4),
        "load_items_s": round(load_s, 3),
        "read_rows_s": round(rows_s, 3),
        "cells_bytes": size,
    }
    print(
        f"original: {first.cells_total} cells, {first.model_calls} calls, {original_s:.1f} s; resume: "
        f"{again.model_calls} calls ({requests} requests at the server), {resume_s:.2f} s = {figures['ratio']:.1%} "
        f"(loading items {load_s:.2f} s, reading {size / 1e6:.1f} MB of rows {rows_s:.2f} s); target 0 calls, < 2%"
    )
    write_result(
        "resume",
        {
            "machine": start,
            "tiers": TIERS,
            **figures,
            "target": "0 model calls and < 2% of the original wall time",
            "met": requests == 0 and again.model_calls == 0 and figures["ratio"] < 0.02,
        },
    )


if __name__ == "__main__":
    main()
