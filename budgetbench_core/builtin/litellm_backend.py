"""The litellm backend: Ollama, OpenRouter, OpenAI-compatible servers (MLX, vLLM, llama.cpp).

litellm is imported on first use (it is slow to import), with its local cost map so
nothing is fetched from the network. Keys come from the environment only.

An ``openai/`` model on a loopback server (the embedded model, a local llama.cpp, vLLM or
MLX server) is called with a direct aiohttp client instead, awaited on the harness's shared
event loop (``acomplete``): litellm's cost lookup, logging and response wrapping cost ~4 ms
of CPU per call, and a blocked thread per call in flight capped a run well below what a
server answers at 128 calls in flight; on loopback there is no cost to look up. The request
body carries the messages' chat JSON as the harness serialised it (``SentMessages``). Both
paths classify failures with the same function (``_failure``), and the fault-injection
matrix runs on both (tests/reliability/test_reliability_clients.py).
``BUDGETBENCH_HTTP_CLIENT=litellm`` sends every call through litellm.
"""

from __future__ import annotations

import ipaddress
import json
import os
import time
from collections.abc import Sequence
from typing import Any
from urllib.parse import urlsplit

import aiohttp

from budgetbench_core import (
    Backend,
    BackendCheck,
    Completion,
    FatalError,
    GenerationParams,
    Message,
    ResponseError,
    TransportError,
    hookimpl,
    redact,
)
from budgetbench_core.event_loop import shared_loop
from budgetbench_core.messages import SentMessages

_TRANSPORT_STATUS = {408, 409, 425, 429, 500, 502, 503, 504, 520, 522, 524, 529}


def _litellm():
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    import litellm

    litellm.suppress_debug_info = True
    litellm.telemetry = False
    return litellm


def _retry_after(exc: Exception) -> float | None:
    response = getattr(exc, "response", None)
    return _retry_after_header(getattr(response, "headers", None) or {})


def _retry_after_header(headers: Any) -> float | None:
    value = headers.get("retry-after") if hasattr(headers, "get") else None
    try:
        return float(value) if value is not None else None
    except ValueError:
        return None


def _failure(
    message: str, status: int | None, transport: bool = False, fatal: bool = False, retry_after: float | None = None
) -> Exception:
    """The one classification of a failed call, for both clients: retry (TransportError),
    stop the run (FatalError) or record the cell's error (ResponseError)."""
    if transport or status in _TRANSPORT_STATUS:
        return TransportError(message + (" [429]" if status == 429 else ""), retry_after)
    if fatal or status in (401, 404):
        return FatalError(message)  # a refused key, unknown provider or model: stop the run
    return ResponseError(message)


def _is_loopback(api_base: str | None) -> bool:
    host = urlsplit(api_base or "").hostname or ""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _usage(prompt_tokens: Any, completion_tokens: Any) -> tuple[Any, Any]:
    # litellm fills a missing usage block with zeros; a chat prompt always has tokens,
    # so a 0 prompt count is a figure the server did not give: record null, not 0.
    if not prompt_tokens:
        return None, None
    return prompt_tokens, completion_tokens


class LiteLLMBackend(Backend):
    """Any model string litellm understands, e.g. ``ollama_chat/qwen2.5:1.5b``.

    For Ollama, ``num_ctx`` is sent through the native chat API, large enough for the
    biggest budget plus the output, because Ollama silently truncates prompts to its
    (small) default context. A local OpenAI-compatible server (``openai/...`` with an api
    base) is asked not to reuse cached prompt prefixes (``cache_prompt: false``, llama.cpp's
    field; other servers ignore it): on llama.cpp a greedy reply to the same prompt differs
    between a fresh slot and one with a cached prefix, so a rerun would not repeat. The
    ``server_prompt_cache`` option (``--server-prompt-cache``) leaves reuse on, for speed.
    """

    name = "litellm"
    description = "Any litellm model string: ollama_chat/..., openrouter/..., openai/<name> with --api-base"
    native_tools = True  # litellm's ``tools`` (and the same field on the direct client)

    def __init__(
        self,
        model: str,
        api_base: str | None = None,
        timeout_s: float = 120.0,
        max_context: int | None = None,
        server_prompt_cache: bool = False,
        **options: Any,
    ) -> None:
        super().__init__(model, api_base=api_base, timeout_s=timeout_s, **options)
        self.max_context = max_context
        self.server_prompt_cache = bool(server_prompt_cache)
        self._headers: dict[str, str] | None = None
        self._route: tuple[tuple[str, str | None, str | None], str] | None = None
        self._client_timeout: aiohttp.ClientTimeout | None = None
        self._body_tails: dict[tuple[Any, ...], str] = {}

    def _asks_no_prompt_reuse(self) -> bool:
        return self.model.startswith("openai/") and bool(self.api_base) and not self.server_prompt_cache

    @property
    def http_client(self) -> str:
        """``direct`` for an ``openai/`` model on a loopback server, else ``litellm`` (decided
        again only when the model, the api base or ``BUDGETBENCH_HTTP_CLIENT`` changes)."""
        key = (self.model, self.api_base, os.environ.get("BUDGETBENCH_HTTP_CLIENT"))
        if self._route is None or self._route[0] != key:
            if key[2] == "litellm":
                client = "litellm"
            else:
                client = "direct" if self.model.startswith("openai/") and _is_loopback(self.api_base) else "litellm"
            self._route = (key, client)
        return self._route[1]

    def start(self) -> None:
        """Import litellm now (seconds on a busy machine), not inside the first call's deadline;
        and what its first call would import on top (httpcore, h11, litellm's logging modules:
        0.37 s on an idle machine): an httpx client, made and closed, and a call with litellm's
        ``mock_response`` (answered by litellm itself, nothing sent). A warm-up that fails is
        let go: the run's first real call reports whatever is wrong."""
        if self.http_client != "litellm":
            return
        litellm = _litellm()
        import httpx

        httpx.Client().close()
        try:
            litellm.completion(
                model=self.model,
                messages=[{"role": "user", "content": "warm-up"}],
                api_base=self.api_base,
                mock_response="ok",
                **self._extra(),
            )
        except Exception:  # noqa: BLE001, S110 - only a warm-up: nothing depends on it
            pass

    def _extra(self) -> dict[str, Any]:
        extra: dict[str, Any] = {}
        if self.model.startswith(("ollama/", "ollama_chat/")) and self.max_context:
            extra["num_ctx"] = self.max_context
        if self.model.startswith("openai/") and self.api_base and not os.environ.get("OPENAI_API_KEY"):
            extra["api_key"] = "not-needed"  # local OpenAI-compatible servers ignore it
        if self._asks_no_prompt_reuse():
            extra["extra_body"] = {"cache_prompt": False}
        return extra

    def preflight(self, flag: str, full: bool, judge: bool = False, prompts_only: bool = False) -> BackendCheck:
        from .litellm_preflight import litellm_check  # httpx and litellm: only when asked

        return litellm_check(self.model, self.api_base, flag, full, judge, prompts_only)

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), **self.prompt_reuse(), "http_client": self.http_client}

    def prompt_reuse(self) -> dict[str, Any]:
        """For the manifest: whether server prompt reuse was allowed and what was sent."""
        return {
            "server_prompt_cache": self.server_prompt_cache,
            "cache_prompt_sent": False if self._asks_no_prompt_reuse() else None,
        }

    def complete(self, messages: Sequence[Message], params: GenerationParams) -> Completion:
        if self.http_client == "direct":  # called outside the harness (which awaits acomplete)
            return shared_loop().run(self._complete_direct(messages, params))
        litellm = _litellm()
        started = time.perf_counter()
        try:
            response = litellm.completion(
                model=self.model,
                messages=[m.to_chat() for m in messages],
                api_base=self.api_base,
                max_tokens=params.max_tokens,
                temperature=params.temperature,
                seed=params.seed,
                timeout=self.timeout_s,
                num_retries=0,
                **({"tools": json.loads(params.tools)} if params.tools else {}),
                **self._extra(),
            )
        except Exception as exc:
            status = getattr(exc, "status_code", None)
            transport = status in _TRANSPORT_STATUS or isinstance(
                exc,
                (
                    litellm.exceptions.APIConnectionError,
                    litellm.exceptions.Timeout,
                    litellm.exceptions.RateLimitError,
                    litellm.exceptions.InternalServerError,
                    litellm.exceptions.ServiceUnavailableError,
                ),
            )
            message = f"{type(exc).__name__} (status {status}): {redact(str(exc))[:500]}"  # redact, then cut
            fatal = isinstance(
                exc, (litellm.exceptions.AuthenticationError, litellm.exceptions.NotFoundError)
            ) or "LLM Provider NOT provided" in str(exc)
            raise _failure(message, status, transport, fatal, _retry_after(exc)) from exc
        latency = time.perf_counter() - started
        try:
            choice = response.choices[0]
            text = choice.message.content
            calls = _tool_calls([c.model_dump() for c in getattr(choice.message, "tool_calls", None) or []])
        except (AttributeError, IndexError, KeyError) as exc:
            raise ResponseError(f"response has no choices[0].message: {exc}") from exc
        if text is None and not calls:
            raise ResponseError("response message has no content")
        usage = getattr(response, "usage", None)
        details = getattr(usage, "prompt_tokens_details", None)
        prompt_tokens, completion_tokens = _usage(
            getattr(usage, "prompt_tokens", None), getattr(usage, "completion_tokens", None)
        )
        cost = None
        hidden = getattr(response, "_hidden_params", None) or {}
        if isinstance(hidden, dict) and hidden.get("response_cost") is not None:
            cost = float(hidden["response_cost"])
        return Completion(
            text=text or "",
            prompt_tokens=prompt_tokens,
            completion_tokens=completion_tokens,
            cached_tokens=getattr(details, "cached_tokens", None) if details else None,
            latency_s=latency,
            cost=cost,
            model=getattr(response, "model", None),
            tool_calls=calls if params.tools else None,
        )

    def async_calls(self) -> bool:
        """The direct client is awaited on the shared event loop; litellm's path stays on a thread."""
        return self.http_client == "direct"

    async def acomplete(self, messages: Sequence[Message], params: GenerationParams) -> Completion:
        if self.http_client != "direct":
            raise NotImplementedError("litellm's own path is synchronous: the harness calls complete()")
        return await self._complete_direct(messages, params)

    def _body_rest(self, params: GenerationParams) -> dict[str, Any]:
        rest: dict[str, Any] = {
            "model": self.model.removeprefix("openai/"),
            "max_tokens": params.max_tokens,
            "temperature": params.temperature,
        }
        if params.seed is not None:
            rest["seed"] = params.seed
        if params.tools:
            rest["tools"] = json.loads(params.tools)
        if self._asks_no_prompt_reuse():
            rest["cache_prompt"] = False
        return rest

    def _direct_body(self, messages: Sequence[Message], params: GenerationParams) -> bytes:
        """The request body, with the messages' chat JSON as the harness serialised it (once);
        the fields after the messages are serialised once per (model, parameters, prompt reuse)."""
        chat = messages.chat_json if isinstance(messages, SentMessages) else None
        if chat is None:
            chat = json.dumps([m.to_chat() for m in messages], ensure_ascii=False)
        key = (
            self.model,
            self.server_prompt_cache,
            bool(self.api_base),
            *((type(v), v) for v in vars(params).values()),
        )
        tail = self._body_tails.get(key)
        if tail is None:
            tail = ", " + json.dumps(self._body_rest(params))[1:]
            if len(self._body_tails) < 64:
                self._body_tails[key] = tail
        try:
            return ('{"messages": ' + chat + tail).encode("utf-8")
        except UnicodeEncodeError:  # a lone surrogate: only a \u escape makes it valid UTF-8 on the wire
            return json.dumps({"messages": json.loads(chat), **self._body_rest(params)}).encode("ascii")

    def _timeout(self) -> aiohttp.ClientTimeout:
        """Per read and per connect, as litellm's httpx client: the harness enforces the total deadline."""
        if self._client_timeout is None:
            self._client_timeout = aiohttp.ClientTimeout(
                total=None, sock_read=self.timeout_s, sock_connect=max(5.0, min(self.timeout_s, 30.0))
            )
        return self._client_timeout

    async def _complete_direct(self, messages: Sequence[Message], params: GenerationParams) -> Completion:
        body = self._direct_body(messages, params)
        if self._headers is None:
            key = os.environ.get("OPENAI_API_KEY") or "not-needed"  # local servers ignore it
            self._headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
        url = (self.api_base or "").rstrip("/") + "/chat/completions"
        session = shared_loop().resource(_SESSION, _new_session, _close_session)
        started = time.perf_counter()
        payload: Any
        try:
            async with session.post(url, data=body, headers=self._headers, timeout=self._timeout()) as response:
                raw = await response.read()
                status = response.status
                if status >= 400:
                    raise _failure(
                        f"HTTP {status}: {redact(raw.decode('utf-8', 'replace'))[:500]}",
                        status,
                        retry_after=_retry_after_header(response.headers),
                    )
            payload = json.loads(raw)
        except (aiohttp.ClientError, TimeoutError, ValueError) as exc:  # no reply, a cut reply, not JSON
            raise _failure(f"{type(exc).__name__}: {redact(str(exc))[:500]}", None, transport=True) from exc
        latency = time.perf_counter() - started
        if not isinstance(payload, dict):
            raise ResponseError(f"response is {type(payload).__name__}, not a JSON object")
        try:
            message = payload["choices"][0]["message"]
            text = message["content"]
            calls = _tool_calls(message.get("tool_calls") or [])
        except (TypeError, IndexError, KeyError, AttributeError) as exc:
            raise ResponseError(f"response has no choices[0].message: {exc!r}") from exc
        if text is None and calls:
            text = ""
        if text is None:
            raise ResponseError("response message has no content")
        if not isinstance(text, str):
            raise ResponseError(f"response message content is {type(text).__name__}, not text")
        usage: dict[str, Any] = payload["usage"] if isinstance(payload.get("usage"), dict) else {}
        details: dict[str, Any] = (
            usage["prompt_tokens_details"] if isinstance(usage.get("prompt_tokens_details"), dict) else {}
        )
        prompt_tokens, completion_tokens = _usage(usage.get("prompt_tokens"), usage.get("completion_tokens"))
        return Completion(
            text=text,
            prompt_tokens=prompt_tokens,
            completion_tokens=completion_tokens,
            cached_tokens=details.get("cached_tokens"),
            latency_s=latency,
            cost=None,
            model=payload.get("model") if isinstance(payload.get("model"), str) else None,
            tool_calls=calls if params.tools else None,
        )


def _tool_calls(calls: list[Any]) -> list[dict[str, Any]]:
    """OpenAI ``tool_calls`` as ``{"id", "name", "arguments"}`` (arguments as JSON text)."""
    out = []
    for call in calls:
        function = call.get("function") or {}
        arguments = function.get("arguments")
        out.append(
            {
                "id": call.get("id") if isinstance(call.get("id"), str) else None,
                "name": str(function.get("name") or ""),
                "arguments": arguments if isinstance(arguments, str) else json.dumps(arguments or {}),
            }
        )
    return out


_SESSION = "litellm-backend:aiohttp"


def _new_session() -> aiohttp.ClientSession:
    """One pooled session on the shared loop for every direct-client backend of the process.
    No connection limit here: the harness holds each model to its own (``ModelCaller``).
    Idle connections are dropped after 4 s, before llama.cpp's server closes them (5 s).
    No cookie jar: an OpenAI-compatible API keeps no session state in cookies."""
    return aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=0, keepalive_timeout=4.0), cookie_jar=aiohttp.DummyCookieJar()
    )


async def _close_session(session: aiohttp.ClientSession) -> None:
    await session.close()


@hookimpl
def register_backends(register):
    register(LiteLLMBackend)


@hookimpl(trylast=True)
def resolve_backend(model):
    """Every model string no other backend claims goes to litellm."""
    return "litellm"
