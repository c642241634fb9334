"""Units formed as the task's items arrive, and the Job an executor runs them through.

The runner never holds the whole task: ``Task.load_wanted`` is consumed lazily, and each
item becomes its units (one per strategy this shard owns, minus the cells finished on
disk) as it arrives. The run order is a seeded shuffle inside a bounded window of units
(``window_shuffle``): the same seed and data give the same order, and at most ``window``
units plus the ones in flight (and so at most that many items) are in memory at once.

``RunJob`` is the driver's side of an executor: ``run_here`` for in-process executors,
``record``/``record_lost`` for executors that run units elsewhere, and ``worker_spec``, the
picklable recipe a remote worker rebuilds the run from (``RemoteWorker``): the same
``Run`` code, with its rows, replies and files buffered and handed back instead of written.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import tempfile
import threading
import uuid
from collections.abc import Callable, Iterable, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from .backends import Completion
from .cell import CellLog
from .events import Error
from .executors import Job, Slots, Unit, UnitOutcome, UnitWorker, WorkerSpec
from .graders import GradingContext
from .host.metering import Metering
from .host.pool import PluginHost
from .model_calls import ModelCaller
from .runlog import now
from .tokenizers import PromptCounter

if TYPE_CHECKING:
    from .cache import ResponseCache
    from .runner import Run, RunConfig

TERMINAL_KINDS = ("result", "violation", "error", "admitted")
# A worker's copy of a started backend reaches the driver's server through these.
_ADDRESS_FIELDS = ("api_base", "server_url")


def window_size(max_concurrency: int) -> int:
    """Units shuffled together: enough to mix strategies and items, few enough to stay small."""
    return max(16, 4 * max(1, max_concurrency))


def window_shuffle(units: Iterable[Unit], size: int, rng: random.Random) -> Iterator[Unit]:
    """``units`` in a seeded random order, holding at most ``size`` of them at a time."""
    buffer: list[Unit] = []
    for unit in units:
        buffer.append(unit)
        if len(buffer) >= size:
            index = rng.randrange(len(buffer))
            buffer[index], buffer[-1] = buffer[-1], buffer[index]
            yield buffer.pop()
    rng.shuffle(buffer)
    yield from buffer


class RunJob(Job):
    """The runner's side of one execution (driver only)."""

    def __init__(self, run: Run, units: Iterator[Unit], progress: Callable[[str, int], None]) -> None:
        self.run = run
        self.units = units
        self.max_concurrency = run.config.max_concurrency
        self.timeout_s = run.config.timeout_s
        self.stop = run._stop
        self.progress = progress
        self.remote_calls = 0
        self._lock = threading.Lock()
        self._spec: RemoteSpec | None = None

    def run_here(self, unit: Unit) -> None:
        self.run.run_unit(unit, self.progress)

    def worker_spec(self) -> RemoteSpec:
        if self._spec is None:
            run = self.run
            self._spec = RemoteSpec(
                key=f"{run.run_key}:{uuid.uuid4().hex}",
                config=run.config,
                run_key=run.run_key,
                task=run.task,
                tokenizer_info=run.tokenizer_info,
                versions=run._plugin_versions(),
                backend_address=_address(run.backend),
                judge_address=_address(run.judge_backend) if run.judge_backend else {},
            )
        return self._spec

    def record(self, unit: Unit, outcome: UnitOutcome) -> None:
        run = self.run
        with self._lock:  # one unit's rows stay together in every cell file
            for relative, data in outcome.files.items():
                write_bytes_atomic(run.run_dir / relative, data)
            for key, completion in outcome.replies:
                run.cache.put(key, completion)
            for row, path in outcome.events:
                run.log.append(row, run.run_dir / path if path else None)
                if row.get("event") in TERMINAL_KINDS and path is None:
                    run._tally(row["event"], row)  # counted, and shown as finished (not resumed) by the display
            self.remote_calls += outcome.calls_made
        self.progress(unit.strategy, len(unit.todo))

    def record_lost(self, unit: Unit, cause: str) -> None:
        run = self.run
        for budget, repeat in unit.todo:
            cell = CellLog(run.log, run._cell_key(unit.strategy, unit.item, budget, repeat), run._tally)
            cell.finish(Error, phase="executor", plugin=unit.strategy, cause=cause)
        self.progress(unit.strategy, len(unit.todo))


def write_bytes_atomic(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(data)
    tmp.replace(path)


def _address(backend: Any) -> dict[str, Any]:
    return {name: getattr(backend, name) for name in _ADDRESS_FIELDS if getattr(backend, name, None)}


@dataclass
class RemoteSpec(WorkerSpec):
    """Everything a worker needs to rebuild the driver's run: the config, the task object the
    driver created (so workers never reread its data files), the identity to check against."""

    key: str
    config: RunConfig
    run_key: str
    task: Any
    tokenizer_info: dict[str, Any]
    versions: dict[str, str]
    backend_address: dict[str, Any] = field(default_factory=dict)
    judge_address: dict[str, Any] = field(default_factory=dict)

    def build(self) -> RemoteWorker:
        return RemoteWorker(self)


class _BufferLog:
    """The ``EventLog`` of a worker: rows kept in order, stamped when they happen, never written."""

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = run_dir
        self.rows: list[tuple[dict[str, Any], str | None]] = []
        self._lock = threading.Lock()

    def append(self, event: dict[str, Any], path: Path | None = None) -> None:
        relative = None if path is None else str(Path(path).relative_to(self.run_dir))
        with self._lock:
            self.rows.append(({"time": now(), **event}, relative))

    def close(self) -> None:
        pass


class _ReplyMemo:
    """A worker's response cache: replies it got in this run, handed to the driver to store."""

    def __init__(self) -> None:
        self.memo: dict[str, Completion] = {}
        self.new: list[tuple[str, Completion]] = []
        self._lock = threading.Lock()

    def lookup(self, key: str) -> tuple[Completion | None, str | None]:
        with self._lock:
            return self.memo.get(key), None

    def put(self, key: str, completion: Completion) -> None:
        with self._lock:
            self.memo[key] = completion
            self.new.append((key, completion))


class _ClusterCaller(ModelCaller):
    """A worker's ``ModelCaller``: each attempt first takes a lease from the executor's
    cluster-wide ``slots`` for this model (so ``-j`` holds across every worker), and only then
    starts the attempt's deadline: waiting for a connection is not the server being slow."""

    slots: Slots | None = None

    def _attempt(self, messages: Any, params: Any, outer: Any) -> Completion:
        if self.slots is None:
            return super()._attempt(messages, params, outer)
        lease: AbstractContextManager[Any] = self.slots(json.dumps(self.backend.cache_identity()))
        with lease:
            return super()._attempt(messages, params, outer)


class RemoteWorker(UnitWorker):
    """A run rebuilt in a worker process: strategies, tokenizer and callers of its own."""

    def __init__(self, spec: RemoteSpec) -> None:
        from .plugins import get_registry
        from .runner import Run

        class WorkerRun(Run):
            def _instantiate(self, kind: str, name: str, **params: Any) -> Any:
                return spec.task if kind == "task" else super()._instantiate(kind, name, **params)

        run: Any = WorkerRun(spec.config, get_registry())  # filled in below as the driver fills its own
        for backend, address in ((run.backend, spec.backend_address), (run.judge_backend, spec.judge_address)):
            if backend is None:
                continue
            for name, value in address.items():
                setattr(backend, name, value)
            if "server_url" not in address:  # a server the driver runs is reached, never started again
                backend.start()  # e.g. litellm's import, seconds on a busy machine: not in a call's deadline
        os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
        import litellm  # noqa: F401 - a core dependency; warmed here for the embedded model's copy too

        tokenizer = run._tokenizer()
        run.counter = PromptCounter(tokenizer)
        run.tokenizer_info = tokenizer.info.to_dict()
        versions = run._plugin_versions()
        if run.tokenizer_info != spec.tokenizer_info or versions != spec.versions:
            raise RuntimeError(
                f"this worker ({os.uname().nodename}) would count or run differently from the driver: tokenizer "
                f"{run.tokenizer_info} vs {spec.tokenizer_info}, plugin versions {versions} vs {spec.versions}; "
                f"install the same distributions on every node"
            )
        run.run_key = spec.run_key
        run.run_dir = Path(tempfile.gettempdir()) / "budgetbench-worker" / f"{spec.run_key}-{os.getpid()}"
        run.run_dir.mkdir(parents=True, exist_ok=True)
        self.memo = _ReplyMemo()
        cache = cast("ResponseCache", self.memo)  # to ModelCaller it is a cache: lookup and put
        config = run.config
        run.caller = _ClusterCaller(
            run.backend,
            cache,
            config.max_concurrency,
            config.retries,
            timeout_s=config.timeout_s,
            plugin=run.ref("backend", run.backend_name),
        )
        run.judge_caller = run.caller
        if run.judge_backend:
            run.judge_caller = _ClusterCaller(
                run.judge_backend,
                cache,
                config.max_concurrency,
                config.retries,
                timeout_s=config.timeout_s,
                plugin=run.ref("backend", run.judge_backend.name),
            )
        run.grading_context = GradingContext(judge=run._judge, judge_model=config.judge_model or config.model)
        if config.isolation == "process":  # the same plugin host as the driver's, in this process
            run.host = PluginHost(run.tokenizer_info, run.scratch_dir)
            run.host.guarded = [run.run_dir]
            if not config.prompts_only:
                run.metering = Metering(run.caller, run.counter, config.seed)
                run.metering.start()
                run.host.meter_with(run.metering)
        self._run = run

    def _files(self) -> dict[Path, int]:
        root = self._run.run_dir / "retrievals"
        return {p: p.stat().st_mtime_ns for p in root.rglob("*") if p.is_file()} if root.exists() else {}

    def run(self, unit: Unit, slots: Slots | None = None) -> UnitOutcome:
        run = self._run
        callers = {id(c): c for c in (run.caller, run.judge_caller)}.values()
        for caller in callers:
            caller.slots = slots
            if slots is not None:
                caller._slots = contextlib.nullcontext()  # the lease is the limit; a local one would add to it
        calls_before = sum(c.calls_made for c in callers)
        before = self._files()
        run.log = buffer = _BufferLog(run.run_dir)
        self.memo.new = []
        unit = Unit(unit.strategy, run.admit_item(unit.item), list(unit.todo))
        run.run_unit(unit, lambda strategy, cells: None)
        files = {
            str(p.relative_to(run.run_dir)): p.read_bytes()
            for p, stamp in self._files().items()
            if before.get(p) != stamp
        }
        return UnitOutcome(buffer.rows, self.memo.new, files, sum(c.calls_made for c in callers) - calls_before)
