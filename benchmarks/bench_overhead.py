"""Harness overhead per model call against an instant-reply server on loopback.

Drives the real runner (truncation, five tiers, LongMemEval_S histories of ~115K
tokens, tokenizer tiktoken:cl100k_base) at concurrency 1 against a server that replies
at once. The time between two finished cells, minus the server's own time for the
request, is what the harness spends per call: strategy, counting, validation, event
logging, grading and the HTTP client. Rows give the split (strategy_s, latency_s).

Strategies run in their worker processes (``--isolation process``, the default); with
``--isolation none`` in the harness's, for comparison (results in ``overhead-in-process.json``).

    .venv/bin/python benchmarks/bench_overhead.py [--items 8] [--repeats 3] [--isolation none]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

from _common import (
    BENCH_TASK,
    FakeOpenAI,
    benchmark_registry,
    chars_tokenised,
    machine,
    median,
    require_data,
    short_history_config,
    write_result,
)

from budgetbench_core import RunConfig, run
from budgetbench_core.runlog import iter_events

BUDGETS = [2048, 4096, 8192, 16384, 32768]


def one_run(server: FakeOpenAI, registry, out: Path, items: int, isolation: str = "process") -> dict:
    finished: list[float] = []
    cpu: list[float] = []
    server.reset()
    config = RunConfig(
        task=BENCH_TASK,
        strategies=["truncation"],
        budgets=BUDGETS,
        out=out,
        model="openai/bench",
        api_base=server.api_base,
        tokenizer="tiktoken:cl100k_base",
        limit=items,
        max_concurrency=1,
        isolation=isolation,
    )
    summary = run(
        config,
        registry,
        progress=lambda name, n: (finished.append(time.perf_counter()), cpu.append(time.process_time())),
    )
    stats = server.stats()
    rows = [e for e in iter_events(out) if e["event"] == "result"]
    assert len(rows) == items * len(BUDGETS), (len(rows), summary)
    intervals = [b - a for a, b in zip(finished, finished[1:])]
    per_cell = (finished[-1] - finished[0]) / (len(finished) - 1)
    server_per_call = stats["server_s"] / stats["requests"]
    strategy = sum(r["strategy_s"] for r in rows) / len(rows)
    client = sum(r["latency_s"] for r in rows) / len(rows)
    return {
        "cells": len(rows),
        "wall_s": summary.wall_s,
        "per_cell_ms": per_cell * 1e3,
        "median_interval_ms": median(intervals) * 1e3,
        "server_ms": server_per_call * 1e3,
        "overhead_ms": (per_cell - server_per_call) * 1e3,
        "harness_cpu_ms": (cpu[-1] - cpu[0]) / (len(cpu) - 1) * 1e3,
        "strategy_ms": strategy * 1e3,
        "http_client_ms": (client - server_per_call) * 1e3,
        "rest_ms": (per_cell - strategy - client) * 1e3,
        "prompt_tokens_mean": sum(r["prompt_tokens"] for r in rows) / len(rows),
    }


def tokenised_per_cell(server: FakeOpenAI, registry, out: Path, items: int, isolation: str) -> float:
    """Characters the harness's tokenizer tokenised per cell in one run (``chars_tokenised``)."""
    with chars_tokenised() as tokenised:
        cells = one_run(server, registry, out, items, isolation)["cells"]
    return tokenised[0] / cells


def short_histories(server: FakeOpenAI, registry, out: Path, cells: int) -> dict:
    """Harness CPU per call on short histories (synthetic-memory, 400 tokens, one tier), instant server."""
    marks: list[tuple[float, float]] = []
    config = short_history_config(server, out, cells, 1)
    summary = run(config, registry, progress=lambda name, n: marks.append((time.perf_counter(), time.process_time())))
    assert summary.results == cells, summary
    (w0, c0), (w1, c1) = marks[0], marks[-1]
    return {
        "cells": cells,
        "harness_cpu_ms": (c1 - c0) / (len(marks) - 1) * 1e3,
        "wall_ms_per_cell": (w1 - w0) / (len(marks) - 1) * 1e3,
    }


def transport_costs(server: FakeOpenAI, calls: int = 40) -> dict:
    """The backend's call against ``litellm.completion`` of the same request, interleaved.

    For a loopback OpenAI-compatible server the backend uses a pooled httpx client;
    this shows what that saves over litellm (cost lookup, logging, its own wrappers).
    """
    from budgetbench_core import GenerationParams, Message
    from budgetbench_core.builtin.litellm_backend import LiteLLMBackend, _litellm

    backend = LiteLLMBackend("openai/bench", api_base=server.api_base)
    litellm = _litellm()
    messages = [Message("user", "What did I say about my dog's name?")]
    senders = {
        "backend": lambda: backend.complete(messages, GenerationParams(32, 0.0, 0)),
        "litellm": lambda: litellm.completion(
            model="openai/bench",
            api_base=server.api_base,
            api_key="not-needed",
            messages=[m.to_chat() for m in messages],
            max_tokens=32,
            temperature=0.0,
            seed=0,
            num_retries=0,
        ),
    }
    wall = {name: [] for name in senders}
    cpu = {name: [] for name in senders}
    for send in senders.values():
        send()
    for _ in range(calls):
        for name, send in senders.items():
            w, c = time.perf_counter(), time.process_time()
            send()
            wall[name].append(time.perf_counter() - w)
            cpu[name].append(time.process_time() - c)
    return {
        f"{name}_{kind}_ms": round(median(values[name]) * 1e3, 2)
        for kind, values in (("wall", wall), ("cpu", cpu))
        for name in senders
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--items", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--isolation", choices=["process", "none"], default="process")
    args = parser.parse_args()
    require_data()
    registry = benchmark_registry()
    start = machine()
    runs = []
    with FakeOpenAI() as server, tempfile.TemporaryDirectory() as tmp:
        one_run(server, registry, Path(tmp) / "warmup", 1, args.isolation)  # imports litellm, loads tiktoken
        for repeat in range(args.repeats):
            result = one_run(server, registry, Path(tmp) / f"run{repeat}", args.items, args.isolation)
            runs.append(result)
            print(
                f"run {repeat}: {result['cells']} cells, {result['per_cell_ms']:.1f} ms per cell, server "
                f"{result['server_ms']:.2f} ms -> harness {result['overhead_ms']:.1f} ms per call "
                f"(CPU {result['harness_cpu_ms']:.1f} ms) "
                f"(strategy {result['strategy_ms']:.1f}, http client {result['http_client_ms']:.1f}, "
                f"counting+logging+grading {result['rest_ms']:.1f})"
            )
        tokenised = {
            mode: round(tokenised_per_cell(server, registry, Path(tmp) / f"chars-{mode}", args.items, mode))
            for mode in ("process", "none")
        }
        print("characters tokenised per cell (isolation process / none):", tokenised)
        short = [short_histories(server, registry, Path(tmp) / f"short{r}", 300) for r in range(args.repeats)]
        print("short histories:", short)
        transport = transport_costs(server)
        print("one small call (backend = pooled httpx), median:", transport)
    keys = ["overhead_ms", "harness_cpu_ms", "strategy_ms", "http_client_ms", "rest_ms", "server_ms", "per_cell_ms"]
    summary = {key: round(median(r[key] for r in runs), 2) for key in keys}
    print("median:", summary, "target: overhead_ms < 5")
    write_result(
        "overhead" if args.isolation == "process" else "overhead-in-process",
        {
            "machine": start,
            "load_average_end": [round(x, 2) for x in os.getloadavg()],  # the machine is shared: busy at the end too?
            "budgets": BUDGETS,
            "items": args.items,
            "isolation": args.isolation,
            "strategy": "truncation",
            "tokenizer": "tiktoken:cl100k_base",
            "median": summary,
            "target_ms": 5,
            "met": summary["overhead_ms"] < 5,
            "transport": transport,
            "chars_tokenised_per_cell": tokenised,
            "runs": runs,
            "short_histories": {
                "harness_cpu_ms": round(median(r["harness_cpu_ms"] for r in short), 2),
                "target_ms": 2,
                "runs": short,
            },
            "targets": {"long_cpu_ms": 5, "short_cpu_ms": 2},
        },
    )


if __name__ == "__main__":
    main()
