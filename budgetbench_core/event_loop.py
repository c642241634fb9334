"""One asyncio event loop for every async model call of the process.

A blocked thread per call in flight costs a thread switch per reply and a sandbox thread
each; at 128 calls in flight that, not the server, set the pace. Backends that define
``acomplete`` are awaited here instead: a daemon thread, started on first use, runs one
loop for all of them. A cell's thread submits the attempt (``submit``) and waits for it
with the attempt's deadline; at the deadline the coroutine is cancelled for real.

A plugin coroutine that blocks (calls ``time.sleep``, reads a socket synchronously) stops
every call on the loop. Such a loop is not hidden: the loop beats every ``BEAT_S``; a
caller whose deadline passed while the loop had not beaten for ``STALL_S`` gets
``stall()``, which names the task that holds it, and says so in its error.
"""

from __future__ import annotations

import asyncio
import atexit
import collections
import concurrent.futures
import os
import threading
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

T = TypeVar("T")

BEAT_S = 0.25
STALL_S = 1.0
CLOSE_S = 2.0
READ_SIZE = 64 * 1024


class _Loop(asyncio.SelectorEventLoop):
    """asyncio reads a socket with ``recv(256 KiB)``: a 256 KiB buffer allocated and freed per
    read, above glibc's mmap threshold, so an mmap and munmap per reply (~10% of the loop's CPU
    per call on loopback). A reply of the OpenAI API is a few KB: 64 KiB reads come from the heap."""

    def _make_socket_transport(self, *args: Any, **kwargs: Any) -> Any:
        transport = super()._make_socket_transport(*args, **kwargs)  # type: ignore[misc]
        transport.max_size = READ_SIZE
        return transport


class Submission:
    """One coroutine submitted from another thread: ``outcome(timeout)`` or ``cancel()``.

    The coroutine's outcome is boxed, never raised into the loop: ``("value", v)`` or
    ``("error", exc)`` for *anything* it raised (``SystemExit`` and ``KeyboardInterrupt``
    would otherwise stop the loop itself, and a ``CancelledError`` nobody asked for is
    the plugin's). ``started`` says whether the loop has begun it; a submission cancelled
    before that is never started.
    """

    __slots__ = ("_loop", "_function", "_name", "_done", "_outcome", "_abandoned", "_task", "started")

    def __init__(self, loop: asyncio.AbstractEventLoop, function: Callable[[], Awaitable[Any]], name: str) -> None:
        self._loop = loop
        self._function = function
        self._name = name
        # A bare lock, held until the outcome is in: the cheapest hand-back between threads
        # (a concurrent Future's Condition cost the loop ~0.2 ms per reply at 128 in flight).
        self._done = threading.Lock()
        self._done.acquire()
        self._outcome: tuple[str, Any] | None = None
        self._abandoned = False
        self._task: asyncio.Task[None] | None = None
        self.started = False

    def _start(self) -> None:
        if self._abandoned:  # the caller gave up before the loop got to it: never sent
            return
        self.started = True
        self._task = self._loop.create_task(self._guarded(), name=self._name)

    async def _guarded(self) -> None:
        try:
            outcome: tuple[str, Any] = ("value", await self._function())
        except asyncio.CancelledError as exc:
            task = asyncio.current_task()
            if task is not None and task.cancelling():
                raise  # our cancel(): the caller is no longer waiting
            outcome = ("error", exc)
        except BaseException as exc:  # noqa: BLE001 - containment is the point
            outcome = ("error", exc)
        self._outcome = outcome
        self._done.release()

    def outcome(self, timeout: float) -> tuple[str, Any]:
        """The boxed outcome; ``TimeoutError`` when it is not there within ``timeout`` seconds."""
        if not self._done.acquire(timeout=min(max(0.0, timeout), threading.TIMEOUT_MAX)):
            raise TimeoutError
        assert self._outcome is not None
        return self._outcome

    def cancel(self) -> None:
        """Stop waiting and cancel the coroutine (on the loop, in order after its start)."""
        self._abandoned = True
        self._loop.call_soon_threadsafe(self._cancel_task)

    def _cancel_task(self) -> None:
        if self._task is not None:
            self._task.cancel()


class SharedLoop:
    """The process's event loop on a daemon thread, with a heartbeat and per-loop resources."""

    def __init__(self) -> None:
        self.loop = _Loop()
        self.beat = time.monotonic()
        self.escaped: list[str] = []  # what plugin callbacks raised past asyncio (SystemExit, KeyboardInterrupt)
        self._resources: dict[str, tuple[Any, Callable[[Any], Awaitable[Any]]]] = {}
        self._queued: collections.deque[Submission] = collections.deque()
        self._wake_sent = False
        started = threading.Event()
        self.thread = threading.Thread(target=self._run, args=(started,), daemon=True, name="budgetbench-event-loop")
        self.thread.start()
        started.wait()

    def _run(self, started: threading.Event) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.call_soon(started.set)
        self.loop.call_soon(self._beat)
        while True:
            try:
                self.loop.run_forever()
                return  # close() stopped it
            except BaseException as exc:  # noqa: BLE001 - SystemExit from a plugin's callback: the loop goes on
                self.escaped.append(f"{type(exc).__name__} escaped a callback on the event loop")

    def _beat(self) -> None:
        self.beat = time.monotonic()
        self.loop.call_later(BEAT_S, self._beat)

    def submit(self, function: Callable[[], Awaitable[Any]], name: str) -> Submission:
        """Run ``function()`` (core code that awaits the plugin) on the loop, from any other thread.

        Submissions queue up and the loop is woken once per batch, not once each: every
        wake-up is a write to the loop's self-pipe, a read on the loop, and a trip through
        the GIL for both threads."""
        submission = Submission(self.loop, function, name)
        self._queued.append(submission)
        if not self._wake_sent:
            self._wake_sent = True
            self.loop.call_soon_threadsafe(self._start_queued)
        return submission

    def _start_queued(self) -> None:
        self._wake_sent = False  # first: a submission queued from now on sends its own wake-up
        queued = self._queued
        while queued:
            queued.popleft()._start()

    def run(self, awaitable: Awaitable[T], timeout: float | None = None) -> T:
        """Await ``awaitable`` on the loop and return its result (for a backend's sync ``complete``)."""
        if threading.current_thread() is self.thread:
            raise RuntimeError("a blocking call on the event loop's own thread would never return")

        async def wait() -> T:
            return await awaitable

        future = asyncio.run_coroutine_threadsafe(wait(), self.loop)
        try:
            return future.result(timeout)
        except TimeoutError:
            future.cancel()
            raise

    def stall(self) -> str | None:
        """Why the loop is not running, when it has not beaten for ``STALL_S``; else None."""
        silent = time.monotonic() - self.beat
        if silent < STALL_S:
            return None
        task = asyncio.current_task(self.loop)
        if task is None:  # no call's coroutine is running: a plugin's callback, or a starved process
            return (
                f"the shared event loop has not run for {silent:.1f} s and no model call holds it "
                f"(a plugin's callback that blocks, or a machine too busy to run it)"
            )
        return (
            f"the shared event loop has not run for {silent:.1f} s: {task.get_name()} blocks it "
            f"(an async backend must await, never block)"
        )

    def resource(self, key: str, factory: Callable[[], T], close: Callable[[T], Awaitable[Any]]) -> T:
        """A per-loop object (an HTTP session), made on first use on the loop thread, closed at exit."""
        entry = self._resources.get(key)
        if entry is None:
            entry = self._resources[key] = (factory(), close)
        return entry[0]

    def close(self) -> None:
        """Close the resources (bounded by ``CLOSE_S``, a stalled loop cannot hold up the exit)."""

        async def close_all() -> None:
            entries, self._resources = list(self._resources.values()), {}
            for value, close in entries:
                try:
                    await close(value)
                except Exception:  # noqa: BLE001 - at exit, a resource that fails to close is let go
                    pass

        if self._resources:
            future = asyncio.run_coroutine_threadsafe(close_all(), self.loop)
            try:
                future.result(CLOSE_S)
            except (TimeoutError, concurrent.futures.CancelledError):
                pass
        self.loop.call_soon_threadsafe(self.loop.stop)


_shared: SharedLoop | None = None
_lock = threading.Lock()


def shared_loop() -> SharedLoop:
    """The process's loop, started on first use."""
    global _shared
    shared = _shared
    if shared is None:
        with _lock:
            if _shared is None:
                _shared = SharedLoop()
            shared = _shared
    return shared


@atexit.register
def _close_at_exit() -> None:
    if _shared is not None:
        _shared.close()


def _forget_after_fork() -> None:
    """A forked child has no loop thread: it starts its own on first use."""
    global _shared, _lock
    _shared, _lock = None, threading.Lock()


os.register_at_fork(after_in_child=_forget_after_fork)
