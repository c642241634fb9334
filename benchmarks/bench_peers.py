"""Side by side with peer harnesses: the same 200 single-call samples through each.

Every harness gets the same prompts (one user message each, 16 output tokens,
temperature 0), the same loopback OpenAI-compatible server answering after a fixed delay
(a child process, so it never takes the harnesses' CPU), and the same concurrency. Each
harness runs in a process of its own, imports its libraries, builds its dataset, and runs a
one-sample warm-up evaluation (another prompt, its own output directory), so one-time
costs (lazy imports, model-info tables, tokenizer files) stay out of the per-call figures;
the warm-up's wall and CPU are reported apart. Then it runs the timed evaluation as a user
runs it: every request, the scoring, and writing the harness's normal log or results.

The same definitions for every harness: ``wall_s`` is that whole evaluation call, from
before its first request to after its results are written, and ``samples_per_s`` =
samples / ``wall_s``; CPU is that call's process CPU (``time.process_time``: all its
threads, plus any child process it reaped), which is the harness's own cost, since the
server is another process. The server counts the requests and how many it held at once.

- BudgetBench: the runner with ``truncation`` at one budget, exact per-call counting with
  tiktoken, the prompt audit, the event log and the response cache, as in any run.
- inspect_ai: ``eval()`` of a Task over a MemoryDataset with ``generate()`` and
  ``includes()``, through its OpenAI-compatible provider (``openai-api/...``), with its
  normal log.
- lm-evaluation-harness: ``simple_evaluate`` with its ``local-chat-completions`` backend
  (``num_concurrent`` = the concurrency) on a ``generate_until`` task over the same prompts,
  results and samples saved by its ``EvaluationTracker`` as its CLI's
  ``--output_path --log_samples`` does.

Each peer is installed by this script, at a pinned version, into a virtualenv of its own
(``--inspect-venv``, ``--lm-eval-venv``), never into the project's; lm-eval needs torch,
which pip takes from this machine's wheel directory (the CPU build, ~190 MB).

Every harness runs ``--repeats`` times (3), in rounds whose order rotates; the figures are
the medians, with the range of samples/s.

    .venv/bin/python benchmarks/bench_peers.py [--samples 200] [--delay 0.2] [--concurrency 16]
        [--peers inspect_ai,lm-eval] [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _common import FakeOpenAI, machine, median, write_result

HERE = Path(__file__).resolve().parent

# Shared by every child: ``evaluate(rows, work) -> (status, samples)`` is the harness's own part,
# defined before this; the child's arguments are the prompts file, concurrency, api_base, work dir.
DRIVER = r"""
import json, os, resource, sys, time, urllib.request

def cpu_now():
    child = resource.getrusage(resource.RUSAGE_CHILDREN)
    return time.process_time() + child.ru_utime + child.ru_stime

def measure(rows, work):
    os.makedirs(work, exist_ok=True)
    wall, cpu = time.perf_counter(), cpu_now()
    status, samples = evaluate(rows, work)
    return {"status": status, "samples": samples, "wall_s": time.perf_counter() - wall, "cpu_s": cpu_now() - cpu}

prompts = json.load(open(PROMPTS_FILE))
warmup = measure(prompts["warmup"], os.path.join(WORK, "warmup"))
base = API_BASE.removesuffix("/v1")
urllib.request.urlopen(urllib.request.Request(base + "/reset", data=b"", method="POST"), timeout=10).read()
result = measure(prompts["samples"], os.path.join(WORK, "timed"))
print(json.dumps({**result, "warmup_wall_s": warmup["wall_s"], "warmup_cpu_s": warmup["cpu_s"],
                  "warmup_status": warmup["status"], "version": VERSION}))
"""

ARGS = r"""
import sys
PROMPTS_FILE, CONCURRENCY, API_BASE, WORK = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
"""

INSPECT_CHILD = (
    ARGS
    + r"""
from inspect_ai import Task, eval
from inspect_ai.dataset import MemoryDataset, Sample
from inspect_ai.scorer import includes
from inspect_ai.solver import generate
import inspect_ai

VERSION = inspect_ai.__version__

def evaluate(rows, work):
    task = Task(dataset=MemoryDataset([Sample(input=p["prompt"], target=p["answer"], id=p["id"]) for p in rows]),
                solver=generate(), scorer=includes())
    logs = eval(task, model="openai-api/bench/bench-model", max_connections=CONCURRENCY, max_samples=CONCURRENCY,
                max_tokens=16, temperature=0.0, log_dir=work, display="none")
    return logs[0].status, len(logs[0].samples or [])
"""
    + DRIVER
)

LM_EVAL_CHILD = (
    ARGS
    + r'''
import json, os
import lm_eval
from lm_eval.evaluator import simple_evaluate
from lm_eval.loggers import EvaluationTracker
from lm_eval.tasks import TaskManager, get_task_dict

VERSION = lm_eval.__version__
TASKS = {}

def write_task(name, rows):
    data = os.path.join(WORK, name + ".jsonl")
    with open(data, "w") as handle:
        handle.write("\n".join(json.dumps({"prompt": r["prompt"], "answer": r["answer"]}) for r in rows) + "\n")
    with open(os.path.join(WORK, name + ".yaml"), "w") as handle:
        handle.write(f"""task: {name}
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

# The datasets are built here, before any timing, as the other harnesses build theirs first
# (TaskManager indexes lm-eval's thousands of task files; its CLI also does that first).
os.makedirs(WORK, exist_ok=True)
for name, key in (("peer_warmup", "warmup"), ("peer_prompts", "samples")):
    write_task(name, json.load(open(PROMPTS_FILE))[key])
MANAGER = TaskManager(include_path=WORK)
for name in ("peer_warmup", "peer_prompts"):
    TASKS[len(TASKS)] = get_task_dict([name], MANAGER)[name]

def evaluate(rows, work):
    task = TASKS[0] if len(rows) == 1 else TASKS[1]
    tracker = EvaluationTracker(output_path=work)
    results = simple_evaluate(
        model="local-chat-completions",
        model_args=f"model=bench-model,base_url={API_BASE}/chat/completions,num_concurrent={CONCURRENCY},"
                   f"max_retries=1,tokenized_requests=False,tokenizer_backend=None",
        tasks=[task], task_manager=MANAGER, apply_chat_template=True, log_samples=True, evaluation_tracker=tracker)
    samples = results.pop("samples")
    tracker.save_results_aggregated(results=results, samples=samples)
    for name in results["configs"]:
        tracker.save_results_samples(task_name=name, samples=samples[name])
    return "success", sum(len(s) for s in samples.values())
'''
    + DRIVER
)

# name: (virtualenv option, distributions pinned, in install order, child script)
PEERS = {
    "inspect_ai": ("inspect_venv", ["inspect-ai==0.3.285", "openai==3.57.0"], INSPECT_CHILD),
    "lm-eval": ("lm_eval_venv", ["torch==2.13.0", "lm-eval[api]==0.4.13"], LM_EVAL_CHILD),
}


def prompts(count: int) -> dict[str, list[dict]]:
    """Short factual questions, each with an answer the fake server does not give, and a warm-up one."""
    cities = ["Paris", "Lima", "Oslo", "Cairo", "Hanoi", "Quito", "Accra", "Bern", "Doha", "Riga"]
    samples = [
        {
            "id": f"q{i:03d}",
            "prompt": f"Question {i}: in one word, which city did I say I moved to in "
            f"{1990 + i % 30}, {cities[i % len(cities)]} or somewhere else?",
            "answer": cities[i % len(cities)],
        }
        for i in range(count)
    ]
    warmup = [{"id": "warmup", "prompt": "Warm-up: in one word, which city is the capital of Peru?", "answer": "Lima"}]
    return {"warmup": warmup, "samples": samples}


def budgetbench_child(prompts_file: str, concurrency: int, api_base: str, work: str) -> None:
    """Runs in the child: the real runner over the prompts as a one-item-per-prompt task."""
    from importlib import metadata

    from budgetbench_core import Item, Message, RunConfig, Task, hookimpl, run
    from budgetbench_core.testing import registry_with

    current: list[dict] = []

    class PeerPrompts(Task):
        name = "peer-prompts"
        default_grader = "contains-answer"
        max_output_tokens = 16
        description = "bench_peers.py prompts, one user message each"

        def load(self, limit, seed):
            for row in current[:limit]:
                yield Item(id=row["id"], history=(), query=Message("user", row["prompt"]), answer=row["answer"])

    class Plugin:
        @staticmethod
        @hookimpl
        def register_tasks(register):
            register(PeerPrompts)

    registry = registry_with(Plugin, distribution="bench-peers")

    def evaluate(rows: list[dict], out: str) -> tuple[str, int]:
        current[:] = rows
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
        summary = run(config, registry)
        return ("success" if summary.results == len(rows) and not summary.errors else "failed"), summary.results

    scope = {
        "evaluate": evaluate,
        "PROMPTS_FILE": prompts_file,
        "API_BASE": api_base,
        "WORK": work,
        "VERSION": metadata.version("budgetbench"),
    }
    exec(compile(DRIVER, "bench_peers DRIVER", "exec"), scope)  # the same driver as the peers'


def ensure_venv(venv: Path, pins: list[str]) -> Path:
    """The peer's own virtualenv with ``pins`` installed; pip runs only when one is missing."""
    python = venv / "bin" / "python"
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    check = (
        "import sys; from importlib.metadata import version, PackageNotFoundError\n"
        "def have(pin):\n"
        "    name, wanted = pin.split('==')\n"
        "    try: return version(name.split('[')[0]).split('+')[0] == wanted\n"
        "    except PackageNotFoundError: return False\n"
        "print(' '.join(p for p in sys.argv[1:] if not have(p)))"
    )
    missing = subprocess.run([str(python), "-c", check, *pins], capture_output=True, text=True, check=True)
    if missing.stdout.split():
        print(f"installing {' '.join(pins)} into {venv}", flush=True)
        subprocess.run([str(python), "-m", "pip", "install", "-q", *pins], check=True)
    return python


def run_child(
    name: str, command: list[str], env: dict[str, str], server: FakeOpenAI, samples: int, timeout_s: float
) -> dict:
    server.reset()
    load = os.getloadavg()[0]
    began = time.perf_counter()
    try:
        out = subprocess.run(command, env=env, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        out = None
    process_s = time.perf_counter() - began
    stats = server.stats()  # reset by the child after its warm-up: the timed evaluation's requests
    result: dict = {
        "harness": name,
        "load_average_before": round(load, 2),
        "load_average_after": round(os.getloadavg()[0], 2),
        "process_wall_s": round(process_s, 2),
        "server_requests": stats["requests"],
        "server_max_inflight": stats["max_inflight"],
    }
    if out is None:
        result["error"] = f"timed out after {timeout_s:.0f} s"
        return result
    lines = [line for line in out.stdout.splitlines() if line.startswith("{")]
    if out.returncode != 0 or not lines:
        result["error"] = (out.stderr or out.stdout)[-1500:]
        return result
    measured = json.loads(lines[-1])
    result.update(measured)
    result["cpu_ms_per_call"] = round(measured["cpu_s"] / max(1, samples) * 1e3, 2)
    result["samples_per_s"] = round(measured["samples"] / measured["wall_s"], 1)
    if measured["status"] != "success" or measured["samples"] != samples or stats["requests"] != samples:
        result["error"] = f"{measured['samples']} samples, {stats['requests']} requests, status {measured['status']}"
    return result


def main() -> None:
    if sys.argv[1:2] == ["child-budgetbench"]:
        budgetbench_child(sys.argv[2], int(sys.argv[3]), sys.argv[4], sys.argv[5])
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=200)
    parser.add_argument("--delay", type=float, default=0.2, help="the server's fixed reply delay, seconds")
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--peers", default=",".join(PEERS), help=f"comma-separated, from {', '.join(PEERS)}")
    parser.add_argument("--inspect-venv", default="/tmp/peer-venv")
    parser.add_argument("--lm-eval-venv", default="/tmp/peer-venv-lm-eval")
    parser.add_argument("--repeats", type=int, default=3, help="rounds of every harness; medians are reported")
    parser.add_argument("--timeout", type=float, default=900, help="seconds per harness and round")
    args = parser.parse_args()
    chosen = [p.strip() for p in args.peers.split(",") if p.strip()]
    unknown = sorted(set(chosen) - set(PEERS))
    if unknown:
        parser.error(f"unknown peer(s) {', '.join(unknown)}; choose from {', '.join(PEERS)}")
    pythons = {name: ensure_venv(Path(getattr(args, PEERS[name][0])), PEERS[name][1]) for name in chosen}
    start = machine()
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
            "HF_HUB_OFFLINE": "1",
            "TOKENIZERS_PARALLELISM": "false",
        }
        common = [str(prompts_file), str(args.concurrency), server.api_base]
        children = {"budgetbench": [sys.executable, str(HERE / "bench_peers.py"), "child-budgetbench", *common]}
        for name in chosen:
            script = Path(tmp) / f"{name}_child.py"
            script.write_text(PEERS[name][2])
            children[name] = [str(pythons[name]), str(script), *common]
        names = list(children)
        for round_ in range(args.repeats):  # rounds rotate the order, so no harness always goes first
            for name in names[round_ % len(names) :] + names[: round_ % len(names)]:
                command = [*children[name], str(Path(tmp) / f"{name}-{round_}")]
                result = {"round": round_, **run_child(name, command, env, server, args.samples, args.timeout)}
                results.append(result)
                print(json.dumps(result)[:600], flush=True)
    ideal = math.ceil(args.samples / args.concurrency) * args.delay  # waves of `concurrency` calls
    summary = {name: summarise([r for r in results if r["harness"] == name]) for name in names}
    ok = {name: s for name, s in summary.items() if s["failed_runs"] == 0}
    ratios = {}
    if "budgetbench" in ok:
        for name, result in ok.items():
            if name != "budgetbench":
                ratios[name] = {
                    "throughput_ratio": round(ok["budgetbench"]["samples_per_s"] / result["samples_per_s"], 3),
                    "cpu_per_call_ratio": round(ok["budgetbench"]["cpu_ms_per_call"] / result["cpu_ms_per_call"], 3),
                }
    peers = [s["samples_per_s"] for n, s in ok.items() if n != "budgetbench"]
    write_result(
        "peers",
        {
            "machine": start,
            "samples": args.samples,
            "delay_s": args.delay,
            "concurrency": args.concurrency,
            "repeats": args.repeats,
            "ideal_wall_s": ideal,
            "definitions": "wall_s: the harness's whole timed evaluation call (after a one-sample warm-up in the "
            "same process), its log/results written inside; samples_per_s = samples / wall_s; cpu_ms_per_call = "
            "that call's process CPU / samples; summary: medians over the rounds",
            "peers_requested": chosen,
            "summary": summary,
            "budgetbench_vs": ratios,
            "target": "BudgetBench throughput >= the fastest peer's",
            "met": len(peers) == len(chosen)
            and "budgetbench" in ok
            and ok["budgetbench"]["samples_per_s"] >= max(peers, default=0),
            "results": results,
        },
    )
    spread = [r[k] for r in results for k in ("load_average_before", "load_average_after")]
    print(
        f"{args.samples} samples, {args.delay} s server delay, concurrency {args.concurrency}: ideal wall "
        f"{ideal:.2f} s; medians of {args.repeats} round(s), load average {min(spread)}-{max(spread)}"
    )
    print(f"{'harness':14} {'wall s':>7} {'samples/s':>9} {'(range)':>13} {'CPU ms/call':>11} {'held':>5}")
    for name, s in summary.items():
        if s["failed_runs"] == len([r for r in results if r["harness"] == name]):
            print(f"{name:14} failed: {s['last_error'][-300:]}")
            continue
        low, high = s["samples_per_s_range"]
        failed = f"  {s['failed_runs']} run(s) failed" if s["failed_runs"] else ""
        print(
            f"{name:14} {s['wall_s']:7.2f} {s['samples_per_s']:9.1f} {f'({low}-{high})':>13} "
            f"{s['cpu_ms_per_call']:11.2f} {s['server_max_inflight']:5d}{failed}"
        )
    for name, ratio in ratios.items():
        print(
            f"BudgetBench / {name}: throughput x{ratio['throughput_ratio']}, CPU per call x{ratio['cpu_per_call_ratio']}"
        )


def summarise(runs: list[dict]) -> dict:
    """One harness over the rounds: medians of the runs that succeeded."""
    good = [r for r in runs if "error" not in r]
    out: dict = {"runs": len(runs), "failed_runs": len(runs) - len(good)}
    if len(good) < len(runs):
        out["last_error"] = [r for r in runs if "error" in r][-1]["error"]
    if good:
        for key in ("wall_s", "samples_per_s", "cpu_ms_per_call", "warmup_wall_s", "warmup_cpu_s"):
            out[key] = round(median(r[key] for r in good), 3)
        out["samples_per_s_range"] = [min(r["samples_per_s"] for r in good), max(r["samples_per_s"] for r in good)]
        out["server_max_inflight"] = max(r["server_max_inflight"] for r in good)
        out["version"] = good[-1]["version"]
    return out


if __name__ == "__main__":
    main()
