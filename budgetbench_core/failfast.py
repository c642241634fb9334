"""Stop a run on a failure that every later call would repeat, instead of erroring every cell.

- A refused key, an unknown provider or model (the backend raises ``FatalError``): the run
  stops after the first such call.
- The same transport error (same exception and status: connection refused, timeout, 5xx)
  on ``max_consecutive`` calls in a row, retries included: the run stops with that cause.
  Any successful call resets the streak.

Until one call has succeeded, calls go out one at a time, so a key the server refuses costs
one call, not one per worker. Once stopped, no further call is sent (it fails at once as
"not sent"), the runner takes no new cell, and what finished stays on disk, so the same
command resumes after the fix.
"""

from __future__ import annotations

import contextlib
import re
import threading
from collections.abc import Callable, Iterator

DEFAULT_MAX_CONSECUTIVE = 10
_PROVEN: contextlib.nullcontext[None] = contextlib.nullcontext()


def signature(message: str) -> str:
    """What makes two transport errors "the same": the exception name and status at the head
    of the message (``APIConnectionError (status None)``), without addresses or timings."""
    head = message.split(":", 1)[0]
    return re.sub(r"\d+(\.\d+)? ?s\b", "<t>", head).strip()


def hint(message: str) -> str:
    """What to change for the common transport errors."""
    lowered = message.lower()
    if "deadline" in lowered or "timeout" in lowered or "timed out" in lowered:
        return " (a slow or overloaded server: raise --timeout or lower --max-concurrency)"
    if "connect" in lowered or "refused" in lowered:
        return " (is the server running? check --api-base)"
    if "429" in lowered or "rate" in lowered:
        return " (rate limited: lower --max-concurrency)"
    return ""


class FailFast:
    """Shared by every model call of a run (thread-safe)."""

    def __init__(self, max_consecutive: int = DEFAULT_MAX_CONSECUTIVE, on_stop: Callable[[], None] | None = None):
        self.max_consecutive = max(1, int(max_consecutive))
        self.on_stop = on_stop
        self.cause: str | None = None
        self.fatal = False
        self._lock = threading.Lock()
        self._streak = 0
        self._last: str | None = None
        self._proven = False  # a call has succeeded: calls may go out in parallel
        self._probe_lock = threading.Lock()

    @property
    def stopped(self) -> bool:
        return self.cause is not None

    def _stop(self, cause: str, fatal: bool) -> None:
        with self._lock:
            if self.cause is not None:
                return
            self.cause, self.fatal = cause, fatal
        if self.on_stop:
            self.on_stop()

    def succeeded(self) -> None:
        if self._proven and not self._streak:  # the common case: nothing to reset, no lock
            return
        with self._lock:
            self._streak, self._last = 0, None
            self._proven = True

    def probe(self) -> contextlib.AbstractContextManager[None]:
        """Around each attempt: one at a time until the first success. A call that waited
        while the first one succeeded goes out at once: without the second check every
        worker already waiting went one at a time (32 workers x 200 ms serialised).
        Once a call has succeeded, a shared no-op (no generator per call)."""
        if self._proven:
            return _PROVEN
        return self._first_calls()

    @contextlib.contextmanager
    def _first_calls(self) -> Iterator[None]:
        with self._probe_lock:
            if not self._proven:
                yield
                return
        yield

    def transport_failed(self, message: str) -> None:
        with self._lock:
            same = signature(message)
            self._streak = self._streak + 1 if same == self._last else 1
            self._last = same
            reached = self._streak >= self.max_consecutive
        if reached:
            self._stop(
                f"the same transport error on {self.max_consecutive} calls in a row: {message}{hint(message)}",
                fatal=False,
            )

    def refused(self, message: str) -> None:
        self._stop(f"the server refused the run: {message}", fatal=True)
