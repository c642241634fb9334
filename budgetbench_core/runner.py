"""The runner: tasks x strategies x budgets x repeats. Scheduling only.

Work is split into units of (strategy, item); a unit runs every (budget, repeat) of its
item in a seeded shuffled order, so per-item strategy state (an embedding index, a
retrieval) is built once and reused for every tier. ``form_units`` decides what to run
(resume included); ``execute_units`` runs the units in a seeded shuffled order on
``max_concurrency`` worker threads; ``cell_pipeline.run_cell`` (or ``episodes.run_episode``)
runs one cell.

What keeps the numbers honest lives elsewhere, in one place each: ``gate`` (the budget
decision for answer prompts and auxiliary calls), ``sandbox`` (canonical prompt,
validation, containment, deadlines), ``identity`` (run_key), ``events`` (the rows),
``cell`` (a cell's event stream and its auxiliary-call channel).
"""

from __future__ import annotations

import contextlib
import itertools
import os
import platform
import random
import shutil
import subprocess
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field, replace
from importlib import metadata
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from .backends import Backend, GenerationParams
from .cache import ResponseCache
from .cell import CellKey, CellLog
from .cell_pipeline import run_cell
from .controls import CONTROLS, HarnessControl, is_control
from .episodes import EpisodicTask, run_episode
from .events import (
    FINAL_EVENTS,
    SCHEMA_VERSION,
    TERMINAL_EVENTS,
)
from .evidence import EvidenceMarkError, evidence_marks
from .executors import Executor, Unit
from .failfast import DEFAULT_MAX_CONSECUTIVE, FailFast
from .gate import AuxiliaryBudgetError
from .graders import Grader, GradingContext
from .host.metering import Metering
from .host.pool import PluginHost, PluginHostError, Source, sandbox_name, strategy_source
from .host.pricing import PriceError, price_for
from .host.remote import RemoteStrategy
from .identity import data_hashes, known_identities, mismatch_message, record_identity, run_key
from .memory_systems import MemorySystem, MemorySystemStrategy
from .messages import Item, Message
from .model_calls import ModelCaller
from .plugins import PluginError, PluginInfo, Registry, get_registry
from .runlog import EventLog, iter_events, now, read_manifest, repair_torn_tails, write_json_atomic
from .sandbox import (
    Deadline,
    PluginFailure,
    PluginRef,
    PrivateView,
    PromptError,
    canonical_message,
    canonical_prompt,
    contained,
    describe_exception,
    json_safe_or_empty,
)
from .scheduling import RunJob, window_shuffle, window_size
from .shards import Shard, ShardError
from .strategies import MemoryStrategy, resets_nothing
from .tasks import Task, TaskDataError, hidden_metadata_keys
from .tokenizers import PromptCounter, Tokenizer

DEFAULT_BUDGETS = (2048, 4096, 8192, 16384, 32768)
LOAD_TIMEOUT_S = 3600.0  # reading a whole official dataset file may be slow; a hang is still caught

__all__ = ["DEFAULT_BUDGETS", "AuxiliaryBudgetError", "Run", "RunConfig", "RunConfigError", "RunSummary", "Unit", "run"]


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


def _git_commit() -> str | None:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5, cwd=Path(__file__).resolve().parent
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None if out.returncode == 0 else None


@contextlib.contextmanager
def _exclusive(run_dir: Path) -> Iterator[None]:
    """One process per run directory: two would overwrite each other's manifest. The OS
    releases the lock when its holder dies, even by kill -9, so a resume is never blocked."""
    import fcntl  # POSIX only, like the embedded server

    with open(run_dir / ".lock", "w") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise RunConfigError(
                f"{run_dir} is in use by another budgetbench run; wait for it to finish or choose another --out"
            ) from None
        yield


def canonical_item(task: str, item: Any) -> Item:
    """The task's item with plain core messages and a str id; bad text names the item and field."""
    if not isinstance(item, Item):
        raise TaskDataError(f"task {task!r} yielded {type(item).__name__}, not Item")
    item_id = item.id
    if not isinstance(item_id, str) or not item_id:
        raise TaskDataError(
            f"task {task!r} yielded an item whose id is {type(item_id).__name__} {item_id!r}, not a non-empty str"
        )
    item_id = str.__str__(item_id)

    def plain(message: Any, where: str) -> Message:
        try:
            return canonical_message(message, where)
        except PromptError as exc:
            raise TaskDataError(
                f"task {task!r}, item {item_id!r}: {exc}; decode the source file strictly "
                f"and use roles system/user/assistant"
            ) from None

    history = tuple(plain(m, f"history[{i}]") for i, m in enumerate(tuple(item.history)))
    return replace(
        item,
        id=item_id,
        history=history,
        query=plain(item.query, "query"),
        system=plain(item.system, "system") if item.system is not None else None,
    )


class Run:
    """One run directory being filled. Build with ``Run(config, registry)``, then ``execute()``."""

    def __init__(self, config: RunConfig, registry: Registry) -> None:
        self.config = config
        self.registry = registry
        self.run_dir = Path(config.out)
        self.task: Task = self._instantiate("task", config.task, **config.task_options)
        try:  # grading-only message metadata, withheld from every strategy's view (PrivateView)
            self.hidden_metadata = hidden_metadata_keys(self.task)
        except TypeError as exc:
            raise PluginError(str(exc)) from None
        grader_name = config.grader or self.task.default_grader
        self.grader: Grader = self._instantiate("grader", grader_name)
        self.grader_name = grader_name
        if config.controls and isinstance(self.task, EpisodicTask):
            raise RunConfigError(f"--controls: task {config.task!r} is an agent episode; controls answer one question")
        try:  # recorded in the manifest; every $ figure of the report is tokens x this price
            self.price = price_for(config.model, config.price)
        except PriceError as exc:
            raise RunConfigError(str(exc)) from None
        if config.isolation not in ("process", "none"):
            raise RunConfigError(f"--isolation must be 'process' or 'none', got {config.isolation!r}")
        # In-process strategies are imported here; isolated ones only in their workers.
        self.strategy_classes = (
            {name: registry.get("strategy", name).obj for name in config.strategies if not is_control(name)}
            if config.isolation == "none"
            else {}
        )
        self.host: PluginHost | None = None  # the workers of an isolated run, started with the run
        self.metering: Metering | None = None  # the gateway plugins' own SDKs call (isolated runs with a model)
        # Plugins' own files (indexes, databases): outside the run directory, removed at the end.
        self.scratch_dir = Path(tempfile.mkdtemp(prefix="budgetbench-scratch-"))
        self.max_output_tokens = config.max_output_tokens or self.task.max_output_tokens
        resolved = registry.resolve_backend(config.model)  # the resolve_backend hook: plugins may claim a model
        self.backend_name = resolved.name
        backend_class = resolved.obj
        self.backend: Backend = backend_class(
            config.model,
            api_base=config.api_base,
            timeout_s=config.timeout_s,
            max_context=max(config.budgets) + self.max_output_tokens,
            max_concurrency=config.max_concurrency,
            server_prompt_cache=config.server_prompt_cache,
        )
        self.judge_backend: Backend | None = None
        if config.judge_model and config.judge_model != config.model:
            judge_class = registry.resolve_backend(config.judge_model).obj
            self.judge_backend = judge_class(
                config.judge_model,
                timeout_s=config.timeout_s,
                max_context=32768,
                max_concurrency=config.max_concurrency,
                server_prompt_cache=config.server_prompt_cache,
            )
        self.log = EventLog(self.run_dir)
        self._local = threading.local()
        self._stop = threading.Event()
        self.fail_fast = FailFast(config.max_consecutive_failures, on_stop=self._stop.set)
        self.on_cell: Callable[[dict[str, Any]], None] | None = None
        self._stats_lock = threading.Lock()
        self.stats = {"results": 0, "violations": 0, "errors": 0, "admitteds": 0, "cells_skipped": 0}
        self.evidence: dict[str, list] = {}  # item id -> its evidence marks
        self.run_key = ""

    # ----------------------------------------------------------------- plugins

    def ref(self, kind: str, name: str) -> PluginRef:
        return PluginRef(kind, name, self._plugin_of(kind, name).distribution)

    def _plugin_of(self, kind: str, name: str) -> PluginInfo:
        """The distribution that provides ``name``; the core itself for a harness control."""
        if kind == "strategy" and is_control(name):
            return PluginInfo(name, "budgetbench", metadata.version("budgetbench"))
        return self.registry.locate(kind, name)

    def _instantiate(self, kind: str, name: str, **params: Any) -> Any:
        registered = self.registry.get(kind, name)
        try:
            return contained("create", self.ref(kind, name), lambda: registered.obj(**params), Deadline(LOAD_TIMEOUT_S))
        except PluginFailure as failure:
            if isinstance(failure.original, TaskDataError):
                raise failure.original from None  # already names the file, record and field
            raise PluginError(
                f"{kind} {name!r} from {registered.plugin.distribution} could not be created with "
                f"{params}: {failure.cause}"
            ) from None

    def _new_strategy(self, name: str) -> MemoryStrategy:
        if is_control(name):
            return HarnessControl(name)  # run by the harness itself, in this process (controls.py)
        params = self.config.strategy_params.get(name, {})
        if self.host is not None:
            try:
                return self.host.new_strategy(name, params, self.config.max_ingest_loss, self._source(name))
            except PluginHostError as exc:
                raise PluginError(
                    f"strategy {name!r} from {self.ref('strategy', name).distribution} could not be created with "
                    f"{params}: {exc}"
                ) from None
        cls = self.strategy_classes[name]

        def create() -> MemoryStrategy:
            if isinstance(cls, type) and issubclass(cls, MemorySystem):
                return MemorySystemStrategy(cls(**params), max_ingest_loss=self.config.max_ingest_loss)
            return cls(**params)

        try:
            return contained("create", self.ref("strategy", name), create, Deadline(self.config.item_timeout_s))
        except PluginFailure as failure:
            raise PluginError(
                f"strategy {name!r} from {failure.plugin.distribution} could not be created with "
                f"{params}: {failure.cause}"
            ) from None

    def _strategy(self, name: str) -> MemoryStrategy:
        """One instance per worker thread: strategies keep per-item state."""
        if self.host is not None and not is_control(name):
            try:
                params = self.config.strategy_params.get(name, {})
                return self.host.strategy(name, params, self.config.max_ingest_loss, self._source(name))
            except PluginHostError as exc:
                raise PluginError(f"strategy {name!r} could not be created: {exc}") from None
        cache = getattr(self._local, "strategies", None)
        if cache is None:
            cache = self._local.strategies = {}
        if name not in cache:
            cache[name] = self._new_strategy(name)
        return cache[name]

    def _source(self, name: str) -> Source:
        """None for a strategy installed as an entry point (its worker finds it the same way);
        for one registered by code in this process (tests), where its worker imports it from."""
        registered = self.registry.registered("strategy", name)
        if registered is None:
            return None
        return strategy_source(registered.obj, registered.plugin.distribution, registered.plugin.version)

    def _discard_strategy(self, name: str) -> None:
        """After a timeout or failure: an isolated strategy's worker is killed (nothing it
        started can reach a server afterwards); an in-process one is only dropped."""
        if self.host is not None:
            self.host.discard(name)
        getattr(self._local, "strategies", {}).pop(name, None)

    # ----------------------------------------------------------------- setup

    def _tokenizer(self) -> Tokenizer:
        spec = self.config.tokenizer or self.backend.default_tokenizer()
        if not spec:
            raise RunConfigError(
                f"model {self.config.model!r} has no default tokenizer: pass --tokenizer "
                f"(hf:<dir>, tiktoken:<encoding>, gguf:<file> or server)"
            )
        prefix = spec.partition(":")[0]  # the resolve_tokenizer hook; registered prefixes are the core's fallback
        registered = prefix in self.registry.names("tokenizer")
        self.tokenizer_ref = self.ref("tokenizer", prefix) if registered else PluginRef("tokenizer", spec)
        try:
            tokenizer, self.tokenizer_plugin = contained(
                "create",
                self.tokenizer_ref,
                lambda: self.registry.resolve_tokenizer_source(spec, self.backend),
                Deadline(LOAD_TIMEOUT_S),
            )
            self.tokenizer_ref = PluginRef("tokenizer", self.tokenizer_ref.name, self.tokenizer_plugin.distribution)
            return tokenizer
        except PluginFailure as failure:
            if isinstance(failure.original, (ValueError, OSError, PluginError)) and not isinstance(
                failure.original, PluginFailure
            ):
                raise failure.original from None  # a clear message about the spec, file or plugin
            raise PluginError(failure.cause) from None

    def admit_item(self, item: Any) -> Item:
        """The task's item made canonical (plain messages, str id); bad data names the item."""
        item = canonical_item(self.config.task, item)
        try:
            self.evidence[item.id] = evidence_marks(item.history)
        except EvidenceMarkError as exc:
            raise TaskDataError(f"task {self.config.task!r}, item {item.id!r}: {exc}") from None
        return item

    def stream_items(self, wanted: Callable[[str], bool]) -> Iterator[Item]:
        """The task's items, read lazily: each ``next`` of its loader is contained (any failure
        names the task and its distribution; a ``TaskDataError`` passes through unchanged).
        Only items ``wanted`` accepts are yielded; an item id seen twice stops the run."""
        ref = self.ref("task", self.config.task)
        seen: set[str] = set()
        yielded: set[str] = set()
        end = object()

        def check(item_id: Any) -> bool:
            item_id = str(item_id)
            if item_id in seen:
                raise RunConfigError(f"task {self.config.task!r} produced duplicate item ids: [{item_id!r}]")
            seen.add(item_id)
            self.selected_ids.append(item_id)
            return wanted(item_id)

        def step(function: Callable[[], Any]) -> Any:
            try:
                return contained("load", ref, function, Deadline(LOAD_TIMEOUT_S))
            except PluginFailure as failure:
                if isinstance(failure.original, (TaskDataError, RunConfigError)):
                    raise failure.original from None  # already names the file, record and field
                raise PluginError(
                    f"task {self.config.task!r} ({ref.distribution}) failed to load its items: "
                    f"{describe_exception(failure.original) if failure.original else failure.cause}"
                ) from None

        source = step(lambda: iter(self.task.load_wanted(self.config.limit, self.config.seed, check)))
        while (item := step(lambda: next(source, end))) is not end:
            item = self.admit_item(item)
            if item.id in yielded:
                raise RunConfigError(f"task {self.config.task!r} produced duplicate item ids: [{item.id!r}]")
            if item.id not in seen and not check(item.id):  # a loader that did not ask is asked here
                continue
            if wanted(item.id):
                yielded.add(item.id)
                yield item
        if not seen:
            raise TaskDataError(
                f"task {self.config.task!r} produced no items (options {self.config.task_options}, "
                f"limit {self.config.limit}): nothing to run"
            )

    def _shard(self, previous: dict[str, Any] | None) -> Shard | None:
        """This invocation's shard; a directory written as one shard is never resumed as another."""
        try:
            shard = Shard.parse(self.config.shard) if self.config.shard else None
        except ShardError as exc:
            raise RunConfigError(str(exc)) from None
        before = ((previous or {}).get("config") or {}).get("shard")
        merged = (previous or {}).get("shards")
        if previous and not merged and before != (str(shard) if shard else None):
            raise RunConfigError(
                f"{self.run_dir} holds {'shard ' + before if before else 'a run made without --shard'}"
                f", not {'shard ' + str(shard) if shard else 'the whole run'}: give the same --shard, "
                f"or another --out"
            )
        if merged and shard:
            raise RunConfigError(f"{self.run_dir} is a merge of shards; resume it without --shard")
        return shard

    def _data_files(self) -> dict[str, str]:
        ref = self.ref("task", self.config.task)
        try:
            declared = contained("data_files", ref, lambda: list(self.task.data_files()), Deadline(LOAD_TIMEOUT_S))
        except PluginFailure as failure:
            raise PluginError(
                f"task {self.config.task!r} ({ref.distribution}) could not say which data files it "
                f"read: {failure.cause}"
            ) from None
        return data_hashes(declared, self.config.task_options)

    def _plugin_versions(self) -> dict[str, str]:
        used = [
            ("task", self.config.task),
            ("grader", self.grader_name),
            ("backend", self.backend_name),
            *(("strategy", s) for s in self.config.strategies),
        ]
        versions = {
            "budgetbench": metadata.version("budgetbench"),
            self.tokenizer_plugin.distribution: self.tokenizer_plugin.version,
        }  # resolved, maybe unregistered
        for kind, name in used:
            plugin = self._plugin_of(kind, name)
            versions[plugin.distribution] = plugin.version
        return dict(sorted(versions.items()))

    def identity(self, tokenizer: Tokenizer, data_files: dict[str, str]) -> dict[str, Any]:
        """Everything that changes the experiment (hashed into ``run_key``)."""
        c = self.config
        return {
            "task": c.task,
            "task_options": json_safe_or_empty(c.task_options),
            "data_files": data_files,
            "strategies": {name: json_safe_or_empty(c.strategy_params.get(name, {})) for name in sorted(c.strategies)},
            "budgets": sorted(c.budgets),
            "repeats": c.repeats,
            "limit": c.limit,
            "model": c.model,
            "api_base": c.api_base,
            "tokenizer": self._tokenizer_identity(tokenizer),
            "grader": {"name": self.grader_name, "version": str(self.grader.version)},
            "judge_model": c.judge_model,
            "seed": c.seed,
            "temperature": c.temperature,
            "max_output_tokens": self.max_output_tokens,
            "max_ingest_loss": c.max_ingest_loss,
            "server_prompt_cache": c.server_prompt_cache,
            "isolation": (
                {"isolation": "process", "sandbox": sandbox_name()}
                if c.isolation == "process"
                else {"isolation": "none", "sandbox": "none"}
            ),
            "versions": self._plugin_versions(),
            **({"prompts_only": True} if c.prompts_only else {}),  # absent otherwise: older keys stay valid
        }

    def _tokenizer_identity(self, tokenizer: Tokenizer) -> dict[str, Any]:
        """The tokenizer's id, backend and exactness; a ``server`` tokenizer is the served model's own,
        so its id (which names an ephemeral port) is left to the model and api base fields."""
        spec = self.config.tokenizer or self.backend.default_tokenizer() or ""  # resolved: never empty here
        info = tokenizer.info.to_dict()
        if spec.partition(":")[0] == "server":
            info["id"] = "server"
        return {"spec": spec, **info}

    def _describe_strategy(self, name: str) -> dict[str, Any]:
        strategy = self._new_strategy(name)
        try:
            described = contained(
                "describe", self.ref("strategy", name), strategy.describe, Deadline(self.config.item_timeout_s)
            )
        except PluginFailure as failure:
            raise PluginError(failure.cause) from None
        finally:
            if isinstance(strategy, RemoteStrategy):
                strategy.close()
        described = json_safe_or_empty(described)
        return {
            **(described if isinstance(described, dict) else {}),
            "distribution": self._plugin_of("strategy", name).distribution,
        }

    def _manifest(self, tokenizer: Tokenizer, started: str, identity: dict[str, Any]) -> dict[str, Any]:
        strategies = {name: self._describe_strategy(name) for name in self.config.strategies}
        used = {("task", self.config.task), ("grader", self.grader_name)} | {
            ("strategy", s) for s in self.config.strategies
        }
        return {
            "schema_version": SCHEMA_VERSION,
            "run_key": self.run_key,
            "identity": identity,
            "config": json_safe_or_empty(self.config.to_dict()),
            "started": started,
            "versions": {
                "budgetbench": metadata.version("budgetbench"),
                "python": platform.python_version(),
                **self.registry.distributions(),
            },
            "plugins_used": {
                f"{kind}:{name}": {
                    "distribution": self._plugin_of(kind, name).distribution,
                    "version": self._plugin_of(kind, name).version,
                }
                for kind, name in sorted(used)
            },
            "price": self.price.to_dict() if self.price is not None else None,
            # what each confined strategy declared it reads beyond the Python environment (read_paths)
            "read_paths": dict(self.host.declared_reads) if self.host is not None else {},
            "task": json_safe_or_empty(self.task.manifest_notes()),
            "data_files": identity["data_files"],
            "grader": {
                "name": self.grader_name,
                "version": str(self.grader.version),
                "binary": bool(self.grader.binary),
                "judge_model": self.config.judge_model,
            },
            "strategies": strategies,
            "model": json_safe_or_empty(self.backend.describe()),
            "judge": json_safe_or_empty(self.judge_backend.describe()) if self.judge_backend else None,
            "tokenizer": tokenizer.info.to_dict(),
            "plugin_failures": [
                {"name": p.name, "distribution": p.distribution, "version": p.version, "error": p.error}
                for p in self.registry.failures
            ],
            "git_commit": _git_commit(),
            "host": {"node": platform.node(), "platform": platform.platform(), "cpus": os.cpu_count()},
        }

    def _finished_cells(self, manifest: dict[str, Any] | None, identity: dict[str, Any]) -> set[tuple]:
        """Cells already finished under the current run_key; rows of any other key stop the run."""
        done: dict[tuple, str] = {}
        foreign: Counter = Counter()
        for event in iter_events(self.run_dir):
            key = event.get("run_key")
            if key != self.run_key:
                foreign[key] += 1
                continue
            if event.get("event") in TERMINAL_EVENTS:
                cell = (
                    event["task"],
                    event["strategy"],
                    int(event["budget"]),
                    int(event["repeat"]),
                    str(event["item_id"]),
                )
                done[cell] = event["event"]
        if manifest and manifest.get("run_key") not in (None, self.run_key) and not foreign:
            foreign[manifest["run_key"]] = 0
        elif manifest and manifest.get("run_key") is None and not foreign and manifest.get("config"):
            foreign[None] = 0
        known = known_identities(self.run_dir, manifest)
        if foreign:
            raise RunConfigError(mismatch_message(self.run_dir, self.run_key, identity, foreign, known))
        record_identity(self.run_dir, self.run_key, identity, known)
        keep = (*FINAL_EVENTS, "admitted") if self.config.prompts_only else FINAL_EVENTS
        return {cell for cell, kind in done.items() if kind in keep}

    # ----------------------------------------------------------------- one cell

    def _cell_key(self, strategy_name: str, item: Item, budget: int, repeat: int) -> CellKey:
        return CellKey(
            self.config.task, strategy_name, budget, repeat, item.id, item.category, self.run_key, self.tokenizer_info
        )

    def _tally(self, kind: str, row: dict[str, Any] | None = None) -> None:
        with self._stats_lock:
            self.stats[kind + "s"] += 1
        if row is not None and self.on_cell is not None:
            self.on_cell(row)

    # ----------------------------------------------------------------- the units

    def form_units(self, items: Iterator[Item], done: set[tuple], shard: Shard | None) -> Iterator[Unit]:
        """Each arriving item's units (the strategies this shard owns, with the cells still to
        run), in a seeded shuffle within a bounded window; cells found done are counted here."""
        cells = [(b, r) for b in self.config.budgets for r in range(self.config.repeats)]

        def units() -> Iterator[Unit]:
            for item in items:
                for strategy in self.config.strategies:
                    if shard and not shard.owns(self.config.task, strategy, item.id):
                        continue
                    pairs = list(cells)
                    random.Random(f"{self.config.seed}:{strategy}:{item.id}").shuffle(pairs)
                    todo = [(b, r) for b, r in pairs if (self.config.task, strategy, b, r, item.id) not in done]
                    self.cells_total[strategy] = self.cells_total.get(strategy, 0) + len(pairs)
                    yield Unit(strategy, item, todo, len(pairs) - len(todo))

        for unit in window_shuffle(units(), window_size(self.config.max_concurrency), random.Random(self.config.seed)):
            self._announce()
            for _ in range(unit.skipped):
                self.progress(unit.strategy, 1)
            with self._stats_lock:
                self.stats["cells_skipped"] += unit.skipped
            if unit.todo:
                yield unit
        self._announce(final=True)

    _announced: tuple[int, float] = (-1, 0.0)  # (cells announced, when)

    def _announce(self, final: bool = False) -> None:
        """Tell ``on_start`` the cell totals known so far: once the first window is read, again
        whenever more items have arrived (at most once a second), and when the task is exhausted."""
        moment = time.monotonic()
        total = sum(self.cells_total.values())
        if self.on_start and total != self._announced[0] and (final or moment - self._announced[1] >= 1.0):
            self._announced = (total, moment)
            self.on_start(total, dict(self.cells_total))

    def run_unit(self, unit: Unit, progress: Callable[[str, int], None]) -> None:
        """Reset the strategy (contained, with a deadline), then run the unit's cells in order."""
        if not unit.todo:
            return
        item, view = unit.item, PrivateView(unit.item, self.hidden_metadata)
        strategy = self._strategy(unit.strategy)
        try:
            no_op = strategy.resets_nothing() if isinstance(strategy, RemoteStrategy) else resets_nothing(strategy)
            if not no_op:  # the base class's no-op needs no call
                contained(
                    "reset", self.ref("strategy", unit.strategy), strategy.reset, Deadline(self.config.item_timeout_s)
                )
        except PluginFailure as failure:
            self._discard_strategy(unit.strategy)
            for budget, repeat in unit.todo:
                cell = CellLog(self.log, self._cell_key(unit.strategy, item, budget, repeat), self._tally)
                cell.fail(
                    "reset",
                    PluginRef("strategy", unit.strategy, failure.plugin.distribution),
                    f"strategy {unit.strategy!r} reset failed before item {item.id!r}: "
                    f"{describe_exception(failure.original) if failure.original else failure.cause}",
                )
                progress(unit.strategy, 1)
            return
        episodic = isinstance(self.task, EpisodicTask) and not getattr(self.config, "prompts_only", False)
        for budget, repeat in unit.todo:
            if self._stop.is_set():
                return
            if episodic:  # the turn loop: budgetbench_core/episodes.py
                run_episode(self, unit.strategy, item, budget, repeat)
            else:
                run_cell(self, unit.strategy, item, view, budget, repeat)
            progress(unit.strategy, 1)

    def executor(self) -> Executor:
        registered = self.registry.get("executor", self.config.executor)
        try:
            return registered.obj(**self.config.executor_options)
        except ValueError as exc:
            raise RunConfigError(str(exc)) from None

    # ----------------------------------------------------------------- the run

    def _judge(self, messages: Sequence[Message], max_tokens: int) -> str:
        prompt = canonical_prompt(list(messages))
        return self.judge_caller.call(prompt, GenerationParams(int(max_tokens), 0.0, self.config.seed)).completion.text

    def execute(
        self,
        progress: Callable[[str, int], None] | None = None,
        on_start: Callable[[int, dict[str, int]], None] | None = None,
        on_cell: Callable[[dict[str, Any]], None] | None = None,
    ) -> RunSummary:
        """``progress(strategy, n)``: n cells done or found done; ``on_cell(row)``: a cell's terminal row."""
        self.on_cell = on_cell
        self.run_dir.mkdir(parents=True, exist_ok=True)
        with _exclusive(self.run_dir):
            return self._execute(progress, on_start)

    def _execute(
        self, progress: Callable[[str, int], None] | None, on_start: Callable[[int, dict[str, int]], None] | None
    ) -> RunSummary:
        progress = progress or (lambda name, n: None)
        started_clock = time.perf_counter()
        previous = read_manifest(self.run_dir)
        shard = self._shard(previous)
        executor = self.executor()
        self.progress, self.on_start = progress, on_start
        self.selected_ids: list[str] = []
        self.cells_total: dict[str, int] = {}
        self._announced = (-1, 0.0)
        self._done: set[tuple] | None = None

        skipped_items: set[str] = set()

        def wanted(item_id: str) -> bool:
            if self._done is None:
                return True  # the first item, read before the run identity is known
            owned = [s for s in self.config.strategies if not shard or shard.owns(self.config.task, s, item_id)]
            cells = [(b, r) for b in self.config.budgets for r in range(self.config.repeats)]
            if any((self.config.task, s, b, r, item_id) not in self._done for s in owned for b, r in cells):
                return True
            if item_id not in skipped_items:  # every cell of it is done: counted, never built
                skipped_items.add(item_id)
                for strategy in owned:
                    self.cells_total[strategy] = self.cells_total.get(strategy, 0) + len(cells)
                    progress(strategy, len(cells))
                with self._stats_lock:
                    self.stats["cells_skipped"] += len(cells) * len(owned)
            return False

        stream = self.stream_items(wanted)
        first = next(stream)  # a task declares the data files it reads by its first item
        data_files = self._data_files()
        self.backend.start()
        if self.judge_backend:
            self.judge_backend.start()
        try:
            tokenizer = self._tokenizer()
            self.counter = PromptCounter(tokenizer)
            self.tokenizer_info = tokenizer.info.to_dict()
            if self.config.isolation == "process":
                self.host = PluginHost(self.tokenizer_info, self.scratch_dir)
                # no strategy may declare it reads these: the run directory and every file of the task's data
                self.host.guarded = [self.run_dir, *map(Path, data_files)]
            identity = self.identity(tokenizer, data_files)
            self.run_key = run_key(identity)
            repair_torn_tails(self.run_dir)
            done = self._done = self._finished_cells(previous, identity)
            invoked = now()
            manifest = self._manifest(tokenizer, (previous or {}).get("started", invoked), identity)
            # Recorded before the first call, so an invocation killed with -9 still shows (finished: null).
            manifest["invocations"] = [
                *(previous or {}).get("invocations", []),
                {"started": invoked, "finished": None, "calls_made": None},
            ]
            write_json_atomic(self.run_dir / "manifest.json", manifest)
            cache = self.cache = ResponseCache(self.run_dir / "cache.sqlite")
            backend_ref = self.ref("backend", self.backend_name)
            self.caller = ModelCaller(
                self.backend,
                cache,
                self.config.max_concurrency,
                self.config.retries,
                timeout_s=self.config.timeout_s,
                plugin=backend_ref,
                fail_fast=self.fail_fast,
            )
            self.judge_caller = (
                ModelCaller(
                    self.judge_backend,
                    cache,
                    self.config.max_concurrency,
                    self.config.retries,
                    timeout_s=self.config.timeout_s,
                    fail_fast=self.fail_fast,
                    plugin=self.ref("backend", self.judge_backend.name),
                )
                if self.judge_backend
                else self.caller
            )
            if self.host is not None and not self.config.prompts_only:  # a model to meter: the gateway before it
                self.metering = Metering(self.caller, self.counter, self.config.seed)
                self.metering.start()
                self.host.meter_with(self.metering)
            self.grading_context = GradingContext(
                judge=self._judge, judge_model=self.config.judge_model or self.config.model
            )
            items = itertools.chain([first] if wanted(first.id) else [], stream)
            job = RunJob(self, self.form_units(items, done, shard), progress)
            try:
                executor.execute(job)
            except BaseException:
                self._stop.set()  # Ctrl+C or a harness error: rows already written stay valid
                raise
            finally:
                cache.close()
                self.log.close()
                calls = (
                    self.caller.calls_made
                    + (self.judge_caller.calls_made if self.judge_backend else 0)
                    + job.remote_calls
                )
                manifest["invocations"][-1] = {
                    "started": invoked,
                    "finished": None if self._stop.is_set() else now(),
                    "calls_made": calls,
                }
                manifest["calls_made"] = sum(i["calls_made"] or 0 for i in manifest["invocations"])
                manifest["selected_items"] = {
                    self.config.task: {
                        "count": len(self.selected_ids),
                        "ids": self.selected_ids,
                        "complete": not self._stop.is_set(),
                    }
                }
                write_json_atomic(self.run_dir / "manifest.json", manifest)
        finally:
            if self.host is not None:
                self.host.close()
            if self.metering is not None:
                self.metering.stop()
            shutil.rmtree(self.scratch_dir, ignore_errors=True)
            self.backend.stop()
            if self.judge_backend:
                self.judge_backend.stop()
        return RunSummary(
            self.run_dir,
            sum(self.cells_total.values()),
            self.stats["cells_skipped"],
            self.stats["results"],
            self.stats["violations"],
            self.stats["errors"],
            manifest["invocations"][-1]["calls_made"],
            time.perf_counter() - started_clock,
            self.stats["admitteds"],
            stopped=self.fail_fast.cause,
            stopped_fatal=self.fail_fast.fatal,
        )


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


def run(config: RunConfig, registry: Registry | None = None, **callbacks: Any) -> RunSummary:
    """Run (or resume) ``config`` and return the summary."""
    refuse_credentials_in_urls(config)
    if not config.budgets or any(isinstance(b, bool) or int(b) != b or b <= 0 for b in config.budgets):
        raise RunConfigError(f"budgets must be positive integers, got {config.budgets}")
    if not config.strategies:
        raise RunConfigError("no strategies given")
    return Run(normalised(config), registry or get_registry()).execute(**callbacks)
