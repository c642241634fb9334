"""The litellm backend: Ollama, OpenRouter, OpenAI-compatible servers (MLX, vLLM, llama.cpp).

litellm is imported on first use (it is slow to import), with its local cost map so
nothing is fetched from the network. Keys come from the environment only.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from typing import Any

from budgetbench_core import (
    Backend,
    Completion,
    FatalError,
    GenerationParams,
    Message,
    ResponseError,
    TransportError,
    hookimpl,
    redact,
)

_TRANSPORT_STATUS = {408, 409, 425, 429, 500, 502, 503, 504, 520, 522, 524, 529}


def _litellm():
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    import litellm

    litellm.suppress_debug_info = True
    litellm.telemetry = False
    return litellm


def _retry_after(exc: Exception) -> float | None:
    response = getattr(exc, "response", None)
    headers = getattr(response, "headers", None) or {}
    value = headers.get("retry-after") if hasattr(headers, "get") else None
    try:
        return float(value) if value is not None else None
    except ValueError:
        return None


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

    def __init__(self, model: str, api_base: str | None = None, timeout_s: float = 120.0,
                 max_context: int | None = None, server_prompt_cache: bool = False, **options: Any) -> None:
        super().__init__(model, api_base=api_base, timeout_s=timeout_s, **options)
        self.max_context = max_context
        self.server_prompt_cache = bool(server_prompt_cache)

    def _asks_no_prompt_reuse(self) -> bool:
        return self.model.startswith("openai/") and bool(self.api_base) and not self.server_prompt_cache

    def start(self) -> None:
        """Import litellm now (seconds on a busy machine), not inside the first call's deadline."""
        _litellm()

    def _extra(self) -> dict[str, Any]:
        extra: dict[str, Any] = {}
        if self.model.startswith(("ollama/", "ollama_chat/")) and self.max_context:
            extra["num_ctx"] = self.max_context
        if self.model.startswith("openai/") and self.api_base and not os.environ.get("OPENAI_API_KEY"):
            extra["api_key"] = "not-needed"  # local OpenAI-compatible servers ignore it
        if self._asks_no_prompt_reuse():
            extra["extra_body"] = {"cache_prompt": False}
        return extra

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), **self.prompt_reuse()}

    def prompt_reuse(self) -> dict[str, Any]:
        """For the manifest: whether server prompt reuse was allowed and what was sent."""
        return {"server_prompt_cache": self.server_prompt_cache,
                "cache_prompt_sent": False if self._asks_no_prompt_reuse() else None}

    def complete(self, messages: Sequence[Message], params: GenerationParams) -> Completion:
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
            message = f"{type(exc).__name__} (status {status}): {redact(str(exc))[:500]}"  # redact, then cut
            if transport:
                raise TransportError(message + (" [429]" if status == 429 else ""), _retry_after(exc)) from exc
            if (status in (401, 404) or isinstance(exc, (litellm.exceptions.AuthenticationError,
                                                         litellm.exceptions.NotFoundError))
                    or "LLM Provider NOT provided" in str(exc)):
                raise FatalError(message) from exc  # a refused key, unknown provider or model: stop the run
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
        prompt_tokens = getattr(usage, "prompt_tokens", None)
        completion_tokens = getattr(usage, "completion_tokens", None)
        if not prompt_tokens:
            # litellm fills a missing usage block with zeros; a chat prompt always has tokens,
            # so a 0 prompt count is a figure the server did not give: record null, not 0.
            prompt_tokens = completion_tokens = None
        cost = None
        hidden = getattr(response, "_hidden_params", None) or {}
        if isinstance(hidden, dict) and hidden.get("response_cost") is not None:
            cost = float(hidden["response_cost"])
        return Completion(
            text=text,
            prompt_tokens=prompt_tokens,
            completion_tokens=completion_tokens,
            cached_tokens=getattr(details, "cached_tokens", None) if details else None,
            latency_s=latency, cost=cost, model=getattr(response, "model", None),
        )


@hookimpl
def register_backends(register):
    register(LiteLLMBackend)


@hookimpl(trylast=True)
def resolve_backend(model):
    """Every model string no other backend claims goes to litellm."""
    return "litellm"
