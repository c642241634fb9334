"""mem0 in its real mode (``infer=True``: LLM fact extraction) on the embedded model, through the
harness's metering gateway: every extraction call is in the ledger under ``write``, call for
call equal to what the model server was sent.

The embedded llama.cpp server sits behind a loopback forwarder that keeps the server's request
log: each request's messages and what the server replied (usage, or its refusal). mem0 2.2.1's
extraction prompt is ~8,700 tokens, of which 8,616 are its fixed instructions (system prompt and
empty sections), so short sessions do not make it fit SmolLM2-135M's trained 8,192; llama.cpp's
server caps a slot there unless RoPE scaling is configured. The model is served as
``local@16384`` (YaRN, factor 2), and every extraction request must be answered (four sessions:
four ~8.7k-token prompts). The server may reuse a cached prompt prefix (``server_prompt_cache``):
mem0's instructions open every prompt, so only the first call processes them.
"""

from __future__ import annotations

import json
import threading
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from budgetbench_strategy_mem0.plugin import GATEWAY, through_gateway

from budgetbench_core import Message, PromptCounter, RunConfig, final_rows, iter_events, run
from budgetbench_core.testing import embedded_model_file, invoke_cli, registered, tokenizer_for

EXTRACTION_MODEL = "local@16384"  # the embedded model with YaRN: a slot holds mem0's ~8.7k-token prompt


class RequestLog:
    """Forwards every request to ``upstream`` and logs (path, request body, reply body)."""

    def __init__(self, upstream: str) -> None:
        self.entries: list[tuple[str, dict, dict]] = []
        log = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:
                pass

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                request = urllib.request.Request(
                    upstream + self.path, data=body, headers={"Content-Type": "application/json"}
                )
                try:
                    with urllib.request.urlopen(request, timeout=900) as reply:
                        data, status = reply.read(), reply.status
                except urllib.error.HTTPError as refused:  # the server's refusal is in its log too
                    data, status = refused.read(), refused.code
                log.entries.append((self.path, json.loads(body), json.loads(data)))
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def test_the_llm_block_points_at_the_gateway_only_where_the_user_named_no_service():
    url = "http://127.0.0.1:5/t/token/v1"
    assert through_gateway(None, url)["config"]["openai_base_url"] == url
    mine = {"provider": "openai", "config": {"model": "m", "max_tokens": 8}}
    assert through_gateway(mine, url)["config"] == {"model": "m", "max_tokens": 8, "openai_base_url": url}
    ollama = {"provider": "ollama", "config": {"model": "q", "ollama_base_url": "http://127.0.0.1:11434"}}
    assert through_gateway(ollama, url) is ollama and through_gateway(mine, None) is mine


def test_infer_needs_no_llm_block_in_a_worker_of_a_run_with_a_model(monkeypatch):
    from budgetbench_strategy_mem0 import Mem0

    monkeypatch.setenv(GATEWAY, "http://127.0.0.1:5/t/secret-token/v1")
    system = Mem0(infer=True)
    assert system.llm["config"]["openai_base_url"].endswith("/t/secret-token/v1")
    assert "secret-token" not in json.dumps(system.describe())  # the token never reaches the manifest


@pytest.mark.slow
@pytest.mark.timeout(3600)
def test_mem0_infer_extraction_calls_are_the_ledgers_write_calls_call_for_call(tmp_path):
    counter = PromptCounter(tokenizer_for(f"gguf:{embedded_model_file()}"))
    out = tmp_path / "run"
    backend = registered("backend", "local").obj(
        EXTRACTION_MODEL, max_context=16384, max_concurrency=1, server_prompt_cache=True
    )
    backend.start()
    log = RequestLog(backend.server_url)
    try:
        run(
            RunConfig(
                task="synthetic-memory",
                strategies=["mem0"],
                budgets=[512],
                out=out,
                model="openai/local-model",
                api_base=log.url + "/v1",
                tokenizer=f"gguf:{embedded_model_file()}",
                task_options={"items": 1, "history_tokens": 400},
                strategy_params={
                    "mem0": {
                        "infer": True,
                        "retries": 0,
                        "top_k": 5,
                        "llm": {"provider": "openai", "config": {"model": "extractor", "max_tokens": 256}},
                    }
                },
                max_concurrency=1,
                retries=0,
                timeout_s=900.0,
                item_timeout_s=3600.0,  # four ~8.7k-token extractions on two shared cores
                server_prompt_cache=True,
            )
        )
    finally:
        log.close()
        backend.stop()
    (row,) = final_rows(out).values()
    answers = [
        [m["content"] for m in e["messages"]] for e in iter_events(out) if e["event"] == "prompt_audit"
    ]  # the harness's own call, if the cell got that far
    log_entries = [
        (counter.count([Message(m["role"], m["content"]) for m in body["messages"]]), reply)
        for path, body, reply in log.entries
        if path.endswith("/chat/completions") and [m["content"] for m in body["messages"]] not in answers
    ]
    metered = [e for e in iter_events(out) if e["event"] == "metered_call"]
    assert metered and {e["phase"] for e in metered} == {"write"}  # extraction happens while it ingests
    assert len(metered) == len(log_entries) >= 1  # call for call: every request the server saw is a row
    answered = [(tokens, reply["usage"]) for tokens, reply in log_entries if "usage" in reply]
    assert [reply for _, reply in log_entries if "usage" not in reply] == []  # every extraction was answered
    assert all(tokens > 8192 for tokens, _ in answered)  # each past the model's trained context
    assert all(e["ok"] for e in metered)
    assert sorted((e["input_tokens"], e["served_prompt_tokens"], e["completion_tokens"]) for e in metered) == sorted(
        (tokens, usage["prompt_tokens"], usage["completion_tokens"]) for tokens, usage in answered
    )  # our exact count is the server's, and its completion tokens are the ledger's
    assert all(usage["completion_tokens"] > 0 for _, usage in answered)  # replies, not refusals
    write = row["metered"]["write"]
    assert write["calls"] == len(answered)
    assert write["input_tokens"] == sum(tokens for tokens, _ in answered)
    assert write["completion_tokens"] == sum(usage["completion_tokens"] for _, usage in answered)
    assert write["cpu_s"] > 0  # the worker's own CPU while it ingested
    written = invoke_cli("report", str(out), "--format", "json")  # the public way to write a report
    assert written.exit_code == 0, written.output
    (ledger,) = json.loads((out / "report" / "report.json").read_text())["ledger"]
    assert ledger["metered_write_calls"] == len(answered)
    assert ledger["metered_write_input_tokens"] == write["input_tokens"]
