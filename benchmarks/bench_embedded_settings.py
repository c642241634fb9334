"""Embedded llama.cpp server: thread and OpenMP settings, idle and under a competing load.

For each setting (generation threads, prompt/batch threads, ``OMP_WAIT_POLICY``) a child
process starts the embedded server (``LocalBackend``, SmolLM2-135M) with that setting, sends
a fixed ~300-token prompt with the prompt cache off, and generates a fixed number of tokens
(``ignore_eos``). llama.cpp's own ``timings`` give prompt and generation tokens per second.
Each setting runs with 0, 1 and 2 competing busy loops (processes spinning on a core, as a
test suite or another model server would), in a child process of its own, because the
OpenMP runtime reads its environment once, when xllamacpp is imported.

    .venv/bin/python benchmarks/bench_embedded_settings.py [--repeats 3] [--loads "0 1 2"]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

from _common import machine, median, write_result

SETTINGS = {
    "threads 2/2 (before)": {"threads": 2, "batch_threads": 2, "env": {}},
    "threads 2/2, PASSIVE": {"threads": 2, "batch_threads": 2, "env": {"OMP_WAIT_POLICY": "PASSIVE"}},
    "threads 2/2, GOMP_SPINCOUNT=10000": {"threads": 2, "batch_threads": 2, "env": {"GOMP_SPINCOUNT": "10000"}},
    "threads 1/1": {"threads": 1, "batch_threads": 1, "env": {}},
    "threads 1/2": {"threads": 1, "batch_threads": 2, "env": {}},
    "threads 1/2, PASSIVE": {"threads": 1, "batch_threads": 2, "env": {"OMP_WAIT_POLICY": "PASSIVE"}},
}
PROMPT = (
    "Summarise this note about the garden. The tomatoes were planted in April next to the basil, "
    "and the beans went along the fence. "
) * 10


def child(threads: int, batch_threads: int, repeats: int, generate: int, timeout_s: float) -> None:
    """Runs in the child: start the server with the setting, measure, print one JSON line."""
    import httpx

    from budgetbench_core.builtin.local_backend import LocalBackend

    backend = LocalBackend(threads=threads, batch_threads=batch_threads, omp_wait_policy=None)
    started = time.perf_counter()
    backend.start()
    start_s = time.perf_counter() - started
    runs = []
    deadline = time.monotonic() + timeout_s
    for index in range(repeats + 1):  # the first is a warm-up
        if time.monotonic() > deadline and len(runs) >= 1:
            break
        began = time.perf_counter()
        reply = httpx.post(
            backend.server_url + "/v1/chat/completions",
            timeout=timeout_s,
            json={
                "messages": [{"role": "user", "content": f"[{index}] {PROMPT}"}],
                "max_tokens": generate,
                "temperature": 0,
                "cache_prompt": False,
                "ignore_eos": True,
            },
        ).json()
        timings = reply["timings"]
        if index:
            runs.append(
                {
                    "prompt_tokens": timings["prompt_n"],
                    "prompt_tok_s": timings["prompt_per_second"],
                    "generated": timings["predicted_n"],
                    "generation_tok_s": timings["predicted_per_second"],
                    "wall_s": time.perf_counter() - began,
                }
            )
    print(json.dumps({"start_s": start_s, "runs": runs, "describe": backend.describe()}))
    backend.stop()


def busy_loops(count: int) -> list[subprocess.Popen]:
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(count)]


def main() -> None:
    if sys.argv[1:2] == ["child"]:
        child(*map(int, sys.argv[2:6]), float(sys.argv[6]))
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--generate", type=int, default=32)
    parser.add_argument("--loads", default="0 1 2", help="numbers of competing busy loops")
    parser.add_argument("--settings", default=";".join(SETTINGS), help="names from SETTINGS, separated by ;")
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds per setting and load")
    parser.add_argument("--name", default="embedded_settings", help="result file: benchmarks/results/<name>.json")
    args = parser.parse_args()
    start = machine()
    names = [n.strip() for n in args.settings.split(";") if n.strip()]
    cells = []
    for load in (int(x) for x in args.loads.split()):
        for name in names:
            setting = SETTINGS[name]
            env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
            env.update(setting["env"])
            loops = busy_loops(load)
            before = os.getloadavg()[0]
            try:
                out = subprocess.run(
                    [
                        sys.executable,
                        __file__,
                        "child",
                        str(setting["threads"]),
                        str(setting["batch_threads"]),
                        str(args.repeats),
                        str(args.generate),
                        str(args.timeout),
                    ],
                    env=env,
                    capture_output=True,
                    text=True,
                    timeout=args.timeout * 2,
                )
            except subprocess.TimeoutExpired:
                out = None
            finally:
                for loop in loops:
                    loop.kill()
                    loop.wait()
            cell = {
                "setting": name,
                **setting,
                "busy_loops": load,
                "load_average_before": round(before, 2),
                "load_average_after": round(os.getloadavg()[0], 2),
            }
            if out is None or out.returncode != 0 or not out.stdout.strip():
                cell["error"] = "timed out" if out is None else out.stderr[-500:]
            else:
                result = json.loads(out.stdout.strip().splitlines()[-1])
                runs = result["runs"]
                cell.update(
                    {
                        "runs": runs,
                        "start_s": round(result["start_s"], 2),
                        "openmp": result["describe"]["openmp"],
                        "prompt_tok_s": round(median(r["prompt_tok_s"] for r in runs), 1),
                        "generation_tok_s": round(median(r["generation_tok_s"] for r in runs), 2),
                    }
                )
            cells.append(cell)
            write_result(
                args.name,
                {
                    "machine": start,
                    "prompt_chars": len(PROMPT),
                    "generate": args.generate,
                    "repeats": args.repeats,
                    "complete": False,
                    "cells": cells,
                },
            )
            print(
                f"busy loops {load}, {name:24}: prompt {cell.get('prompt_tok_s', '-')} tok/s, generation "
                f"{cell.get('generation_tok_s', '-')} tok/s (load {cell['load_average_before']} -> "
                f"{cell['load_average_after']}){' ' + cell['error'][:80] if 'error' in cell else ''}",
                flush=True,
            )
    write_result(
        args.name,
        {
            "machine": start,
            "prompt_chars": len(PROMPT),
            "generate": args.generate,
            "repeats": args.repeats,
            "complete": True,
            "cells": cells,
        },
    )


if __name__ == "__main__":
    main()
