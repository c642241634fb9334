"""Checks before the first cell, so a mistake costs seconds, not a run of errored cells.

In order: what the model's backend can check for itself (``Backend.preflight``: for litellm,
the provider, its key and the server; for the embedded model, its file), the tokenizer
loads and counts, and every budget fits the model's context where the backend learnt it.
Nothing here depends on which backend it is. Every failure is one line naming what to
change. ``budgetbench run --no-preflight`` skips the checks that need the network or the
tokenizer; parameter checks (``params``) always run.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from .backends import Backend
from .messages import Message
from .plugins import Registry, UnknownNameError
from .run_config import DEFAULT_BUDGETS, RunConfigError

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


def _backend_check(
    backend_class: type[Backend],
    model: str,
    config: Any,
    problems: list[str],
    passed: list[str],
    flag: str,
    full: bool,
    judge: bool = False,
) -> ModelContext:
    """Ask the backend what it can check before the run (``Backend.preflight``): nothing here
    depends on which backend it is."""
    try:
        backend = backend_class(model, api_base=None if judge else config.api_base, timeout_s=config.timeout_s)
        found = backend.preflight(flag, full, judge=judge, prompts_only=bool(getattr(config, "prompts_only", False)))
    except Exception as exc:  # e.g. the embedded model's wheel is missing: the message says which
        problems.append(f"{flag} {model}: {exc}")
        return ModelContext()
    problems.extend(found.problems)
    passed.extend(found.passed)
    return ModelContext(found.context_tokens, found.context_source, found.total_limit)


def _tokenizer(
    config: Any, registry: Registry, backend_class: type[Backend], problems: list[str], passed: list[str]
) -> None:
    try:
        backend = backend_class(config.model, api_base=config.api_base, timeout_s=config.timeout_s)
    except Exception as exc:
        problems.append(f"--model {config.model!r}: backend {backend_class.name!r} refused it ({_one_line(exc)})")
        return
    spec = config.tokenizer or backend.default_tokenizer()
    if backend.counts_on_own_server and spec == backend.default_tokenizer():
        return  # its own tokenizer counts on its own server, which starts with the run
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
    """A judge model other than --model: what its backend checks without contacting it."""
    judge = getattr(config, "judge_model", None)
    if not judge or judge == config.model:
        return
    judge_class = registry.resolve_backend(judge).obj
    _backend_check(judge_class, judge, config, problems, [], "--judge-model", full, judge=True)


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
    context = _backend_check(backend_class, config.model, config, problems, passed, "--model", full)
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
