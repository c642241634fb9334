"""The metering gateway's cost to the harness: main-process CPU per call a plugin's own SDK sends.

Everything of the harness runs here as in a run: the run's ``ModelCaller`` (no reply cache) in
front of a loopback OpenAI-compatible server in a child process (``_common.FakeOpenAI``), and
``host.metering.Metering`` (the gateway, exact counting with the run's tokenizer, the budget
check, a ``metered_call`` row per call in a chained cell file) in front of that caller. A second
child plays a plugin's SDK: it sends ``--calls`` chat completions through the gateway on one
keep-alive connection. The same calls are also made straight through the caller from here,
which is what the harness spends on any model call. The gateway's overhead per forwarded call
is the difference of this process's CPU per call (``time.process_time``: the children's work is
not in it). Target (the isolation issue): <= 1 ms.

    .venv/bin/python benchmarks/bench_gateway.py --calls 2000
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _common import FakeOpenAI, machine, write_result

from budgetbench_core import Message
from budgetbench_core.backends import GenerationParams
from budgetbench_core.builtin.litellm_backend import LiteLLMBackend
from budgetbench_core.cell import CellLog, CellStamp
from budgetbench_core.host.metering import Metering
from budgetbench_core.model_calls import ModelCaller
from budgetbench_core.runlog import EventLog
from budgetbench_core.testing import tokenizer_for
from budgetbench_core.tokenizers import PromptCounter

SDK = r"""
import http.client, json, sys
url, key, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
host, rest = url.split("://", 1)[1].split("/", 1)
connection = http.client.HTTPConnection(*host.split(":"))
print("ready", flush=True); sys.stdin.readline()
for i in range(n):
    body = {"model": "vendor", "max_tokens": 8,
            "messages": [{"role": "user", "content": f"Note {i}: the user moved to Lisbon in May."}]}
    connection.request("POST", "/" + rest + "/chat/completions", json.dumps(body),
                       {"Content-Type": "application/json", "Authorization": f"Bearer {key}"})
    reply = connection.getresponse(); reply.read()
    assert reply.status == 200, reply.status
print("done", flush=True)
"""


def direct(caller: ModelCaller, calls: int) -> float:
    """This process's CPU seconds per call made straight through the run's caller."""
    params = GenerationParams(8, 0.0, 0)
    started = time.process_time()
    for i in range(calls):
        caller.call((Message("user", f"Note {i}: the user moved to Lisbon in May."),), params)
    return (time.process_time() - started) / calls


def through_gateway(metering: Metering, cell: CellLog, calls: int) -> tuple[float, float]:
    """This process's CPU seconds per call a child sends through the gateway, and wall seconds."""
    token = metering.new_token()
    metering.bind(token, cell, None)  # aux: budget-checked against the cell's budget
    url = metering.environment(token)["OPENAI_BASE_URL"]
    child = subprocess.Popen(
        [sys.executable, "-c", SDK, url, token, str(calls)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert child.stdout is not None and child.stdin is not None
    assert child.stdout.readline().strip() == "ready"
    cpu, wall = time.process_time(), time.perf_counter()
    child.stdin.write("go\n")
    child.stdin.flush()
    assert child.stdout.readline().strip() == "done"
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    child.wait(30)
    metering.unbind(token)
    return cpu / calls, wall / calls


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    start = machine()
    counter = PromptCounter(tokenizer_for("tiktoken:cl100k_base"))
    rounds = []
    with FakeOpenAI() as server, tempfile.TemporaryDirectory() as tmp:
        backend = LiteLLMBackend("openai/bench", api_base=server.api_base, timeout_s=10)
        caller = ModelCaller(backend, None, 4, retries=0)
        metering = Metering(caller, counter, seed=0)
        metering.start()
        log = EventLog(Path(tmp) / "run")
        stamp = CellStamp("bench", "vendor-sdk", 512, 0, "item-0", None, "bench", None)
        cell = CellLog(log, stamp)
        direct(caller, 50)  # warm: connection pool, lazy imports
        through_gateway(metering, cell, 50)
        for repeat in range(args.repeats):
            plain = direct(caller, args.calls)
            gated, wall = through_gateway(metering, cell, args.calls)
            rounds.append(
                {
                    "direct_cpu_ms_per_call": plain * 1e3,
                    "gateway_cpu_ms_per_call": gated * 1e3,
                    "overhead_cpu_ms_per_call": (gated - plain) * 1e3,
                    "gateway_wall_ms_per_call": wall * 1e3,
                }
            )
            print(f"repeat {repeat}: " + ", ".join(f"{k} {v:.3f}" for k, v in rounds[-1].items()))
        metering.stop()
        rows = sum(1 for line in (Path(tmp) / "run").rglob("*.jsonl") for _ in line.open())
    median = {key: sorted(r[key] for r in rounds)[len(rounds) // 2] for key in rounds[0]}
    print("median:", json.dumps({k: round(v, 3) for k, v in median.items()}), "target overhead <= 1 ms")
    write_result(
        "gateway",
        {
            "machine": start,
            "calls": args.calls,
            "metered_rows_written": rows,
            "median": median,
            "target_overhead_ms": 1.0,
            "met": median["overhead_cpu_ms_per_call"] <= 1.0,
            "rounds": rounds,
        },
    )


if __name__ == "__main__":
    main()
