"""The plugin sandbox: nothing a plugin returns or raises is trusted.

Three tools, used by the runner for every plugin call and by the conformance kit:

- ``contained(phase, plugin, function, deadline)`` runs plugin code on a thread of its own
  and turns *any* ``BaseException`` (``SystemExit`` and ``KeyboardInterrupt`` raised by a
  plugin included) or a missed deadline into a ``PluginFailure`` naming the plugin, its
  distribution and the phase. A real Ctrl+C reaches the main thread, never a plugin thread,
  so it still stops the run.
- ``canonical_prompt(value)`` rebuilds whatever ``apply`` returned as plain core
  ``Message(role, content)`` values: exact ``str`` content, a role from ``ROLES``, metadata
  copied through ``json_safe`` (what cannot be copied is dropped and listed). That object is
  what is counted, hashed, audited, cached and sent; the strategy's objects never leave here.
- ``validate_prompt(item, prompt)`` checks the canonical prompt against the item the runner
  keeps for itself (system prompt first, query last, both unchanged).
"""

from __future__ import annotations

import _thread
import hmac
import math
import os
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from itertools import chain, repeat
from operator import is_
from queue import SimpleQueue
from types import MappingProxyType
from typing import Any, TypeVar

from .evidence import EVIDENCE_ID_KEY, EVIDENCE_KEY
from .messages import ROLES, Item, Message

T = TypeVar("T")

MAX_DEPTH = 32
MAX_NODES = 100_000


class PromptError(ValueError):
    """``apply`` returned something that is not an acceptable prompt; the message says why."""


HISTORY_MUTATED = "the strategy mutated the history it was given"  # the cause a run and the kit both record


@dataclass(frozen=True)
class PluginRef:
    """Who is at fault when plugin code fails: kind, registered name and distribution."""

    kind: str
    name: str
    distribution: str | None = None

    def describe(self) -> str:
        return f"{self.kind} {self.name!r}" + (f" ({self.distribution})" if self.distribution else "")


class PluginFailure(Exception):
    """Plugin code raised (anything) or missed its deadline. ``cause`` is ready for an error row."""

    def __init__(
        self, phase: str, plugin: PluginRef, cause: str, timed_out: bool = False, original: BaseException | None = None
    ) -> None:
        super().__init__(cause)
        self.phase = phase
        self.plugin = plugin
        self.cause = cause
        self.timed_out = timed_out
        self.original = original


class PhaseError(Exception):
    """Raised by core wrappers (the memory-system adapter) to say which phase of a plugin failed."""

    def __init__(self, phase: str, original: BaseException) -> None:
        super().__init__(describe_exception(original))
        self.phase = phase
        self.original = original


class Deadline:
    """An absolute point in time; ``remaining()`` never goes below zero."""

    def __init__(self, seconds: float) -> None:
        self.seconds = float(seconds)
        self.at = time.monotonic() + self.seconds

    def remaining(self) -> float:
        return max(0.0, self.at - time.monotonic())

    def expired(self) -> bool:
        return time.monotonic() >= self.at

    @classmethod
    def within(cls, seconds: float, outer: Deadline | None) -> Deadline:
        """The earlier of ``seconds`` from now and ``outer``."""
        inner = cls(seconds)
        if outer is not None and outer.at < inner.at:
            inner.at, inner.seconds = outer.at, outer.remaining()
        return inner


class PluginRaised(RuntimeError):
    """An exception raised by plugin code in its worker process, as the worker described it
    (``Type: message``): the harness never unpickles a plugin's exception object."""

    def __init__(self, description: str, traceback: str = "") -> None:
        super().__init__(description)
        self.description = description
        self.plugin_traceback = traceback


def describe_exception(exc: BaseException) -> str:
    """``Type: message`` without running plugin code that could raise or hang (``__str__``)."""
    if type(exc) is PluginRaised:
        return exc.description
    name = type(exc).__name__
    try:
        args = exc.args if isinstance(exc.args, tuple) else ()
        text = ", ".join(a if type(a) is str else _plain_repr(a) for a in args)
    except BaseException:  # noqa: BLE001 - a hostile exception object
        text = "<unprintable>"
    return f"{name}: {text}" if text else name


def _plain_repr(value: Any) -> str:
    if type(value) in (int, float, bool, type(None)):
        return repr(value)
    return f"<{type(value).__name__}>"


class _Worker:
    """A daemon thread that runs contained calls one after another.

    Starting a thread per call cost ~0.2 ms of CPU and a scheduling round trip per phase of
    every cell; a worker goes back to the idle pool when its call returns. A call that
    misses its deadline keeps its worker (Python cannot kill it), exactly as a thread of
    its own would be left behind; the worker rejoins the pool if the call ever returns.
    The handoff is a C-level queue and a plain lock (no ``threading.Event``, whose Python
    condition variable cost several times more per call).
    """

    _idle: list[_Worker] = []
    _lock = threading.Lock()
    MAX_IDLE = 256

    def __init__(self) -> None:
        self._tasks: SimpleQueue[tuple[Callable[[], Any], list[Any], Any, str]] = SimpleQueue()
        self._thread = threading.Thread(target=self._loop, daemon=True, name="plugin")
        self._thread.start()

    @classmethod
    def run(cls, function: Callable[[], Any], phase: str) -> tuple[list[Any], Any]:
        """Hand ``function`` to an idle worker; returns the box its outcome lands in (``[True,
        value]`` or ``[False, exception]``) and a lock released once it is there."""
        with cls._lock:
            worker = cls._idle.pop() if cls._idle else None
        worker = worker or cls()
        box: list[Any] = []
        done = _thread.allocate_lock()
        done.acquire()
        worker._tasks.put((function, box, done, phase))
        return box, done

    def _loop(self) -> None:
        get = self._tasks.get
        while True:
            function, box, done, phase = get()
            self._thread.name = f"plugin-{phase}"
            try:
                box.extend((True, function()))
            except BaseException as exc:  # noqa: BLE001 - containment is the point
                box.extend((False, exc))
            del function
            with self._lock:
                idle = len(self._idle) < self.MAX_IDLE
                if idle:
                    self._idle.append(self)
            done.release()
            if not idle:
                return

    @classmethod
    def _forget_after_fork(cls) -> None:
        """A forked child has none of its parent's threads: start from an empty pool."""
        cls._idle = []
        cls._lock = threading.Lock()


os.register_at_fork(after_in_child=_Worker._forget_after_fork)


def contained(phase: str, plugin: PluginRef, function: Callable[[], T], deadline: Deadline) -> T:
    """``function()`` on a daemon worker thread, waited for until ``deadline``.

    Returns its value or raises ``PluginFailure``. A thread that misses the deadline is
    left behind (Python cannot kill it): the caller must discard the instance it used and
    close whatever channel it was given.
    """
    box, done = _Worker.run(function, phase)
    if not done.acquire(timeout=deadline.remaining()):
        raise PluginFailure(
            phase, plugin, f"{plugin.describe()} did not return within {deadline.seconds:g} s ({phase})", timed_out=True
        )
    returned, value = box
    if not returned:
        error = value
        if isinstance(error, PluginFailure):
            raise error
        if isinstance(error, PhaseError):
            phase, error = error.phase, error.original
        raise PluginFailure(
            phase, plugin, f"{plugin.describe()} failed in {phase}: {describe_exception(error)}", original=error
        )
    return value


@dataclass(frozen=True)
class Stage:
    """One plugin call of a ``contained_stages`` chain. ``function`` receives the previous
    stage's value (the first stage receives None); ``deadline`` is a fixed ``Deadline`` or the
    seconds the stage may take from when it starts."""

    phase: str
    plugin: PluginRef
    function: Callable[[Any], Any]
    deadline: Deadline | float


class StageFailure(Exception):
    """Stage ``stage`` of a chain failed; ``failure`` says how, exactly as ``contained`` would."""

    def __init__(self, stage: int, failure: PluginFailure) -> None:
        super().__init__(failure.cause)
        self.stage = stage
        self.failure = failure


def contained_stages(*stages: Stage) -> Any:
    """The stages' calls one after another on one worker thread, each bound by its own
    deadline and blamed on its own plugin: ``contained`` for each, with one handoff instead of
    one per call (under load every handoff is two waits for the interpreter lock). Returns the
    last stage's value or raises ``StageFailure``; which stage is running is recorded by the
    chain itself, never by the plugin."""
    at: list[Any] = [0, time.monotonic()]  # the running stage and when it started

    def chain() -> Any:
        value = None
        for index, stage in enumerate(stages):
            if index:
                at[1], at[0] = time.monotonic(), index  # the start first: read after the index
            try:
                value = stage.function(value)
            except BaseException as exc:  # noqa: BLE001 - containment is the point
                raise _Failed(index, exc) from None
        return value

    box, done = _Worker.run(chain, stages[0].phase)
    while True:
        index, started = at
        stage = stages[index]
        limit = stage.deadline if isinstance(stage.deadline, Deadline) else None
        remaining = limit.remaining() if limit else max(0.0, started + float(stage.deadline) - time.monotonic())
        if done.acquire(timeout=remaining):
            break
        if at[0] == index:
            seconds = limit.seconds if limit else float(stage.deadline)
            failure = PluginFailure(
                stage.phase,
                stage.plugin,
                f"{stage.plugin.describe()} did not return within {seconds:g} s ({stage.phase})",
                timed_out=True,
            )
            raise StageFailure(index, failure)
    returned, value = box
    if returned:
        return value
    index, error = value.args if isinstance(value, _Failed) else (at[0], value)
    stage = stages[index]
    if isinstance(error, PluginFailure):
        raise StageFailure(index, error)
    phase = stage.phase
    if isinstance(error, PhaseError):
        phase, error = error.phase, error.original
    raise StageFailure(
        index,
        PluginFailure(
            phase,
            stage.plugin,
            f"{stage.plugin.describe()} failed in {phase}: {describe_exception(error)}",
            original=error,
        ),
    )


class _Failed(Exception):
    """A stage's exception with the stage's index, as the chain caught it."""


# ----------------------------------------------------------------- JSON-safe copies


def json_safe(value: Any, dropped: list[str] | None = None, path: str = "$") -> Any:
    """A copy of ``value`` made only of exact dict/list/str/int/float/bool/None.

    Anything else (objects, cycles, NaN, non-string keys, too deep or too large) is left
    out and its path appended to ``dropped``; this never raises on hostile input types, and
    never calls a plugin's ``__str__``, ``__repr__`` or ``__eq__``.
    """
    dropped = dropped if dropped is not None else []
    budget = [MAX_NODES]
    return _copy(value, dropped, path, set(), 0, budget)


_MISSING = object()


def _copy(value: Any, dropped: list[str], path: str, active: set[int], depth: int, budget: list[int]) -> Any:
    budget[0] -= 1
    if budget[0] < 0 or depth > MAX_DEPTH:
        dropped.append(path)
        return _MISSING
    kind = type(value)
    if value is None or kind is bool or kind is int:
        return value
    if kind is float:
        if math.isfinite(value):
            return value
        dropped.append(path)
        return _MISSING
    if isinstance(value, str):
        return str.__str__(value)  # an exact str, whatever the subclass overrides
    if isinstance(value, int) and not isinstance(value, bool):
        return int.__index__(value)
    if isinstance(value, (dict, Mapping, list, tuple)):
        if id(value) in active:
            dropped.append(path + " (cycle)")
            return _MISSING
        active.add(id(value))
        try:
            if isinstance(value, dict):
                pairs = list(dict.items(value))
            elif isinstance(value, (list, tuple)):
                pairs = list(enumerate(list.__iter__(value) if isinstance(value, list) else tuple.__iter__(value)))
            else:
                pairs = list(value.items())  # a mapping proxy over one of our dicts
            out: Any = {} if isinstance(value, (dict, Mapping)) else []
            for key, item in pairs:
                if isinstance(out, dict):
                    if not isinstance(key, str):
                        dropped.append(f"{path}[<{type(key).__name__} key>]")
                        continue
                    key = str.__str__(key)
                    copied = _copy(item, dropped, f"{path}.{key}", active, depth + 1, budget)
                    if copied is not _MISSING:
                        out[key] = copied
                else:
                    copied = _copy(item, dropped, f"{path}[{key}]", active, depth + 1, budget)
                    if copied is not _MISSING:
                        out.append(copied)
            return out
        finally:
            active.discard(id(value))
    dropped.append(f"{path} (<{kind.__name__}>)")
    return _MISSING


def json_safe_or_empty(value: Any, dropped: list[str] | None = None) -> Any:
    copied = json_safe(value, dropped)
    return None if copied is _MISSING else copied


# ----------------------------------------------------------------- the canonical prompt


def canonical_message(value: Any, where: str, dropped: list[str] | None = None) -> Message:
    """A plain core ``Message`` rebuilt from the fields stored on ``value`` (a Message or a
    subclass); properties and overridden methods of a subclass are never consulted."""
    return _message(*_canonical_fields(value, where, dropped))


def _canonical_fields(value: Any, where: str, dropped: list[str] | None) -> tuple[str, str, dict[str, Any]]:
    """Role, content and a metadata dict of our own, read as ``canonical_message`` reads them."""
    if not isinstance(value, Message):
        raise PromptError(f"{where} is a {type(value).__name__}, not a Message")
    try:
        fields = object.__getattribute__(value, "__dict__")
    except AttributeError:
        raise PromptError(f"{where} has no stored fields") from None
    if type(fields) is not dict:
        raise PromptError(f"{where} has no plain stored fields")
    role, content, metadata = fields.get("role"), fields.get("content"), fields.get("metadata")
    if not isinstance(role, str) or not isinstance(content, str):
        raise PromptError(
            f"{where}: role and content must be str, got {type(role).__name__} and {type(content).__name__}"
        )
    role, content = str.__str__(role), str.__str__(content)
    if role not in ROLES:
        raise PromptError(f"{where} has unknown role {role!r}; allowed: {list(ROLES)}")
    if not content.isascii() and not _utf8(content):
        try:
            content.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise PromptError(f"{where}.content is not valid UTF-8 text (character {exc.start})") from None
    meta = _flat_copy(metadata)
    if meta is None:
        lost: list[str] = []
        meta = json_safe_or_empty(metadata, lost) if metadata is not None else {}
        if not isinstance(meta, dict):
            meta = {}
        if dropped is not None:
            dropped.extend(f"{where}.metadata{p[1:]}" for p in lost)
    return role, content, meta


_FLAT_TYPES = frozenset({str, int, bool, type(None)})
_STR = frozenset({str})
_FLAT_OR_FLOAT = _FLAT_TYPES | {float}


def _utf8(text: str) -> bool:
    """No lone surrogates: the text can be sent as UTF-8."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _message(role: str, content: str, metadata: dict[str, Any]) -> Message:
    """A core Message from values already checked (exact str role and content, a plain
    metadata dict of our own), without ``Message.__init__``'s checks and copy."""
    message = object.__new__(Message)
    fields = object.__getattribute__(message, "__dict__")
    fields["role"], fields["content"], fields["metadata"] = role, content, MappingProxyType(metadata)
    return message


def _flat_copy(metadata: Any) -> dict[str, Any] | None:
    """The common case of ``json_safe`` at C speed: a dict (or a proxy over one) of exact str
    keys and exact str/int/bool/None/finite float values, copied; None for anything else."""
    if type(metadata) is not dict and type(metadata) is not MappingProxyType:
        return None
    out = dict(metadata)
    if not _STR.issuperset(map(type, out)):
        return None
    if not _FLAT_TYPES.issuperset(map(type, out.values())):
        if not _FLAT_OR_FLOAT.issuperset(map(type, out.values())):
            return None
        if not all(math.isfinite(v) for v in out.values() if type(v) is float):
            return None
    return out


def canonical_prompt(value: Any, dropped: list[str] | None = None) -> tuple[Message, ...]:
    """``value`` (what ``apply`` returned) as a tuple of plain core messages, or PromptError."""
    if not isinstance(value, list):
        raise PromptError(f"apply must return list[Message], got {type(value).__name__}")
    items = list.__iter__(value)
    messages = []
    roles = set()
    for index, entry in enumerate(items):
        if not isinstance(entry, Message):
            kinds = sorted({type(m).__name__ for m in list.__iter__(value) if not isinstance(m, Message)})
            raise PromptError(f"apply must return list[Message], got a list with {kinds}")
        try:
            fields = object.__getattribute__(entry, "__dict__")
        except AttributeError:
            fields = None
        role = dict.get(fields, "role") if type(fields) is dict else None
        if type(role) is str and role in ROLES:  # the usual message: plain fields, flat metadata
            content = dict.get(fields, "content")
            if type(content) is str and (content.isascii() or _utf8(content)):
                meta = _flat_copy(dict.get(fields, "metadata", {}))
                if meta is not None:
                    messages.append(_message(role, content, meta))
                    continue
        if isinstance(role, str) and str.__str__(role) not in ROLES:
            roles.add(str.__str__(role))
            continue
        messages.append(canonical_message(entry, f"prompt[{index}]", dropped))
    if roles:
        raise PromptError(f"prompt has messages with unknown roles {sorted(roles)}; allowed: {list(ROLES)}")
    return tuple(messages)


def same_message(a: Message, b: Message) -> bool:
    return a.role == b.role and a.content == b.content


def validate_prompt(item: Item, prompt: tuple[Message, ...]) -> None:
    """The canonical prompt starts with the item's system prompt and ends with its query, unchanged."""
    if not prompt or not same_message(prompt[-1], item.query):
        raise PromptError("prompt does not end with the item's query unchanged")
    if item.system is not None and not same_message(prompt[0], item.system):
        raise PromptError("prompt does not start with the item's system prompt unchanged")


_FLAT = frozenset({str, int, float, bool, type(None)})


def _metadata_signature(metadata: Any) -> Any:
    """Flat metadata of exact plain types (the usual session id and date) is compared as its
    items; anything else by the text of its JSON-safe copy, which cost ~6 ms per cell on a
    500-message history when done for every message."""
    if type(metadata) in (dict, MappingProxyType):
        items = tuple(metadata.items())
        if all(type(k) is str and type(v) in _FLAT for k, v in items):
            return items
    return repr(json_safe_or_empty(metadata))


def fingerprint(messages: Any) -> tuple:
    """What a strategy must not change: role, content and JSON-safe metadata of each message.
    Read from stored fields like ``canonical_message`` (a hostile object cannot lie about it)."""
    out = []
    for entry in tuple(messages):
        fields = object.__getattribute__(entry, "__dict__") if isinstance(entry, Message) else {}
        role, content = fields.get("role"), fields.get("content")
        out.append(
            (
                type(entry) is Message,
                type(role) is str and role,
                type(content) is str and content,
                _metadata_signature(fields.get("metadata")),
            )
        )
    return tuple(out)


GRADING_KEYS = frozenset({EVIDENCE_KEY, EVIDENCE_ID_KEY})
"""Message metadata no strategy ever sees, whatever the task: the evidence marks."""


def opaque_id(key: bytes, item_id: str) -> str:
    """The id a strategy's view carries instead of the item's: a dataset's ids can carry its
    labels (LongMemEval's ``_abs`` suffix marks its abstention questions, ``gpt4_`` mostly its
    temporal-reasoning ones). Keyed with the run's secret, so the same within a run and its
    resumptions (a memory system's saved retrieval, a strategy's per-item state) and not
    computable from the public ids outside it."""
    if not key:
        raise ValueError("an opaque item id needs the run's secret key")  # a keyless HMAC anyone can recompute
    return "item-" + hmac.new(key, item_id.encode("utf-8", "surrogatepass"), "sha256").hexdigest()[:16]


class SealedView:
    """The item as a strategy in a worker process sees it, as the harness keeps it: no grading
    key and an opaque id, as in ``PrivateView``, but made from the runner's canonical item
    (``engine.intake.canonical_item``) without copies. Only its frame crosses to the worker
    (``host.wire``) and no plugin code runs beside it, so there is nothing to check: ``intact``
    is always true. A message with no withheld metadata is the runner's own (immutable) one.
    It saves ~1.5 ms per LongMemEval_S item, and ~0.25 ms per cell of checking."""

    def __init__(self, item: Item, hidden: frozenset[str] = frozenset(), view_id: str | None = None) -> None:
        withheld = GRADING_KEYS | hidden

        def seen(message: Message) -> Message:
            metadata = message.metadata
            if withheld.isdisjoint(metadata):
                return message
            return _message(message.role, message.content, {k: v for k, v in metadata.items() if k not in withheld})

        self.item = replace(
            item,
            id=item.id if view_id is None else view_id,
            history=tuple(map(seen, item.history)),
            query=seen(item.query),
            system=seen(item.system) if item.system is not None else None,
            answer=None,
            category=None,
            metadata={},
        )

    def intact(self) -> bool:
        return True


class PrivateView:
    """The item as one strategy sees it, and what it was when made: ``intact()`` says whether
    the strategy changed any of it (a message, its role, content or metadata, nested metadata,
    or swapped any object), at the cost of a few C-level passes instead of a fingerprint.

    The view holds no grading key (a vendor's memory layer is an interested party): the answer,
    the category and the item's metadata are None / empty, and every message's metadata lacks
    ``GRADING_KEYS`` and the task's ``hidden`` keys (``Task.hidden_metadata``). The runner's own
    item keeps all of it for validation, evidence recall, grading and reports.

    Everything here is the view's own: fresh ``Message`` objects whose metadata dicts (nested
    values copied too) only this view holds, so nothing the runner keeps is reachable through
    it. The check compares object identities, never calling ``__eq__`` on what a strategy may
    have put there; nested metadata (rare) is compared as the text of its JSON-safe copy.
    """

    def __init__(self, item: Item, hidden: frozenset[str] = frozenset(), view_id: str | None = None) -> None:
        head = (item.system,) if item.system is not None else ()
        given = (*head, *tuple.__iter__(item.history), item.query)  # an episode's turn holds the task's objects
        # metadata dicts of its own; nested values are copies (json_safe), so nothing mutable is shared
        fields = [_canonical_fields(m, f"message {index} of the item", None) for index, m in enumerate(given)]
        metadata = [meta for _, _, meta in fields]
        withheld = GRADING_KEYS | hidden
        for meta in metadata:
            if not withheld.isdisjoint(meta):
                for key in withheld.intersection(meta):
                    del meta[key]
        messages = [_message(*field) for field in fields]
        system = messages[0] if head else None
        self.item = replace(
            item,
            id=item.id if view_id is None else view_id,
            history=tuple(messages[len(head) : -1]),
            query=messages[-1],
            system=system,
            answer=None,
            category=None,
            metadata={},
        )
        self._fields = object.__getattribute__(self.item, "__dict__")
        self._values = tuple(self._fields.values())
        self._messages = tuple(messages)
        self._dicts = tuple(map(object.__getattribute__, messages, repeat("__dict__")))
        self._stored = list(chain.from_iterable(map(dict.values, self._dicts)))
        self._metadata = tuple(metadata)
        self._pairs = list(chain.from_iterable(chain.from_iterable(map(dict.items, metadata))))
        flat = _FLAT_OR_FLOAT.issuperset(map(type, chain.from_iterable(map(dict.values, metadata))))
        self._nested = (
            []
            if flat
            else [
                (d, key, repr(json_safe_or_empty(value)))
                for d in metadata
                for key, value in d.items()
                if type(value) not in _FLAT_TYPES and type(value) is not float
            ]
        )

    def intact(self) -> bool:
        """True when nothing of the view differs from what it was made with."""
        fields = object.__getattribute__(self.item, "__dict__")
        if fields is not self._fields or len(fields) != len(self._values):
            return False
        if not all(map(is_, fields.values(), self._values)):
            return False  # the history tuple, query or system swapped (the tuple itself cannot change)
        messages = self._messages
        if not all(map(is_, map(type, messages), repeat(Message))):
            return False  # a message's class swapped
        if not all(map(is_, map(object.__getattribute__, messages, repeat("__dict__")), self._dicts)):
            return False
        stored = list(chain.from_iterable(map(dict.values, self._dicts)))
        if len(stored) != len(self._stored) or not all(map(is_, stored, self._stored)):
            return False  # role, content or metadata replaced (object.__setattr__), or a field added
        pairs = list(chain.from_iterable(chain.from_iterable(map(dict.items, self._metadata))))
        if len(pairs) != len(self._pairs) or not all(map(is_, pairs, self._pairs)):
            return False  # a metadata dict edited (reached through gc, say)
        return all(repr(json_safe_or_empty(d.get(key))) == text for d, key, text in self._nested)
