"""The runner: tasks x strategies x budgets x repeats. Setting a run up and scheduling it.

A run goes through named stages: **resolve** the plugins its config names
(``engine.run_plugins``), **identify** the experiment (tokenizer, data files, run key:
``engine.manifest``), **resume** (the cells finished under that key are skipped), **serve**
(the callers, the plugin host and its metering gateway, one ``CellServices`` for every
cell), **schedule** (units formed as the task's items arrive, in a seeded shuffled order,
on an executor) and **record** (the manifest's invocation and selected items).

What keeps the numbers honest lives elsewhere, in one place each: ``gate`` (the budget
decision), ``sandbox`` (canonical prompt, validation, containment, deadlines), ``identity``
(run_key), ``events`` (the rows), ``cell`` (a cell's event stream and its auxiliary-call
channel), and the engine (``engine/``: what runs a cell).
"""

from __future__ import annotations

import contextlib
import gc
import hmac
import itertools
import random
import shutil
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from .cache import CACHE_FILE, ResponseCache
from .engine.intake import ItemIntake
from .engine.manifest import finished_cells, identity, manifest
from .engine.run_plugins import LOAD_TIMEOUT_S, RunPlugins
from .engine.scheduling import RemoteSpec, RunJob, address_of, window_shuffle, window_size
from .engine.services import CellServices, CellSettings, callers, plugin_host
from .engine.strategy_pool import StrategyPool
from .episodes import EpisodicTask
from .events import CellKey, SchemaError
from .executors import Executor, Unit
from .failfast import FailFast
from .gate import AuxiliaryBudgetError
from .host.pricing import PriceError, price_for
from .identity import data_hashes, run_key
from .integrity import chained_files, read_record
from .plugins import PluginError, Registry, get_registry
from .run_config import (
    DEFAULT_BUDGETS,
    RunConfig,
    RunConfigError,
    RunSummary,
    normalised,
    refuse_credentials_in_urls,
)
from .run_manifest import Manifest
from .runlog import EventLog, load_manifest, now, repair_torn_tails, write_json_atomic
from .sandbox import Deadline, PluginFailure, contained
from .shards import Shard, ShardError
from .strategies import resets_nothing
from .tokenizers import PromptCounter

__all__ = [
    "DEFAULT_BUDGETS",
    "AuxiliaryBudgetError",
    "Run",
    "RunConfig",
    "RunConfigError",
    "RunSummary",
    "Unit",
    "refuse_credentials_in_urls",
    "resets_nothing",
    "run",
]


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


@contextlib.contextmanager
def _start_up_frozen() -> Iterator[None]:
    """Keep the objects made before the cells (litellm's and the plugins' imports, the
    tokenizer: ~390K here) out of the cyclic collector's passes while the cells run. Each full
    pass over them cost ~220 ms, which landed on whichever cell was allocating (a LongMemEval_S
    cell's CPU: docs/performance.md). Unfrozen at the end, so no garbage is kept for good."""
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


class Tally:
    """Terminal rows counted by kind as cells finish (any thread), each shown to ``on_cell``."""

    def __init__(self, on_cell: Callable[[dict[str, Any]], None] | None) -> None:
        self.on_cell = on_cell
        self.counts = {"results": 0, "violations": 0, "errors": 0, "admitteds": 0, "cells_skipped": 0}
        self._lock = threading.Lock()

    def __call__(self, kind: str, row: dict[str, Any] | None = None) -> None:
        self.add(kind + "s")
        if row is not None and self.on_cell is not None:
            self.on_cell(row)

    def add(self, counter: str, n: int = 1) -> None:
        with self._lock:
            self.counts[counter] += n


class Run:
    """One run directory being filled. Build with ``Run(config, registry)``, then ``execute()``."""

    def __init__(self, config: RunConfig, registry: Registry) -> None:
        self.config = config
        self.run_dir = Path(config.out)
        if config.isolation not in ("process", "none"):
            raise RunConfigError(f"--isolation must be 'process' or 'none', got {config.isolation!r}")
        self.plugins = RunPlugins(config, registry)
        if config.controls and isinstance(self.plugins.task, EpisodicTask):
            raise RunConfigError(f"--controls: task {config.task!r} is an agent episode; controls answer one question")
        try:  # recorded in the manifest; every $ figure of the report is tokens x this price
            self.price = price_for(config.model, config.price)
        except PriceError as exc:
            raise RunConfigError(str(exc)) from None
        self._stop = threading.Event()
        self.fail_fast = FailFast(config.max_consecutive_failures, on_stop=self._stop.set)
        self.intake = ItemIntake(config, self.plugins.task, self.plugins.ref("task", config.task))
        self.cells_total: dict[str, int] = {}
        self._announced = (-1, 0.0)  # (cells announced, when)
        self.on_start: Callable[..., None] | None = None  # (total, per_strategy, final=...)
        self._done: set[CellKey] | None = None  # the cells finished on disk, once the run key is known

    # ----------------------------------------------------------------- stages

    def _previous(self) -> Manifest | None:
        """The manifest of the invocations before this one, if any."""
        try:
            return load_manifest(self.run_dir)
        except SchemaError as exc:
            raise RunConfigError(f"{exc}; choose another --out") from None

    def _shard(self, previous: Manifest | None) -> Shard | None:
        """This invocation's shard; a directory written as one shard is never resumed as another."""
        try:
            shard = Shard.parse(self.config.shard) if self.config.shard else None
        except ShardError as exc:
            raise RunConfigError(str(exc)) from None
        before = previous.config.get("shard") if previous else None
        merged = previous.shards if previous else None
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
        ref = self.plugins.ref("task", self.config.task)
        try:
            declared = contained(
                "data_files", ref, lambda: list(self.plugins.task.data_files()), Deadline(LOAD_TIMEOUT_S)
            )
        except PluginFailure as failure:
            raise PluginError(
                f"task {self.config.task!r} ({ref.distribution}) could not say which data files it "
                f"read: {failure.cause}"
            ) from None
        return data_hashes(declared, self.config.task_options)

    def _executor(self) -> Executor:
        registered = self.plugins.registry.get("executor", self.config.executor)
        try:
            return registered.obj(**self.config.executor_options)
        except ValueError as exc:
            raise RunConfigError(str(exc)) from None

    def form_units(
        self, items: Iterator[Any], done: set[CellKey], shard: Shard | None, tally: Tally, progress: Any
    ) -> Iterator[Unit]:
        """Each arriving item's units (the strategies this shard owns, with the cells still to
        run), in a seeded shuffle within a bounded window; cells found done are counted here."""
        c = self.config
        cells = [(b, r) for b in c.budgets for r in range(c.repeats)]

        def units() -> Iterator[Unit]:
            for item in items:
                for strategy in c.strategies:
                    if shard and not shard.owns(c.task, strategy, item.id):
                        continue
                    pairs = list(cells)
                    random.Random(f"{c.seed}:{strategy}:{item.id}").shuffle(pairs)
                    todo = [(b, r) for b, r in pairs if CellKey(c.task, strategy, b, r, item.id) not in done]
                    self.cells_total[strategy] = self.cells_total.get(strategy, 0) + len(pairs)
                    yield Unit(strategy, item, todo, len(pairs) - len(todo))

        for unit in window_shuffle(units(), window_size(c.max_concurrency), random.Random(c.seed)):
            self._announce()
            for _ in range(unit.skipped):
                progress(unit.strategy, 1)
            tally.add("cells_skipped", unit.skipped)
            if unit.todo:
                yield unit
        self._announce(final=True)

    def _announce(self, final: bool = False) -> None:
        """Tell ``on_start`` the cell totals known so far: once the first window is read, again
        whenever more items have arrived (at most once a second), and when the task is exhausted."""
        moment = time.monotonic()
        total = sum(self.cells_total.values())
        if self.on_start and (final or (total != self._announced[0] and moment - self._announced[1] >= 1.0)):
            self._announced = (total, moment)
            self.on_start(total, dict(self.cells_total), final=final)

    def _wanted(self, shard: Shard | None, tally: Tally, progress: Any) -> Callable[[str], bool]:
        """Whether an item has a cell still to run; an item done in every cell is counted, never built."""
        c = self.config
        cells = [(b, r) for b in c.budgets for r in range(c.repeats)]
        skipped: set[str] = set()

        def wanted(item_id: str) -> bool:
            if self._done is None:
                return True  # the first item, read before the run identity is known
            owned = [s for s in c.strategies if not shard or shard.owns(c.task, s, item_id)]
            if any(CellKey(c.task, s, b, r, item_id) not in self._done for s in owned for b, r in cells):
                return True
            if item_id not in skipped:
                skipped.add(item_id)
                for strategy in owned:
                    self.cells_total[strategy] = self.cells_total.get(strategy, 0) + len(cells)
                self._announce()  # the display knows of these cells before they are counted done
                for strategy in owned:
                    progress(strategy, len(cells))
                tally.add("cells_skipped", len(cells) * len(owned))
            return False

        return wanted

    # ----------------------------------------------------------------- the run

    def execute(
        self,
        progress: Callable[[str, int], None] | None = None,
        on_start: Callable[..., None] | None = None,
        on_cell: Callable[[dict[str, Any]], None] | None = None,
        on_turn: Callable[[dict[str, Any]], None] | None = None,
    ) -> RunSummary:
        """``progress(strategy, n)``: n cells done or found done; ``on_start(total, per_strategy,
        final=...)``: the cell totals known so far (``final``: the task has no more items);
        ``on_cell(row)``: a cell's terminal row; ``on_turn(turn)``: an episode's finished turn."""
        self.run_dir.mkdir(parents=True, exist_ok=True)
        with _exclusive(self.run_dir):
            return self._execute(progress or (lambda name, n: None), on_start, Tally(on_cell), on_turn)

    def _execute(self, progress: Callable[[str, int], None], on_start: Any, tally: Tally, on_turn: Any) -> RunSummary:
        config, plugins = self.config, self.plugins
        started_clock = time.perf_counter()
        previous = self._previous()
        shard = self._shard(previous)
        executor = self._executor()
        self.on_start = on_start
        wanted = self._wanted(shard, tally, progress)
        stream = self.intake.stream(wanted)
        first = next(stream)  # a task declares the data files it reads by its first item
        data_files = self._data_files()
        plugins.start()
        # Plugins' own files (indexes, databases): outside the run directory, removed at the end.
        scratch_dir = Path(tempfile.mkdtemp(prefix="budgetbench-scratch-"))
        host = metering = None
        try:
            tokenizer = plugins.tokenizer()
            counter = PromptCounter(tokenizer)
            tokenizer_info = tokenizer.info.to_dict()
            run_identity = identity(config, plugins, tokenizer, data_files)
            key = run_key(run_identity)
            repair_torn_tails(self.run_dir)
            log = EventLog(self.run_dir)
            if read_record(self.run_dir) is not None or chained_files(self.run_dir):
                # A resume reads which cells are done from the directory: verify it first, so an
                # edited or forged row is refused (naming file and line) before it decides anything.
                log.open("resume")
            done = self._done = finished_cells(self.run_dir, key, previous, run_identity, config.prompts_only)
            cache = ResponseCache(self.run_dir / CACHE_FILE, log.key)
            view_key = hmac.new(log.key, b"opaque item ids of strategies' views", "sha256").digest()
            model_callers = callers(
                plugins, cache, config.max_concurrency, config.retries, config.timeout_s, fail_fast=self.fail_fast
            )
            # no strategy may declare it reads these: the run directory and every file of the task's data
            guarded = [self.run_dir, *map(Path, data_files)]
            host, metering = plugin_host(
                config, plugins, tokenizer_info, scratch_dir, guarded, model_callers[0], counter
            )
            pool = StrategyPool(config, plugins, host)
            invoked = now()
            record = manifest(
                config,
                plugins,
                tokenizer,
                key,
                (previous.started if previous else None) or invoked,
                run_identity,
                {name: pool.describe(name) for name in config.strategies},
                dict(host.declared_reads) if host is not None else {},
                dict(host.declared_hosts) if host is not None else {},
                self.price,
                # Recorded before the first call, so an invocation killed with -9 still shows (finished: null).
                [
                    *(previous.invocations if previous else []),
                    {"started": invoked, "finished": None, "calls_made": None},
                ],
            )
            write_json_atomic(self.run_dir / "manifest.json", record.to_dict())
            services = CellServices.assemble(
                config,
                plugins,
                CellSettings.of(config, plugins, key, tokenizer_info, view_key),
                counter,
                model_callers,
                pool,
                log=log,
                run_dir=self.run_dir,
                scratch_dir=scratch_dir,
                evidence=self.intake.evidence,
                tally=tally,
                stop=self._stop,
                on_turn=on_turn,
            )

            def spec() -> RemoteSpec:
                return RemoteSpec(
                    key=f"{key}:{uuid.uuid4().hex}",
                    config=config,
                    run_key=key,
                    task=plugins.task,
                    tokenizer_info=tokenizer_info,
                    versions=plugins.versions(),
                    view_key=view_key,
                    backend_address=address_of(plugins.backend),
                    judge_address=address_of(plugins.judge_backend) if plugins.judge_backend else {},
                )

            items = itertools.chain([first] if wanted(first.id) else [], stream)
            job = RunJob(
                services,
                self.form_units(items, done, shard, tally, progress),
                progress,
                cache,
                spec,
                config.max_concurrency,
                config.timeout_s,
            )
            try:
                with _start_up_frozen():
                    executor.execute(job)
            except BaseException:
                self._stop.set()  # Ctrl+C or a harness error: rows already written stay valid
                raise
            finally:
                cache.close()
                log.close()
                calls = sum({id(c): c.calls_made for c in model_callers}.values()) + job.workers_calls
                complete = not self._stop.is_set()
                record.invocations[-1] = {
                    "started": invoked,
                    "finished": now() if complete else None,
                    "calls_made": calls,
                    "plugin_workers": dict(host.spawned) if host is not None else {},
                    "plugin_shared_memory": dict(host.shared_memory) if host is not None else {},
                }
                record.calls_made = sum(i["calls_made"] or 0 for i in record.invocations)
                if host is not None:  # refused before any cell was served: nobody's row shows them
                    record.undeclared_network = list(host.proxy.unattributed)
                ids = self.intake.selected_ids
                record.selected_items = {config.task: {"count": len(ids), "ids": ids, "complete": complete}}
                write_json_atomic(self.run_dir / "manifest.json", record.to_dict())
        finally:
            if host is not None:
                host.close()
            if metering is not None:
                metering.stop()
            shutil.rmtree(scratch_dir, ignore_errors=True)
            plugins.stop()
        counts = tally.counts
        return RunSummary(
            self.run_dir,
            sum(self.cells_total.values()),
            counts["cells_skipped"],
            counts["results"],
            counts["violations"],
            counts["errors"],
            record.invocations[-1]["calls_made"],
            time.perf_counter() - started_clock,
            counts["admitteds"],
            stopped=self.fail_fast.cause,
            stopped_fatal=self.fail_fast.fatal,
        )


def run(config: RunConfig, registry: Registry | None = None, **callbacks: Any) -> RunSummary:
    """Run (or resume) ``config`` and return the summary."""
    refuse_credentials_in_urls(config)
    if not config.budgets or any(isinstance(b, bool) or int(b) != b or b <= 0 for b in config.budgets):
        raise RunConfigError(f"budgets must be positive integers, got {config.budgets}")
    if not config.strategies:
        raise RunConfigError("no strategies given")
    return Run(normalised(config), registry or get_registry()).execute(**callbacks)
