"""The litellm backend: Ollama, OpenRouter, OpenAI-compatible servers (MLX, vLLM, llama.cpp).

litellm is imported on first use (it is slow to import), with its local cost map so
nothing is fetched from the network. Keys come from the environment only.

An ``openai/<name>`` model on a loopback ``--api-base`` (the embedded model, a local
llama.cpp, vLLM or MLX server) is called with a plain pooled HTTP client instead:
litellm spends about 4 ms of CPU per call on cost lookup and logging, more than the
rest of the harness, and a local server has no price to look up.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Sequence
from typing import Any

import httpx

from budgetbench_core import Backend, Completion, GenerationParams, Message, ResponseError, TransportError, hookimpl

_TRANSPORT_STATUS = {408, 409, 425, 429, 500, 502, 503, 504, 520, 522, 524, 529}
_LOOPBACK_HOSTS = {"127.0.0.1", "localhost", "::1"}


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


class LiteLLMBackend(Backend):
    """Any model string litellm understands, e.g. ``ollama_chat/qwen2.5:1.5b``.

    For Ollama, ``num_ctx`` is sent through the native chat API, large enough for the
    biggest budget plus the output, because Ollama silently truncates prompts to its
    (small) default context.
    """

    name = "litellm"
    description = "Any litellm model string: ollama_chat/..., openrouter/..., openai/<name> with --api-base"

    def __init__(self, model: str, api_base: str | None = None, timeout_s: float = 120.0,
                 max_context: int | None = None, **options: Any) -> None:
        super().__init__(model, api_base=api_base, timeout_s=timeout_s, **options)
        self.max_context = max_context
        self._http: httpx.Client | None = None
        self._http_lock = threading.Lock()

    def _extra(self) -> dict[str, Any]:
        extra: dict[str, Any] = {}
        if self.model.startswith(("ollama/", "ollama_chat/")) and self.max_context:
            extra["num_ctx"] = self.max_context
        if self.model.startswith("openai/") and self.api_base and not os.environ.get("OPENAI_API_KEY"):
            extra["api_key"] = "not-needed"  # local OpenAI-compatible servers ignore it
        return extra

    def _direct(self) -> bool:
        """Loopback OpenAI-compatible servers are called without litellm (see the module docstring)."""
        return (self.model.startswith("openai/") and bool(self.api_base)
                and httpx.URL(self.api_base).host in _LOOPBACK_HOSTS)

    def _client(self) -> httpx.Client:
        with self._http_lock:
            if self._http is None or self._http.base_url != httpx.URL(self.api_base.rstrip("/") + "/"):
                key = os.environ.get("OPENAI_API_KEY") or "not-needed"
                # connect gets at least 5 s, as in the OpenAI client: a busy server's full listen
                # backlog drops the first SYN, and the kernel only resends it after 1 s.
                timeout = httpx.Timeout(self.timeout_s, connect=max(self.timeout_s, 5.0))
                self._http = httpx.Client(base_url=self.api_base.rstrip("/") + "/", timeout=timeout,
                                          headers={"Authorization": f"Bearer {key}"},
                                          limits=httpx.Limits(max_connections=None, max_keepalive_connections=64))
            return self._http

    def _complete_direct(self, messages: Sequence[Message], params: GenerationParams) -> Completion:
        body: dict[str, Any] = {"model": self.model.partition("/")[2], "messages": [m.to_chat() for m in messages],
                                "max_tokens": params.max_tokens, "temperature": params.temperature}
        if params.seed is not None:
            body["seed"] = params.seed
        started = time.perf_counter()
        try:
            response = self._client().post("chat/completions", json=body)
        except httpx.HTTPError as exc:  # refused, reset, timed out, body cut short
            raise TransportError(f"{type(exc).__name__}: {str(exc)[:500]}") from exc
        status = response.status_code
        if status in _TRANSPORT_STATUS:
            raise TransportError(f"status {status}: {response.text[:500]}" + (" [429]" if status == 429 else ""),
                                 _retry_after_header(response.headers))
        if status != 200:
            raise ResponseError(f"status {status}: {response.text[:500]}")
        try:
            data = response.json()
        except ValueError as exc:  # a garbled body is retried, as litellm does
            raise TransportError(f"status 200 with a body that is not JSON: {response.text[:200]!r}") from exc
        latency = time.perf_counter() - started
        try:
            text = data["choices"][0]["message"]["content"]
        except (TypeError, IndexError, KeyError) as exc:
            raise ResponseError(f"response has no choices[0].message.content: {exc!r}") from exc
        if text is None:
            raise ResponseError("response message has no content")
        usage = data.get("usage") or {}
        details = usage.get("prompt_tokens_details") or {}
        return Completion(text=text, prompt_tokens=usage.get("prompt_tokens"),
                          completion_tokens=usage.get("completion_tokens"), cached_tokens=details.get("cached_tokens"),
                          latency_s=latency, cost=None, model=data.get("model"))

    def complete(self, messages: Sequence[Message], params: GenerationParams) -> Completion:
        if self._direct():
            return self._complete_direct(messages, params)
        litellm = _litellm()
        started = time.perf_counter()
        try:
            response = litellm.completion(
                model=self.model, messages=[m.to_chat() for m in messages], api_base=self.api_base,
                max_tokens=params.max_tokens, temperature=params.temperature, seed=params.seed,
                timeout=self.timeout_s, num_retries=0, **self._extra(),
            )
        except Exception as exc:
            status = getattr(exc, "status_code", None)
            transport = (
                status in _TRANSPORT_STATUS
                or isinstance(exc, (litellm.exceptions.APIConnectionError, litellm.exceptions.Timeout,
                                    litellm.exceptions.RateLimitError, litellm.exceptions.InternalServerError,
                                    litellm.exceptions.ServiceUnavailableError))
            )
            message = f"{type(exc).__name__} (status {status}): {str(exc)[:500]}"
            if transport:
                raise TransportError(message + (" [429]" if status == 429 else ""), _retry_after(exc)) from exc
            raise ResponseError(message) from exc
        latency = time.perf_counter() - started
        try:
            choice = response.choices[0]
            text = choice.message.content
        except (AttributeError, IndexError, KeyError) as exc:
            raise ResponseError(f"response has no choices[0].message: {exc}") from exc
        if text is None:
            raise ResponseError("response message has no content")
        usage = getattr(response, "usage", None)
        details = getattr(usage, "prompt_tokens_details", None)
        cost = None
        hidden = getattr(response, "_hidden_params", None) or {}
        if isinstance(hidden, dict) and hidden.get("response_cost") is not None:
            cost = float(hidden["response_cost"])
        return Completion(
            text=text,
            prompt_tokens=getattr(usage, "prompt_tokens", None),
            completion_tokens=getattr(usage, "completion_tokens", None),
            cached_tokens=getattr(details, "cached_tokens", None) if details else None,
            latency_s=latency, cost=cost, model=getattr(response, "model", None),
        )


@hookimpl
def register_backends(register):
    register(LiteLLMBackend)
