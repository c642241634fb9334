"""Every model call of a run goes through here: cache, connection limit, retries, timing.

Only transport failures (connection errors, timeouts, 429 and 5xx) are retried, with
exponential back-off that honours Retry-After. Anything else propagates and becomes an
``error`` row: a failed call is never turned into a prediction.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass

from .backends import Backend, Completion, GenerationParams, TransportError
from .cache import ResponseCache, cache_key
from .messages import Message

MAX_BACKOFF_S = 60.0


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


class ModelCaller:
    """Calls one backend with a response cache, a connection limit and bounded retries."""

    def __init__(
        self,
        backend: Backend,
        cache: ResponseCache | None,
        max_connections: int,
        retries: int = 4,
        backoff_s: float = 0.5,
    ) -> None:
        self.backend = backend
        self.cache = cache
        self.retries = retries
        self.backoff_s = backoff_s
        self._slots = threading.BoundedSemaphore(max(1, max_connections))
        self._count_lock = threading.Lock()
        self.calls_made = 0
        self.rate_limited = 0

    def _count(self, rate_limited: bool = False) -> None:
        with self._count_lock:
            self.calls_made += 1
            self.rate_limited += int(rate_limited)

    def call(self, messages: Sequence[Message], params: GenerationParams) -> CallOutcome:
        key = cache_key(*self.backend.cache_identity(), messages, params)
        if self.cache is not None:
            hit = self.cache.get(key)
            if hit is not None:
                return CallOutcome(hit, 0, True)
        attempts = 0
        while True:
            attempts += 1
            try:
                with self._slots:
                    completion = self.backend.complete(messages, params)
                self._count()
            except TransportError as exc:
                self._count(rate_limited="429" in str(exc))
                if attempts > self.retries:
                    raise CallFailed(f"transport error after {attempts} attempts: {exc}", attempts) from exc
                delay = self.backoff_s * 2 ** (attempts - 1) * (1 + random.random() / 2)
                if exc.retry_after is not None:
                    delay = max(delay, exc.retry_after)
                time.sleep(min(delay, MAX_BACKOFF_S))
                continue
            except Exception as exc:  # the server answered unusably (ResponseError) or the backend broke
                self._count()
                raise CallFailed(f"{type(exc).__name__} (not retried): {exc}", attempts) from exc
            if self.cache is not None:
                self.cache.put(key, completion)
            return CallOutcome(completion, attempts, False)
