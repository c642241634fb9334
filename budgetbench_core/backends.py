"""The Backend contract: send messages to a model, return text and what the server reported."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, ClassVar

from .messages import Message


class TransportError(RuntimeError):
    """A failure worth retrying: connection refused or reset, timeout, 429, 5xx.

    ``retry_after`` carries the server's Retry-After in seconds when it sent one.
    """

    def __init__(self, message: str, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class ResponseError(RuntimeError):
    """The server answered, but not with a usable completion (malformed, empty). Not retried."""


class FatalError(ResponseError):
    """Every later call would fail the same way: the key is refused (401), the provider is
    unknown, the server has no such model (404). The run stops after the first one."""


@dataclass(frozen=True)
class GenerationParams:
    """Part of the response-cache key, with the model and the messages. ``tools`` is the JSON
    array of tool schemas (OpenAI format) sent with the messages, or None: the served template
    renders them into the prompt, so they are counted, cached and audited with it."""

    max_tokens: int
    temperature: float = 0.0
    seed: int | None = None
    tools: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class Completion:
    """A model reply. ``prompt_tokens`` is the server's own count (None when not given).
    ``tool_calls`` are the structured tool calls of a call sent with ``tools``, each
    ``{"id", "name", "arguments"}`` (arguments as the JSON text the server returned)."""

    text: str
    prompt_tokens: int | None
    completion_tokens: int | None
    latency_s: float
    cached_tokens: int | None = None
    cost: float | None = None
    model: str | None = None
    tool_calls: list[dict[str, Any]] | None = None


@dataclass
class BackendCheck:
    """What a backend's ``preflight`` learnt before a run: the model's input context where it
    could learn it (and where from), a server's hard limit on prompt plus output, one line per
    problem naming the fix, and what passed."""

    context_tokens: int | None = None
    context_source: str = ""
    total_limit: int | None = None
    problems: list[str] = field(default_factory=list)
    passed: list[str] = field(default_factory=list)


class Backend(ABC):
    """Base class for model backends. Subclasses set ``name``.

    ``model`` is the user's model string; ``api_base`` an optional server address.
    ``start``/``stop`` bracket a run (the embedded backend starts its server there).
    ``default_tokenizer`` names the tokenizer spec that counts exactly for this model.

    ``complete`` is required. A backend that also defines ``acomplete`` is awaited on the
    harness's one shared event loop instead (no thread per call in flight); ``async_calls``
    says, per instance, which of the two the harness uses (``AsyncBackend`` is the base for
    one that is async only).

    What the harness asks of a backend rather than assuming from its name: ``preflight`` (what
    it can check before a run, its context window), ``counts_on_own_server`` (its default
    tokenizer needs its own server, started with the run), ``native_tools`` (it sends
    ``GenerationParams.tools`` to the model and returns ``Completion.tool_calls``; a task that
    needs native tool calls is refused on any other backend), ``total_deadline_s`` (the deadline
    of one attempt) and ``activity`` (what a call in flight is doing, for the Ctrl-C message).
    Constructor options the runner passes: ``api_base``, ``timeout_s``, ``max_context`` (the
    largest budget plus output), ``max_concurrency`` and ``server_prompt_cache``; accept the
    ones you do not use in ``**options``.
    """

    name: ClassVar[str]
    description: ClassVar[str] = ""
    counts_on_own_server: ClassVar[bool] = False
    native_tools: ClassVar[bool] = False

    def __init__(self, model: str, api_base: str | None = None, timeout_s: float = 120.0, **options: Any) -> None:
        self.model = model
        self.api_base = api_base
        self.timeout_s = timeout_s
        self.options = options

    def start(self) -> None:  # noqa: B027 - optional: most backends have nothing to start
        """Prepare (start a server, open connections). Called once before the first call."""

    def stop(self) -> None:  # noqa: B027 - optional, like start
        """Release what ``start`` acquired."""

    def default_tokenizer(self) -> str | None:
        """Tokenizer spec to use when the user gives none; None means the user must choose."""
        return None

    def cache_identity(self) -> tuple[str, str | None]:
        """(model, api base) for the response-cache key: what makes two replies comparable."""
        return self.model, self.api_base

    def describe(self) -> dict[str, Any]:
        """Recorded in the manifest. Never include secrets."""
        return {"backend": self.name, "model": self.model, "api_base": self.api_base}

    @abstractmethod
    def complete(self, messages: Sequence[Message], params: GenerationParams) -> Completion:
        """One chat completion. Raise TransportError for retryable failures."""

    async def acomplete(self, messages: Sequence[Message], params: GenerationParams) -> Completion:
        """Optional: ``complete`` as a coroutine, run on the shared event loop. It must await,
        never block: a blocked loop stops every call of the process until the deadlines pass."""
        raise NotImplementedError(f"{type(self).__name__} has no acomplete")

    def preflight(self, flag: str, full: bool, judge: bool = False, prompts_only: bool = False) -> BackendCheck:
        """Checks before the run (``flag`` names the option, ``--model`` or ``--judge-model``):
        ``full`` False (``--no-preflight``) allows no network; a ``judge`` is not contacted; a
        ``prompts_only`` run calls no model. Default: nothing known, nothing wrong."""
        return BackendCheck()

    def total_deadline_s(self, configured: float) -> float | None:
        """The deadline of one attempt, given ``--timeout``; None: none (the cell's deadline
        still applies), for a local server that is slow but alive. Default: ``configured``."""
        return configured

    def activity(self) -> str | None:
        """What the calls in flight are doing (prompt tokens processed...), or None."""
        return None

    def async_calls(self) -> bool:
        """Whether the harness awaits ``acomplete`` rather than calling ``complete`` on a
        thread: True when a subclass defines ``acomplete``. Asked once per run."""
        return type(self).acomplete is not Backend.acomplete


class AsyncBackend(Backend):
    """A backend whose calls are coroutines: implement ``acomplete`` (it must await, never
    block); ``complete``, for callers outside a run, runs it on the harness's shared event
    loop. Open per-loop resources (an aiohttp session) lazily with ``loop_resource``."""

    @abstractmethod
    async def acomplete(self, messages: Sequence[Message], params: GenerationParams) -> Completion:
        """One chat completion, awaited on the shared loop."""

    def complete(self, messages: Sequence[Message], params: GenerationParams) -> Completion:
        from .event_loop import shared_loop

        return shared_loop().run(self.acomplete(messages, params))

    def loop_resource(self, key: str, factory: Any, close: Any) -> Any:
        """The loop's resource ``key``, made by ``factory()`` on first use and closed with the
        coroutine ``close(resource)`` at exit."""
        from .event_loop import shared_loop

        return shared_loop().resource(key, factory, close)
