"""The runner: tasks x strategies x budgets x repeats, with the budget enforced here.

Work is split into units of (strategy, item); a unit runs every (budget, repeat) of its
item in a seeded shuffled order, so per-item strategy state (an embedding index, a
retrieval) is built once and reused for every tier. Units run in a seeded shuffled
order on ``max_concurrency`` worker threads.

For every cell the runner asks the strategy for a prompt, checks that the prompt is
well formed, counts it exactly with the chat template, and sends it only if it fits.
An over-budget prompt becomes a ``violation`` row scored 0; a failure becomes an
``error`` row with its cause; nothing is ever guessed.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import platform
import random
import subprocess
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from dataclasses import asdict, dataclass, field, replace
from importlib import metadata
from pathlib import Path
from typing import Any

from .backends import Backend, GenerationParams
from .cache import ResponseCache
from .graders import Grader, GradingContext
from .memory_systems import IngestLossError, MemorySystem, MemorySystemStrategy
from .messages import ROLES, Item, Message
from .model_calls import CallFailed, ModelCaller
from .plugins import PluginError, Registry, get_registry
from .runlog import (
    FINAL_EVENTS,
    SCHEMA_VERSION,
    EventLog,
    final_rows,
    now,
    read_manifest,
    repair_torn_tails,
    write_json_atomic,
)
from .strategies import MemoryStrategy, StrategyContext
from .tasks import Task, TaskDataError
from .tokenizers import PromptCounter, Tokenizer

DEFAULT_BUDGETS = (2048, 4096, 8192, 16384, 32768)

# Changing any of these makes an existing run directory a different experiment.
_IDENTITY_FIELDS = ("task", "task_options", "model", "api_base", "tokenizer", "grader", "judge_model",
                    "limit", "seed", "temperature", "max_output_tokens")


class RunConfigError(ValueError):
    """The requested run cannot start; the message says what to change."""


class AuxiliaryBudgetError(RuntimeError):
    """A strategy's auxiliary call (summary, compression) had a prompt over the budget."""

    def __init__(self, message: str, prompt_tokens: int) -> None:
        super().__init__(message)
        self.prompt_tokens = prompt_tokens


class StrategyTimeout(RuntimeError):
    pass


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


def _git_commit() -> str | None:
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5,
                             cwd=Path(__file__).resolve().parent)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None if out.returncode == 0 else None


def _message_fingerprint(message: Message) -> int:
    try:
        return hash((message.role, message.content, tuple(message.metadata.items())))
    except TypeError:  # mutable (unhashable) metadata values: compare their text
        return hash((message.role, message.content, tuple(sorted(map(str, message.metadata.items())))))


def _history_fingerprint(history: Sequence[Message]) -> int:
    """Checked after every cell; hashable metadata is hashed directly (str hashes are
    cached), since turning every value into text cost ~5 ms per cell on a 500-message history."""
    return hash(tuple(map(_message_fingerprint, history)))


def _private_copy(item: Item) -> Item:
    """``item`` with Message objects of its own, so a strategy that defeats the frozen
    dataclasses (``object.__setattr__``) spoils only its own cells, not its neighbours'."""
    def copy(message: Message) -> Message:
        return Message(message.role, message.content, message.metadata)

    return replace(item, history=tuple(map(copy, item.history)), query=copy(item.query),
                   system=copy(item.system) if item.system is not None else None)


def _check_text(task: str, item: Item) -> None:
    """Undecodable bytes smuggled in as surrogates (``errors="surrogateescape"``) cannot be
    logged, counted or sent: refuse them up front, naming the item and field."""
    fields = [("system", item.system), ("query", item.query), *((f"history[{i}]", m) for i, m in enumerate(item.history))]
    for name, message in fields:
        if message is None:
            continue
        try:
            message.content.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise TaskDataError(f"task {task!r}, item {item.id!r}: {name}.content is not valid UTF-8 text (undecodable "
                                f"byte at character {exc.start}); decode the source file strictly") from None


def _backend_for(model: str) -> str:
    """``local`` and ``local:<gguf>`` run the embedded server; anything else goes to litellm."""
    return "local" if model == "local" or model.startswith("local:") else "litellm"


def _prompt_hash(messages: Sequence[Message]) -> str:
    payload = json.dumps([m.to_chat() for m in messages], ensure_ascii=False)
    return hashlib.sha256(payload.encode("utf-8", "surrogatepass")).hexdigest()


def _describe_error(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


@contextlib.contextmanager
def _exclusive(run_dir: Path) -> Iterator[None]:
    """One process per run directory: two would overwrite each other's manifest. The OS
    releases the lock when its holder dies, even by kill -9, so a resume is never blocked."""
    import fcntl  # POSIX only, like the embedded server

    with open(run_dir / ".lock", "w") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise RunConfigError(f"{run_dir} is in use by another budgetbench run; wait for it to finish "
                                 f"or choose another --out") from None
        yield


def _call_with_timeout(function: Callable[[], Any], timeout_s: float) -> Any:
    """Run ``function`` on a daemon thread; a hang past ``timeout_s`` raises StrategyTimeout."""
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["value"] = function()
        except BaseException as exc:  # handed back to the caller below
            box["error"] = exc

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(timeout_s)
    if thread.is_alive():
        raise StrategyTimeout(f"did not return within {timeout_s:g} s")
    if "error" in box:
        raise box["error"]
    return box["value"]


class Run:
    """One run directory being filled. Build with ``Run.prepare(config)``, then ``execute()``."""

    def __init__(self, config: RunConfig, registry: Registry) -> None:
        self.config = config
        self.registry = registry
        self.run_dir = Path(config.out)
        self.task: Task = self._instantiate("task", config.task, **config.task_options)
        grader_name = config.grader or self.task.default_grader
        self.grader: Grader = self._instantiate("grader", grader_name)
        self.strategy_classes = {name: registry.get("strategy", name).obj for name in config.strategies}
        self.max_output_tokens = config.max_output_tokens or self.task.max_output_tokens
        backend_name = _backend_for(config.model)
        backend_class = registry.get("backend", backend_name).obj
        self.backend: Backend = backend_class(
            config.model, api_base=config.api_base, timeout_s=config.timeout_s,
            max_context=max(config.budgets) + self.max_output_tokens, max_concurrency=config.max_concurrency,
        )
        self.judge_backend: Backend | None = None
        if config.judge_model and config.judge_model != config.model:
            judge_class = registry.get("backend", _backend_for(config.judge_model)).obj
            self.judge_backend = judge_class(config.judge_model, timeout_s=config.timeout_s,
                                             max_context=32768, max_concurrency=config.max_concurrency)
        self.log = EventLog(self.run_dir)
        self._local = threading.local()
        self._stop = threading.Event()
        self._stats_lock = threading.Lock()
        self.stats = {"results": 0, "violations": 0, "errors": 0, "cells_skipped": 0}

    def _instantiate(self, kind: str, name: str, **params: Any) -> Any:
        registered = self.registry.get(kind, name)
        try:
            return registered.obj(**params)
        except TaskDataError:
            raise  # already names the file, record and field
        except Exception as exc:
            raise PluginError(
                f"{kind} {name!r} from {registered.plugin.distribution} could not be created with {params}: "
                f"{_describe_error(exc)}"
            ) from exc

    # ----------------------------------------------------------------- setup

    def _check_identity(self) -> None:
        previous = read_manifest(self.run_dir)
        if previous is None:
            return
        old = previous.get("config", {})
        new = self.config.to_dict()
        changed = [name for name in _IDENTITY_FIELDS if old.get(name) != new.get(name)]
        if changed:
            details = "; ".join(f"{name}: {old.get(name)!r} -> {new.get(name)!r}" for name in changed)
            raise RunConfigError(
                f"{self.run_dir} holds a different run ({details}). Resume it with the same settings "
                f"or choose another --out."
            )

    def _tokenizer(self) -> Tokenizer:
        spec = self.config.tokenizer or self.backend.default_tokenizer()
        if not spec:
            raise RunConfigError(
                f"model {self.config.model!r} has no default tokenizer: pass --tokenizer "
                f"(hf:<dir>, tiktoken:<encoding>, gguf:<file> or server)"
            )
        prefix, _, argument = spec.partition(":")
        factory = self.registry.get("tokenizer", prefix).obj
        return factory(argument, self.backend)

    def _load_items(self) -> list[Item]:
        """All items up front; a loader bug becomes an error naming the task and its distribution."""
        try:
            items = list(self.task.load(self.config.limit, self.config.seed))
        except TaskDataError:
            raise  # already names the file, record and field
        except Exception as exc:
            registered = self.registry.get("task", self.config.task)
            raise PluginError(f"task {self.config.task!r} ({registered.plugin.distribution}) failed to load its items: "
                              f"{_describe_error(exc)}") from exc
        if not items:
            raise TaskDataError(f"task {self.config.task!r} produced no items (options {self.config.task_options}, "
                                f"limit {self.config.limit}): nothing to run")
        for item in items:
            _check_text(self.config.task, item)
        return items

    def _manifest(self, tokenizer: Tokenizer, started: str) -> dict[str, Any]:
        strategies = {}
        for name in self.config.strategies:
            strategy = self._new_strategy(name)
            strategies[name] = {**strategy.describe(), "distribution": self.registry.get("strategy", name).plugin.distribution}
        used = {("task", self.config.task), ("grader", self.grader.name)} | {("strategy", s) for s in self.config.strategies}
        return {
            "schema_version": SCHEMA_VERSION,
            "config": self.config.to_dict(),
            "started": started,
            "versions": {"budgetbench": metadata.version("budgetbench"), "python": platform.python_version(),
                         **self.registry.distributions()},
            "plugins_used": {f"{kind}:{name}": {"distribution": self.registry.get(kind, name).plugin.distribution,
                                                 "version": self.registry.get(kind, name).plugin.version}
                             for kind, name in sorted(used)},
            "task": self.task.manifest_notes(),
            "grader": {"name": self.grader.name, "version": self.grader.version, "binary": self.grader.binary,
                       "judge_model": self.config.judge_model},
            "strategies": strategies,
            "model": self.backend.describe(),
            "judge": self.judge_backend.describe() if self.judge_backend else None,
            "tokenizer": tokenizer.info.to_dict(),
            "plugin_failures": [{"name": p.name, "distribution": p.distribution, "version": p.version, "error": p.error}
                                for p in self.registry.failures],
            "git_commit": _git_commit(),
            "host": {"node": platform.node(), "platform": platform.platform(), "cpus": os.cpu_count()},
        }

    def _new_strategy(self, name: str) -> MemoryStrategy:
        cls = self.strategy_classes[name]
        params = self.config.strategy_params.get(name, {})
        registered = self.registry.get("strategy", name)
        try:
            if issubclass(cls, MemorySystem):
                return MemorySystemStrategy(cls(**params), max_ingest_loss=self.config.max_ingest_loss)
            return cls(**params)
        except Exception as exc:
            raise PluginError(
                f"strategy {name!r} from {registered.plugin.distribution} could not be created with {params}: "
                f"{_describe_error(exc)}"
            ) from exc

    def _strategy(self, name: str) -> MemoryStrategy:
        """One instance per worker thread: strategies keep per-item state."""
        cache = getattr(self._local, "strategies", None)
        if cache is None:
            cache = self._local.strategies = {}
        if name not in cache:
            cache[name] = self._new_strategy(name)
        return cache[name]

    def _discard_strategy(self, name: str) -> None:
        getattr(self._local, "strategies", {}).pop(name, None)

    # ----------------------------------------------------------------- events

    def _emit(self, event: dict[str, Any]) -> None:
        self.log.append(event)
        kind = event["event"]
        if kind in ("result", "violation", "error"):
            with self._stats_lock:
                self.stats[kind + "s"] += 1

    # ----------------------------------------------------------------- one cell

    def _run_cell(self, strategy_name: str, item: Item, budget: int, repeat: int, fingerprint: int) -> None:
        base = {"task": self.config.task, "strategy": strategy_name, "budget": budget, "repeat": repeat,
                "item_id": item.id, "category": item.category, "tokenizer": self.tokenizer_info}
        aux = {"aux_calls": 0, "aux_prompt_tokens": 0, "aux_completion_tokens": 0, "aux_latency_s": 0.0}
        strategy = self._strategy(strategy_name)
        context = StrategyContext(item=item, budget=budget, counter=self.counter, seed=self.config.seed + repeat,
                                  run_dir=self.run_dir, complete=self._auxiliary_call(base, budget, aux, repeat))
        started = time.perf_counter()
        try:
            prompt = _call_with_timeout(lambda: strategy.apply(item.history, budget, context),
                                        self.config.item_timeout_s)
            strategy_s = time.perf_counter() - started
            self._validate_prompt(strategy_name, item, prompt, fingerprint)
        except AuxiliaryBudgetError as exc:
            self._emit({**base, "event": "violation", "phase": "auxiliary", "prompt_tokens": exc.prompt_tokens,
                        "quality": 0, "cause": str(exc), **aux})
            return
        except Exception as exc:
            if isinstance(exc, StrategyTimeout):
                self._discard_strategy(strategy_name)
            phase = "ingest" if isinstance(exc, IngestLossError) else "strategy"
            self._emit({**base, "event": "error", "phase": phase, "plugin": strategy_name,
                        "cause": f"strategy {strategy_name!r} failed on item {item.id!r}: {_describe_error(exc)}",
                        "strategy_s": time.perf_counter() - started, **aux})
            return
        try:
            prompt_tokens = self.counter.count(prompt)
        except Exception as exc:
            self._emit({**base, "event": "error", "phase": "counting", "cause": f"token counting failed: {_describe_error(exc)}"})
            return
        self._emit({**base, "event": "prompt_audit", "prompt_hash": _prompt_hash(prompt), "prompt_tokens": prompt_tokens,
                    "messages": [m.to_dict() for m in prompt], "strategy_audit": context.audit})
        if prompt_tokens > budget:
            self._emit({**base, "event": "violation", "phase": "prompt", "prompt_tokens": prompt_tokens, "quality": 0,
                        "strategy_s": strategy_s, **aux})
            return
        params = GenerationParams(self.max_output_tokens, self.config.temperature,
                                  self.config.seed + repeat)
        try:
            outcome = self.caller.call(prompt, params)
        except CallFailed as exc:
            self._emit({**base, "event": "error", "phase": "model", "cause": str(exc), "attempts": exc.attempts,
                        "prompt_tokens": prompt_tokens, "strategy_s": strategy_s, **aux})
            return
        except Exception as exc:
            self._emit({**base, "event": "error", "phase": "model", "cause": _describe_error(exc),
                        "prompt_tokens": prompt_tokens, "strategy_s": strategy_s, **aux})
            return
        completion = outcome.completion
        try:
            prediction = self.task.extract_prediction(item, completion.text)
            verdict = self.grader.grade(item, prediction, self.grading_context)
            quality = float(verdict.quality)
            if not 0.0 <= quality <= 1.0:
                raise ValueError(f"quality {quality} outside [0, 1]")
        except Exception as exc:
            self._emit({**base, "event": "error", "phase": "grading", "plugin": self.grader.name,
                        "cause": f"grading failed: {_describe_error(exc)}", "completion": completion.text,
                        "prompt_tokens": prompt_tokens, "served_prompt_tokens": completion.prompt_tokens})
            return
        self._emit({
            **base, "event": "result", "prediction": prediction, "completion": completion.text,
            "answer": item.answer, "quality": quality, "verdict": verdict.detail,
            "grader": {"name": self.grader.name, "version": self.grader.version},
            "prompt_tokens": prompt_tokens, "served_prompt_tokens": completion.prompt_tokens,
            "served_cached_tokens": completion.cached_tokens,
            "served_count_matches": None if completion.prompt_tokens is None else completion.prompt_tokens == prompt_tokens,
            "completion_tokens": completion.completion_tokens, "utilisation": prompt_tokens / budget,
            "latency_s": completion.latency_s, "strategy_s": strategy_s, "cost": completion.cost,
            "attempts": outcome.attempts, "cached": outcome.cached, **aux,
        })

    def _validate_prompt(self, name: str, item: Item, prompt: Any, fingerprint: int) -> None:
        if not isinstance(prompt, list) or not all(isinstance(m, Message) for m in prompt):
            raise TypeError(f"apply must return list[Message], got {type(prompt).__name__}"
                            + (f" of {sorted({type(m).__name__ for m in prompt})}" if isinstance(prompt, list) else ""))
        unknown = sorted({m.role for m in prompt} - set(ROLES))
        if unknown:
            raise ValueError(f"prompt has messages with unknown roles {unknown}; allowed: {list(ROLES)}")
        if not prompt or prompt[-1] != item.query:
            raise ValueError("prompt does not end with the item's query unchanged")
        if item.system is not None and prompt[0] != item.system:
            raise ValueError("prompt does not start with the item's system prompt unchanged")
        if _history_fingerprint(item.history) != fingerprint:
            raise ValueError("the strategy mutated the history it was given")

    def _auxiliary_call(self, base: dict[str, Any], budget: int, totals: dict[str, Any], repeat: int):
        def complete(messages: Sequence[Message], max_tokens: int, purpose: str) -> str:
            messages = list(messages)
            prompt_tokens = self.counter.count(messages)
            if prompt_tokens > budget:
                raise AuxiliaryBudgetError(
                    f"auxiliary call {purpose!r} has {prompt_tokens} prompt tokens, over the budget of {budget}",
                    prompt_tokens)
            outcome = self.caller.call(messages, GenerationParams(max_tokens, 0.0, self.config.seed + repeat))
            completion = outcome.completion
            totals["aux_calls"] += 1
            totals["aux_prompt_tokens"] += prompt_tokens
            totals["aux_completion_tokens"] += completion.completion_tokens or 0
            totals["aux_latency_s"] += completion.latency_s
            self._emit({**base, "event": "aux_call", "purpose": purpose, "prompt_tokens": prompt_tokens,
                        "served_prompt_tokens": completion.prompt_tokens,
                        "completion_tokens": completion.completion_tokens, "latency_s": completion.latency_s,
                        "cached": outcome.cached, "messages": [m.to_dict() for m in messages],
                        "completion": completion.text})
            return completion.text

        return complete

    def _judge(self, messages: Sequence[Message], max_tokens: int) -> str:
        return self.judge_caller.call(list(messages), GenerationParams(max_tokens, 0.0, self.config.seed)).completion.text

    # ----------------------------------------------------------------- the run

    def _unit(self, strategy_name: str, item: Item, done: set[tuple], progress: Callable[[str, int], None]) -> None:
        pairs = [(b, r) for b in self.config.budgets for r in range(self.config.repeats)]
        random.Random(f"{self.config.seed}:{strategy_name}:{item.id}").shuffle(pairs)
        todo = [(b, r) for b, r in pairs if (self.config.task, strategy_name, b, r, item.id) not in done]
        for _ in range(len(pairs) - len(todo)):
            progress(strategy_name, 1)
        with self._stats_lock:
            self.stats["cells_skipped"] += len(pairs) - len(todo)
        if not todo:
            return
        item = _private_copy(item)
        strategy = self._strategy(strategy_name)
        try:
            strategy.reset()
        except Exception as exc:
            self._discard_strategy(strategy_name)
            for budget, repeat in todo:
                self._emit({"task": self.config.task, "strategy": strategy_name, "budget": budget, "repeat": repeat,
                            "item_id": item.id, "category": item.category, "event": "error", "phase": "strategy",
                            "plugin": strategy_name,
                            "cause": f"strategy {strategy_name!r} reset failed before item {item.id!r}: {_describe_error(exc)}"})
                progress(strategy_name, 1)
            return
        fingerprint = _history_fingerprint(item.history)
        for budget, repeat in todo:
            if self._stop.is_set():
                return
            self._run_cell(strategy_name, item, budget, repeat, fingerprint)
            progress(strategy_name, 1)

    def execute(self, progress: Callable[[str, int], None] | None = None,
                on_start: Callable[[int, dict[str, int]], None] | None = None) -> RunSummary:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        with _exclusive(self.run_dir):
            return self._execute(progress, on_start)

    def _execute(self, progress: Callable[[str, int], None] | None,
                 on_start: Callable[[int, dict[str, int]], None] | None) -> RunSummary:
        progress = progress or (lambda name, n: None)
        started_clock = time.perf_counter()
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self._check_identity()
        items = self._load_items()
        ids = [item.id for item in items]
        if len(set(ids)) != len(ids):
            raise RunConfigError(f"task {self.config.task!r} produced duplicate item ids")
        self.backend.start()
        if self.judge_backend:
            self.judge_backend.start()
        try:
            tokenizer = self._tokenizer()
            self.counter = PromptCounter(tokenizer)
            self.tokenizer_info = tokenizer.info.to_dict()
            previous = read_manifest(self.run_dir) or {}
            invoked = now()
            manifest = self._manifest(tokenizer, previous.get("started", invoked))
            # Recorded before the first call, so an invocation killed with -9 still shows (finished: null).
            manifest["invocations"] = [*previous.get("invocations", []),
                                       {"started": invoked, "finished": None, "calls_made": None}]
            write_json_atomic(self.run_dir / "manifest.json", manifest)
            cache = ResponseCache(self.run_dir / "cache.sqlite")
            self.caller = ModelCaller(self.backend, cache, self.config.max_concurrency, self.config.retries)
            self.judge_caller = (ModelCaller(self.judge_backend, cache, self.config.max_concurrency, self.config.retries)
                                 if self.judge_backend else self.caller)
            self.grading_context = GradingContext(judge=self._judge, judge_model=self.config.judge_model or self.config.model)
            repair_torn_tails(self.run_dir)
            done = {key for key, row in final_rows(self.run_dir).items() if row["event"] in FINAL_EVENTS}
            units = [(s, item) for s in self.config.strategies for item in items]
            random.Random(self.config.seed).shuffle(units)
            per_strategy = {s: len(items) * len(self.config.budgets) * self.config.repeats for s in self.config.strategies}
            if on_start:
                on_start(sum(per_strategy.values()), per_strategy)
            pool = ThreadPoolExecutor(max_workers=max(1, self.config.max_concurrency))
            try:
                futures = [pool.submit(self._unit, s, item, done, progress) for s, item in units]
                finished, _ = wait(futures, return_when=FIRST_EXCEPTION)
                for future in finished:
                    future.result()
            except BaseException:
                # Ctrl+C or a harness bug: stop taking cells; rows already written stay valid.
                self._stop.set()
                raise
            finally:
                pool.shutdown(wait=True, cancel_futures=True)
                cache.close()
                self.log.close()
                calls = self.caller.calls_made + (self.judge_caller.calls_made if self.judge_backend else 0)
                manifest["invocations"][-1] = {"started": invoked, "finished": None if self._stop.is_set() else now(),
                                               "calls_made": calls}
                manifest["calls_made"] = sum(i["calls_made"] or 0 for i in manifest["invocations"])
                write_json_atomic(self.run_dir / "manifest.json", manifest)
        finally:
            self.backend.stop()
            if self.judge_backend:
                self.judge_backend.stop()
        return RunSummary(self.run_dir, sum(per_strategy.values()), self.stats["cells_skipped"], self.stats["results"],
                          self.stats["violations"], self.stats["errors"], manifest["invocations"][-1]["calls_made"],
                          time.perf_counter() - started_clock)


def run(config: RunConfig, registry: Registry | None = None, **callbacks: Any) -> RunSummary:
    """Run (or resume) ``config`` and return the summary."""
    if not config.budgets or any(b <= 0 for b in config.budgets):
        raise RunConfigError(f"budgets must be positive integers, got {config.budgets}")
    if not config.strategies:
        raise RunConfigError("no strategies given")
    return Run(config, registry or get_registry()).execute(**callbacks)
