"""Ctrl-C and slow local servers: the first Ctrl-C says what it waits for and sends nothing more,
the second exits 130 at once (embedded server included); a call to the embedded model is
bounded by the server's progress, not by a total deadline, and a stall is not retried."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from budgetbench_core import GenerationParams, Message
from budgetbench_core.builtin.litellm_backend import LiteLLMBackend
from budgetbench_core.builtin.local_backend import LocalBackend
from budgetbench_core.interrupts import waiting_message
from budgetbench_core.model_calls import CallFailed, InFlight, ModelCaller, calls_in_flight
from budgetbench_core.runlog import final_rows
from budgetbench_core.testing import FaultServer

BUDGETBENCH = Path(sys.executable).with_name("budgetbench")
MESSAGES = [Message("user", "where is Paris? answer in one word.")]
PARAMS = GenerationParams(16, 0.0, 0)
# A busy slot whose counters never move: what /slots shows of a server that is stuck.
FROZEN_SLOT = {
    "id": 0,
    "is_processing": True,
    "id_task": 7,
    "n_prompt_tokens": 3927,
    "n_prompt_tokens_processed": 512,
    "next_token": [{"n_decoded": 0, "n_remain": 64}],
}


def clean_env() -> dict[str, str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("BUDGETBENCH_")}
    return {**base, "LITELLM_LOCAL_MODEL_COST_MAP": "True"}


def run_until_first_row(command: list[str]) -> tuple[subprocess.Popen, list[str]]:
    """Start ``budgetbench run`` and read its stderr up to the first finished cell."""
    process = subprocess.Popen(command, stderr=subprocess.PIPE, text=True, env=clean_env())
    assert process.stderr is not None
    seen = []
    for line in process.stderr:
        seen.append(line)
        if line.startswith("[ 1/"):
            return process, seen
    process.kill()
    raise AssertionError("the run ended before its first cell: " + "".join(seen))


def local_backend_on(server: FaultServer, **options) -> LocalBackend:
    """The embedded backend's client side pointed at a loopback fake instead of its own server."""
    backend = LocalBackend(**options)
    backend.server_url, backend.api_base = server.base_url, server.url
    return backend


def test_a_stalled_local_server_fails_the_call_once_without_a_retry():
    with FaultServer(rate=1.0, faults=("hang",), hang_s=60, routes={"/slots": (200, [FROZEN_SLOT])}) as server:
        backend = local_backend_on(server, timeout_s=1.0, stall_s=2.0)
        caller = ModelCaller(backend, None, 1, retries=4, backoff_s=0.01, timeout_s=1.0)
        with pytest.raises(CallFailed) as failed:
            caller.call(MESSAGES, PARAMS)
        assert failed.value.attempts == 1 and server.completions() == 1
    message = str(failed.value)
    assert "made no progress" in message and "not retried" in message
    assert "slot 0: 512 prompt tokens processed, 0 generated" in message


def test_a_slow_local_server_that_progresses_is_waited_for_past_its_stall_limit():
    started = time.monotonic()

    def moving_slot():  # 50 prompt tokens more at every look: slow, but alive
        return 200, [{**FROZEN_SLOT, "n_prompt_tokens_processed": 50 * int((time.monotonic() - started) * 20)}]

    with FaultServer(latency_s=4.0, routes={"/slots": moving_slot}) as server:
        backend = local_backend_on(server, timeout_s=1.0, stall_s=1.5)  # the reply takes longer than both
        caller = ModelCaller(backend, None, 1, retries=4, backoff_s=0.01, timeout_s=1.0)
        outcome = caller.call(MESSAGES, PARAMS)
        assert outcome.completion.text == "Paris" and outcome.attempts == 1 and server.completions() == 1
        assert ("GET", "/slots") in server.hits


def test_the_embedded_backend_sets_no_total_deadline_on_its_direct_client():
    with FaultServer() as server:
        backend = local_backend_on(server, timeout_s=5.0)
        assert backend.http_client == "direct" and backend.total_deadline_s(5.0) is None
        assert backend.stall_limit_s() == 60.0  # nothing measured yet: the floor, above --timeout
        backend.watch.longest_step_s = 9.0
        assert backend.stall_limit_s() == 90.0  # ten of the longest step seen


def test_after_the_first_ctrl_c_nothing_more_is_sent():
    with FaultServer() as server:
        caller = ModelCaller(LiteLLMBackend("openai/fault-model", api_base=server.url), None, 1, retries=4)
        assert caller.call(MESSAGES, PARAMS).completion.text == "Paris"
        caller.stopping = "the run was interrupted (Ctrl-C)"  # what stop_sending sets on every caller (the CLI tests)
        with pytest.raises(CallFailed, match="not sent: the run was interrupted") as failed:
            caller.call([Message("user", "and Rome?")], PARAMS)
        assert failed.value.attempts == 0 and server.completions() == 1


def test_the_waiting_message_counts_the_calls_and_their_limits():
    calls = [
        InFlight("backend 'litellm'", 42.4, None),
        InFlight("backend 'litellm'", 97.0, None),
        InFlight("backend 'local'", None, "slot 0: 512 prompt tokens processed, 0 generated"),
    ]
    message = waiting_message(calls)
    assert "waiting for 3 calls in flight" in message and "2 within their deadline (up to 97 s)" in message
    assert "1 on backend 'local' with no total deadline" in message and "512 prompt tokens processed" in message
    assert "Ctrl-C again to stop now" in message
    assert "no more model calls" in waiting_message([]) and calls_in_flight() == []


def test_one_ctrl_c_says_at_once_how_many_calls_it_waits_for(tmp_path):
    out = tmp_path / "r"
    with FaultServer(latency_s=2.0, count_prompt=lambda messages: 10) as server:
        process, seen = run_until_first_row(
            [
                str(BUDGETBENCH),
                "run",
                *("-t", "synthetic-memory", "-s", "truncation", "-b", "256 512 1k 2k"),
                *("--task-option", "items=3", "--task-option", "history_tokens=300"),
                *("--tokenizer", "tiktoken:cl100k_base", "--timeout", "30", "-j", "1"),
                *("-m", "openai/fault-model", "--api-base", server.url, "--no-report", "--display", "plain"),
                *("-o", str(out)),
            ]
        )
        while server.completions() < 2 and process.poll() is None:  # the next cell's call is in flight
            time.sleep(0.05)
        process.send_signal(signal.SIGINT)
        rest = process.stderr.read()
        code = process.wait(timeout=120)
        sent = server.completions()
    assert code == 130, "".join(seen) + rest
    assert "waiting for 1 call in flight: 1 within their deadline (up to " in rest, rest
    assert "press Ctrl-C again to stop now" in rest and "Traceback" not in rest
    results = [r for r in final_rows(out).values() if r["event"] == "result"]
    assert 1 <= len(results) == sent < 12  # the call in flight finished and was kept; none was sent after


@pytest.mark.slow
def test_double_ctrl_c_on_the_embedded_model_exits_130_at_once(tmp_path):
    out = tmp_path / "r"
    process, seen = run_until_first_row(
        [
            str(BUDGETBENCH),
            "run",
            *("-t", "synthetic-memory", "-s", "truncation", "-b", "512 1k 2k"),
            *("--task-option", "items=4", "--task-option", "history_tokens=1500"),
            *("-j", "2", "--no-report", "--display", "plain", "-o", str(out)),
        ]
    )
    process.send_signal(signal.SIGINT)
    first = ""
    for line in process.stderr:  # said at once (a cell that finished just then may print first)
        seen.append(line)
        if line.startswith("interrupted:"):
            first = line
            break
    process.send_signal(signal.SIGINT)
    try:
        code = process.wait(timeout=15)
    except subprocess.TimeoutExpired:
        process.kill()
        raise AssertionError("a double Ctrl-C did not stop the run within 15 s: " + "".join(seen)) from None
    rest = process.stderr.read()
    assert code == 130, "".join(seen) + rest
    assert "interrupted: sending no more model calls" in first and "Ctrl-C again" in first, first
    assert "stopped: finished rows are saved" in rest
    assert not Path(f"/proc/{process.pid}").exists()  # the process, and the server in it, is gone
    results = [r for r in final_rows(out).values() if r["event"] == "result"]
    assert results and all(r["served_prompt_tokens"] == r["prompt_tokens"] for r in results)


@pytest.mark.slow
def test_a_call_longer_than_the_timeout_finishes_on_the_embedded_model():
    backend = LocalBackend(timeout_s=120.0)
    backend.start()
    try:
        caller = ModelCaller(backend, None, 1, retries=0, timeout_s=0.001)  # no call could fit in it
        long_prompt = [Message("user", " ".join(f"Note {i}: the key is in drawer {i % 7}." for i in range(300)))]
        outcome = caller.call(long_prompt, GenerationParams(32, 0.0, 0))
    finally:
        backend.stop()
    assert outcome.attempts == 1 and outcome.completion.prompt_tokens and outcome.completion.prompt_tokens > 2000
    assert backend.watch.longest_step_s > 0  # its prompt steps were seen and measured
