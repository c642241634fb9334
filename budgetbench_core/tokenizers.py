"""Token counting of the prompt as the served model sees it, chat template included.

A ``Tokenizer`` renders a message list with the model's chat template and counts the
result. ``PromptCounter`` wraps one with a per-message cache so strategies can
estimate prompt sizes in linear time; the runner always makes the final decision
with the exact ``count`` of the whole rendered prompt.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.util
import os
import threading
from abc import ABC, abstractmethod
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from types import MappingProxyType
from typing import Any, TypeVar

from .messages import TOOL_CALL_ID, TOOL_CALLS, Message

T = TypeVar("T")  # what ``fit`` drops: messages, or indices that ``frame`` turns into messages


def use_bundled_tiktoken_encodings() -> None:
    """Point tiktoken at the encodings litellm ships, so nothing is downloaded offline.

    tiktoken fetches cl100k_base/o200k_base on first use unless TIKTOKEN_CACHE_DIR holds
    them; a value the user set is kept.
    """
    if "TIKTOKEN_CACHE_DIR" in os.environ:
        return
    spec = importlib.util.find_spec("litellm")
    if spec and spec.submodule_search_locations:
        folder = os.path.join(list(spec.submodule_search_locations)[0], "litellm_core_utils", "tokenizers")
        if os.path.isdir(folder):
            os.environ["TIKTOKEN_CACHE_DIR"] = folder


@dataclass(frozen=True)
class TokenizerInfo:
    """Recorded on every event row: which tokenizer counted, and whether exactly."""

    id: str
    backend: str
    exact: bool

    def to_dict(self) -> dict:
        return asdict(self)


class Tokenizer(ABC):
    """Counts rendered prompts. Subclasses implement ``count_text`` and ``render``."""

    info: TokenizerInfo

    @abstractmethod
    def render(self, messages: Sequence[Message]) -> str:
        """The prompt string after the chat template, with the generation prompt."""

    @abstractmethod
    def count_text(self, text: str) -> int:
        """Tokens in a raw string (no template, no special tokens added)."""

    def count(self, messages: Sequence[Message]) -> int:
        """Exact tokens of the rendered prompt: what the server will be given."""
        return self.count_rendered(self.render(messages))

    def count_rendered(self, prompt: str) -> int:
        """Tokens of an already rendered prompt (special tokens parsed)."""
        return self.count_text(prompt)

    def count_texts(self, texts: Sequence[str]) -> list[int]:
        """``count_text`` of each text. By default one at a time; a tokenizer that answers
        over a channel (a plugin worker's) counts them in one request."""
        return [self.count_text(text) for text in texts]

    def count_in_message(self, role: str, content: str) -> int:
        """Tokens of ``content`` as it is tokenised inside a ``role`` message, for estimates.

        By default the content's own count. A tokenizer that counts a prompt piece by
        piece returns the piece the content sits in, so that estimates and exact counts
        share one cache and each message is tokenised once.
        """
        return self.count_text(content)

    def render_with_tools(self, messages: Sequence[Message], tools: str) -> str:
        """The prompt with ``tools`` (the JSON array of tool schemas sent with it) rendered in,
        as the served template renders them. Default: NotImplementedError, since a tokenizer
        that does not know the template cannot count the tool block exactly."""
        raise NotImplementedError(f"tokenizer {self.info.id!r} cannot render tool schemas")


class WithTools(Tokenizer):
    """``tokenizer`` rendering every prompt with ``tools`` in it: the counter of calls that send
    tool schemas, so that strategies, the gate and the audit count what the server is given."""

    def __init__(self, tokenizer: Tokenizer, tools: str) -> None:
        self.tokenizer = tokenizer
        self.tools = tools
        self.info = tokenizer.info

    def render(self, messages: Sequence[Message]) -> str:
        return self.tokenizer.render_with_tools(messages, self.tools)

    def count_text(self, text: str) -> int:
        return self.tokenizer.count_text(text)

    def count_rendered(self, prompt: str) -> int:
        return self.tokenizer.count_rendered(prompt)

    def count_in_message(self, role: str, content: str) -> int:
        return self.tokenizer.count_in_message(role, content)


def _digest(text: str) -> bytes:
    return hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=16).digest()


def _exact_str(value: object, what: str) -> str:
    """``value`` as a plain ``str``: a subclass's own ``__eq__``, ``__hash__`` or ``encode``
    could otherwise make a cache return another text's count."""
    if type(value) is str:
        return value
    if not isinstance(value, str):
        raise TypeError(f"{what} must be str, got {type(value).__name__}")
    return str.__str__(value)


class CountCache:
    """Token counts of texts, for tokenizers and counters that count a text once per run.

    Counts are kept by a 16-byte digest of the text (up to ``size`` of them, oldest dropped
    first). The texts seen lately are also kept by reference, up to ``recent_chars``
    characters: their lookup costs one dict probe, since Python hashes a string once,
    where a digest reads the whole text again. Thread-safe; texts are taken as plain
    ``str`` (a ``str`` subclass is copied first).
    """

    def __init__(self, size: int = 1 << 18, recent_chars: int = 1 << 21) -> None:
        self._size = size
        self._recent_limit = recent_chars
        self._by_digest: dict[bytes, int] = {}
        self._recent: dict[str, int] = {}
        self._recent_chars = 0
        self._lock = threading.Lock()

    def get(self, text: str) -> int | None:
        if type(text) is str:
            tokens = self._recent.get(text)  # the common case: one probe
            if tokens is not None:
                return tokens
        return self._find(_exact_str(text, "a counted text"))[0]

    def _find(self, text: str) -> tuple[int | None, bytes | None]:
        """The count of a plain ``text`` if cached, else None and the text's digest."""
        tokens = self._recent.get(text)
        if tokens is not None:
            return tokens, None
        key = _digest(text)
        tokens = self._by_digest.get(key)
        if tokens is not None:
            self._remember(text, tokens)
        return tokens, key

    def put(self, text: str, tokens: int) -> None:
        text = _exact_str(text, "a counted text")
        self._store(text, _digest(text), tokens)

    def _store(self, text: str, key: bytes, tokens: int) -> None:
        with self._lock:
            self._by_digest[key] = tokens
            while len(self._by_digest) > self._size:
                del self._by_digest[next(iter(self._by_digest))]
        self._remember(text, tokens)

    def _remember(self, text: str, tokens: int) -> None:
        with self._lock:
            if text in self._recent:
                return
            self._recent[text] = tokens
            self._recent_chars += len(text)
            while self._recent_chars > self._recent_limit and self._recent:
                oldest = next(iter(self._recent))
                self._recent_chars -= len(oldest)
                del self._recent[oldest]

    def count(self, text: str, count_new: Callable[[str], int]) -> int:
        """The cached count of ``text``, or ``count_new(text)`` (then cached)."""
        text = _exact_str(text, "a counted text")
        tokens, key = self._find(text)
        if tokens is None:
            tokens = count_new(text)
            self._store(text, key or _digest(text), tokens)
        return tokens

    def count_all(self, texts: Sequence[str], count_new: Callable[[list[str]], list[int]]) -> list[int]:
        """Counts of ``texts``; the ones not cached go to ``count_new`` in one call, once each."""
        plain = [_exact_str(t, "a counted text") for t in texts]
        found = [self._find(t) for t in plain]
        missing = {t: key for t, (n, key) in zip(plain, found) if n is None}
        if not missing:
            return [n for n, _ in found]  # type: ignore[misc]  # every text is cached
        counted = count_new(list(missing))
        if len(counted) != len(missing):
            raise ValueError(f"counted {len(counted)} texts where {len(missing)} were given")
        new = dict(zip(missing, counted))
        for text, key in missing.items():
            self._store(text, key or _digest(text), new[text])
        return [new[t] if n is None else n for t, (n, _) in zip(plain, found)]


def _wire(role: str, metadata: Any) -> str:
    """The native tool-call field of a message that ``Message.to_chat`` sends besides role and
    content (an assistant's ``tool_calls`` JSON text, a tool message's ``tool_call_id``), read as
    a plain ``str``; "" for any other message."""
    if role == "assistant":
        key = TOOL_CALLS
    elif role == "tool":
        key = TOOL_CALL_ID
    else:
        return ""
    value = metadata.get(key) if isinstance(metadata, Mapping) else None
    return str.__str__(value) if isinstance(value, str) else ""


def _stored_fields(messages: Sequence[Message]) -> tuple[tuple[str, str, str], ...]:
    """The (role, content, tool-call field) of each message, read once from its stored fields
    as plain ``str`` (a subclass's properties, ``str`` subclasses and instance attributes are
    never consulted); the third is what ``to_chat`` sends for native tool calls, else ""."""
    key: list[tuple[str, str, str]] = []
    for message in messages:
        if type(message) is Message:
            fields = message.__dict__
            role, content = fields.get("role"), fields.get("content")
            if type(role) is str and type(content) is str:
                key.append((role, content, _wire(role, fields.get("metadata"))))
                continue
        if not isinstance(message, Message):
            raise TypeError(f"a prompt holds Message objects, got {type(message).__name__}")
        fields = object.__getattribute__(message, "__dict__")
        role = _exact_str(fields.get("role"), "a message's role")
        content = _exact_str(fields.get("content"), "content")
        key.append((role, content, _wire(role, fields.get("metadata"))))
    return tuple(key)


_PLAIN_LAYOUT = tuple(f.name for f in dataclasses.fields(Message)) == ("role", "content", "metadata")
_NO_METADATA: Mapping[str, Any] = MappingProxyType({})


def _plain_message(role: str, content: str, wire: str = "") -> Message:
    """``Message(role, content)`` for two plain strings, at a fifth of the cost of ``__init__``;
    ``wire`` (see ``_wire``) becomes the one metadata field ``to_chat`` reads for tool calls."""
    metadata = _NO_METADATA
    if wire:
        metadata = MappingProxyType({TOOL_CALLS if role == "assistant" else TOOL_CALL_ID: wire})
    if not _PLAIN_LAYOUT:
        return Message(role, content, metadata)
    message = object.__new__(Message)
    message.__dict__.update(role=role, content=content, metadata=metadata)
    return message


class PromptCounter:
    """Linear-time prompt estimates from cached per-message counts.

    The template overhead of each role and of the generation prompt is measured once by
    rendering probe messages. For additive templates such as ChatML the estimate equals
    the exact count; ``fit`` always confirms with the exact count and drops messages
    until the confirmed count fits, so a non-additive template can never overshoot.
    Each message is counted once per run (``CountCache``), whatever the number of tiers.
    """

    _PROBE = "probe"
    _EXACT_CACHE_SIZE = 128

    def __init__(self, tokenizer: Tokenizer) -> None:
        self.tokenizer = tokenizer
        self._contents = CountCache()
        self._in_role: dict[str, CountCache] = {}
        self._exact_cache: OrderedDict[tuple, int] = OrderedDict()
        self._role_overhead: dict[str, int] = {}
        self._lock = threading.Lock()
        self._base: int | None = None
        self._with_tools: dict[str, PromptCounter] = {}
        self.without_tools: PromptCounter | None = None  # on a ``with_tools`` counter: the one it was made from

    @property
    def info(self) -> TokenizerInfo:
        return self.tokenizer.info

    def with_tools(self, tools: str) -> PromptCounter:
        """The counter of prompts sent with ``tools`` (the JSON array of tool schemas): every
        count includes the tool block as the template renders it. One per tools text, kept."""
        with self._lock:
            counter = self._with_tools.get(tools)
            if counter is None:
                counter = self._with_tools[tools] = PromptCounter(WithTools(self.tokenizer, tools))
                counter.without_tools = self
        return counter

    def count(self, messages: Sequence[Message]) -> int:
        """Exact count of the rendered prompt.

        Recent counts are remembered by (role, content) sequence, because the prompt a
        strategy confirmed with ``fit`` is counted again by the runner; on a 32K-token
        prompt that second count costs tens of milliseconds.
        """
        key = _stored_fields(messages)
        with self._lock:
            cached = self._exact_cache.get(key)
        if cached is not None:
            return cached
        # What is counted is rebuilt from the key, so no object a strategy holds (and could
        # change from another thread meanwhile) decides the count stored under that key.
        exact = self.tokenizer.count([_plain_message(*fields) for fields in key])
        with self._lock:
            self._exact_cache[key] = exact
            if len(self._exact_cache) > self._EXACT_CACHE_SIZE:
                self._exact_cache.popitem(last=False)
        return exact

    def content_tokens(self, content: str) -> int:
        return self._contents.count(content, self.tokenizer.count_text)

    def contents_tokens(self, contents: Sequence[str]) -> list[int]:
        """``content_tokens`` of each text, the ones not yet counted in one go: in a worker,
        one request to the harness instead of one per text."""
        return self._contents.count_all(contents, self.tokenizer.count_texts)

    def _in_message(self, role: str, content: str) -> int:
        role = _exact_str(role, "a message's role")
        cache = self._in_role.get(role)
        if cache is None:
            with self._lock:
                cache = self._in_role.setdefault(role, CountCache())
        tokens = cache.get(content)
        if tokens is None:
            tokens = cache.count(content, lambda text: self.tokenizer.count_in_message(role, text))
        return tokens

    def _overhead(self, role: str) -> int:
        """Template tokens a message of ``role`` adds, measured before a closing user message.

        Probes always end with a user message, as real prompts do (some servers treat a
        trailing assistant message as a prefill). Templates that insert a default system
        prompt when none is given make the system overhead negative; sums stay exact.
        """
        if role not in self._role_overhead:
            closing = [Message("user", self._PROBE)]
            without = self.tokenizer.count(closing)
            with_role = self.tokenizer.count([Message(role, self._PROBE), *closing])
            overhead = with_role - without - self._in_message(role, self._PROBE)
            with self._lock:
                self._role_overhead[role] = overhead
        return self._role_overhead[role]

    def message_tokens(self, message: Message) -> int:
        """Estimated tokens one message adds to a prompt (content plus its template)."""
        return self._in_message(message.role, message.content) + self._overhead(message.role)

    @property
    def base(self) -> int:
        """Tokens the template adds once per prompt (BOS, generation prompt)."""
        if self._base is None:
            closing = [Message("user", self._PROBE)]
            self._base = self.tokenizer.count(closing) - self.message_tokens(closing[0])
        return self._base

    def estimate(self, messages: Sequence[Message]) -> int:
        return self.base + sum(self.message_tokens(m) for m in messages)

    def fit(
        self, frame: Callable[[list[T]], list[Message]], kept: list[T], budget: int, drop_index: int = 0
    ) -> tuple[list[T], int]:
        """Drop messages from ``kept`` (at ``drop_index``) until ``frame(kept)`` fits exactly.

        Returns the kept messages and the exact count; the count may still exceed the
        budget when nothing is left to drop (the runner then records a violation).
        """
        kept = list(kept)
        while True:
            exact = self.count(frame(kept))
            if exact <= budget or not kept:
                return kept, exact
            index = drop_index if drop_index >= 0 else len(kept) + drop_index
            kept.pop(min(max(index, 0), len(kept) - 1))
