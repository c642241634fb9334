"""Executors: how a run's units are scheduled (the ``register_executors`` plugin point).

A run is a stream of units, each one strategy on one item with the (budget, repeat)
cells still to do. The runner forms units as the task's items arrive and hands them to an
executor through a :class:`Job`. Whatever the executor, the process that called ``run`` (the
driver) is the only writer of the event log, the response cache and the manifest:

- an in-process executor (the built-in ``thread``, ``builtin/executors.py``) calls ``job.run_here(unit)``, which writes
  each row as it happens;
- an executor that runs units elsewhere (``ray``) ships ``job.worker_spec()`` to its workers
  once, has each worker run ``spec.build().run(unit, slots, replies)``, and hands the returned
  :class:`UnitOutcome` to ``job.record(unit, outcome)`` in the driver. A unit whose worker is
  lost is simply run again: nothing of it was recorded, so it is never half-recorded. Given
  ``calls`` (``DriverCalls``, e.g. around ``spec.call_desk()`` on the driver's node), a worker
  makes no model call itself, so a lost worker loses no reply either.
"""

from __future__ import annotations

import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any, ClassVar

from .backends import Completion, GenerationParams
from .messages import Item, Message


@dataclass
class Unit:
    """One (strategy, item) and the (budget, repeat) cells of it still to run, in order;
    ``skipped`` cells of it were found finished on disk."""

    strategy: str
    item: Item
    todo: list[tuple[int, int]]
    skipped: int = 0


@dataclass
class UnitOutcome:
    """What a remote worker hands back for one unit: its events in order (each stamped with the
    time it happened), the model replies it received (keyed as in the response cache) and the
    files it wrote under the run directory, by path relative to it."""

    events: list[tuple[dict[str, Any], str | None]] = field(default_factory=list)  # (row, file or None: its cell's)
    replies: list[tuple[str, Completion]] = field(default_factory=list)
    files: dict[str, bytes] = field(default_factory=dict)  # run-directory files the unit wrote (retrievals/...)
    calls_made: int = 0


# A model's connection slots: a context manager held around each model call, given a key
# naming the model (its cache identity). The thread executor's slots are per process; an
# executor running on several machines passes slots that hold across all of them.
Slots = Callable[[str], AbstractContextManager[Any]]


class SharedReplies(ABC):
    """The model replies of one run, shared by every worker of an executor that runs units
    elsewhere: no worker asks the model for a reply another worker has, or is getting (a
    thread run's one cache does the same for its threads)."""

    @abstractmethod
    def claim(self, key: str) -> Completion | None:
        """The reply for ``key`` (a response-cache key) if a worker has it, waiting while one is
        getting it; None: get it yourself, then ``put`` it."""

    @abstractmethod
    def put(self, key: str, completion: Completion) -> None:
        """The reply for ``key``, for every worker (and whoever waits for it)."""


@dataclass(frozen=True)
class CallRequest:
    """One model call a remote worker hands to ``DriverCalls``: the prompt as gated
    (``chat_json`` its serialisation, the cache key's), and the cell's time left."""

    judge: bool  # the judge's backend, not the model's
    messages: tuple[Message, ...]
    chat_json: str
    params: GenerationParams
    seconds: float | None


@dataclass(frozen=True)
class CallReply:
    """What became of a ``CallRequest``: the reply, or ``failure`` (why the call failed)."""

    completion: Completion | None
    attempts: int
    cached: bool
    warnings: tuple[str, ...] = ()
    failure: str = ""


class DriverCalls(ABC):
    """Makes a remote worker's model calls in a place that outlives the worker (the driver's
    node), with the run's cache, ``-j`` limit, retries and deadlines: a reply a lost worker was
    waiting for is kept there, and its unit's rerun gets it instead of asking the model again."""

    @abstractmethod
    def call(self, request: CallRequest) -> CallReply: ...

    @abstractmethod
    def calls_made(self) -> int:
        """Model calls sent so far (every attempt), counted where they were made: a lost
        worker's calls included, which its unit's ``UnitOutcome`` never brought back."""


class UnitWorker(ABC):
    """Runs units away from the driver: strategies built here, model called from here (or,
    given ``DriverCalls``, from there)."""

    @abstractmethod
    def run(
        self,
        unit: Unit,
        slots: Slots | None = None,
        replies: SharedReplies | None = None,
        calls: DriverCalls | None = None,
    ) -> UnitOutcome:
        """Every remaining cell of ``unit``; rows and replies are returned, never written.
        ``replies``: the run's replies shared across workers (consulted before any model call);
        ``calls``: where every model call is made instead (then ``slots`` and ``replies`` are unused)."""


class WorkerSpec(ABC):
    """A picklable recipe for a :class:`UnitWorker`, built once per worker process."""

    key: str  # the same for every worker of one run invocation (a cache key for built workers)

    @abstractmethod
    def build(self) -> UnitWorker: ...

    def call_desk(self) -> DriverCalls:
        """The run's model calls made here, for ``DriverCalls`` of every worker: build it where
        calls should be made (its backends read this process's environment for API keys)."""
        raise NotImplementedError(f"{type(self).__name__} makes no calls for its workers")


class Job(ABC):
    """The runner's side of an execution, handed to ``Executor.execute``."""

    units: Iterator[Unit]  # lazily formed; pull only as many as you can run now
    max_concurrency: int  # the run's per-model connection limit (``-j``)
    timeout_s: float  # one model call's deadline: how long a connection slot can be held
    stop: threading.Event  # set on Ctrl+C or a harness error: take no new units

    @abstractmethod
    def run_here(self, unit: Unit) -> None:
        """Run ``unit`` in this process, writing every row as it happens."""

    @abstractmethod
    def worker_spec(self) -> WorkerSpec:
        """The recipe remote workers build their :class:`UnitWorker` from."""

    @abstractmethod
    def record(self, unit: Unit, outcome: UnitOutcome) -> None:
        """Write a remote unit's rows and replies (driver only)."""

    @abstractmethod
    def record_lost(self, unit: Unit, cause: str) -> None:
        """Every remaining cell of ``unit`` as an ``error`` row (phase ``executor``): its worker
        was lost more often than the executor retries."""

    @abstractmethod
    def record_desk_calls(self, calls: int) -> None:
        """The workers' model calls as their ``DriverCalls`` counted them (``calls_made()``):
        the run's count of them, in place of the sum over recorded units."""


class Executor(ABC):
    """Base class for executors. Subclasses set ``name`` and implement ``execute``.

    ``options`` maps each constructor keyword to its help text; the command line offers it
    as ``--<name>-<option>`` (``--ray-address``), and ``RunConfig.executor_options`` carries it.
    """

    name: ClassVar[str]
    description: ClassVar[str] = ""
    options: ClassVar[dict[str, str]] = {}

    def __init__(self, **options: Any) -> None:
        unknown = sorted(set(options) - set(self.options))
        if unknown:
            raise ValueError(
                f"executor {self.name!r} has no option {', '.join(unknown)}; "
                f"its options: {', '.join(sorted(self.options)) or 'none'}"
            )
        self.settings = options

    @abstractmethod
    def execute(self, job: Job) -> None:
        """Run every unit of ``job.units``; return when all are recorded. An exception stops the run."""
