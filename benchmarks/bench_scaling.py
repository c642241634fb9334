"""Scaling: the Ray executor against threads, and peak RSS of the streamed loader.

1. Throughput against a loopback server that answers after ``--delay`` seconds (a model's
   latency without its CPU): synthetic-memory, truncation and recency, one tier, ``-j 4``;
   the thread executor, then the Ray executor on a local cluster of ``--cpus`` CPUs, run twice
   on the same cluster (cold: worker processes start and import the harness; warm: reused),
   with one unit per CPU and with ``--ray-unit-cpus 0.25`` (four waiting units per CPU).
   The cluster's start-up (``ray.init``) is timed on its own.
2. With ``--rag-items N``: the per-item CPU-heavy case, rag on N LongMemEval_S questions (one
   tier, an instant server), threads (``-j 2``) against Ray on the same 2 CPUs: embedding a
   115K-token history is seconds to minutes of CPU per item, in the strategy.
3. Peak RSS of ``budgetbench run`` (thread executor, a child process) over 50 and 500
   synthetic-memory items of ~100K tokens each (``history_tokens=100000``), truncation at one
   tier: flat when items are streamed. The figures of the runner that loaded every item up
   front (commit dd57f5c, same command) are quoted for comparison.

    .venv/bin/python benchmarks/bench_scaling.py [--delay 0.2] [--cpus 2] [--items 50 500]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _common import LONGMEMEVAL_S, FakeOpenAI, machine, require_data, write_result

from budgetbench_core import RunConfig, iter_events, run

BUDGETBENCH = Path(sys.executable).with_name("budgetbench")
# Measured with the same command on the runner that held every item (commit dd57f5c), this machine.
LOADED_UP_FRONT = {50: {"peak_rss_mb": 407.4, "wall_s": 23.1}, 500: {"peak_rss_mb": 1216.4, "wall_s": 162.8}}


def throughput(server: FakeOpenAI, out: Path, items: int, executor: str, **options) -> dict:
    server.reset()
    config = RunConfig(
        task="synthetic-memory",
        strategies=["truncation", "recency"],
        budgets=[2048],
        out=out,
        model="openai/bench",
        api_base=server.api_base,
        tokenizer="tiktoken:cl100k_base",
        max_concurrency=4,
        task_options={"items": items, "history_tokens": 1500},
        executor=executor,
        executor_options=options,
    )
    started = time.perf_counter()
    summary = run(config)
    wall = time.perf_counter() - started
    cells = sum(1 for e in iter_events(out) if e["event"] == "result")
    assert cells == 2 * items, (cells, summary)
    stats = server.stats()
    return {
        "executor": executor,
        "options": options,
        "cells": cells,
        "wall_s": round(wall, 2),
        "cells_per_s": round(cells / wall, 2),
        "max_inflight": stats["max_inflight"],
        "requests": stats["requests"],
    }


def rag(server: FakeOpenAI, out: Path, items: int, executor: str) -> dict:
    config = RunConfig(
        task="longmemeval",
        task_options={"path": str(LONGMEMEVAL_S), "split": "s"},
        grader="longmemeval-match",
        strategies=["rag"],
        budgets=[4096],
        out=out,
        model="openai/bench",
        api_base=server.api_base,
        tokenizer="tiktoken:cl100k_base",
        limit=items,
        max_concurrency=2,
        executor=executor,
        item_timeout_s=3600.0,
    )
    started = time.perf_counter()
    summary = run(config)
    wall = time.perf_counter() - started
    assert summary.results + summary.violations == items, summary
    return {"executor": executor, "items": items, "wall_s": round(wall, 1), "s_per_item": round(wall / items, 1)}


def peak_rss(server: FakeOpenAI, items: int) -> dict:
    """One ``budgetbench run`` in a child process; its peak RSS from the kernel's accounting
    (``ru_maxrss`` of the only child of a small wrapper process, so neither the server nor a
    Ray worker of this process can be mistaken for it)."""
    with tempfile.TemporaryDirectory() as out:
        command = [
            str(BUDGETBENCH),
            "run",
            "-t",
            "synthetic-memory",
            "-s",
            "truncation",
            "-b",
            "2048",
            "-m",
            "openai/bench",
            "--api-base",
            server.api_base,
            "--tokenizer",
            "tiktoken:cl100k_base",
            "-j",
            "2",
            "--task-option",
            f"items={items}",
            "--task-option",
            "history_tokens=100000",
            "-o",
            out,
            "--no-report",
            "--no-preflight",
            "--display",
            "none",
        ]
        wrapper = (
            "import resource, subprocess, sys; code = subprocess.run(sys.argv[1:]).returncode; "
            "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss); sys.exit(code)"
        )
        started = time.perf_counter()
        process = subprocess.run([sys.executable, "-c", wrapper, *command], capture_output=True, text=True)
        wall = time.perf_counter() - started
        assert process.returncode == 0, process.stderr[-2000:]
        results = sum(1 for e in iter_events(Path(out)) if e["event"] in ("result", "violation"))
    return {
        "items": items,
        "history_tokens": 100000,
        "cells": results,
        "wall_s": round(wall, 1),
        "peak_rss_mb": round(int(process.stdout.split()[-1]) / 1024, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--delay", type=float, default=0.2)
    parser.add_argument("--cpus", type=int, default=2)
    parser.add_argument("--cells-items", type=int, default=40, help="items of the throughput runs (2 cells each)")
    parser.add_argument("--items", type=int, nargs="*", default=[50, 500], help="item counts of the RSS runs")
    parser.add_argument("--rag-items", type=int, default=0, help="LongMemEval_S questions of the rag case (0: skip)")
    parser.add_argument("--skip-throughput", action="store_true")
    parser.add_argument("--out", default="scaling", help="results/<out>.json")
    args = parser.parse_args()
    started = machine()
    import ray

    results: dict = {"delay_s": args.delay, "cpus": args.cpus}
    if args.rag_items:
        require_data()
        with tempfile.TemporaryDirectory() as tmp, FakeOpenAI() as server:
            rows = [rag(server, Path(tmp) / "threads", args.rag_items, "thread")]
            ray.init(num_cpus=args.cpus, include_dashboard=False, log_to_driver=False, _node_ip_address="127.0.0.1")
            try:
                rows.append(rag(server, Path(tmp) / "ray", args.rag_items, "ray"))
            finally:
                ray.shutdown()
        results["rag_longmemeval_s"] = rows
        for row in rows:
            print(
                f"rag, {row['items']} LongMemEval_S questions, {row['executor']}: {row['wall_s']} s "
                f"({row['s_per_item']} s per item)"
            )
    if not args.skip_throughput:
        with tempfile.TemporaryDirectory() as tmp, FakeOpenAI(delay_s=args.delay) as server:
            root = Path(tmp)
            runs = [throughput(server, root / "threads", args.cells_items, "thread")]
            clock = time.perf_counter()
            ray.init(num_cpus=args.cpus, include_dashboard=False, log_to_driver=False, _node_ip_address="127.0.0.1")
            results["ray_init_s"] = round(time.perf_counter() - clock, 2)
            try:
                for label, options in (("cold", {}), ("warm", {}), ("warm", {"unit_cpus": 0.25})):
                    row = throughput(server, root / f"ray-{len(runs)}", args.cells_items, "ray", **options)
                    runs.append({**row, "workers": label})
            finally:
                ray.shutdown()
            results["throughput"] = runs
            for row in runs:
                print(
                    f"{row['executor']:6} {row.get('workers', ''):4} {row['options']}: {row['cells']} cells in "
                    f"{row['wall_s']} s = {row['cells_per_s']} cells/s, max in flight {row['max_inflight']}"
                )
            print(f"ray.init (local cluster of {args.cpus} CPUs): {results['ray_init_s']} s")
    rss = []
    for items in args.items:
        with FakeOpenAI() as server:
            row = peak_rss(server, items)
        row["loaded_up_front"] = LOADED_UP_FRONT.get(items)
        rss.append(row)
        print(
            f"{items} items of ~100K tokens: peak RSS {row['peak_rss_mb']} MB, {row['wall_s']} s "
            f"(all items up front: {row['loaded_up_front']})"
        )
    results["rss"] = rss
    write_result(args.out, {"machine_start": started, **results})


if __name__ == "__main__":
    main()
