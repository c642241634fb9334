"""Units formed as the task's items arrive, and the Job an executor runs them through.

The runner never holds the whole task: ``Task.load_wanted`` is consumed lazily, and each
item becomes its units (one per strategy this shard owns, minus the cells finished on
disk) as it arrives. The run order is a seeded shuffle inside a bounded window of units
(``window_shuffle``): the same seed and data give the same order, and at most ``window``
units plus the ones in flight (and so at most that many items) are in memory at once.

``RunJob`` is the driver's side of an executor: ``run_here`` for in-process executors,
``record``/``record_lost`` for executors that run units elsewhere, and ``worker_spec``, the
picklable recipe a remote worker rebuilds the run from (``RemoteWorker``): the same
plugins and ``CellServices``, with its rows, replies and files buffered and handed back
instead of written.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import tempfile
import threading
from collections.abc import Callable, Iterable, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from ..backends import Completion
from ..cache import cache_key
from ..executors import (
    CallReply,
    CallRequest,
    DriverCalls,
    Job,
    SharedReplies,
    Slots,
    Unit,
    UnitOutcome,
    UnitWorker,
    WorkerSpec,
)
from ..gate import chat_json as serialise
from ..model_calls import CallFailed, CallOutcome, ModelCaller
from ..retrievals import write_retrieval
from ..run_config import RunConfig
from ..runlog import now
from ..sandbox import Deadline
from ..tokenizers import PromptCounter
from .intake import ItemIntake
from .run_plugins import RunPlugins
from .services import CellServices, CellSettings, callers, plugin_host
from .strategy_pool import StrategyPool
from .units import lost, run_unit

if TYPE_CHECKING:
    from ..cache import ResponseCache

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
    """The driver's side of one execution: ``services`` run the units here and record the
    ones run elsewhere; ``spec`` is the recipe a remote worker rebuilds the services from."""

    def __init__(
        self,
        services: CellServices,
        units: Iterator[Unit],
        progress: Callable[[str, int], None],
        cache: ResponseCache,
        spec: Callable[[], RemoteSpec],
        max_concurrency: int,
        timeout_s: float,
    ) -> None:
        self.services = services
        self.units = units
        self.max_concurrency = max_concurrency
        self.timeout_s = timeout_s
        self.stop = services.stop
        self.progress = progress
        self.cache = cache
        self.remote_calls = 0  # the model calls the recorded units say they made
        self._desk_calls: int | None = None
        self._lock = threading.Lock()
        self._make_spec = spec
        self._spec: RemoteSpec | None = None

    def run_here(self, unit: Unit) -> None:
        run_unit(self.services, unit, self.progress)

    def worker_spec(self) -> RemoteSpec:
        if self._spec is None:
            self._spec = self._make_spec()
        return self._spec

    def record(self, unit: Unit, outcome: UnitOutcome) -> None:
        services = self.services
        with self._lock:  # one unit's rows stay together in every cell file
            for relative, data in outcome.files.items():  # MAC'd by the worker under its own key: here under the run's
                write_retrieval(services.run_dir, services.run_dir / relative, json.loads(data), services.log.key)
            for key, completion in outcome.replies:
                self.cache.put(key, completion)
            for row, path in outcome.events:
                services.log.append(row, services.run_dir / path if path else None)
                if row.get("event") in TERMINAL_KINDS and path is None:
                    services.tally(row["event"], row)  # counted, and shown as finished (not resumed) by the display
            self.remote_calls += outcome.calls_made
        self.progress(unit.strategy, len(unit.todo))

    def record_lost(self, unit: Unit, cause: str) -> None:
        lost(self.services, unit, cause)
        self.progress(unit.strategy, len(unit.todo))

    def record_desk_calls(self, calls: int) -> None:
        with self._lock:
            self._desk_calls = calls

    @property
    def workers_calls(self) -> int:
        """The model calls made for remote workers: where the executor had a desk count them,
        that count (a lost unit's calls are in it, not in any recorded outcome)."""
        return self.remote_calls if self._desk_calls is None else self._desk_calls


def address_of(backend: Any) -> dict[str, Any]:
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
    view_key: bytes = field(repr=False)  # the driver's: views carry the same opaque ids
    backend_address: dict[str, Any] = field(default_factory=dict)
    judge_address: dict[str, Any] = field(default_factory=dict)

    def build(self) -> RemoteWorker:
        return RemoteWorker(self)

    def call_desk(self) -> CallDesk:
        return CallDesk(self)


def _reach_backends(plugins: RunPlugins, spec: RemoteSpec) -> None:
    """The driver's backends in this process: addressed as the driver's, started unless the
    driver runs their server (which is reached, never started again)."""
    for backend, address in ((plugins.backend, spec.backend_address), (plugins.judge_backend, spec.judge_address)):
        if backend is None:
            continue
        for name, value in address.items():
            setattr(backend, name, value)
        if "server_url" not in address:
            backend.start()  # e.g. litellm's import, seconds on a busy machine: not in a call's deadline
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    import litellm  # noqa: F401 - a core dependency; warmed here for the embedded model's copy too


class _Memory:
    """A response cache in memory (what ``ModelCaller`` asks of one: lookup and put)."""

    def __init__(self) -> None:
        self.replies: dict[str, Completion] = {}

    def lookup(self, key: str) -> tuple[Completion | None, str | None]:
        return self.replies.get(key), None

    def put(self, key: str, completion: Completion) -> None:
        self.replies[key] = completion


class CallDesk(DriverCalls):
    """The run's model and judge callers in one process, for every remote worker: one cache,
    one reply asked for at a time per prompt, ``-j`` connections, the run's retries and
    ``--timeout``. A call goes on (and its reply is kept) when the worker that asked is lost."""

    def __init__(self, spec: RemoteSpec) -> None:
        from ..plugins import get_registry

        config = spec.config
        plugins = RunPlugins(config, get_registry(), task=spec.task)
        _reach_backends(plugins, spec)
        memory = cast("ResponseCache", _Memory())
        self.model, self.judge = callers(plugins, memory, config.max_concurrency, config.retries, config.timeout_s)

    def call(self, request: CallRequest) -> CallReply:
        caller = self.judge if request.judge else self.model
        deadline = None if request.seconds is None else Deadline(request.seconds)
        try:
            outcome = caller.call(request.messages, request.params, deadline, chat_json=request.chat_json)
        except CallFailed as failed:
            return CallReply(None, failed.attempts, False, failure=str(failed))
        return CallReply(outcome.completion, outcome.attempts, outcome.cached, tuple(outcome.warnings))

    def calls_made(self) -> int:
        return sum({id(c): c.calls_made for c in (self.model, self.judge) if c is not None}.values())


class _BufferLog:
    """The ``EventLog`` of a worker: rows kept in order, stamped when they happen, never written.
    ``key`` is the worker's own, for the retrievals it keeps in its directory (not a run's: the
    driver MACs what it records under the run's key, which never leaves the driver)."""

    def __init__(self, run_dir: Path, key: bytes) -> None:
        self.run_dir = run_dir
        self.key = key
        self.rows: list[tuple[dict[str, Any], str | None]] = []
        self._lock = threading.Lock()

    def append(self, event: dict[str, Any], path: Path | None = None) -> None:
        relative = None if path is None else str(Path(path).relative_to(self.run_dir))
        with self._lock:
            self.rows.append(({"time": now(), **event}, relative))

    def close(self) -> None:
        pass


class _ReplyMemo:
    """A worker's response cache: replies it got or was given in this run, handed to the driver
    to store; ``shared`` (the executor's, if any) is asked before any model call and told of
    every new reply, so no two workers ask the model the same thing."""

    def __init__(self) -> None:
        self.memo: dict[str, Completion] = {}
        self.new: list[tuple[str, Completion]] = []
        self.shared: SharedReplies | None = None
        self._lock = threading.Lock()

    def lookup(self, key: str) -> tuple[Completion | None, str | None]:
        with self._lock:
            hit = self.memo.get(key)
        if hit is None and self.shared is not None:
            hit = self.shared.claim(key)
            if hit is not None:  # the worker that got it may be lost before the driver records it
                self._keep(key, hit)
        return hit, None

    def put(self, key: str, completion: Completion) -> None:
        self._keep(key, completion)
        if self.shared is not None:
            self.shared.put(key, completion)

    def _keep(self, key: str, completion: Completion) -> None:
        with self._lock:
            self.memo[key] = completion
            self.new.append((key, completion))


class _ClusterCaller(ModelCaller):
    """A worker's ``ModelCaller``. Given ``driver``, it hands every call there (made where a
    lost worker cannot lose it) and keeps the reply for the driver's cache. Otherwise each
    attempt first takes a lease from the executor's cluster-wide ``slots`` for this model (so
    ``-j`` holds across every worker), and only then starts the attempt's deadline."""

    slots: Slots | None = None
    driver: DriverCalls | None = None  # where this worker's calls are made, if not here
    judge = False  # the judge's caller (told to ``driver``)

    def call(
        self, messages: Any, params: Any, deadline: Deadline | None = None, *, chat_json: str | None = None
    ) -> CallOutcome:
        if self.driver is None:
            return super().call(messages, params, deadline, chat_json=chat_json)
        sent = chat_json if chat_json is not None else serialise(messages)
        remaining = None if deadline is None else deadline.remaining()
        reply = self.driver.call(CallRequest(self.judge, tuple(messages), sent, params, remaining))
        with self._count_lock:
            self.calls_made += reply.attempts
        if reply.completion is None:
            raise CallFailed(reply.failure, reply.attempts)
        if self.cache is not None:  # handed to the driver's response cache with the unit's rows
            self.cache.put(cache_key(*self.backend.cache_identity(), sent, params), reply.completion)
        return CallOutcome(reply.completion, reply.attempts, reply.cached, list(reply.warnings))

    def _attempt(self, messages: Any, params: Any, outer: Any) -> Completion:
        if self.slots is None:
            return super()._attempt(messages, params, outer)
        lease: AbstractContextManager[Any] = self.slots(json.dumps(self.backend.cache_identity()))
        with lease:
            return super()._attempt(messages, params, outer)


class RemoteWorker(UnitWorker):
    """The driver's run rebuilt in a worker process: the same plugins and services, with a
    tokenizer and callers of its own and its rows, replies and files handed back."""

    def __init__(self, spec: RemoteSpec) -> None:
        from ..plugins import get_registry

        config = spec.config
        plugins = RunPlugins(config, get_registry(), task=spec.task)
        _reach_backends(plugins, spec)
        tokenizer = plugins.tokenizer()
        counter = PromptCounter(tokenizer)
        tokenizer_info = tokenizer.info.to_dict()
        versions = plugins.versions()
        if tokenizer_info != spec.tokenizer_info or versions != spec.versions:
            raise RuntimeError(
                f"this worker ({os.uname().nodename}) would count or run differently from the driver: tokenizer "
                f"{tokenizer_info} vs {spec.tokenizer_info}, plugin versions {versions} vs {spec.versions}; "
                f"install the same distributions on every node"
            )
        # Its own directory and key: a retrieval left by another worker is not one of its own.
        run_dir = Path(tempfile.mkdtemp(prefix=f"budgetbench-worker-{spec.run_key}-"))
        self.run_dir = run_dir
        self.key = os.urandom(32)
        self.memo = _ReplyMemo()
        cache = cast("ResponseCache", self.memo)  # to ModelCaller it is a cache: lookup and put
        self.callers: tuple[_ClusterCaller, _ClusterCaller] = callers(  # type: ignore[assignment]
            plugins, cache, config.max_concurrency, config.retries, config.timeout_s, caller_class=_ClusterCaller
        )
        self.callers[1].judge = self.callers[1] is not self.callers[0]
        scratch_dir = Path(tempfile.mkdtemp(prefix="budgetbench-scratch-"))
        host, self.metering = plugin_host(
            config, plugins, tokenizer_info, scratch_dir, [run_dir], self.callers[0], counter
        )
        self.intake = ItemIntake(config, plugins.task, plugins.ref("task", config.task))
        self.services = CellServices.assemble(
            config,
            plugins,
            CellSettings.of(config, plugins, spec.run_key, tokenizer_info, spec.view_key),
            counter,
            self.callers,
            StrategyPool(config, plugins, host),
            log=_BufferLog(run_dir, self.key),
            run_dir=run_dir,
            scratch_dir=scratch_dir,
            evidence=self.intake.evidence,
            tally=lambda kind, row: None,  # the driver counts the rows it records
            stop=threading.Event(),
        )

    def _files(self) -> dict[Path, int]:
        root = self.run_dir / "retrievals"
        return {p: p.stat().st_mtime_ns for p in root.rglob("*") if p.is_file()} if root.exists() else {}

    def run(
        self,
        unit: Unit,
        slots: Slots | None = None,
        replies: SharedReplies | None = None,
        calls: DriverCalls | None = None,
    ) -> UnitOutcome:
        self.memo.shared = replies
        callers = {id(c): c for c in self.callers}.values()
        for caller in callers:
            caller.driver = calls
            caller.slots = slots
            if slots is not None:
                caller._slots = contextlib.nullcontext()  # type: ignore[assignment]  # the lease is the limit; a local one would add to it
        calls_before = sum(c.calls_made for c in callers)
        before = self._files()
        buffer = _BufferLog(self.run_dir, self.key)
        self.memo.new = []
        unit = Unit(unit.strategy, self.intake.admit(unit.item), list(unit.todo))
        run_unit(self.services.with_log(buffer), unit, lambda strategy, cells: None)
        files = {
            str(p.relative_to(self.run_dir)): p.read_bytes()
            for p, stamp in self._files().items()
            if before.get(p) != stamp
        }
        return UnitOutcome(buffer.rows, self.memo.new, files, sum(c.calls_made for c in callers) - calls_before)
