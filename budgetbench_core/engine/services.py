"""What a cell is given to run: one services object, built once per run (and once per remote
worker), never the runner. Everything here is either read-only for a cell or safe to share
between the cells running at once (the log, the callers, the pool, the tally)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import urlsplit

from ..backends import GenerationParams
from ..cell import CellLog, CellStamp
from ..graders import Grader, GradingContext
from ..host.metering import Metering, charge
from ..host.pool import PluginHost
from ..host.quotas import Quota, half_the_memory
from ..messages import Item, Message
from ..model_calls import ModelCaller
from ..run_config import RunConfig
from ..runlog import EventLog
from ..sandbox import PluginRef, PrivateView, SealedView, canonical_prompt, opaque_id
from ..strategies import MemoryStrategy
from ..tasks import Task
from ..tokenizers import PromptCounter
from .run_plugins import JUDGE_CONTEXT, RunPlugins
from .strategy_pool import StrategyPool


@dataclass(frozen=True)
class CellSettings:
    """The slice of the run's config a cell reads."""

    task: str
    run_key: str
    tokenizer: dict[str, Any]
    seed: int
    temperature: float
    max_output_tokens: int
    item_timeout_s: float
    timeout_s: float
    prompts_only: bool
    model: str
    judge_model: str | None
    user_context: int  # the largest prompt a simulated user's call may have: the largest tier
    judge_context: int  # the same for the judge
    view_key: bytes = field(repr=False)  # the secret of the views' opaque item ids (``view``); no default: never b""

    @classmethod
    def of(
        cls, config: RunConfig, plugins: RunPlugins, run_key: str, tokenizer: dict[str, Any], view_key: bytes
    ) -> CellSettings:
        return cls(
            view_key=view_key,
            task=config.task,
            run_key=run_key,
            tokenizer=tokenizer,
            seed=config.seed,
            temperature=config.temperature,
            max_output_tokens=plugins.max_output_tokens,
            item_timeout_s=config.item_timeout_s,
            timeout_s=config.timeout_s,
            prompts_only=config.prompts_only,
            model=config.model,
            judge_model=config.judge_model,
            user_context=max(config.budgets),
            judge_context=(
                JUDGE_CONTEXT - plugins.max_output_tokens if plugins.judge_backend is not None else max(config.budgets)
            ),
        )


Tally = Callable[[str, dict[str, Any] | None], None]


class StrategyRefs(Protocol):
    """What a cell's prompt step needs of the run's strategies: the calling thread's instance,
    its blame, giving it back when a unit's prompts are built, and dropping an instance that
    timed out (``StrategyPool``; the conformance kit's one-strategy pool)."""

    def get(self, name: str) -> MemoryStrategy: ...

    def ref(self, name: str) -> PluginRef: ...

    def release(self, name: str) -> None: ...

    def discard(self, name: str) -> None: ...


@dataclass(frozen=True)
class PromptServices:
    """What building, gating and auditing a prompt needs (``pipeline.build_prompt`` and the
    strategy's context): the counter, the auxiliary-call caller, the log and the strategies.
    The conformance kit builds this part alone: it has no task, grader or judge."""

    settings: CellSettings
    counter: PromptCounter
    tokenizer_ref: PluginRef
    caller: ModelCaller | None  # None only where no model is called (a kit without a model)
    log: EventLog
    run_dir: Path  # where the main process keeps saved retrievals (never given to a plugin)
    scratch_dir: Path  # the plugins' own files (in-process strategies only; workers have their own)
    strategies: StrategyRefs
    evidence: Mapping[str, Sequence[Any]]  # item id -> its evidence marks (intake)
    tally: Tally | None

    def cell_key(self, strategy: str, item: Item, budget: int, repeat: int) -> CellStamp:
        s = self.settings
        return CellStamp(s.task, strategy, budget, repeat, item.id, item.category, s.run_key, s.tokenizer)

    def cell(self, strategy: str, item: Item, budget: int, repeat: int) -> CellLog:
        return CellLog(self.log, self.cell_key(strategy, item, budget, repeat), self.tally)


@dataclass(frozen=True)
class CellServices(PromptServices):
    """Counter, callers, log, strategies, task and grader of a run, as cells use them."""

    caller: ModelCaller
    strategies: StrategyPool
    tally: Tally
    task: Task
    task_ref: PluginRef
    grader: Grader
    grader_name: str
    grader_ref: PluginRef
    hidden_metadata: Any  # grading-only metadata keys, withheld from every strategy's view
    backend_name: str
    judge_caller: ModelCaller
    stop: threading.Event
    on_turn: Callable[[dict[str, Any]], None] | None = None  # each finished episode turn, for the display

    def view(self, item: Item, sealed: bool = False) -> PrivateView | SealedView:
        """``item`` as a strategy sees it: no grading key, and an opaque id (``opaque_id``).
        ``sealed``: for a strategy in a worker process, of an item the intake made canonical."""
        made = SealedView if sealed else PrivateView
        return made(item, self.hidden_metadata, opaque_id(self.settings.view_key, item.id))

    def grading(self, cell: CellLog | None = None) -> GradingContext:
        """The grader's context; its judge calls are charged to ``cell`` (phase ``judge``)."""
        return GradingContext(
            judge=lambda messages, max_tokens: self.judge(messages, max_tokens, cell),
            judge_model=self.settings.judge_model or self.settings.model,
        )

    def judge(self, messages: Sequence[Message], max_tokens: int, cell: CellLog | None = None) -> str:
        """A grader's judge call: the judge's caller, temperature 0, the run's seed. Its tokens go
        on ``cell``'s ``metered.judge``: our exact count when the judge is the run's model, the
        judge server's own count otherwise (missing when it reports none)."""
        params = GenerationParams(int(max_tokens), 0.0, self.settings.seed)
        prompt = canonical_prompt(list(messages))
        outcome = self.judge_caller.call(prompt, params)
        if cell is not None:
            completion = outcome.completion
            own_model = self.judge_caller is self.caller
            charge(
                cell,
                "judge",
                self.counter.count(prompt) if own_model else completion.prompt_tokens,
                completion.completion_tokens,
                0.0 if outcome.cached else (completion.latency_s or 0.0),
            )
        return outcome.completion.text

    @classmethod
    def assemble(
        cls,
        config: RunConfig,
        plugins: RunPlugins,
        settings: CellSettings,
        counter: PromptCounter,
        callers: tuple[ModelCaller, ModelCaller],
        strategies: StrategyPool,
        **shared: Any,
    ) -> CellServices:
        """The services of a run (driver or remote worker): ``shared`` holds ``log``,
        ``run_dir``, ``scratch_dir``, ``evidence``, ``tally`` and ``stop``."""
        return cls(
            settings=settings,
            task=plugins.task,
            task_ref=plugins.ref("task", config.task),
            grader=plugins.grader,
            grader_name=plugins.grader_name,
            grader_ref=plugins.ref("grader", plugins.grader_name),
            hidden_metadata=plugins.hidden_metadata,
            counter=counter,
            tokenizer_ref=plugins.tokenizer_ref,
            backend_name=plugins.backend_name,
            caller=callers[0],
            judge_caller=callers[1],
            strategies=strategies,
            **shared,
        )

    def with_log(self, log: Any) -> CellServices:
        """The same services writing to ``log`` (a remote worker's buffer)."""
        return replace(self, log=log)


def callers(
    plugins: RunPlugins, cache: Any, max_concurrency: int, retries: int, timeout_s: float, **options: Any
) -> tuple[ModelCaller, ModelCaller]:
    """The model's caller and the judge's (the same one without a judge model of its own);
    ``options`` go to ``ModelCaller`` (``fail_fast``, or ``caller_class`` for a remote worker's)."""
    caller_class = options.pop("caller_class", ModelCaller)

    def caller(backend: Any, name: str) -> ModelCaller:
        ref = plugins.ref("backend", name)
        return caller_class(backend, cache, max_concurrency, retries, timeout_s=timeout_s, plugin=ref, **options)

    model = caller(plugins.backend, plugins.backend_name)
    judge = caller(plugins.judge_backend, plugins.judge_backend.name) if plugins.judge_backend else model
    return model, judge


def plugin_host(
    config: RunConfig,
    plugins: RunPlugins,
    tokenizer: dict[str, Any],
    scratch_dir: Path,
    guarded: list[Path],
    caller: ModelCaller,
    counter: PromptCounter,
) -> tuple[PluginHost | None, Metering | None]:
    """The confined workers of an isolated run, and the gateway their own SDKs call (with a
    model to meter); ``guarded`` are the paths no strategy may declare it reads, and no
    strategy may declare it reaches the run's model or judge servers (only the gateway does)."""
    if config.isolation != "process":
        return None, None
    memory = config.worker_memory_mb * 2**20 if config.worker_memory_mb is not None else half_the_memory()
    quota = Quota(config.worker_disk_mb * 2**20, config.worker_processes, memory)
    host = PluginHost(tokenizer, scratch_dir, max_workers=config.max_concurrency, quota=quota)
    host.guarded = guarded
    host.guarded_hosts = server_hosts(plugins)
    metering = None
    if not config.prompts_only:
        metering = Metering(caller, counter, config.seed)
        metering.start()
        host.meter_with(metering)
    return host, metering


def server_hosts(plugins: RunPlugins) -> list[str]:
    """``host:port`` of every model server the run talks to (the embedded one once started)."""
    hosts = []
    for backend in (plugins.backend, plugins.judge_backend):
        for name in ("api_base", "server_url"):
            url = getattr(backend, name, None) if backend is not None else None
            if isinstance(url, str) and "://" in url:
                parts = urlsplit(url)
                if parts.hostname:
                    default = 443 if parts.scheme == "https" else 80
                    hosts.append(f"{parts.hostname}:{parts.port or default}")
    return sorted(set(hosts))
