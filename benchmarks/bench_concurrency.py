"""Throughput at concurrency 1, 8, 32 and 128 against a server that answers after 200 ms.

Drives the real runner (synthetic-memory, truncation, one tier, tiktoken:cl100k_base)
with ``max_concurrency`` N, back to back with N = 1, and reports cells per second as a
ratio to N = 1. The server records how many requests it held at once, which shows the
connection limit is honoured. It also records the harness's CPU time per cell (process
time; the server is another process), which bounds throughput on a busy machine: at
200 ms per call, concurrency N needs N * 5 cells/s, i.e. N * 5 * cpu_ms / 1000 of a core.
A last phase answers the first requests with 429 and Retry-After, and checks every cell
still finishes, no sooner than Retry-After allows.

Two shares of ideal are reported. ``efficiency`` (the target's figure) is over the whole run,
from the run's start to the last cell: it includes fail fast's probe (the first call goes
alone, 200 ms in which nothing else is sent), so with 10 waves it cannot exceed ~0.91.
``steady_efficiency`` is labelled as such: from the first finished cell to the last, i.e.
after the probe. ``event_loop_cpu_ms_per_cell`` is the CPU time of the shared event loop's
thread (the HTTP client: aiohttp, the reply's JSON, the hand-back to the cell's thread),
part of ``harness_cpu_ms_per_cell``.

    .venv/bin/python benchmarks/bench_concurrency.py [--delay 0.2] [--repeats 3]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import threading
import time
from pathlib import Path

from _common import FakeOpenAI, machine, median, short_history_config, write_result

from budgetbench_core import run
from budgetbench_core.event_loop import shared_loop
from budgetbench_core.host.process_tree import cpu_ticks, descendants, read_small
from budgetbench_core.runlog import iter_events, read_manifest

LEVELS = [1, 8, 32, 128]
TARGETS = {32: 0.9, 128: 0.8}  # share of ideal throughput


def loop_cpu() -> float:
    """CPU seconds of the shared event loop's thread so far."""
    ident = shared_loop().thread.ident
    assert ident is not None
    return time.clock_gettime(time.pthread_getcpuclockid(ident))


def threads_cpu() -> dict[int, tuple[str, float]]:
    """CPU seconds of every live thread of this process, by thread id, with its name."""
    out = {}
    for thread in threading.enumerate():
        if thread.ident is None:
            continue
        try:
            out[thread.ident] = (thread.name, time.clock_gettime(time.pthread_getcpuclockid(thread.ident)))
        except OSError:  # the thread ended in the meantime
            pass
    return out


def tree_cpu() -> dict[int, tuple[str, float]]:
    """CPU seconds of every process under this one (the loopback server, the plugin workers and
    their guards), by pid, with what it is: its own seconds and those of children it reaped."""
    tick = os.sysconf("SC_CLK_TCK")
    out = {}
    for pid in descendants(os.getpid()):
        try:
            command = read_small(f"/proc/{pid}/cmdline")
        except OSError:
            continue  # ended meanwhile
        ticks = cpu_ticks(pid)
        if any(ticks):  # all zeros: ended meanwhile (or not yet scheduled, which costs nothing)
            out[pid] = ("server" if b"serve" in command else "plugin_workers", sum(ticks) / tick)
    return out


def machine_cpu(before: dict, after: dict, harness_ms: float, cells: int) -> dict:
    """CPU ms per cell of every process of the run (the harness's, the server's, the workers'),
    which two cores bound: at 200 ms per call, N in flight need N * 5 cells/s."""
    kinds = {"harness": harness_ms}
    for pid, (kind, seconds) in after.items():
        kinds[kind] = kinds.get(kind, 0.0) + (seconds - before.get(pid, (kind, 0.0))[1]) / cells * 1e3
    kinds["all"] = sum(kinds.values())
    return {kind: round(value, 3) for kind, value in kinds.items()}


def cpu_by_kind(before: dict[int, tuple[str, float]], after: dict[int, tuple[str, float]], cells: int) -> dict:
    """Where the harness's CPU per cell went, in ms: the event loop (HTTP client), the cells'
    threads (prompt, count, cache, log, grade), the sandbox's plugin threads (strategy, tokenizer)."""
    kinds: dict[str, float] = {}
    for ident, (name, seconds) in after.items():
        kind = (
            "event_loop"
            if name == "budgetbench-event-loop"
            else "plugin_threads"
            if name.startswith("plugin")
            else "cell_threads"
            if name.startswith("ThreadPoolExecutor")
            else "main_and_other"
        )
        kinds[kind] = kinds.get(kind, 0.0) + seconds - before.get(ident, (name, 0.0))[1]
    return {kind: round(value / cells * 1e3, 3) for kind, value in sorted(kinds.items())}


def throughput(server: FakeOpenAI, out: Path, concurrency: int, cells: int) -> dict:
    server.reset()
    snapshots: list[dict[int, tuple[str, float]]] = []
    trees: list[dict[int, tuple[str, float]]] = []

    def started(total: int, per: dict[str, int], final: bool = False) -> None:
        if "start" not in marks:
            marks.update(start=time.perf_counter(), cpu=time.process_time(), loop=loop_cpu())
            snapshots.append(threads_cpu())
            trees.append(tree_cpu())

    def finished_one() -> None:
        finished.append(time.perf_counter())
        cpu.append(time.process_time())
        if len(finished) == cells:  # the cells' threads are still alive: their CPU is readable
            snapshots.append(threads_cpu())
            trees.append(tree_cpu())

    marks: dict[str, float] = {}
    finished: list[float] = []
    config = short_history_config(server, out, cells, concurrency)
    cpu: list[float] = []
    summary = run(
        config,
        on_start=started,
        progress=lambda name, n: finished_one(),
    )
    stats = server.stats()
    results = sum(1 for e in iter_events(out) if e["event"] == "result")
    assert results == cells, (results, summary)
    seconds = finished[-1] - marks["start"]
    steady = finished[-1] - finished[0]
    return {
        "concurrency": concurrency,
        "cells": cells,
        "seconds": seconds,
        "cells_per_s": cells / seconds,
        "steady_cells_per_s": (cells - 1) / steady if steady > 0 else None,
        "max_inflight": stats["max_inflight"],
        "requests": stats["requests"],
        "harness_cpu_ms_per_cell": (cpu[-1] - marks["cpu"]) / cells * 1e3,
        "event_loop_cpu_ms_per_cell": (loop_cpu() - marks["loop"]) / cells * 1e3,
        "cpu_ms_per_cell_by_thread": cpu_by_kind(snapshots[0], snapshots[-1], cells),
        "machine_cpu_ms_per_cell": machine_cpu(trees[0], trees[-1], (cpu[-1] - marks["cpu"]) / cells * 1e3, cells),
        "plugin_workers_started": sum(read_manifest(out)["invocations"][-1]["plugin_workers"].values()),
    }


def rate_limited(server: FakeOpenAI, out: Path, concurrency: int, cells: int, retry_after: float) -> dict:
    started = time.perf_counter()
    config = short_history_config(server, out, cells, concurrency)
    summary = run(config)
    wall = time.perf_counter() - started
    rows = [e for e in iter_events(out) if e["event"] in ("result", "error")]
    stats = server.stats()
    return {
        "cells": cells,
        "concurrency": concurrency,
        "results": summary.results,
        "errors": summary.errors,
        "rows_retried": sum(1 for r in rows if (r.get("attempts") or 1) > 1),
        "server_429": stats["rate_limited"],
        "server_requests": stats["requests"],
        "max_inflight": stats["max_inflight"],
        "retry_after_s": retry_after,
        "wall_s": wall,
        "all_finished": summary.results == cells,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--delay", type=float, default=0.2)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--waves",
        type=int,
        default=10,
        help="cells per level = waves x N: the first call goes alone (fail-fast probe), a fixed cost",
    )
    args = parser.parse_args()
    start = machine()
    rounds: list[list[dict]] = []
    with FakeOpenAI(delay_s=args.delay) as server, tempfile.TemporaryDirectory() as tmp:
        throughput(server, Path(tmp) / "warmup", 4, 8)
        for repeat in range(args.repeats):
            measured = []
            for level in LEVELS:
                result = throughput(server, Path(tmp) / f"r{repeat}-c{level}", level, max(10, args.waves * level))
                measured.append(result)
            base, steady_base = measured[0]["cells_per_s"], measured[0]["steady_cells_per_s"]
            for result in measured:
                result["speedup"] = result["cells_per_s"] / base
                result["efficiency"] = result["speedup"] / result["concurrency"]
                result["steady_efficiency"] = result["steady_cells_per_s"] / steady_base / result["concurrency"]
                print(
                    f"repeat {repeat} concurrency {result['concurrency']:>3}: {result['cells_per_s']:6.1f} cells/s, "
                    f"x{result['speedup']:.1f} ({result['efficiency']:.2f} of ideal over the whole run, "
                    f"{result['steady_efficiency']:.2f} after the first success), "
                    f"server held at most {result['max_inflight']}, harness CPU "
                    f"{result['harness_cpu_ms_per_cell']:.2f} ms per cell "
                    f"(event loop {result['event_loop_cpu_ms_per_cell']:.2f})"
                )
            print("  CPU ms per cell by thread:", {r["concurrency"]: r["cpu_ms_per_cell_by_thread"] for r in measured})
            print("  CPU ms per cell by process:", {r["concurrency"]: r["machine_cpu_ms_per_cell"] for r in measured})
            rounds.append(measured)
    summary = {}
    for index, level in enumerate(LEVELS):
        summary[str(level)] = {
            key: round(median(r[index][key] for r in rounds), 3)
            for key in (
                "cells_per_s",
                "speedup",
                "efficiency",
                "steady_efficiency",
                "max_inflight",
                "harness_cpu_ms_per_cell",
                "event_loop_cpu_ms_per_cell",
            )
        }
        summary[str(level)]["machine_cpu_ms_per_cell"] = {
            kind: round(median(r[index]["machine_cpu_ms_per_cell"].get(kind, 0.0) for r in rounds), 3)
            for kind in rounds[0][index]["machine_cpu_ms_per_cell"]
        }
    for level in summary.values():
        level["max_inflight"] = int(level["max_inflight"])  # a count, not a median of two
    print("median:", summary, "targets (share of ideal):", TARGETS)
    retry_after = 0.5
    # Fewer 429s in a row than fail fast's limit (10), which would stop the run.
    with (
        FakeOpenAI(delay_s=args.delay, rate_limit_first=6, retry_after=retry_after) as server,
        tempfile.TemporaryDirectory() as tmp,
    ):
        limited = rate_limited(server, Path(tmp) / "429", 8, 24, retry_after)
    print("429 phase:", limited)
    write_result(
        "concurrency",
        {
            "machine": start,
            "delay_s": args.delay,
            "levels": LEVELS,
            "median": summary,
            "targets": {str(k): v for k, v in TARGETS.items()},
            "met": {str(level): summary[str(level)]["efficiency"] >= share for level, share in TARGETS.items()},
            "met_after_first_success": {
                str(level): summary[str(level)]["steady_efficiency"] >= share for level, share in TARGETS.items()
            },
            "connection_limit_honoured": all(
                r[i]["max_inflight"] <= LEVELS[i] for r in rounds for i in range(len(LEVELS))
            ),
            "rate_limit_phase": limited,
            "rounds": rounds,
        },
    )


if __name__ == "__main__":
    main()
