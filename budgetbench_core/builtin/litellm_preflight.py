"""What the litellm backend checks before a run (its ``preflight``): the provider is known and
its key is set (litellm's own environment validation), the server answers (``/v1/models``
for an ``--api-base``, ``/api/tags`` for Ollama, one tiny call for a hosted provider), and
the model's context where it can be learnt. Every failure is one line naming what to change.
"""

from __future__ import annotations

import difflib
import os
from typing import Any

import httpx

from budgetbench_core import BackendCheck


def _one_line(exc: BaseException, limit: int = 200) -> str:
    text = " ".join(str(exc).split())
    text = text if len(text) <= limit else text[: limit - 3] + "..."
    return f"{type(exc).__name__}: {text}"


HTTP_TIMEOUT_S = 10.0
OLLAMA_DEFAULT = "http://localhost:11434"
_OLLAMA = ("ollama/", "ollama_chat/")


def _litellm():
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    import litellm

    litellm.suppress_debug_info = True
    return litellm


def _provider(model: str, problems: list[str], flag: str = "--model") -> str | None:
    litellm = _litellm()
    try:
        return litellm.get_llm_provider(model)[1]
    except Exception:
        prefix = model.split("/", 1)[0] if "/" in model else model
        close = difflib.get_close_matches(prefix, [*litellm.provider_list, "local"], n=1, cutoff=0.7)
        hint = f"did you mean {close[0] + ('' if close[0] == 'local' else '/...')!r}? " if close else ""
        problems.append(
            f"{flag} {model!r}: no provider is known for it; {hint}use 'local', "
            "ollama_chat/<name>, openrouter/<org>/<name>, or openai/<name> with --api-base "
            "(providers: https://docs.litellm.ai/docs/providers)"
        )
        return None


def _keys(model: str, provider: str, api_base: str | None, problems: list[str], flag: str = "--model") -> None:
    """litellm's environment validation, minus what the backend supplies itself."""
    missing = _litellm().validate_environment(model=model).get("missing_keys", [])
    for key in missing:
        if key.endswith(("_API_BASE", "_BASE_URL")) and (api_base or provider in ("ollama", "ollama_chat")):
            continue  # --api-base given, or Ollama's default address
        if provider == "openai" and api_base and key == "OPENAI_API_KEY":
            continue  # a local OpenAI-compatible server: the backend sends a placeholder key
        if key.endswith(("_API_BASE", "_BASE_URL")):
            problems.append(f"{flag} {model!r} needs a server address: pass --api-base or set {key}")
        else:
            whose = "" if flag == "--model" else f" (for {flag} {model!r})"
            problems.append(f"{key} is not set{whose}: export {key}=... (keys are read only from the environment)")


def _get(url: str, headers: dict[str, str] | None = None) -> httpx.Response:
    return httpx.get(url, headers=headers or {}, timeout=HTTP_TIMEOUT_S)


def _ollama(model: str, api_base: str | None, problems: list[str], passed: list[str]) -> BackendCheck:
    base = (api_base or os.environ.get("OLLAMA_API_BASE") or OLLAMA_DEFAULT).rstrip("/")
    name = model.split("/", 1)[1]
    try:
        tags = _get(f"{base}/api/tags")
        tags.raise_for_status()
        served = [m.get("name", "") for m in tags.json().get("models", [])]
    except (httpx.HTTPError, ValueError) as exc:
        problems.append(
            f"Ollama does not answer at {base} ({_one_line(exc, 120)}): start it with `ollama serve`, "
            "or pass --api-base http://<host>:11434"
        )
        return BackendCheck()
    wanted = name if ":" in name else f"{name}:latest"
    if wanted not in served and name not in served:
        have = ", ".join(served[:8]) or "no models"
        problems.append(f"Ollama at {base} has no model {name!r} (it has: {have}): run `ollama pull {name}`")
        return BackendCheck()
    passed.append(f"Ollama at {base} serves {name}")
    try:
        shown = httpx.post(f"{base}/api/show", json={"model": name}, timeout=HTTP_TIMEOUT_S).json()
        lengths = [v for k, v in (shown.get("model_info") or {}).items() if k.endswith(".context_length")]
        if lengths:
            return BackendCheck(int(lengths[0]), f"Ollama /api/show for {name}")
    except (httpx.HTTPError, ValueError, TypeError):
        pass
    return BackendCheck()


def _openai_compatible(model: str, api_base: str, problems: list[str], passed: list[str]) -> BackendCheck:
    base = api_base.rstrip("/")
    key = os.environ.get("OPENAI_API_KEY") if model.startswith("openai/") else None
    try:
        listing = _get(f"{base}/models", {"Authorization": f"Bearer {key or 'not-needed'}"})
    except httpx.HTTPError as exc:
        problems.append(
            f"no server answers at {base} ({_one_line(exc, 120)}): start it, or fix --api-base "
            "(an OpenAI-compatible server's address ends in /v1)"
        )
        return BackendCheck()
    if listing.status_code in (401, 403):
        variable = "OPENAI_API_KEY" if model.startswith("openai/") else "the provider's key variable"
        problems.append(f"{base} refused the API key ({listing.status_code}): set {variable} to a key it accepts")
        return BackendCheck()
    if listing.status_code == 404:
        return _tiny_call(model, api_base, problems, passed)
    if listing.status_code != 200:
        problems.append(f"{base}/models answered {listing.status_code}: check --api-base and that the server is ready")
        return BackendCheck()
    passed.append(f"server at {base} answered")
    try:
        entries = listing.json().get("data", [])
    except ValueError:
        entries = []
    served = model.split("/", 1)[1]
    for entry in entries:
        if isinstance(entry, dict) and entry.get("id") == served and entry.get("max_model_len"):
            limit = int(entry["max_model_len"])
            return BackendCheck(limit, f"{base}/models max_model_len", total_limit=limit)
    return BackendCheck()


def _tiny_call(model: str, api_base: str | None, problems: list[str], passed: list[str]) -> BackendCheck:
    """One completion of one output token: the only way to learn that a hosted key works."""
    litellm = _litellm()
    extra: dict[str, Any] = {}
    if model.startswith("openai/") and api_base and not os.environ.get("OPENAI_API_KEY"):
        extra["api_key"] = "not-needed"
    try:
        litellm.completion(
            model=model,
            messages=[{"role": "user", "content": "Say OK."}],
            api_base=api_base,
            max_tokens=1,
            timeout=30,
            num_retries=0,
            **extra,
        )
    except Exception as exc:
        status = getattr(exc, "status_code", None)
        where = api_base or model.split("/", 1)[0]
        if status in (401, 403) or isinstance(exc, litellm.exceptions.AuthenticationError):
            problems.append(
                f"{where} refused the API key ({status}): check the provider's key variable ({_one_line(exc, 100)})"
            )
        elif status == 404 or isinstance(exc, litellm.exceptions.NotFoundError):
            problems.append(f"{where} does not serve {model!r} ({_one_line(exc, 100)}): check the model name")
        elif isinstance(exc, (litellm.exceptions.APIConnectionError, litellm.exceptions.Timeout)):
            problems.append(
                f"cannot reach {where} ({_one_line(exc, 100)}): check the network and --api-base, "
                "or pass --no-preflight to try anyway"
            )
        else:
            problems.append(f"a one-token test call to {model!r} failed ({_one_line(exc, 140)}): check --model")
        return BackendCheck()
    passed.append(f"{model} answered a one-token call")
    return BackendCheck()


def _hosted_context(model: str) -> BackendCheck:
    try:
        info = _litellm().get_model_info(model)
    except Exception:
        return BackendCheck()
    tokens = info.get("max_input_tokens") if info else None
    return BackendCheck(int(tokens), "litellm's model table") if tokens else BackendCheck()


def litellm_check(
    model: str, api_base: str | None, flag: str, full: bool, judge: bool, prompts_only: bool
) -> BackendCheck:
    """The checks of a litellm model: its provider always; with ``full``, its key, and for the
    run's own model (not a judge) the server or one tiny call (none in a prompts-only run)."""
    problems: list[str] = []
    passed: list[str] = []
    provider = _provider(model, problems, flag)
    found = BackendCheck()
    if provider and full:
        _keys(model, provider, None if judge else api_base, problems, flag)
        if not problems and not judge:
            if model.startswith(_OLLAMA):
                found = _ollama(model, api_base, problems, passed)
            elif api_base:
                found = _openai_compatible(model, api_base, problems, passed)
            elif not prompts_only:  # a prompts-only run calls no model
                found = _tiny_call(model, None, problems, passed)
    if provider and found.context_tokens is None and not judge:
        found = _hosted_context(model)
    found.problems, found.passed = problems, passed
    return found
