"""A fault-injecting OpenAI-compatible chat server on loopback, for tests of the harness
and of plugins (``budgetbench_core.testing.FaultServer``).

It answers ``POST /v1/chat/completions`` like a tiny deterministic model, except that a
configurable share of requests get a fault: 500, 429 with Retry-After, 400 (a request the
server refuses: not retried), a dropped connection, a hang past the client's timeout, a
reply trickled a byte at a time, malformed JSON, a truncated body, empty or null
content, a missing usage block, or a usage block that disagrees with the prompt. Which request gets
which fault is decided by a hash of (seed, request body, how often that body was seen),
so a run is reproducible whatever the thread scheduling. Every request is recorded
(time, body hash, fault, prompt tokens, auth header) for the tests to check against
the run directory.
"""

from __future__ import annotations

import hashlib
import json
import random
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

FAULTS = ("500", "429", "close", "hang", "malformed", "truncated", "empty", "null_content", "usage_mismatch")
# Opt-in faults, not drawn unless named in ``faults``: a refused request, a reply that
# trickles (each byte within any per-read timeout, the whole past any sane deadline),
# and a reply without a usage block.
EXTRA_FAULTS = ("400", "trickle", "no_usage")
# Faults after which the client never gets a usable completion for that attempt.
NO_COMPLETION = frozenset({"500", "429", "400", "close", "hang", "malformed", "truncated", "null_content"})
USAGE_OFFSET = 17  # what a "usage_mismatch" reply adds to the true prompt count


def messages_hash(messages: list[dict[str, Any]]) -> str:
    """Hash of the chat messages as sent (role and content only)."""
    payload = json.dumps([{"role": m["role"], "content": m["content"]} for m in messages], ensure_ascii=False)
    return hashlib.sha256(payload.encode("utf-8", "surrogatepass")).hexdigest()


def default_reply(messages: list[dict[str, Any]]) -> str:
    """A deterministic 'model': a capitalised word from the user's messages, chosen by the prompt hash."""
    words = sorted(
        {
            w.strip(".,!?'")
            for m in messages
            if m["role"] == "user"
            for w in m["content"].split()
            if w[:1].isupper() and w.strip(".,!?'").isalpha()
        }
    )
    if not words:
        return "unknown"
    return words[int(messages_hash(messages)[:8], 16) % len(words)]


def send_headers(
    handler: BaseHTTPRequestHandler, status: int, length: int, headers: dict[str, str] | None = None
) -> None:
    """Status line and headers of a JSON reply of ``length`` bytes (the body is the caller's)."""
    handler.send_response(status)
    handler.send_header("Content-Type", "application/json")
    handler.send_header("Content-Length", str(length))
    for key, value in (headers or {}).items():
        handler.send_header(key, value)
    handler.end_headers()


def send_json(
    handler: BaseHTTPRequestHandler, status: int, payload: Any, headers: dict[str, str] | None = None
) -> None:
    """A whole JSON reply."""
    data = json.dumps(payload).encode()
    send_headers(handler, status, len(data), headers)
    handler.wfile.write(data)


@dataclass
class Request:
    time: float
    body_hash: str
    fault: str | None
    prompt_tokens: int | None
    authorization: str | None
    status: int | None = None


class _QuietServer(ThreadingHTTPServer):
    """Clients that give up (timeouts, a killed runner) reset connections: not worth a traceback."""

    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        if not isinstance(sys.exc_info()[1], (ConnectionResetError, BrokenPipeError)):
            super().handle_error(request, client_address)


@dataclass
class FaultServer:
    """``with FaultServer(rate=0.2) as server:`` then point clients at ``server.url``.

    ``rate`` is the share of requests that get a fault, drawn uniformly from ``faults``.
    ``count_prompt(messages)`` gives the true prompt size for the usage block.
    ``hang_s`` must exceed the client's timeout. ``latency_s`` delays every healthy reply.
    ``echo_auth_in_errors`` makes error bodies quote the Authorization header, as some
    providers quote (part of) a wrong key back. ``trickle_s`` is the pause between bytes
    of a ``trickle`` reply. ``rate=1.0`` with one fault makes every request fail that way.
    ``routes`` answers other endpoints (``{"/api/tags": (200, {...})}``, any method; a callable
    giving that pair is asked per request, e.g. a llama.cpp ``/slots`` that moves) and
    ``route_default``, when given, answers every other path too, chat included (a provider
    that refuses every key). ``hits`` lists ``(method, path)`` of every request.
    """

    rate: float = 0.0
    faults: tuple[str, ...] = FAULTS
    seed: int = 0
    retry_after_s: float = 1.0
    hang_s: float = 3.0
    latency_s: float = 0.0
    count_prompt: Callable[[list[dict[str, Any]]], int] | None = None
    reply: Callable[[list[dict[str, Any]]], str] = default_reply
    echo_auth_in_errors: bool = False
    trickle_s: float = 0.5
    routes: dict[str, tuple[int, Any] | Callable[[], tuple[int, Any]]] = field(default_factory=dict)
    route_default: tuple[int, Any] | None = None
    requests: list[Request] = field(default_factory=list)
    hits: list[tuple[str, str]] = field(default_factory=list)

    def __post_init__(self) -> None:
        unknown = set(self.faults) - set(FAULTS) - set(EXTRA_FAULTS)
        if unknown:
            raise ValueError(f"unknown faults {sorted(unknown)}; known: {FAULTS + EXTRA_FAULTS}")
        self._seen: Counter[str] = Counter()
        self._lock = threading.Lock()
        self._release = threading.Event()
        self._httpd: ThreadingHTTPServer | None = None

    # ------------------------------------------------------------------ lifecycle

    def __enter__(self) -> FaultServer:
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            disable_nagle_algorithm = True  # else the body waits for a delayed ACK: 40 ms per reply

            def log_message(self, *args: Any) -> None:  # keep test output quiet
                pass

            def do_GET(self) -> None:
                if not server._routed(self):
                    send_json(self, 200, {"object": "list", "data": [{"id": "fault-model", "object": "model"}]})

            def do_POST(self) -> None:
                if not server._routed(self):
                    server._handle(self)

        self._httpd = _QuietServer(("127.0.0.1", 0), Handler)
        # stop() waits until the loop next looks (0.5 s by default)
        self._thread = threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._release.set()  # wake hanging handlers
        assert self._httpd is not None
        self._httpd.shutdown()
        self._httpd.server_close()

    @property
    def port(self) -> int:
        assert self._httpd is not None
        return int(self._httpd.server_address[1])

    @property
    def base_url(self) -> str:
        """``http://127.0.0.1:<port>``, for clients that add their own paths (Ollama's ``/api``)."""
        assert self._httpd is not None
        return f"http://127.0.0.1:{self._httpd.server_address[1]}"

    @property
    def url(self) -> str:
        """The OpenAI-compatible base, ``.../v1``."""
        return self.base_url + "/v1"

    def completions(self) -> int:
        """How many chat-completion requests arrived (whatever was answered)."""
        return sum(1 for _, path in self.hits if path.endswith("/chat/completions"))

    def _routed(self, handler: BaseHTTPRequestHandler) -> bool:
        """Record the request; answer it from ``routes`` (or ``route_default``) when one applies."""
        with self._lock:
            self.hits.append((handler.command, handler.path))
        answer = self.routes.get(handler.path, self.route_default)
        if answer is None:
            return False
        if callable(answer):
            answer = answer()
        length = int(handler.headers.get("Content-Length") or 0)
        if length:
            handler.rfile.read(length)
        send_json(handler, *answer)
        return True

    # ------------------------------------------------------------------ requests

    def _choose_fault(self, body_hash: str) -> str | None:
        with self._lock:
            self._seen[body_hash] += 1
            nth = self._seen[body_hash]
        rng = random.Random(f"{self.seed}:{body_hash}:{nth}")
        if rng.random() >= self.rate:
            return None
        return rng.choice(self.faults)

    def _completion(self, content: str | None, prompt_tokens: int | None, usage: bool = True) -> dict:
        reply: dict[str, Any] = {
            "id": "chatcmpl-fault",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": "fault-model",
            "choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": content}}],
        }
        if usage:
            reply["usage"] = {
                "prompt_tokens": prompt_tokens or 0,
                "completion_tokens": 1 if content else 0,
                "total_tokens": (prompt_tokens or 0) + (1 if content else 0),
            }
        return reply

    def _handle(self, handler: BaseHTTPRequestHandler) -> None:
        length = int(handler.headers.get("Content-Length") or 0)
        body = json.loads(handler.rfile.read(length) or b"{}")
        messages = body.get("messages") or []
        body_hash = messages_hash(messages)
        fault = self._choose_fault(body_hash)
        prompt_tokens = self.count_prompt(messages) if self.count_prompt else None
        record = Request(time.time(), body_hash, fault, prompt_tokens, handler.headers.get("Authorization"))
        with self._lock:
            self.requests.append(record)
        error_detail = f"injected {fault}"
        if self.echo_auth_in_errors:
            error_detail += f"; you sent Authorization: {record.authorization}"
        try:
            if fault == "500":
                record.status = 500
                send_json(handler, 500, {"error": {"message": error_detail, "type": "server_error"}})
            elif fault == "429":
                record.status = 429
                send_json(
                    handler,
                    429,
                    {"error": {"message": error_detail, "type": "rate_limit"}},
                    {"Retry-After": f"{self.retry_after_s:g}"},
                )
            elif fault == "400":
                record.status = 400
                send_json(handler, 400, {"error": {"message": error_detail, "type": "invalid_request_error"}})
            elif fault == "trickle":
                record.status = 200
                data = json.dumps(self._completion(self.reply(messages), prompt_tokens)).encode()
                send_headers(handler, 200, len(data))
                for index in range(len(data)):
                    if self._release.wait(self.trickle_s):
                        break
                    handler.wfile.write(data[index : index + 1])
                    handler.wfile.flush()
                handler.close_connection = True
            elif fault == "close":
                handler.close_connection = True  # no status line at all
            elif fault == "hang":
                self._release.wait(self.hang_s)
                handler.close_connection = True
            elif fault == "malformed":
                record.status = 200
                data = b'{"id": "chatcmpl-fault", "choices": [{"message": {"content": "Paris"'  # cut JSON
                data += b", oops}}"
                send_headers(handler, 200, len(data))
                handler.wfile.write(data)
            elif fault == "truncated":
                record.status = 200
                data = json.dumps(self._completion(self.reply(messages), prompt_tokens)).encode()
                send_headers(handler, 200, len(data))
                handler.wfile.write(data[: len(data) // 2])
                handler.wfile.flush()
                handler.close_connection = True
            else:
                if self.latency_s:
                    time.sleep(self.latency_s)
                content = {"empty": "", "null_content": None}.get(fault or "", self.reply(messages))
                served = prompt_tokens
                if fault == "usage_mismatch" and prompt_tokens is not None:
                    served = prompt_tokens + USAGE_OFFSET
                record.status = 200
                send_json(handler, 200, self._completion(content, served, usage=fault != "no_usage"))
        except (BrokenPipeError, ConnectionResetError):
            handler.close_connection = True  # the client gave up (timeout): nothing to send

    # ------------------------------------------------------------------ summaries

    def by_hash(self) -> dict[str, list[Request]]:
        grouped: dict[str, list[Request]] = {}
        for request in sorted(self.requests, key=lambda r: r.time):
            grouped.setdefault(request.body_hash, []).append(request)
        return grouped

    def fault_counts(self) -> Counter[str]:
        return Counter(r.fault or "ok" for r in self.requests)
