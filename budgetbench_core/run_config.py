"""What a run is asked to do (``RunConfig``), what it reports at the end (``RunSummary``), and
the checks a configuration passes before anything starts. Imported by the CLI, the runner and
the engine alike, so none of them imports another for a type."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from .controls import CONTROLS
from .failfast import DEFAULT_MAX_CONSECUTIVE

DEFAULT_BUDGETS = (2048, 4096, 8192, 16384, 32768)


class RunConfigError(ValueError):
    """The requested run cannot start; the message says what to change."""


@dataclass
class RunConfig:
    task: str
    strategies: list[str]
    out: Path
    budgets: list[int] = field(default_factory=lambda: list(DEFAULT_BUDGETS))
    model: str = "local"
    api_base: str | None = None
    tokenizer: str | None = None
    grader: str | None = None
    judge_model: str | None = None
    task_options: dict[str, Any] = field(default_factory=dict)
    strategy_params: dict[str, dict[str, Any]] = field(default_factory=dict)
    limit: int | None = None
    repeats: int = 1
    seed: int = 0
    max_concurrency: int = 4
    temperature: float = 0.0
    max_output_tokens: int | None = None
    retries: int = 4
    timeout_s: float = 120.0
    item_timeout_s: float = 600.0
    max_ingest_loss: float = 0.0
    # How units are scheduled, never what they compute: not part of the run identity.
    executor: str = "thread"
    executor_options: dict[str, Any] = field(default_factory=dict)
    shard: str | None = None  # "i/N": only the units of shard i of N (see shards.py)
    server_prompt_cache: bool = False  # let a llama.cpp server reuse cached prompts: faster, replies may differ
    prompts_only: bool = False  # strategies, gate, audit and evidence recall only: no model call
    max_consecutive_failures: int = DEFAULT_MAX_CONSECUTIVE  # the same transport error this often: stop
    # "process": strategies run in confined worker processes (host/); "none": in this process,
    # for debugging a plugin only (recorded in the identity and shown in the report header)
    isolation: str = "process"
    # also run the harness controls (control:no_memory, control:evidence_only): reference lines, never ranked
    controls: bool = False
    price: str | None = None  # "IN/OUT" $ per million tokens for the cost ledger (default: litellm's map)

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["out"] = str(self.out)
        return data


@dataclass
class RunSummary:
    run_dir: Path
    cells_total: int
    cells_skipped: int
    results: int
    violations: int
    errors: int
    model_calls: int
    wall_s: float
    admitted: int = 0  # prompts-only run: prompts that fitted (not sent)
    stopped: str | None = None  # why the run stopped early (failfast), None if it did not
    stopped_fatal: bool = False  # stopped by a refused key, unknown provider or model


def normalised(config: RunConfig) -> RunConfig:
    """``config`` with duplicate budgets and strategies removed (first occurrence kept): a
    cell is never run twice in one command."""
    controls = list(CONTROLS) if config.controls else []
    return replace(
        config,
        budgets=list(dict.fromkeys(int(b) for b in config.budgets)),
        strategies=list(dict.fromkeys([*config.strategies, *controls])),
    )


def refuse_credentials_in_urls(config: RunConfig) -> None:
    """A URL option carrying a user or password would be written to the manifest and identity:
    refused, with the way to pass a key instead."""
    urls = {"--api-base": config.api_base, **{f"--executor-option {k}": v for k, v in config.executor_options.items()}}
    for option, value in urls.items():
        if not isinstance(value, str) or "@" not in value:
            continue
        parts = urlsplit(value)
        if parts.username or parts.password:
            shown = parts._replace(
                netloc=f"<credentials>@{parts.hostname or ''}{f':{parts.port}' if parts.port else ''}"
            )
            raise RunConfigError(
                f"{option} {shown.geturl()}: the URL carries credentials, which would be written to the run's "
                f"manifest and identity; pass the key in the environment instead (OPENAI_API_KEY, or the "
                f"provider's *_API_KEY variable litellm reads) and give the URL without it"
            )
