"""CPU per model call on each client path, alone and at 128 calls in flight.

Drives ``ModelCaller.call`` (the path every cell's call takes: cache lookup and write,
fail fast, the connection slot, the deadline, the backend) from plain threads, without
the rest of the cell (strategy, counting, logging), against the loopback FakeOpenAI
server in a child process. Two client paths of the litellm backend for an ``openai/``
model on loopback: ``direct`` (aiohttp on the shared event loop) and ``litellm``
(``BUDGETBENCH_HTTP_CLIENT=litellm``: litellm's client on a thread per call).

- ``serial``: one call at a time to an instant server: process CPU per call.
- ``concurrent``: ``--inflight`` threads each making calls to a server that answers after
  ``--delay`` s: process CPU per call, the event loop's thread's share, and the share
  of ideal throughput (inflight / delay calls per second).

Every prompt is distinct (no cache hit). The figures bound the model-call path's part
of a cell's CPU; bench_concurrency measures whole cells.

    .venv/bin/python benchmarks/bench_model_calls.py [--calls 200] [--inflight 128] [--waves 6]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import threading
import time
from pathlib import Path

from _common import FakeOpenAI, machine, median, write_result

from budgetbench_core import GenerationParams, Message
from budgetbench_core.builtin.litellm_backend import LiteLLMBackend
from budgetbench_core.cache import ResponseCache
from budgetbench_core.event_loop import shared_loop
from budgetbench_core.failfast import FailFast
from budgetbench_core.gate import chat_json
from budgetbench_core.model_calls import ModelCaller
from budgetbench_core.sandbox import Deadline

PARAMS = GenerationParams(32, 0.0, 0)
FILLER = " ".join(f"word{i}" for i in range(300))  # ~400 tokens, the short-history cells' size


def prompt(n: int) -> tuple[list[Message], str]:
    """The messages and their chat JSON (the runner hands ``Gated.chat_json`` to the call)."""
    messages = [
        Message("system", "You are a helpful assistant."),
        Message("user", f"Session {n}: {FILLER}"),
        Message("user", f"Question {n}: what was the first word?"),
    ]
    return messages, chat_json(messages)


def send(model: ModelCaller, sent: tuple[list[Message], str], deadline: Deadline | None = None) -> None:
    model.call(sent[0], PARAMS, deadline, chat_json=sent[1])


def thread_cpu(thread: threading.Thread) -> float:
    assert thread.ident is not None
    return time.clock_gettime(time.pthread_getcpuclockid(thread.ident))


def caller(server: FakeOpenAI, directory: Path, connections: int) -> ModelCaller:
    backend = LiteLLMBackend("openai/bench", api_base=server.api_base, timeout_s=30.0)
    backend.start()
    return ModelCaller(
        backend,
        ResponseCache(directory / "cache.sqlite", os.urandom(32)),
        connections,
        timeout_s=30.0,
        fail_fast=FailFast(),
    )


def serial(server: FakeOpenAI, directory: Path, calls: int, base: int) -> dict:
    model = caller(server, directory, 1)
    for n in range(5):  # warm: imports, the session, the first connection, fail fast's probe
        send(model, prompt(base - 1 - n))
    prompts = [prompt(base + n) for n in range(calls)]
    loop_thread = shared_loop().thread
    cpu, loop0 = time.process_time(), thread_cpu(loop_thread)
    wall = time.perf_counter()
    for sent in prompts:
        send(model, sent)
    wall = time.perf_counter() - wall
    return {
        "calls": calls,
        "cpu_ms_per_call": round((time.process_time() - cpu) / calls * 1e3, 3),
        "event_loop_cpu_ms_per_call": round((thread_cpu(loop_thread) - loop0) / calls * 1e3, 3),
        "wall_ms_per_call": round(wall / calls * 1e3, 3),
    }


def concurrent(server: FakeOpenAI, directory: Path, inflight: int, waves: int, delay: float, base: int) -> dict:
    model = caller(server, directory, inflight)
    send(model, prompt(base - 1))  # fail fast's probe goes alone
    prompts = [prompt(base + n) for n in range(inflight * waves)]
    loop_thread = shared_loop().thread
    barrier = threading.Barrier(inflight + 1)
    failures: list[str] = []

    def work(worker: int) -> None:
        barrier.wait()
        for wave in range(waves):
            try:
                send(model, prompts[wave * inflight + worker], Deadline.within(60.0, None))
            except Exception as exc:  # noqa: BLE001 - counted and reported
                failures.append(f"{type(exc).__name__}: {exc}")

    threads = [threading.Thread(target=work, args=(w,), name=f"caller-{w}") for w in range(inflight)]
    for thread in threads:
        thread.start()
    barrier.wait()
    cpu, loop0, wall = time.process_time(), thread_cpu(loop_thread), time.perf_counter()
    for thread in threads:
        thread.join()
    wall = time.perf_counter() - wall
    calls = inflight * waves
    ideal = inflight / delay
    return {
        "inflight": inflight,
        "calls": calls,
        "failures": len(failures),
        "first_failure": failures[0] if failures else None,
        "calls_per_s": round(calls / wall, 1),
        "share_of_ideal": round(calls / wall / ideal, 3),
        "cpu_ms_per_call": round((time.process_time() - cpu) / calls * 1e3, 3),
        "event_loop_cpu_ms_per_call": round((thread_cpu(loop_thread) - loop0) / calls * 1e3, 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=200, help="serial calls per path and repeat")
    parser.add_argument("--inflight", type=int, default=128)
    parser.add_argument("--waves", type=int, default=6, help="calls per thread in the concurrent phase")
    parser.add_argument("--delay", type=float, default=0.2)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--paths", default="direct,litellm")
    args = parser.parse_args()
    start = machine()
    results: dict[str, dict[str, list[dict]]] = {}
    base = 1_000_000
    with tempfile.TemporaryDirectory() as tmp, FakeOpenAI() as instant, FakeOpenAI(delay_s=args.delay) as slow:
        for repeat in range(args.repeats):
            for path in args.paths.split(","):
                if path == "litellm":
                    os.environ["BUDGETBENCH_HTTP_CLIENT"] = "litellm"
                else:
                    os.environ.pop("BUDGETBENCH_HTTP_CLIENT", None)
                directory = Path(tmp) / f"{path}-{repeat}"
                directory.mkdir()
                one = serial(instant, directory / "serial", args.calls, base)
                base += 10 * args.calls
                many = concurrent(slow, directory / "concurrent", args.inflight, args.waves, args.delay, base)
                base += 10 * args.inflight * args.waves
                results.setdefault(path, {"serial": [], "concurrent": []})
                results[path]["serial"].append(one)
                results[path]["concurrent"].append(many)
                print(f"repeat {repeat} {path:8s} serial {one}")
                print(f"repeat {repeat} {path:8s} {args.inflight} in flight {many}")
    summary = {
        path: {
            phase: {
                key: round(median(r[key] for r in rows), 3)
                for key in rows[0]
                if isinstance(rows[0][key], (int, float)) and key not in ("inflight", "calls", "failures")
            }
            for phase, rows in phases.items()
        }
        for path, phases in results.items()
    }
    print("median:", summary)
    write_result(
        "model_calls",
        {
            "machine": start,
            "delay_s": args.delay,
            "inflight": args.inflight,
            "median": summary,
            "runs": results,
        },
    )


if __name__ == "__main__":
    main()
