"""Every model call of a run goes through here: cache, connection limit, retries, deadlines.

A reply is asked for once: cells asking the same prompt (the cache key) at once wait for the
first one's reply instead of each sending it.

The backend is plugin code: each attempt runs in the sandbox (``sandbox.contained``) with a
*total* deadline (``timeout_s``, never later than the cell's own deadline), so a server that
trickles bytes cannot hold a call past it, and anything the backend raises is contained.
Only transport failures (connection errors, timeouts, 429 and 5xx) are retried, with
exponential back-off that honours Retry-After, within the deadline. Anything else becomes
``CallFailed``: a failed call is never turned into a prediction. A failure every later call
would repeat (a refused key, the same transport error K times in a row) stops the run
(``failfast``): after it no call is sent. What the backend returns is
checked and copied into a plain ``Completion``: an unreported figure stays ``None``.

A backend that defines ``acomplete`` (``Backend.async_calls()``) is awaited on the shared
event loop (``event_loop``) instead of run on a sandbox thread: the cell's thread submits
the attempt and waits with the same total deadline, and at the deadline the coroutine is
cancelled. Its connection slot is a semaphore on the loop, taken by the coroutine and freed
when it has finished, so the server never holds more than ``max_connections`` calls of this
caller, even from a coroutine that ignores cancellation. What it raises is classified as on
the sync path.

A backend may choose its attempts' total deadline (``total_deadline_s``): the embedded
server has none and bounds each call by the server's progress instead, so a slow machine
slows a call down rather than failing it, and what it raises then is not retried.

The first Ctrl-C stops every caller of the process from sending (``stop_sending``): the
attempts in flight (``calls_in_flight``, what the interrupt message says it waits for) may
finish, nothing new goes out and nothing is retried.

The prompt is serialised once: ``chat_json`` (``Gated.chat_json``) makes the cache key and
is handed to the backend with the messages (``SentMessages.chat_json``) for its request body.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import itertools
import random
import threading
import time
import weakref
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from .backends import Backend, Completion, FatalError, GenerationParams, TransportError
from .cache import ResponseCache, cache_key
from .event_loop import SharedLoop, shared_loop
from .failfast import FailFast
from .gate import chat_json as serialise
from .messages import Message, SentMessages
from .sandbox import Deadline, PluginFailure, PluginRef, contained, describe_exception

MAX_BACKOFF_S = 60.0
# The total deadline of an attempt whose backend sets none (``total_deadline_s`` is None):
# finite only because lock waits need a number; the cell's own deadline still applies.
NO_TOTAL_DEADLINE_S = 10.0**7
# How long a backend may take to answer a question about itself (its total deadline, whether it
# is async): not the call's timeout, which may be shorter than a thread handoff on a busy machine.
QUESTION_S = 30.0
_CALLERS: weakref.WeakSet[ModelCaller] = weakref.WeakSet()


class CallFailed(RuntimeError):
    """A call that failed after every retry; ``attempts`` says how many were made."""

    def __init__(self, message: str, attempts: int) -> None:
        super().__init__(message)
        self.attempts = attempts


@dataclass
class CallOutcome:
    completion: Completion
    attempts: int
    cached: bool
    warnings: list[str] = field(default_factory=list)


def _count_or_none(value: object, name: str) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise TypeError(f"{name} is {type(value).__name__} {value!r}, not a count")
    return int.__index__(value)


def _tool_calls(value: object) -> list[dict[str, Any]] | None:
    """``Completion.tool_calls`` as plain data, or TypeError."""
    if value is None:
        return None
    if not isinstance(value, list):
        raise TypeError(f"tool_calls is {type(value).__name__}, not a list")
    calls = []
    for call in value:
        if not isinstance(call, dict) or not all(isinstance(call.get(k), str) for k in ("name", "arguments")):
            raise TypeError("a tool call must be a dict with str 'name' and 'arguments'")
        ident = call.get("id")
        calls.append(
            {
                "id": str.__str__(ident) if isinstance(ident, str) else None,
                "name": str.__str__(call["name"]),
                "arguments": str.__str__(call["arguments"]),
            }
        )
    return calls


def plain_completion(completion: object) -> Completion:
    """A ``Completion`` made of exact types, or TypeError: what a backend returned is not trusted."""
    if not isinstance(completion, Completion):
        raise TypeError(f"backend returned {type(completion).__name__}, not Completion")
    fields = object.__getattribute__(completion, "__dict__")
    text = fields.get("text")
    if not isinstance(text, str):
        raise TypeError(f"completion text is {type(text).__name__}, not str")
    latency = fields.get("latency_s")
    cost = fields.get("cost")
    model = fields.get("model")
    return Completion(
        text=str.__str__(text),
        prompt_tokens=_count_or_none(fields.get("prompt_tokens"), "prompt_tokens"),
        completion_tokens=_count_or_none(fields.get("completion_tokens"), "completion_tokens"),
        latency_s=float(latency) if type(latency) in (int, float) else 0.0,
        cached_tokens=_count_or_none(fields.get("cached_tokens"), "cached_tokens"),
        cost=float(cost) if type(cost) in (int, float) else None,
        model=str.__str__(model) if isinstance(model, str) else None,
        tool_calls=_tool_calls(fields.get("tool_calls")),
    )


@dataclass(frozen=True)
class _NotAwaitable:
    """What ``acomplete`` returned instead of a coroutine (its type's name)."""

    kind: str


@dataclass(frozen=True)
class InFlight:
    """One attempt being sent now: its backend, the seconds left of its total deadline (None:
    the backend set none) and what the backend says it is doing (``activity()``)."""

    plugin: str
    remaining_s: float | None
    activity: str | None


def calls_in_flight() -> list[InFlight]:
    """Every attempt in flight in this process, over all callers (for the first Ctrl-C's message)."""
    found: list[InFlight] = []
    for caller in list(_CALLERS):
        found.extend(caller.in_flight())
    return found


def stop_sending(reason: str) -> None:
    """Every caller of this process sends nothing more and retries nothing (the first Ctrl-C);
    attempts already in flight may finish. Callers made afterwards are not affected."""
    for caller in list(_CALLERS):
        caller.stopping = reason


class ModelCaller:
    """Calls one backend with a response cache, a connection limit, bounded retries and deadlines."""

    def __init__(
        self,
        backend: Backend,
        cache: ResponseCache | None,
        max_connections: int,
        retries: int = 4,
        backoff_s: float = 0.5,
        timeout_s: float | None = None,
        plugin: PluginRef | None = None,
        fail_fast: FailFast | None = None,
    ) -> None:
        self.backend = backend
        self.cache = cache
        self.retries = retries
        self.backoff_s = backoff_s
        self.timeout_s = timeout_s if timeout_s is not None else float(getattr(backend, "timeout_s", 120.0))
        self.plugin = plugin or PluginRef("backend", getattr(backend, "name", type(backend).__name__))
        self.fail_fast = fail_fast  # the run's: stops every caller on a failure all later calls would repeat
        self.max_connections = max(1, max_connections)
        self._slots = threading.BoundedSemaphore(self.max_connections)
        self._async: bool | None = None  # backend.async_calls(), asked on the first attempt
        self._async_slots: tuple[SharedLoop, asyncio.Semaphore] | None = None
        self._count_lock = threading.Lock()
        self._fetching: dict[str, threading.Event] = {}  # keys being asked for now: a second asker waits
        self.calls_made = 0
        self.stopping: str | None = None  # why nothing more is sent (``stop_sending``)
        self._flying: dict[int, Deadline | None] = {}  # attempts in flight: their total deadline
        self._ids = itertools.count()
        self._chosen: dict[float, float | None] = {}  # the backend's total_deadline_s, per timeout
        _CALLERS.add(self)

    def in_flight(self) -> list[InFlight]:
        with self._count_lock:
            deadlines = list(self._flying.values())
        if not deadlines:
            return []
        try:
            said = self.backend.activity()
        except Exception:  # noqa: BLE001 - a description only; the message goes out without it
            said = None
        what = said if isinstance(said, str) else None
        return [InFlight(self.plugin.describe(), None if d is None else d.remaining(), what) for d in deadlines]

    def _total_deadline(self, outer: Deadline | None) -> tuple[Deadline, bool]:
        """The attempt's deadline and whether the backend set none (``total_deadline_s``, asked
        once per timeout and contained: it is plugin code; None leaves only the cell's deadline)."""
        choose = self.backend.total_deadline_s
        if self.timeout_s not in self._chosen:
            configured = self.timeout_s
            seconds: object = contained("model", self.plugin, lambda: choose(configured), Deadline(QUESTION_S))
            if seconds is not None and (type(seconds) not in (int, float) or not seconds > 0):  # type: ignore[operator]
                raise PluginFailure(
                    "model",
                    self.plugin,
                    f"{self.plugin.describe()} total_deadline_s() returned {seconds!r}, not seconds or None",
                )
            self._chosen[configured] = None if seconds is None else float(seconds)  # type: ignore[arg-type]
        chosen = self._chosen[self.timeout_s]
        if chosen is None:
            return Deadline.within(NO_TOTAL_DEADLINE_S, outer), True
        return Deadline.within(chosen, outer), False

    def _count(self) -> None:
        with self._count_lock:
            self.calls_made += 1

    def _attempt(self, messages: Sequence[Message], params: GenerationParams, outer: Deadline | None) -> Completion:
        """One attempt within min(its total deadline, the outer one); TransportError for a missed deadline."""
        deadline, unbounded = self._total_deadline(outer)
        key = next(self._ids)
        with self._count_lock:
            self._flying[key] = None if unbounded and outer is None else deadline
        try:
            if self._uses_async():
                return self._attempt_async(messages, params, deadline)
            return self._attempt_sync(messages, params, deadline)
        finally:
            with self._count_lock:
                del self._flying[key]

    def _attempt_sync(self, messages: Sequence[Message], params: GenerationParams, deadline: Deadline) -> Completion:
        with self._slots:
            try:
                return plain_completion(
                    contained("model", self.plugin, lambda: self.backend.complete(messages, params), deadline)
                )
            except PluginFailure as failure:
                if failure.timed_out:
                    raise TransportError(
                        f"no complete reply within the total deadline of {deadline.seconds:g} s"
                    ) from None
                if isinstance(failure.original, TransportError):
                    raise failure.original from None
                raise

    def _uses_async(self) -> bool:
        """``backend.async_calls()``, asked once (contained: it is plugin code)."""
        if self._async is None:
            if type(self.backend).async_calls is Backend.async_calls:  # the core's own rule, nothing to contain
                answer: object = self.backend.async_calls()
            else:
                answer = contained("model", self.plugin, self.backend.async_calls, Deadline(QUESTION_S))
            if type(answer) is not bool:
                raise PluginFailure(
                    "model",
                    self.plugin,
                    f"{self.plugin.describe()} async_calls() returned {type(answer).__name__}, not bool",
                )
            self._async = answer
        return self._async

    def _loop_slots(self, loop: SharedLoop) -> asyncio.Semaphore:
        """The connection limit of the async path: a semaphore on the loop, taken inside the
        coroutine and given back when it ends (a lock per call on the caller's thread and a
        ``threading.Condition`` per release on the loop's cost more than the request)."""
        slots = self._async_slots
        if slots is None or slots[0] is not loop:  # a forked child has a loop of its own
            slots = self._async_slots = (loop, asyncio.Semaphore(self.max_connections))
        return slots[1]

    def _attempt_async(self, messages: Sequence[Message], params: GenerationParams, deadline: Deadline) -> Completion:
        """The attempt as a coroutine on the shared loop; the slot is held until it has finished."""
        loop = shared_loop()
        slots = self._loop_slots(loop)
        backend = self.backend
        sent = []  # non-empty once the coroutine holds a slot (read by this thread at the deadline)

        async def attempt() -> object:
            async with slots:
                sent.append(True)
                awaitable = backend.acomplete(messages, params)
                if not inspect.isawaitable(awaitable):
                    return _NotAwaitable(type(awaitable).__name__)
                return await awaitable

        submission = loop.submit(attempt, self.plugin.describe())
        try:
            kind, value = submission.outcome(deadline.remaining())
        except TimeoutError:
            submission.cancel()
            stall = loop.stall()
            if submission.started and not sent:
                raise TransportError(
                    f"no connection free within the total deadline of {deadline.seconds:g} s "
                    f"({self.max_connections} calls to this model still in flight; nothing sent)"
                    + (f"; {stall}" if stall else "")
                ) from None
            raise TransportError(
                f"no complete reply within the total deadline of {deadline.seconds:g} s"
                + (f"; {stall}" if stall else "")
            ) from None
        if kind == "error":
            if isinstance(value, TransportError):
                raise value
            raise PluginFailure(
                "model",
                self.plugin,
                f"{self.plugin.describe()} failed in model: {describe_exception(value)}",
                original=value,
            )
        if isinstance(value, _NotAwaitable):
            raise TypeError(f"acomplete returned {value.kind}, not a coroutine")
        return plain_completion(value)

    def call(
        self,
        messages: Sequence[Message],
        params: GenerationParams,
        deadline: Deadline | None = None,
        *,
        chat_json: str | None = None,
    ) -> CallOutcome:
        """``chat_json`` is ``gate.chat_json(messages)`` when the caller has it (``Gated.chat_json``)."""
        sent = SentMessages(messages, chat_json if chat_json is not None else serialise(messages))
        key = cache_key(*self.backend.cache_identity(), sent.chat_json, params)
        warnings: list[str] = []
        if self.cache is None:
            return self._fetch(key, sent, params, deadline, warnings)
        hit, warning = self.cache.lookup(key)
        if warning:
            warnings.append(warning)
        if hit is not None:
            return CallOutcome(hit, 0, True, warnings)
        with self._count_lock:  # one thread asks for a reply; the others asking the same wait for it
            fetching = self._fetching.get(key)
            if fetching is None:
                fetching = self._fetching[key] = threading.Event()
                mine = True
            else:
                mine = False
        if not mine:
            fetching.wait(None if deadline is None else deadline.remaining())
            hit, _ = self.cache.lookup(key)
            if hit is not None:
                return CallOutcome(hit, 0, True, warnings)
            # the other call failed (or the deadline passed): this one asks for itself
        try:
            return self._fetch(key, sent, params, deadline, warnings)
        finally:
            if mine:
                with self._count_lock:
                    del self._fetching[key]
                fetching.set()

    def _fetch(
        self, key: str, sent: SentMessages, params: GenerationParams, deadline: Deadline | None, warnings: list[str]
    ) -> CallOutcome:
        """The attempts of one call, retried as the policy says; its reply goes to the cache."""
        attempts = 0
        while True:
            if deadline is not None and deadline.expired():
                raise CallFailed(f"the cell's deadline passed before attempt {attempts + 1}", attempts)
            attempts += 1
            try:
                with self.fail_fast.probe() if self.fail_fast else contextlib.nullcontext():
                    if self.stopping:
                        raise CallFailed(f"not sent: {self.stopping}", attempts - 1)
                    if self.fail_fast and self.fail_fast.stopped:  # a fatal error or a streak: send nothing more
                        raise CallFailed(f"not sent: the run is stopping ({self.fail_fast.cause})", attempts - 1)
                    completion = self._attempt(sent, params, deadline)
                    if self.fail_fast:
                        self.fail_fast.succeeded()  # before the probe lock is released, so waiters go in parallel
                self._count()
            except TransportError as exc:
                self._count()
                if self.fail_fast:
                    self.fail_fast.transport_failed(str(exc))
                if attempts > self.retries or (self.fail_fast and self.fail_fast.stopped) or self.stopping:
                    raise CallFailed(f"transport error after {attempts} attempts: {exc}", attempts) from exc
                delay = self.backoff_s * 2 ** (attempts - 1) * (1 + random.random() / 2)
                if exc.retry_after is not None:
                    delay = max(delay, exc.retry_after)
                delay = min(delay, MAX_BACKOFF_S)
                if deadline is not None and deadline.remaining() < delay:
                    raise CallFailed(
                        f"transport error after {attempts} attempts: {exc}; no time left for a retry "
                        f"before the cell's deadline",
                        attempts,
                    ) from exc
                time.sleep(delay)
                continue
            except PluginFailure as failure:  # the server answered unusably (ResponseError) or the backend broke
                self._count()
                original = failure.original
                what = describe_exception(original) if original is not None else failure.cause
                if self.fail_fast and isinstance(original, FatalError):
                    self.fail_fast.refused(what)
                raise CallFailed(f"{what} (not retried)", attempts) from None
            except TypeError as exc:  # the backend returned something that is not a completion
                self._count()
                raise CallFailed(
                    f"{self.plugin.describe()} returned an unusable completion: {exc} (not retried)", attempts
                ) from None
            if self.cache is not None:
                self.cache.put(key, completion)
            return CallOutcome(completion, attempts, False, warnings)
