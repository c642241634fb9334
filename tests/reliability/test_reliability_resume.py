"""kill -9 the `budgetbench run` process again and again, resume each time, and compare
the final rows with an uninterrupted run of the same seed.

The model is the deterministic loopback server (budgetbench_core.testing.FaultServer, no faults),
so the two runs must agree row for row. After every kill a torn, half-written line is
appended to one cell file, as a kill during a write leaves it; the reader and the next
resume must cope. The server's request log proves that no cell was sent again after its
row was written.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from datetime import datetime
from pathlib import Path

import pytest

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

from budgetbench_core import Message, RunConfig, run  # noqa: E402
from budgetbench_core.builtin.tokenizers import TiktokenTokenizer  # noqa: E402
from budgetbench_core.runlog import cell_files, final_rows, iter_events, read_manifest  # noqa: E402
from budgetbench_core.runner import RunConfigError  # noqa: E402
from budgetbench_core.testing import FaultServer, messages_hash  # noqa: E402

BUDGETBENCH = Path(sys.executable).with_name("budgetbench")
KILLS = 5
SETTINGS = dict(
    task="synthetic-memory",
    strategies=["truncation", "checkpoint"],
    budgets=[50, 300, 1000],
    task_options={"items": 24, "history_tokens": 600},
    seed=3,
    max_concurrency=2,
    retries=0,
    timeout_s=10.0,
    tokenizer="tiktoken:cl100k_base",
    model="openai/fault-model",
)
COMPARED = ("event", "prediction", "quality", "prompt_tokens", "served_prompt_tokens", "verdict", "phase", "cause")


def _counter():
    tokenizer = TiktokenTokenizer("cl100k_base")
    return lambda messages: tokenizer.count([Message(m["role"], m["content"]) for m in messages])


def _command(out: Path, api_base: str) -> list[str]:
    command = [
        str(BUDGETBENCH),
        "run",
        "-t",
        SETTINGS["task"],
        "-b",
        " ".join(map(str, SETTINGS["budgets"])),
        "-m",
        SETTINGS["model"],
        "--api-base",
        api_base,
        "--tokenizer",
        SETTINGS["tokenizer"],
        "--seed",
        str(SETTINGS["seed"]),
        "-j",
        str(SETTINGS["max_concurrency"]),
        "--retries",
        str(SETTINGS["retries"]),
        "--timeout",
        str(SETTINGS["timeout_s"]),
        "-o",
        str(out),
        "--no-report",
    ]
    for strategy in SETTINGS["strategies"]:
        command += ["-s", strategy]
    for key, value in SETTINGS["task_options"].items():
        command += ["--task-option", f"{key}={value}"]
    return command


def _tear_a_line(out: Path, rng: random.Random) -> None:
    """Leave what a kill in the middle of a write leaves: a line without its end."""
    files = cell_files(out)
    if files:
        with open(rng.choice(files), "ab") as handle:
            handle.write(b'{"event": "result", "task": "synthetic-memory", "strat')


def _epoch(iso: str) -> float:
    return datetime.fromisoformat(iso).timestamp()


@pytest.mark.slow
def test_kill_nine_and_resume_matches_uninterrupted_run(tmp_path):
    rng = random.Random(20261129)
    with FaultServer(latency_s=0.03, count_prompt=_counter()) as reference_server:
        run(RunConfig(out=tmp_path / "reference", api_base=reference_server.url, **SETTINGS))
    reference = final_rows(tmp_path / "reference")
    calls_needed = len(reference_server.requests)

    out = tmp_path / "resumed"
    kills = 0
    env = {**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True"}
    with FaultServer(latency_s=0.03, count_prompt=_counter()) as server:
        while True:
            process = subprocess.Popen(
                _command(out, server.url), env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
            )
            # Kill after a random number of further requests (a random point mid-run).
            target = len(server.requests) + rng.randint(1, max(2, calls_needed // (KILLS + 2)))
            while process.poll() is None and kills < KILLS and len(server.requests) < target:
                time.sleep(0.005)
            if process.poll() is None and kills < KILLS:
                time.sleep(rng.random() * 0.05)
                os.kill(process.pid, signal.SIGKILL)
                process.wait()
                kills += 1
                list(iter_events(out))  # the reader copes with whatever the kill left
                _tear_a_line(out, rng)
                continue
            _, stderr = process.communicate(timeout=600)
            assert process.returncode == 0, stderr.decode()
            break

    assert kills == KILLS
    resumed = final_rows(out)
    assert resumed.keys() == reference.keys()
    for key, row in reference.items():
        assert {f: row.get(f) for f in COMPARED} == {f: resumed[key].get(f) for f in COMPARED}, key
    counts = lambda rows: sorted((r["event"], r["strategy"], r["budget"]) for r in rows.values())  # noqa: E731
    assert counts(resumed) == counts(reference)
    assert {r["event"] for r in resumed.values()} == {"result", "violation"}

    # Terminal rows: exactly one per cell; every torn fragment was cut, every line is whole JSON.
    terminal = [e for e in iter_events(out) if e["event"] in ("result", "violation", "error")]
    assert len(terminal) == len(resumed)
    for path in cell_files(out):
        data = path.read_bytes()
        assert data.endswith(b"\n") and all(json.loads(line) for line in data.splitlines())

    # No cell was sent to the model again after its row was written.
    audits = {}
    for event in iter_events(out):
        if event["event"] == "prompt_audit":
            audits[(event["strategy"], event["budget"], event["item_id"])] = messages_hash(event["messages"])
    by_hash = server.by_hash()
    cells_of_hash = Counter(audits.values())
    checked = 0
    for (_task, strategy, budget, _repeat, item_id), row in resumed.items():
        prompt = audits.get((strategy, budget, item_id))
        if row["event"] != "result" or cells_of_hash[prompt] > 1:
            continue  # a prompt shared by two cells may legitimately be sent for the other one
        checked += 1
        sent = by_hash[prompt]
        assert [r for r in sent if r.time > _epoch(row["time"])] == [], (strategy, budget, item_id)
    assert checked >= len(resumed) // 3

    manifest = read_manifest(out)
    assert len(manifest["invocations"]) == KILLS + 1
    assert [i["finished"] is None for i in manifest["invocations"]] == [True] * KILLS + [False]
    print(
        f"crash-resume figures: kills={kills} cells={len(resumed)} reference_calls={calls_needed} "
        f"resumed_calls={len(server.requests)} repeated_calls={len(server.requests) - calls_needed}"
    )


def test_a_second_process_on_the_same_run_directory_is_refused(tmp_path):
    """Two runs writing one directory would overwrite each other's manifest."""
    import fcntl

    out = tmp_path / "run"
    out.mkdir()
    settings = {**SETTINGS, "budgets": [10], "task_options": {"items": 2, "history_tokens": 300}}
    with open(out / ".lock", "w") as held:  # what a live `budgetbench run` holds
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        with pytest.raises(RunConfigError, match="in use by another budgetbench run"):
            run(RunConfig(out=out, api_base="http://127.0.0.1:9/v1", **settings))
    assert not (out / "cells").exists()
    summary = run(RunConfig(out=out, api_base="http://127.0.0.1:9/v1", **settings))  # released: runs
    assert summary.violations == summary.cells_total == 4
