"""Token counting of the prompt as the served model sees it, chat template included.

A ``Tokenizer`` renders a message list with the model's chat template and counts the
result. ``PromptCounter`` wraps one with a per-message cache so strategies can
estimate prompt sizes in linear time; the runner always makes the final decision
with the exact ``count`` of the whole rendered prompt.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import threading
from abc import ABC, abstractmethod
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import TypeVar

from .messages import Message

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

    def count_in_message(self, role: str, content: str) -> int:
        """Tokens of ``content`` as it is tokenised inside a ``role`` message, for estimates.

        By default the content's own count. A tokenizer that counts a prompt piece by
        piece returns the piece the content sits in, so that estimates and exact counts
        share one cache and each message is tokenised once.
        """
        return self.count_text(content)


def _digest(text: str) -> bytes:
    return hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=16).digest()


class PromptCounter:
    """Linear-time prompt estimates from cached per-message counts.

    The template overhead of each role and of the generation prompt is measured once by
    rendering probe messages. For additive templates such as ChatML the estimate equals
    the exact count; ``fit`` always confirms with the exact count and drops messages
    until the confirmed count fits, so a non-additive template can never overshoot.
    """

    _PROBE = "probe"
    _EXACT_CACHE_SIZE = 128

    def __init__(self, tokenizer: Tokenizer) -> None:
        self.tokenizer = tokenizer
        self._content_cache: dict[bytes, int] = {}
        self._message_cache: dict[tuple[str, bytes], int] = {}
        self._exact_cache: OrderedDict[tuple, int] = OrderedDict()
        self._role_overhead: dict[str, int] = {}
        self._lock = threading.Lock()
        self._base: int | None = None

    @property
    def info(self) -> TokenizerInfo:
        return self.tokenizer.info

    def count(self, messages: Sequence[Message]) -> int:
        """Exact count of the rendered prompt.

        Recent counts are remembered by (role, content) sequence, because the prompt a
        strategy confirmed with ``fit`` is counted again by the runner; on a 32K-token
        prompt that second count costs tens of milliseconds.
        """
        key = tuple((m.role, m.content) for m in messages)
        with self._lock:
            cached = self._exact_cache.get(key)
        if cached is not None:
            return cached
        exact = self.tokenizer.count(messages)
        with self._lock:
            self._exact_cache[key] = exact
            if len(self._exact_cache) > self._EXACT_CACHE_SIZE:
                self._exact_cache.popitem(last=False)
        return exact

    def content_tokens(self, content: str) -> int:
        key = _digest(content)
        cached = self._content_cache.get(key)
        if cached is None:
            cached = self.tokenizer.count_text(content)
            with self._lock:
                self._content_cache[key] = cached
        return cached

    def _in_message(self, role: str, content: str) -> int:
        key = (role, _digest(content))
        cached = self._message_cache.get(key)
        if cached is None:
            cached = self.tokenizer.count_in_message(role, content)
            with self._lock:
                self._message_cache[key] = cached
        return cached

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
