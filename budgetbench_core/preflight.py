"""Checks before the first cell, so a mistake costs seconds, not a run of errored cells.

In order: the model's provider is known and its key is set (litellm's own environment
validation), the server answers (``/v1/models`` for an ``--api-base``, ``/api/tags``
for Ollama, one tiny call for a hosted provider), the tokenizer loads and counts, and
every budget fits the model's context where it can be learnt. Every failure is one
line naming what to change. ``budgetbench run --no-preflight`` skips the checks that
need the network or the tokenizer; parameter checks (``params``) always run.
"""

from __future__ import annotations

import difflib
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import httpx

from .backends import Backend
from .messages import Message
from .plugins import Registry, UnknownNameError
from .runner import DEFAULT_BUDGETS, RunConfigError

HTTP_TIMEOUT_S = 10.0
OLLAMA_DEFAULT = "http://localhost:11434"
_OLLAMA = ("ollama/", "ollama_chat/")


class PreflightError(RunConfigError):
    """One or more checks failed; ``problems`` holds one line each, naming the fix."""

    def __init__(self, problems: Sequence[str]) -> None:
        super().__init__("\n".join(problems))
        self.problems = list(problems)


@dataclass
class ModelContext:
    """What is known of the model's size limits, and where it was learnt."""

    tokens: int | None = None  # input tokens the model takes (its trained context)
    source: str = ""
    total_limit: int | None = None  # a server's hard limit on prompt + output (vLLM max_model_len)


@dataclass
class PreflightReport:
    budgets: list[int]
    context: ModelContext
    notes: list[str] = field(default_factory=list)  # one-line remarks shown before the run
    passed: list[str] = field(default_factory=list)  # what was checked, for the "preflight:" line


def _one_line(exc: BaseException, limit: int = 200) -> str:
    text = " ".join(str(exc).split())
    text = text if len(text) <= limit else text[: limit - 3] + "..."
    return f"{type(exc).__name__}: {text}"


# ----------------------------------------------------------------- tokenizer suggestions

# (pattern on the model name, Hugging Face repo; {size} from the pattern's group). Every size of
# these families shares one tokenizer and chat template, so the default size counts the same.
_FAMILIES = [
    (r"qwen-?2\.5[-:_ ]?(\d+(?:\.\d+)?)b", "Qwen/Qwen2.5-{size}B-Instruct", "7"),
    (r"qwen-?2\.5(?![-.]?coder|[-.]?vl|[-.]?math)", "Qwen/Qwen2.5-{size}B-Instruct", "7"),
    (r"qwen-?3[-:_ ]?(\d+(?:\.\d+)?)b", "Qwen/Qwen3-{size}B", "8"),
    (r"qwen-?2[-:_ ]?(\d+(?:\.\d+)?)b", "Qwen/Qwen2-{size}B-Instruct", "7"),
    (r"llama-?3\.1[-:_ ]?(\d+)b", "meta-llama/Llama-3.1-{size}B-Instruct", "8"),
    (r"llama-?3\.2[-:_ ]?(\d+)b", "meta-llama/Llama-3.2-{size}B-Instruct", "3"),
    (r"llama-?3\.3[-:_ ]?(\d+)b", "meta-llama/Llama-3.3-{size}B-Instruct", "70"),
    (r"gemma-?2[-:_ ]?(\d+)b", "google/gemma-2-{size}b-it", "9"),
    (r"gemma-?3[-:_ ]?(\d+)b", "google/gemma-3-{size}b-it", "4"),
    (r"mistral-?7b|mistral(:|$)", "mistralai/Mistral-7B-Instruct-v0.3", ""),
    (r"phi-?3\.5", "microsoft/Phi-3.5-mini-instruct", ""),
    (r"phi-?4", "microsoft/phi-4", ""),
    (r"smollm2[-:_ ]?(\d+m)", "HuggingFaceTB/SmolLM2-{size}-Instruct", "135M"),
]


def suggest_tokenizer(model: str) -> str:
    """The ``--tokenizer`` to pass for ``model``, or where to look it up."""
    name = model.split("/", 1)[1] if "/" in model else model
    lowered = name.lower()
    for pattern, repo, default_size in _FAMILIES:
        found = re.search(pattern, lowered)
        if found:
            size = found.group(1) if found.groups() and found.group(1) else default_size
            return f"pass --tokenizer hf:{repo.format(size=size.upper() if size.endswith('m') else size)}"
    if model.startswith(_OLLAMA):
        where = f"https://ollama.com/library/{name.split(':')[0]}"
    elif model.startswith("openrouter/"):
        where = f"https://openrouter.ai/{name}"
    else:
        where = "the model's card"
    return (
        f"pass --tokenizer hf:<the model's Hugging Face repo> (see {where}), or tiktoken:o200k_base "
        "to count approximately"
    )


# ----------------------------------------------------------------- the checks


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


def _ollama(model: str, api_base: str | None, problems: list[str], passed: list[str]) -> ModelContext:
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
        return ModelContext()
    wanted = name if ":" in name else f"{name}:latest"
    if wanted not in served and name not in served:
        have = ", ".join(served[:8]) or "no models"
        problems.append(f"Ollama at {base} has no model {name!r} (it has: {have}): run `ollama pull {name}`")
        return ModelContext()
    passed.append(f"Ollama at {base} serves {name}")
    try:
        shown = httpx.post(f"{base}/api/show", json={"model": name}, timeout=HTTP_TIMEOUT_S).json()
        lengths = [v for k, v in (shown.get("model_info") or {}).items() if k.endswith(".context_length")]
        if lengths:
            return ModelContext(int(lengths[0]), f"Ollama /api/show for {name}")
    except (httpx.HTTPError, ValueError, TypeError):
        pass
    return ModelContext()


def _openai_compatible(model: str, api_base: str, problems: list[str], passed: list[str]) -> ModelContext:
    base = api_base.rstrip("/")
    key = os.environ.get("OPENAI_API_KEY") if model.startswith("openai/") else None
    try:
        listing = _get(f"{base}/models", {"Authorization": f"Bearer {key or 'not-needed'}"})
    except httpx.HTTPError as exc:
        problems.append(
            f"no server answers at {base} ({_one_line(exc, 120)}): start it, or fix --api-base "
            "(an OpenAI-compatible server's address ends in /v1)"
        )
        return ModelContext()
    if listing.status_code in (401, 403):
        variable = "OPENAI_API_KEY" if model.startswith("openai/") else "the provider's key variable"
        problems.append(f"{base} refused the API key ({listing.status_code}): set {variable} to a key it accepts")
        return ModelContext()
    if listing.status_code == 404:
        return _tiny_call(model, api_base, problems, passed)
    if listing.status_code != 200:
        problems.append(f"{base}/models answered {listing.status_code}: check --api-base and that the server is ready")
        return ModelContext()
    passed.append(f"server at {base} answered")
    try:
        entries = listing.json().get("data", [])
    except ValueError:
        entries = []
    served = model.split("/", 1)[1]
    for entry in entries:
        if isinstance(entry, dict) and entry.get("id") == served and entry.get("max_model_len"):
            limit = int(entry["max_model_len"])
            return ModelContext(limit, f"{base}/models max_model_len", total_limit=limit)
    return ModelContext()


def _tiny_call(model: str, api_base: str | None, problems: list[str], passed: list[str]) -> ModelContext:
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
        return ModelContext()
    passed.append(f"{model} answered a one-token call")
    return ModelContext()


def _hosted_context(model: str) -> ModelContext:
    try:
        info = _litellm().get_model_info(model)
    except Exception:
        return ModelContext()
    tokens = info.get("max_input_tokens") if info else None
    return ModelContext(int(tokens), "litellm's model table") if tokens else ModelContext()


def _local_context(backend_class: type, config: Any, problems: list[str], flag: str = "--model") -> ModelContext:
    try:
        backend = backend_class(config.model)
    except Exception as exc:  # model file missing: the message says which wheel or path
        problems.append(f"{flag} {config.model}: {exc}")
        return ModelContext()
    path = getattr(backend, "model_path", None)
    if path is not None and not path.is_file():
        problems.append(f"{flag} {config.model}: no such model file {path}; give the path of a .gguf file")
        return ModelContext()
    tokens = getattr(backend, "model_context", None)
    return ModelContext(tokens, f"the embedded model {backend.model_path.name}") if tokens else ModelContext()


def _tokenizer(
    config: Any, registry: Registry, backend_class: type[Backend], problems: list[str], passed: list[str]
) -> None:
    if backend_class.name == "local" and (config.tokenizer or "server") == "server":
        return  # the embedded server counts for itself; it starts with the run
    try:
        backend = backend_class(config.model, api_base=config.api_base, timeout_s=config.timeout_s)
    except Exception as exc:
        problems.append(f"--model {config.model!r}: backend {backend_class.name!r} refused it ({_one_line(exc)})")
        return
    spec = config.tokenizer or backend.default_tokenizer()
    if not spec:
        problems.append(
            f"--model {config.model!r} has no exact tokenizer of its own: {suggest_tokenizer(config.model)}"
        )
        return
    prefix = spec.partition(":")[0]
    try:
        tokenizer = registry.resolve_tokenizer(spec, backend)
        tokenizer.count([Message("user", "preflight")])
    except UnknownNameError:
        close = difflib.get_close_matches(prefix, registry.names("tokenizer"), n=1)
        hint = f"did you mean {close[0] + ':'!r}? " if close else ""
        problems.append(
            f"--tokenizer {spec!r}: unknown kind {prefix!r}; {hint}use hf:<dir or id>, "
            "tiktoken:<encoding>, gguf:<file> or server"
        )
        return
    except Exception as exc:
        fix = "download it once with network access, or pass a local folder" if prefix == "hf" else "check the spec"
        problems.append(f"--tokenizer {spec!r} does not load ({_one_line(exc, 160)}): {fix}")
        return
    passed.append(f"tokenizer {tokenizer.info.id} loaded" + ("" if tokenizer.info.exact else " (approximate)"))


def fitting_budgets(context: ModelContext, max_output: int) -> list[int]:
    """The default tiers that fit ``context`` (all of them when it is unknown)."""
    if context.tokens is None:
        return list(DEFAULT_BUDGETS)
    fit = [
        b
        for b in DEFAULT_BUDGETS
        if b <= context.tokens and (context.total_limit is None or b + max_output <= context.total_limit)
    ]
    return fit or [max(256, min(context.tokens, context.total_limit or context.tokens) - max_output)]


# the example of a larger model names its tokenizer too, or following the hint fails next
LARGER_MODEL = " (e.g. --model ollama_chat/qwen2.5:1.5b --tokenizer hf:Qwen/Qwen2.5-1.5B-Instruct)"


def _check_budgets(budgets: list[int], context: ModelContext, max_output: int, problems: list[str]) -> None:
    if context.tokens is None:
        return
    too_big = [b for b in budgets if b > context.tokens]
    if context.total_limit is not None:
        too_big += [b for b in budgets if b not in too_big and b + max_output > context.total_limit]
    if too_big:
        fit = " ".join(map(str, fitting_budgets(context, max_output)))
        limit = (
            f"{context.total_limit} tokens for prompt + {max_output} output"
            if context.total_limit
            else f"{context.tokens} tokens"
        )
        problems.append(
            f"budget{'s' if len(too_big) > 1 else ''} {' '.join(map(str, sorted(too_big)))} "
            f"do{'' if len(too_big) > 1 else 'es'} not fit the model's context ({limit}, from "
            f'{context.source}): use -b "{fit}" or a model with a larger context{LARGER_MODEL}'
        )


def _judge(config: Any, registry: Registry, problems: list[str], full: bool) -> None:
    """A judge model other than --model: its model file, or its provider and key (no call)."""
    judge = getattr(config, "judge_model", None)
    if not judge or judge == config.model:
        return
    judge_class = registry.resolve_backend(judge).obj
    if judge_class.name == "local":
        _local_context(judge_class, SimpleNamespace(model=judge), problems, "--judge-model")
    elif judge_class.name == "litellm":
        provider = _provider(judge, problems, "--judge-model")
        if provider and full:
            _keys(judge, provider, None, problems, "--judge-model")


def preflight(
    config: Any, registry: Registry, *, budgets_given: bool, full: bool = True, max_output: int = 64
) -> PreflightReport:
    """Check ``config`` (a RunConfig) before the run; raise PreflightError listing every problem.

    ``budgets_given`` False means the tiers are to be chosen here: the default tiers that fit
    the model's context. ``full`` False (``--no-preflight``) skips network and tokenizer checks.
    """
    problems: list[str] = []
    passed: list[str] = []
    context = ModelContext()
    backend_class = registry.resolve_backend(config.model).obj
    if backend_class.name == "local":
        context = _local_context(backend_class, config, problems)
    elif backend_class.name == "litellm":
        provider = _provider(config.model, problems)
        if provider and full:
            _keys(config.model, provider, config.api_base, problems)
            if not problems:
                if config.model.startswith(_OLLAMA):
                    context = _ollama(config.model, config.api_base, problems, passed)
                elif config.api_base:
                    context = _openai_compatible(config.model, config.api_base, problems, passed)
                elif not getattr(config, "prompts_only", False):  # a prompts-only run calls no model
                    context = _tiny_call(config.model, None, problems, passed)
        if provider and context.tokens is None:
            context = _hosted_context(config.model)
    if full and not problems:
        _tokenizer(config, registry, backend_class, problems, passed)
    _judge(config, registry, problems, full)
    notes: list[str] = []
    budgets = list(config.budgets)
    if not budgets_given:
        budgets = fitting_budgets(context, max_output)
        if context.tokens is not None and budgets != list(DEFAULT_BUDGETS):
            dropped = [b for b in DEFAULT_BUDGETS if b not in budgets]
            notes.append(
                f"budgets: {' '.join(map(str, budgets))} (the model's context is {context.tokens} tokens, "
                f"from {context.source}; {' '.join(map(str, dropped))} would not fit; choose with -b)"
            )
    else:
        _check_budgets(budgets, context, max_output, problems)
    if problems:
        raise PreflightError(problems)
    return PreflightReport(budgets, context, notes, passed)
