"""The metering gateway: a loopback OpenAI-compatible endpoint every plugin model call goes through.

A plugin's own SDK (mem0's ``llm``/``embedder`` blocks, an OpenAI client) is pointed at this
endpoint instead of at the model, so its calls cannot bypass the harness: each one is counted
exactly by the harness's counter, budget-checked when its grant carries a budget, forwarded
through the harness's model caller, and reported to ``on_call`` as one plain ``CallRecord``
naming the cell and phase it belongs to. What the server's usage block says is recorded next to
our own count, and missing figures stay ``None``.

Who is calling is an unguessable token the harness hands out per cell and phase (``grant``) and
takes back (``revoke``): in the path (``/t/<token>/v1/...``) or as the bearer API key on plain
``/v1/...`` paths, which is how OpenAI SDKs send ``api_key``. A request with no live token is
refused with 403 and recorded: a request that arrives after ``revoke`` is never forwarded.
Every request gets exactly one record, except a successful ``GET /v1/models``, which reaches
no model.
"""

from __future__ import annotations

import base64
import json
import secrets
import struct
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from ..backends import Completion, GenerationParams
from ..messages import CHAT_ROLES, Message

PHASES = ("write", "read", "answer", "aux", "judge", "user")
MAX_BODY = 64 * 1024 * 1024  # a 1M-token prompt is ~4 MB of JSON
# Request fields that change what kind of reply comes back: refused, never silently dropped.
REFUSED_FIELDS = ("tools", "functions", "tool_choice", "function_call", "logprobs", "top_logprobs")
# Fields the gateway reads; any other field is accepted, not forwarded, and listed in ``ignored``.
CHAT_FIELDS = ("model", "messages", "max_tokens", "max_completion_tokens", "temperature", "seed", "stream", "n")
EMBEDDING_FIELDS = ("model", "input", "encoding_format")
NO_RETRY = {"x-should-retry": "false"}  # OpenAI SDKs obey it: the harness has already retried

Forward = Callable[[tuple[Message, ...], GenerationParams], Completion]
Embed = Callable[[list[str]], Sequence[Sequence[float]]]


@dataclass(frozen=True)
class Grant:
    """What a token stands for: the cell (plain data the harness chose), the phase, a budget."""

    cell: str
    phase: str
    budget: int | None


@dataclass(frozen=True)
class CallRecord:
    """One request to the gateway, for the cost ledger (``time``: when it arrived).

    ``kind``: ``call`` (forwarded; ``ok`` says whether a reply came back), ``violation`` (over
    the grant's budget, not sent), ``refused`` (no live token), ``invalid`` (a request the
    gateway does not serve), ``error`` (the harness failed before sending). ``input_tokens`` is
    our exact count; ``served_prompt_tokens`` and ``completion_tokens`` are the reply's usage.
    """

    time: float
    kind: str
    token: str | None
    cell: str | None
    phase: str | None
    budget: int | None
    endpoint: str
    model: str | None
    input_tokens: int | None
    served_prompt_tokens: int | None
    completion_tokens: int | None
    latency_s: float
    ok: bool
    status: int
    error: str | None
    ignored: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["ignored"] = list(self.ignored)
        return out


class _Refusal(Exception):
    """A request answered with an error status, recorded as ``kind``."""

    def __init__(self, status: int, kind: str, message: str, error_type: str = "invalid_request_error") -> None:
        super().__init__(message)
        self.status = status
        self.kind = kind
        self.error_type = error_type


@dataclass
class _Request:
    """What is known about a request so far, for its record."""

    started: float
    wall: float
    endpoint: str
    token: str | None = None
    grant: Grant | None = None
    model: str | None = None
    input_tokens: int | None = None
    ignored: tuple[str, ...] = ()


class MeteringGateway:
    """``forward`` is the harness's model caller, ``count`` the exact prompt counter, ``on_call``
    receives every ``CallRecord``. ``embed`` (optional) answers ``/v1/embeddings`` and
    ``count_text`` counts its inputs. ``model`` is the name ``/v1/models`` lists;
    ``default_max_tokens`` applies when a request gives none.
    """

    def __init__(
        self,
        forward: Forward,
        count: Callable[[Sequence[Message]], int],
        on_call: Callable[[CallRecord], None],
        *,
        embed: Embed | None = None,
        count_text: Callable[[str], int] | None = None,
        model: str = "budgetbench",
        default_max_tokens: int = 512,
    ) -> None:
        self.forward = forward
        self.count = count
        self.on_call = on_call
        self.embed = embed
        self.count_text = count_text
        self.model = model
        self.default_max_tokens = default_max_tokens
        self._grants: dict[str, Grant] = {}
        self._lock = threading.Lock()
        self._sending: dict[str, int] = {}  # token -> its calls being forwarded now
        self._sent = threading.Condition(self._lock)  # told when one of them is recorded
        self._server: ThreadingHTTPServer | None = None
        self._stopped = False
        self._replies = 0

    # ------------------------------------------------------------------ grants

    def grant(self, cell: str, phase: str, budget: int | None = None, token: str | None = None) -> str:
        """A new token for ``cell`` and ``phase`` (or ``token`` again, bound to them now: a plugin's
        SDK keeps the key it was built with); calls with it are attributed to them."""
        if phase not in PHASES:
            raise ValueError(f"unknown phase {phase!r}; phases are {', '.join(PHASES)}")
        if budget is not None and (isinstance(budget, bool) or not isinstance(budget, int) or budget <= 0):
            raise ValueError(f"budget must be a positive int or None, got {budget!r}")
        token = token or secrets.token_urlsafe(24)
        with self._lock:
            self._grants[token] = Grant(str(cell), phase, budget)
        return token

    def revoke(self, token: str) -> None:
        """No request with ``token`` that arrives after this is forwarded: it gets 403, and so
        does one whose prompt was still being counted. A call already being forwarded is waited
        for (it is bounded by the run's call timeout) and recorded before this returns: its
        cost is its cell's, whose row is not written yet."""
        with self._lock:
            self._grants.pop(token, None)
            while self._sending.get(token):
                self._sent.wait()

    @contextmanager
    def _sending_call(self, request: _Request) -> Iterator[None]:
        """Forward and record under ``request``'s grant, or refuse it if revoked meanwhile."""
        with self._lock:
            if self._stopped or request.token is None or request.token not in self._grants:
                raise _Refusal(403, "refused", "the token was revoked before the call was sent", "permission_denied")
            self._sending[request.token] = self._sending.get(request.token, 0) + 1
        try:
            yield
        finally:
            with self._lock:
                self._sending[request.token] -= 1
                if not self._sending[request.token]:
                    del self._sending[request.token]
                self._sent.notify_all()

    def _live(self, token: str | None) -> Grant | None:
        with self._lock:
            return None if self._stopped or token is None else self._grants.get(token)

    # ------------------------------------------------------------------ serving

    def start(self) -> str:
        """Serve on a free loopback port; returns the base URL (``http://127.0.0.1:<port>``)."""
        if self._server is not None:
            return self.base_url
        self._server = _Server(("127.0.0.1", 0), _handler(self))
        # stop() waits until the loop next looks (0.5 s by default): at the end of every run
        serve = {"poll_interval": 0.02}
        threading.Thread(target=self._server.serve_forever, kwargs=serve, name="metering-gateway", daemon=True).start()
        return self.base_url

    def stop(self) -> None:
        """Stop serving; from now on every request, even on an open connection, is refused."""
        with self._lock:
            self._stopped = True
            self._grants.clear()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()

    @property
    def base_url(self) -> str:
        if self._server is None:
            raise RuntimeError("the gateway is not started")
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def url_for(self, token: str) -> str:
        """The OpenAI ``base_url`` for a plugin holding ``token``."""
        return f"{self.base_url}/t/{token}/v1"

    # ------------------------------------------------------------------ requests

    def handle(
        self, method: str, path: str, authorization: str | None, body: bytes
    ) -> tuple[int, dict[str, Any], dict[str, str]]:
        """One request: (status, JSON reply, extra headers). The HTTP layer only carries bytes."""
        token, route = _route(path, authorization)
        request = _Request(time.perf_counter(), time.time(), _ENDPOINTS.get((method, route), route or path), token)
        try:
            request.grant = self._live(token)
            if request.grant is None:
                raise _Refusal(403, "refused", _refusal_reason(token, self._stopped), "permission_denied")
            if (method, route) == ("GET", "/v1/models"):
                return (
                    200,
                    {"object": "list", "data": [{"id": self.model, "object": "model", "owned_by": "budgetbench"}]},
                    {},
                )
            if (method, route) == ("POST", "/v1/chat/completions"):
                return self._chat(request, _json_object(body))
            if (method, route) == ("POST", "/v1/embeddings"):
                return self._embeddings(request, _json_object(body))
            raise _Refusal(404, "invalid", f"{method} {route or path} is not served here", "not_found")
        except _Refusal as refusal:
            self._record(request, refusal.kind, False, refusal.status, str(refusal))
            error = {"message": str(refusal), "type": refusal.error_type}
            return refusal.status, {"error": error}, NO_RETRY

    def _chat(self, request: _Request, body: dict[str, Any]) -> tuple[int, dict[str, Any], dict[str, str]]:
        request.model = body.get("model") if isinstance(body.get("model"), str) else None
        request.ignored = tuple(sorted(k for k in body if k not in CHAT_FIELDS))
        if body.get("stream"):
            raise _Refusal(400, "invalid", "stream is not supported by the BudgetBench gateway: send stream=false")
        refused = [k for k in REFUSED_FIELDS if body.get(k)]
        if refused or body.get("n", 1) != 1:
            what = ", ".join(refused) or f"n={body.get('n')!r}"
            raise _Refusal(400, "invalid", f"{what} is not supported by the BudgetBench gateway (plain chat only)")
        messages = _messages(body.get("messages"))
        params = _params(body, self.default_max_tokens)
        assert request.grant is not None
        try:
            request.input_tokens = self.count(messages)
        except Exception as exc:
            raise _Refusal(500, "error", f"the harness could not count the prompt: {exc}", "server_error") from None
        budget = request.grant.budget
        if budget is not None and request.input_tokens > budget:
            raise _Refusal(
                400,
                "violation",
                f"the prompt has {request.input_tokens} tokens, over the budget of {budget}; it was not sent",
                "budget_exceeded",
            )
        with self._sending_call(request):  # refused if revoked while the prompt was counted
            try:
                completion = self.forward(messages, params)
            except Exception as exc:
                self._record(request, "call", False, 502, f"{type(exc).__name__}: {exc}")
                return 502, {"error": {"message": f"the model call failed: {exc}", "type": "upstream_error"}}, NO_RETRY
            self._record(request, "call", True, 200, None, completion.prompt_tokens, completion.completion_tokens)
        with self._lock:
            self._replies += 1
            number = self._replies
        reply: dict[str, Any] = {
            "id": f"chatcmpl-budgetbench-{number}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": request.model or self.model,
            "choices": [
                {"index": 0, "message": {"role": "assistant", "content": completion.text}, "finish_reason": "stop"}
            ],
        }
        if completion.prompt_tokens is not None and completion.completion_tokens is not None:
            reply["usage"] = {
                "prompt_tokens": completion.prompt_tokens,
                "completion_tokens": completion.completion_tokens,
                "total_tokens": completion.prompt_tokens + completion.completion_tokens,
            }
        return 200, reply, {}

    def _embeddings(self, request: _Request, body: dict[str, Any]) -> tuple[int, dict[str, Any], dict[str, str]]:
        request.model = body.get("model") if isinstance(body.get("model"), str) else None
        request.ignored = tuple(sorted(k for k in body if k not in EMBEDDING_FIELDS))
        if self.embed is None:
            raise _Refusal(
                501,
                "invalid",
                "this run serves no embedding model: /v1/embeddings is not available through the gateway",
                "not_implemented",
            )
        texts = _texts(body.get("input"))
        encoding = body.get("encoding_format") or "float"
        if encoding not in ("float", "base64"):
            raise _Refusal(400, "invalid", f"encoding_format must be 'float' or 'base64', got {encoding!r}")
        if self.count_text is not None:
            request.input_tokens = sum(self.count_text(text) for text in texts)
        with self._sending_call(request):
            try:
                vectors = [list(map(float, vector)) for vector in self.embed(texts)]
            except Exception as exc:
                self._record(request, "call", False, 502, f"{type(exc).__name__}: {exc}")
                message = f"the embedding call failed: {exc}"
                return 502, {"error": {"message": message, "type": "upstream_error"}}, NO_RETRY
            if len(vectors) != len(texts):
                message = f"the embedding model returned {len(vectors)} vectors for {len(texts)} inputs"
                self._record(request, "call", False, 502, message)
                return 502, {"error": {"message": message, "type": "upstream_error"}}, NO_RETRY
            self._record(request, "call", True, 200, None, completion_tokens=0)
        data = [
            {"object": "embedding", "index": i, "embedding": _encoded(vector, encoding)}
            for i, vector in enumerate(vectors)
        ]
        reply: dict[str, Any] = {"object": "list", "data": data, "model": request.model or self.model}
        if request.input_tokens is not None:
            reply["usage"] = {"prompt_tokens": request.input_tokens, "total_tokens": request.input_tokens}
        return 200, reply, {}

    def _record(
        self,
        request: _Request,
        kind: str,
        ok: bool,
        status: int,
        error: str | None,
        served: int | None = None,
        completion_tokens: int | None = None,
    ) -> None:
        grant = request.grant
        self.on_call(
            CallRecord(
                time=request.wall,
                kind=kind,
                token=request.token,
                cell=grant.cell if grant else None,
                phase=grant.phase if grant else None,
                budget=grant.budget if grant else None,
                endpoint=request.endpoint,
                model=request.model,
                input_tokens=request.input_tokens,
                served_prompt_tokens=served,
                completion_tokens=completion_tokens,
                latency_s=time.perf_counter() - request.started,
                ok=ok,
                status=status,
                error=error,
                ignored=request.ignored,
            )
        )


_ENDPOINTS = {
    ("POST", "/v1/chat/completions"): "chat.completions",
    ("POST", "/v1/embeddings"): "embeddings",
    ("GET", "/v1/models"): "models",
}


def _route(path: str, authorization: str | None) -> tuple[str | None, str]:
    """(token, the path from ``/v1`` on): the token from ``/t/<token>/`` or the bearer key."""
    path = path.split("?", 1)[0]
    if path.startswith("/t/"):
        token, _, rest = path[3:].partition("/")
        return token[:128] or None, "/" + rest
    if authorization and authorization[:7].lower() == "bearer ":
        return authorization[7:].strip()[:128] or None, path
    return None, path


def _refusal_reason(token: str | None, stopped: bool) -> str:
    if stopped:
        return "the gateway has stopped: no call is forwarded"
    if token is None:
        return "no token: use the base_url the harness gave (/t/<token>/v1) or the token as the API key"
    return "unknown or revoked token: this plugin's phase has ended or the token was never granted"


def _json_object(body: bytes) -> dict[str, Any]:
    try:
        data = json.loads(body)
    except (UnicodeDecodeError, ValueError) as exc:
        raise _Refusal(400, "invalid", f"the request body is not JSON: {exc}") from None
    if not isinstance(data, dict):
        raise _Refusal(400, "invalid", f"the request body must be a JSON object, got {type(data).__name__}")
    return data


def _messages(value: Any) -> tuple[Message, ...]:
    if not isinstance(value, list) or not value:
        raise _Refusal(400, "invalid", "messages must be a non-empty list of {role, content} objects")
    messages = []
    for index, entry in enumerate(value):
        role = entry.get("role") if isinstance(entry, dict) else None
        content = entry.get("content") if isinstance(entry, dict) else None
        if role not in CHAT_ROLES:
            raise _Refusal(
                400, "invalid", f"messages[{index}].role must be one of {', '.join(CHAT_ROLES)}, got {role!r}"
            )
        if not isinstance(content, str):
            raise _Refusal(
                400,
                "invalid",
                f"messages[{index}].content must be a string (content parts are not supported), "
                f"got {type(content).__name__}",
            )
        messages.append(Message(role, content))
    return tuple(messages)


def _params(body: dict[str, Any], default_max_tokens: int) -> GenerationParams:
    max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
    max_tokens = default_max_tokens if max_tokens is None else max_tokens
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens <= 0:
        raise _Refusal(400, "invalid", f"max_tokens must be a positive integer, got {max_tokens!r}")
    temperature = body.get("temperature")
    temperature = 0.0 if temperature is None else temperature
    if isinstance(temperature, bool) or not isinstance(temperature, (int, float)) or not 0 <= temperature <= 2:
        raise _Refusal(400, "invalid", f"temperature must be a number from 0 to 2, got {temperature!r}")
    seed = body.get("seed")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        raise _Refusal(400, "invalid", f"seed must be an integer, got {seed!r}")
    return GenerationParams(max_tokens, float(temperature), seed)


def _texts(value: Any) -> list[str]:
    texts = [value] if isinstance(value, str) else value
    if not isinstance(texts, list) or not texts or not all(isinstance(t, str) for t in texts):
        raise _Refusal(
            400, "invalid", "input must be a string or a non-empty list of strings (token arrays are not supported)"
        )
    return texts


def _encoded(vector: list[float], encoding: str) -> list[float] | str:
    """``base64`` is what OpenAI SDKs ask for by default: little-endian float32."""
    if encoding == "float":
        return vector
    return base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode("ascii")


class _Server(ThreadingHTTPServer):
    """A thread per connection; clients that hang up are not worth a traceback."""

    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        if not isinstance(sys.exc_info()[1], (ConnectionResetError, BrokenPipeError)):
            super().handle_error(request, client_address)


def _handler(gateway: MeteringGateway) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive: an SDK's connection pool reuses its connections
        # Headers and body go out in two writes: with Nagle's algorithm the body waited for the
        # client's delayed ACK of the headers, 40 ms on every call (benchmarks/bench_gateway.py).
        disable_nagle_algorithm = True

        def log_message(self, *args: Any) -> None:
            pass

        def _serve(self, method: str) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            if length > MAX_BODY:
                self._send(413, {"error": {"message": f"request body over {MAX_BODY} bytes"}}, NO_RETRY)
                self.close_connection = True
                return
            body = self.rfile.read(length) if length else b""
            status, payload, headers = gateway.handle(method, self.path, self.headers.get("Authorization"), body)
            self._send(status, payload, headers)

        def _send(self, status: int, payload: dict[str, Any], headers: dict[str, str]) -> None:
            data = json.dumps(payload, ensure_ascii=False).encode("utf-8")
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            for key, value in headers.items():
                self.send_header(key, value)
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:
            self._serve("GET")

        def do_POST(self) -> None:
            self._serve("POST")

    return Handler
