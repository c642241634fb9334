"""The direct OpenAI-compatible client and litellm classify every failure alike.

Loopback ``openai/`` servers are called with a direct aiohttp client awaited on the shared
event loop, everything else through litellm on a thread (``builtin/litellm_backend.py``).
Both share one classification; these tests make the same faulty replies reach both paths
and compare what the backend raises or returns, then what the harness makes of it
(``ModelCaller``: the async path against the sync one, deadlines included), and run the
thousand-call fault-injection matrix through litellm as well (the matrix in
test_reliability_faults.py runs on the direct client, the default for loopback servers).
"""

from __future__ import annotations

import json
import os
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

from budgetbench_core import GenerationParams, Message  # noqa: E402
from budgetbench_core.builtin.litellm_backend import LiteLLMBackend  # noqa: E402
from budgetbench_core.failfast import FailFast  # noqa: E402
from budgetbench_core.model_calls import CallFailed, ModelCaller  # noqa: E402
from budgetbench_core.testing import EXTRA_FAULTS, FAULTS, FaultServer  # noqa: E402

MESSAGES = [Message("user", "What is the capital of France?")]


def outcome(backend: LiteLLMBackend) -> tuple:
    """What a call came to: the completion's fields, or the exception's class, Retry-After and 429 tag."""
    try:
        c = backend.complete(MESSAGES, GenerationParams(8, 0.0, 1))
        return ("ok", c.text, c.prompt_tokens, c.completion_tokens, c.cached_tokens, c.model, c.cost)
    except Exception as exc:  # noqa: BLE001 - the classification is what is compared
        return (type(exc).__name__, getattr(exc, "retry_after", None), "[429]" in str(exc))


def both(url: str, monkeypatch) -> dict[str, tuple]:
    results = {}
    for client in ("litellm", "direct"):
        if client == "litellm":
            monkeypatch.setenv("BUDGETBENCH_HTTP_CLIENT", "litellm")
        else:
            monkeypatch.delenv("BUDGETBENCH_HTTP_CLIENT", raising=False)
        backend = LiteLLMBackend("openai/fault-model", api_base=url, timeout_s=1.5)
        assert backend.http_client == client and backend.describe()["http_client"] == client
        results[client] = outcome(backend)
    return results


@pytest.mark.parametrize("fault", [*FAULTS, *EXTRA_FAULTS, None])
def test_both_clients_treat_each_injected_fault_alike(fault, monkeypatch):
    with FaultServer(
        rate=1.0 if fault else 0.0,
        faults=(fault,) if fault else FAULTS,
        hang_s=3.0,
        trickle_s=0.05,
        retry_after_s=0.7,
        count_prompt=lambda messages: 17,
    ) as server:
        results = both(server.url, monkeypatch)
    assert results["direct"] == results["litellm"], results
    expected = {
        "500": "TransportError",
        "429": "TransportError",
        "close": "TransportError",
        "hang": "TransportError",
        "malformed": "TransportError",
        "truncated": "TransportError",
        "null_content": "ResponseError",
        "400": "ResponseError",
    }.get(fault, "ok")
    assert results["direct"][0] == expected


class _StatusServer(ThreadingHTTPServer):
    """Answers every request with one HTTP status and an OpenAI-style error body."""

    daemon_threads = True

    def __init__(self, status: int) -> None:
        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def do_POST(self):
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                body = json.dumps({"error": {"message": f"status {status}", "type": "x", "code": status}}).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        super().__init__(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.serve_forever, daemon=True).start()


def harness_outcome(backend: LiteLLMBackend) -> tuple:
    """What the harness made of one call with no retry: the reply, or the failure's attempts and
    whether fail fast took it for a refusal."""
    fail_fast = FailFast()
    caller = ModelCaller(backend, None, 4, retries=0, fail_fast=fail_fast)
    try:
        c = caller.call(MESSAGES, GenerationParams(8, 0.0, 1)).completion
        return ("ok", c.text, c.prompt_tokens, c.completion_tokens)
    except CallFailed as exc:
        return ("failed", exc.attempts, fail_fast.fatal, "transport error" in str(exc))


@pytest.mark.parametrize("fault", ["500", "429", "close", "hang", "trickle", "malformed", "null_content", "400", None])
def test_the_harness_treats_each_fault_alike_on_the_async_and_the_sync_path(fault, monkeypatch):
    """The direct client is awaited on the event loop, litellm runs on a sandbox thread; a
    hang and a trickle are cut by the same total deadline on both."""
    results = {}
    for client in ("litellm", "direct"):
        with FaultServer(
            rate=1.0 if fault else 0.0,
            faults=(fault,) if fault else FAULTS,
            hang_s=3.0,
            trickle_s=0.2,
            count_prompt=lambda messages: 17,
        ) as server:
            if client == "litellm":
                monkeypatch.setenv("BUDGETBENCH_HTTP_CLIENT", "litellm")
            else:
                monkeypatch.delenv("BUDGETBENCH_HTTP_CLIENT", raising=False)
            backend = LiteLLMBackend("openai/fault-model", api_base=server.url, timeout_s=1.5)
            assert backend.async_calls() is (client == "direct")
            results[client] = harness_outcome(backend)
    assert results["direct"] == results["litellm"], results
    transport = fault in ("500", "429", "close", "hang", "trickle", "malformed")
    assert results["direct"][0] == ("ok" if fault is None else "failed")
    if fault:
        assert results["direct"] == ("failed", 1, False, transport)


@pytest.mark.parametrize(
    "status,expected",
    [
        (401, "FatalError"),
        (404, "FatalError"),
        (403, "ResponseError"),
        (422, "ResponseError"),
        (503, "TransportError"),
        (408, "TransportError"),
    ],
)
def test_both_clients_treat_each_error_status_alike(status, expected, monkeypatch):
    server = _StatusServer(status)
    try:
        results = both(f"http://127.0.0.1:{server.server_address[1]}/v1", monkeypatch)
    finally:
        server.shutdown()
        server.server_close()
    assert results["direct"] == results["litellm"], results
    assert results["direct"][0] == expected


@pytest.mark.slow
def test_the_fault_matrix_through_litellm(tmp_path, monkeypatch):
    """The thousand-call matrix again, every call through litellm."""
    import test_reliability_faults

    monkeypatch.setenv("BUDGETBENCH_HTTP_CLIENT", "litellm")
    test_reliability_faults.test_thousand_calls_with_injected_faults(tmp_path)


def test_both_clients_treat_a_refused_connection_alike(monkeypatch):
    import socket

    with socket.socket() as sock:  # a port nobody listens on once this closes
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    results = both(f"http://127.0.0.1:{port}/v1", monkeypatch)
    assert results["direct"] == results["litellm"] == ("TransportError", None, False), results
