"""Embedded llama.cpp server: thread and OpenMP settings, idle and under a competing load.

For each setting (generation threads, prompt/batch threads, ``OMP_WAIT_POLICY``) a child
process starts the embedded server (``LocalBackend``, SmolLM2-135M) with that setting, sends
a short warm-up, then a fixed ~300-token prompt with the prompt cache off, generating a fixed
number of tokens (``ignore_eos``), ``--repeats`` times. llama.cpp's own ``timings`` give
prompt and generation tokens per second; they come with every streamed token
(``timings_per_token``), so a setting that collapses is cut off at ``--request-seconds`` and
still reports its rate over the tokens it made (or an upper bound when it made fewer than
two). Each setting runs with 0 and 1 (``--loads``) competing busy loops (processes spinning
on a core, as a test suite or another model server would), in a child process of its own,
because the OpenMP runtime reads its environment once, when xllamacpp is imported.

The default settings cross generation/prompt threads (CPU count for both, as llama.cpp
does; 1/1; 1 for generation and CPU count for prompts, the chosen one) with
``OMP_WAIT_POLICY`` PASSIVE or llama.cpp's default (spinning). Every cell is bounded
(``--cell-seconds`` after the server is up), so the default run takes about 2-3 minutes on
an idle 2-core machine and at most ~8.

    .venv/bin/python benchmarks/bench_embedded_settings.py [--repeats 3] [--loads "0 1"]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

from _common import machine, median, write_result

CPUS = max(1, os.cpu_count() or 1)
SETTINGS = {
    f"threads {CPUS}/{CPUS}, default (llama.cpp)": {"threads": CPUS, "batch_threads": CPUS, "env": {}},
    f"threads {CPUS}/{CPUS}, PASSIVE (chosen before)": {
        "threads": CPUS,
        "batch_threads": CPUS,
        "env": {"OMP_WAIT_POLICY": "PASSIVE"},
    },
    "threads 1/1, default": {"threads": 1, "batch_threads": 1, "env": {}},
    "threads 1/1, PASSIVE": {"threads": 1, "batch_threads": 1, "env": {"OMP_WAIT_POLICY": "PASSIVE"}},
    f"threads 1/{CPUS}, default": {"threads": 1, "batch_threads": CPUS, "env": {}},
    f"threads 1/{CPUS}, PASSIVE (chosen)": {"threads": 1, "batch_threads": CPUS, "env": {"OMP_WAIT_POLICY": "PASSIVE"}},
    # not run by default: --settings names it
    f"threads {CPUS}/{CPUS}, GOMP_SPINCOUNT=10000": {
        "threads": CPUS,
        "batch_threads": CPUS,
        "env": {"GOMP_SPINCOUNT": "10000"},
    },
}
DEFAULT_SETTINGS = list(SETTINGS)[:6]
PROMPT = (
    "Summarise this note about the garden. The tomatoes were planted in April next to the basil, "
    "and the beans went along the fence. "
) * 10
START_ALLOWANCE_S = 60  # the child's imports and the server's start, on top of its cell budget


def stream(url: str, content: str, generate: int, cap_s: float) -> dict:
    """One request, streamed; stops reading at ``cap_s`` (closing the connection cancels it)."""
    import httpx

    began = time.perf_counter()
    timings, first_token_s, capped = None, None, False
    body = {
        "messages": [{"role": "user", "content": content}],
        "max_tokens": generate,
        "temperature": 0,
        "cache_prompt": False,
        "ignore_eos": True,
        "stream": True,
        "timings_per_token": True,
    }
    try:
        with httpx.stream("POST", url, json=body, timeout=httpx.Timeout(cap_s, connect=10)) as reply:
            reply.raise_for_status()
            for line in reply.iter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[6:])
                if "timings" in chunk:
                    timings = chunk["timings"]
                    first_token_s = first_token_s or time.perf_counter() - began
                if time.perf_counter() - began > cap_s:
                    capped = True
                    break
    except httpx.ReadTimeout:
        capped = True
    wall = time.perf_counter() - began
    run: dict = {"wall_s": round(wall, 2), "capped": capped, "prompt_tokens": None, "generated": 0}
    run["prompt_tok_s"] = run["generation_tok_s"] = run["generation_below_tok_s"] = None
    if timings is None:  # the prompt did not finish within the cap
        return run
    run.update(prompt_tokens=timings["prompt_n"], prompt_tok_s=timings["prompt_per_second"])
    run["generated"] = timings["predicted_n"]
    if timings["predicted_n"] >= 2:
        run["generation_tok_s"] = timings["predicted_per_second"]
    else:  # fewer than two tokens since the prompt finished: only a bound
        run["generation_below_tok_s"] = 2 / max(1e-3, wall - first_token_s)
    return run


def child(threads: int, batch_threads: int, repeats: int, generate: int, cell_s: float, request_s: float) -> None:
    """Runs in the child: start the server with the setting, measure, print one JSON line."""
    from budgetbench_core.builtin.local_backend import LocalBackend

    backend = LocalBackend(threads=threads, batch_threads=batch_threads, omp_wait_policy=None)
    started = time.perf_counter()
    backend.start()
    start_s = time.perf_counter() - started
    url = backend.server_url + "/v1/chat/completions"
    deadline = time.monotonic() + cell_s
    warmup = stream(url, "[warm-up] " + PROMPT, 4, min(request_s, cell_s) / 2)
    runs = []
    for index in range(1, repeats + 1):
        remaining = deadline - time.monotonic()
        if runs and (remaining <= 1 or runs[-1]["capped"]):
            break  # the first measured request always runs; a capped one is not repeated
        runs.append(stream(url, f"[{index}] {PROMPT}", generate, min(request_s, remaining) if runs else request_s))
    print(json.dumps({"start_s": start_s, "warmup": warmup, "runs": runs, "describe": backend.describe()}))
    backend.stop()


def busy_loops(count: int) -> list[subprocess.Popen]:
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(count)]


def summarise(runs: list[dict]) -> dict:
    """Medians over the requests that measured a rate; bounds where none did."""
    prompt = [r["prompt_tok_s"] for r in runs if r["prompt_tok_s"] is not None]
    generation = [r["generation_tok_s"] for r in runs if r["generation_tok_s"] is not None]
    below = [r["generation_below_tok_s"] for r in runs if r["generation_below_tok_s"] is not None]
    return {
        "prompt_tok_s": round(median(prompt), 1) if prompt else None,
        "generation_tok_s": round(median(generation), 2) if generation else None,
        "generation_below_tok_s": round(max(below), 2) if below and not generation else None,
        "capped": any(r["capped"] for r in runs),
    }


def figure(cell: dict) -> str:
    if "error" in cell:
        return "error"
    if cell["generation_tok_s"] is not None:
        generation = f"{cell['generation_tok_s']:.2f}"
    elif cell["generation_below_tok_s"] is not None:
        generation = f"< {cell['generation_below_tok_s']:.2f}"
    else:
        return f"prompt unfinished after {max(r['wall_s'] for r in cell['runs'])} s (cut off)"
    prompt = f"{cell['prompt_tok_s']:.0f}" if cell["prompt_tok_s"] is not None else "-"
    return f"{generation} gen, {prompt} prompt{' (cut off)' if cell['capped'] else ''}"


def table(names: list[str], loads: list[int], cells: list[dict]) -> str:
    """Markdown: one row per setting, one column per load, generation and prompt tokens/s."""
    by = {(c["setting"], c["busy_loops"]): c for c in cells}
    head = "| setting (generation/prompt threads) | " + " | ".join(
        "idle (0 busy loops)" if n == 0 else f"{n} busy loop{'s' if n > 1 else ''}" for n in loads
    )
    lines = [head + " |", "|---" * (len(loads) + 1) + "|"]
    for name in names:
        lines.append(f"| {name} | " + " | ".join(figure(by[(name, n)]) for n in loads) + " |")
    spread = [c["load_average_before"] for c in cells] + [c["load_average_after"] for c in cells]
    lines.append(f"\ntokens/s (llama.cpp timings, median of the requests); load average {min(spread)}-{max(spread)}")
    return "\n".join(lines)


def main() -> None:
    if sys.argv[1:2] == ["child"]:
        child(*map(int, sys.argv[2:6]), float(sys.argv[6]), float(sys.argv[7]))
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3, help="measured requests per cell, after a warm-up")
    parser.add_argument("--generate", type=int, default=32, help="tokens generated per request")
    parser.add_argument("--loads", default="0 1", help="numbers of competing busy loops")
    parser.add_argument("--settings", default=";".join(DEFAULT_SETTINGS), help="names from SETTINGS, separated by ;")
    parser.add_argument("--request-seconds", type=float, default=20.0, help="a request is cut off after this")
    parser.add_argument("--cell-seconds", type=float, default=30.0, help="per setting and load, once the server is up")
    parser.add_argument("--name", default="embedded_settings", help="result file: benchmarks/results/<name>.json")
    args = parser.parse_args()
    names = [n.strip() for n in args.settings.split(";") if n.strip()]
    unknown = [n for n in names if n not in SETTINGS]
    if unknown:
        parser.error(f"unknown setting(s) {unknown}; choose from: {'; '.join(SETTINGS)}")
    loads = [int(x) for x in args.loads.split()]
    if not names or not loads:
        parser.error("--settings and --loads need at least one entry each")
    child_timeout = START_ALLOWANCE_S + args.cell_seconds + args.request_seconds  # killed after this
    print(
        f"{len(names) * len(loads)} cells; each is cut off {args.cell_seconds:.0f} s after its server is up "
        f"(about {len(names) * len(loads) * (args.cell_seconds + 10) / 60:.0f} min at most in all)",
        flush=True,
    )
    start = machine()
    cells = []
    for load in loads:
        for name in names:
            setting = SETTINGS[name]
            # llama.cpp's defaults are OpenMP's: no OpenMP variable of ours or the caller's reaches the child
            env = {k: v for k, v in os.environ.items() if not k.startswith(("OMP_", "GOMP_", "KMP_"))}
            env.update(setting["env"])
            loops = busy_loops(load)
            before = os.getloadavg()[0]
            began = time.perf_counter()
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
                        str(args.cell_seconds),
                        str(args.request_seconds),
                    ],
                    env=env,
                    capture_output=True,
                    text=True,
                    timeout=child_timeout,
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
                "cell_wall_s": round(time.perf_counter() - began, 1),
            }
            if out is None or out.returncode != 0 or not out.stdout.strip():
                cell["error"] = f"timed out after {child_timeout:.0f} s" if out is None else out.stderr[-500:]
            else:
                result = json.loads(out.stdout.strip().splitlines()[-1])
                cell.update(
                    runs=result["runs"],
                    warmup=result["warmup"],
                    start_s=round(result["start_s"], 2),
                    openmp=result["describe"]["openmp"],
                    **summarise(result["runs"]),
                )
            cells.append(cell)
            payload = {
                "machine": start,
                "prompt_chars": len(PROMPT),
                "generate": args.generate,
                "repeats": args.repeats,
                "request_seconds": args.request_seconds,
                "cell_seconds": args.cell_seconds,
                "complete": False,
                "cells": cells,
            }
            write_result(args.name, payload)
            print(
                f"busy loops {load}, {name:32}: {figure(cell)} (tokens/s; load {cell['load_average_before']} -> "
                f"{cell['load_average_after']}, {cell['cell_wall_s']} s)"
                f"{' ' + cell['error'][-200:] if 'error' in cell else ''}",
                flush=True,
            )
    payload["complete"] = True
    payload["table"] = table(names, loads, cells)
    write_result(args.name, payload)
    print(payload["table"])


if __name__ == "__main__":
    main()
