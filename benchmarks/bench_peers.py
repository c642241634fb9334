"""Side by side with peer harnesses: the same 200 single-call samples through each.

Every harness gets the same prompts (one user message each, 16 output tokens,
temperature 0), the same loopback OpenAI-compatible server answering after a fixed delay
(a child process, so it never takes the harnesses' CPU), and the same concurrency. Each
harness runs in a process of its own; it imports its libraries first, then times its own
evaluation call: wall time, and the CPU time of its process (``time.process_time``), which
is the harness's own cost per call since the server is elsewhere.

- BudgetBench: the runner with ``truncation`` at one budget, exact per-call counting with
  tiktoken, the prompt audit, the event log and the response cache, as in any run.
- inspect_ai: ``eval()`` of a Task over a MemoryDataset with ``generate()`` and
  ``includes()``, through its OpenAI-compatible provider (``openai-api/...``), with its
  normal log. It is installed by this script into a separate virtualenv (``--peer-venv``,
  default /tmp/peer-venv), never into the project's.
- lm-evaluation-harness (``--lm-eval``): its ``local-chat-completions`` backend on a
  generate_until task over the same prompts, in the same virtualenv.

    .venv/bin/python benchmarks/bench_peers.py [--samples 200] [--delay 0.2] [--concurrency 16]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _common import FakeOpenAI, machine, write_result

HERE = Path(__file__).resolve().parent

INSPECT_CHILD = r"""
import json, sys, time
from inspect_ai import Task, eval
from inspect_ai.dataset import MemoryDataset, Sample
from inspect_ai.scorer import includes
from inspect_ai.solver import generate
import openai  # noqa: F401  (imported before timing, like every harness's libraries)

prompts = json.load(open(sys.argv[1]))
concurrency, log_dir = int(sys.argv[2]), sys.argv[3]
task = Task(dataset=MemoryDataset([Sample(input=p["prompt"], target=p["answer"], id=p["id"]) for p in prompts]),
            solver=generate(), scorer=includes())
wall, cpu = time.perf_counter(), time.process_time()
logs = eval(task, model="openai-api/bench/bench-model", max_connections=concurrency, max_samples=concurrency,
            max_tokens=16, temperature=0.0, log_dir=log_dir, display="none")
wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
log = logs[0]
print(json.dumps({"wall_s": wall, "cpu_s": cpu, "status": log.status,
                  "samples": len(log.samples or []), "version": __import__("inspect_ai").__version__}))
"""

LM_EVAL_CHILD = r'''
import json, os, sys, time
import lm_eval
from lm_eval.tasks import TaskManager

prompts_file, concurrency, base_url, work = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
rows = [{"prompt": p["prompt"], "answer": p["answer"]} for p in json.load(open(prompts_file))]
data = os.path.join(work, "peer_prompts.jsonl")
with open(data, "w") as handle:
    handle.write("\n".join(json.dumps(r) for r in rows) + "\n")
with open(os.path.join(work, "peer_prompts.yaml"), "w") as handle:
    handle.write(f"""task: peer_prompts
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: generate_until
doc_to_text: "{{{{prompt}}}}"
doc_to_target: "{{{{answer}}}}"
generation_kwargs:
  max_gen_toks: 16
  temperature: 0.0
  do_sample: false
  until: []
metric_list:
  - metric: exact_match
""")
manager = TaskManager(include_path=work)
wall, cpu = time.perf_counter(), time.process_time()
results = lm_eval.simple_evaluate(
    model="local-chat-completions",
    model_args=f"model=bench-model,base_url={base_url}/chat/completions,num_concurrent={concurrency},"
               f"max_retries=1,tokenized_requests=False,tokenizer_backend=None",
    tasks=["peer_prompts"], task_manager=manager, apply_chat_template=True, log_samples=True)
wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
samples = len(results["samples"]["peer_prompts"])
print(json.dumps({"wall_s": wall, "cpu_s": cpu, "status": "success", "samples": samples,
                  "version": lm_eval.__version__ if hasattr(lm_eval, "__version__") else None}))
'''


def prompts(count: int) -> list[dict]:
    """Short factual questions, each with an answer the fake server does not give."""
    cities = ["Paris", "Lima", "Oslo", "Cairo", "Hanoi", "Quito", "Accra", "Bern", "Doha", "Riga"]
    return [
        {
            "id": f"q{i:03d}",
            "prompt": f"Question {i}: in one word, which city did I say I moved to in "
            f"{1990 + i % 30}, {cities[i % len(cities)]} or somewhere else?",
            "answer": cities[i % len(cities)],
        }
        for i in range(count)
    ]


def budgetbench_child(prompts_file: str, api_base: str, concurrency: int, out: str) -> None:
    """Runs in the child: the real runner over the prompts as a one-item-per-prompt task."""
    from budgetbench_core import Item, Message, RunConfig, Task, hookimpl, run
    from budgetbench_core.builtin.litellm_backend import _litellm
    from budgetbench_core.testing import registry_with

    rows = json.loads(Path(prompts_file).read_text())

    class PeerPrompts(Task):
        name = "peer-prompts"
        default_grader = "contains-answer"
        max_output_tokens = 16
        description = "bench_peers.py prompts, one user message each"

        def load(self, limit, seed):
            for row in rows[:limit]:
                yield Item(id=row["id"], history=(), query=Message("user", row["prompt"]), answer=row["answer"])

    class Plugin:
        @staticmethod
        @hookimpl
        def register_tasks(register):
            register(PeerPrompts)

    registry = registry_with(Plugin, distribution="bench-peers")
    _litellm()  # imported before timing, like every harness's libraries
    config = RunConfig(
        task="peer-prompts",
        strategies=["truncation"],
        budgets=[1024],
        out=Path(out),
        model="openai/bench-model",
        api_base=api_base,
        tokenizer="tiktoken:cl100k_base",
        max_concurrency=concurrency,
        temperature=0.0,
    )
    wall, cpu = time.perf_counter(), time.process_time()
    summary = run(config, registry)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    from importlib import metadata

    print(
        json.dumps(
            {
                "wall_s": wall,
                "cpu_s": cpu,
                "status": "success" if summary.results == len(rows) else "failed",
                "samples": summary.results,
                "errors": summary.errors,
                "version": metadata.version("budgetbench"),
            }
        )
    )


def ensure_peer_venv(venv: Path, packages: list[str]) -> Path:
    python = venv / "bin" / "python"
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    missing = [
        p
        for p in packages
        if subprocess.run(
            [str(python), "-c", f"import {p.split('[')[0].replace('-', '_')}"], capture_output=True
        ).returncode
        != 0
    ]
    install = {"inspect_ai": "inspect-ai", "lm_eval": "lm-eval[api]", "openai": "openai"}
    if missing:
        subprocess.run([str(python), "-m", "pip", "install", "-q", *(install[p] for p in missing)], check=True)
    return python


def run_child(
    name: str, command: list[str], env: dict[str, str], server: FakeOpenAI, samples: int, timeout_s: float
) -> dict:
    server.reset()
    load = os.getloadavg()[0]
    began = time.perf_counter()
    out = subprocess.run(command, env=env, capture_output=True, text=True, timeout=timeout_s)
    process_s = time.perf_counter() - began
    stats = server.stats()
    result: dict = {
        "harness": name,
        "load_average_before": round(load, 2),
        "load_average_after": round(os.getloadavg()[0], 2),
        "process_wall_s": round(process_s, 2),
        "server_requests": stats["requests"],
        "server_max_inflight": stats["max_inflight"],
    }
    lines = [line for line in out.stdout.splitlines() if line.startswith("{")]
    if out.returncode != 0 or not lines:
        result["error"] = (out.stderr or out.stdout)[-1500:]
        return result
    measured = json.loads(lines[-1])
    result.update(measured)
    result["cpu_ms_per_call"] = round(measured["cpu_s"] / max(1, samples) * 1e3, 2)
    result["samples_per_s"] = round(measured["samples"] / measured["wall_s"], 1)
    return result


def main() -> None:
    if sys.argv[1:2] == ["child-budgetbench"]:
        budgetbench_child(sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5])
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=200)
    parser.add_argument("--delay", type=float, default=0.2, help="the server's fixed reply delay, seconds")
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--peer-venv", default="/tmp/peer-venv")
    parser.add_argument("--lm-eval", action="store_true", help="also run lm-evaluation-harness")
    parser.add_argument("--timeout", type=float, default=900)
    args = parser.parse_args()
    start = machine()
    packages = ["inspect_ai", "openai"] + (["lm_eval"] if args.lm_eval else [])
    peer_python = ensure_peer_venv(Path(args.peer_venv), packages)
    results = []
    with FakeOpenAI(delay_s=args.delay) as server, tempfile.TemporaryDirectory() as tmp:
        prompts_file = Path(tmp) / "prompts.json"
        prompts_file.write_text(json.dumps(prompts(args.samples)))
        env = {
            **os.environ,
            "BENCH_API_KEY": "not-needed",
            "BENCH_BASE_URL": server.api_base,
            "OPENAI_API_KEY": "not-needed",
            "INSPECT_LOG_LEVEL": "warning",
            "HF_DATASETS_OFFLINE": "1",
            "TOKENIZERS_PARALLELISM": "false",
        }
        (Path(tmp) / "inspect_child.py").write_text(INSPECT_CHILD)
        (Path(tmp) / "lm_eval_child.py").write_text(LM_EVAL_CHILD)
        children = {
            "budgetbench": [
                sys.executable,
                str(HERE / "bench_peers.py"),
                "child-budgetbench",
                str(prompts_file),
                server.api_base,
                str(args.concurrency),
                str(Path(tmp) / "bb-run"),
            ],
            "inspect_ai": [
                str(peer_python),
                str(Path(tmp) / "inspect_child.py"),
                str(prompts_file),
                str(args.concurrency),
                str(Path(tmp) / "inspect-logs"),
            ],
        }
        if args.lm_eval:
            (Path(tmp) / "lm").mkdir()
            children["lm-evaluation-harness"] = [
                str(peer_python),
                str(Path(tmp) / "lm_eval_child.py"),
                str(prompts_file),
                str(args.concurrency),
                server.api_base,
                str(Path(tmp) / "lm"),
            ]
        for name, command in children.items():
            result = run_child(name, command, env, server, args.samples, args.timeout)
            results.append(result)
            print(json.dumps(result)[:600], flush=True)
    ideal = args.samples * args.delay / args.concurrency
    ok = {r["harness"]: r for r in results if "error" not in r and r.get("samples") == args.samples}
    ratios = {}
    if "budgetbench" in ok:
        for name, result in ok.items():
            if name != "budgetbench":
                ratios[name] = {
                    "throughput_ratio": round(ok["budgetbench"]["samples_per_s"] / result["samples_per_s"], 3),
                    "cpu_per_call_ratio": round(ok["budgetbench"]["cpu_ms_per_call"] / result["cpu_ms_per_call"], 3),
                }
    peers = [r["samples_per_s"] for n, r in ok.items() if n != "budgetbench"]
    write_result(
        "peers",
        {
            "machine": start,
            "samples": args.samples,
            "delay_s": args.delay,
            "concurrency": args.concurrency,
            "ideal_wall_s": ideal,
            "results": results,
            "budgetbench_vs": ratios,
            "target": "BudgetBench throughput >= the fastest peer's",
            "met": bool(peers) and "budgetbench" in ok and ok["budgetbench"]["samples_per_s"] >= max(peers),
        },
    )
    for name, ratio in ratios.items():
        print(
            f"BudgetBench / {name}: throughput x{ratio['throughput_ratio']}, CPU per call x{ratio['cpu_per_call_ratio']}"
        )


if __name__ == "__main__":
    main()
