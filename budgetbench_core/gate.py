"""The budget gate: the one function that decides whether a prompt may be sent.

Answer prompts and auxiliary calls (summaries, compression) go through the same ``gate``:
the messages are rebuilt as the canonical prompt (``sandbox.canonical_prompt``), counted
exactly with the chat template, and hashed (``admit`` does the last two for the prompt the
runner has just canonicalised itself). Only ``Gated.prompt`` is ever sent. After a
call, ``served_over_budget`` checks the server's own count: a served count above the
budget is a violation, whatever our count said.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from .fragments import Fragments
from .messages import TOOL_CALL_ID, TOOL_CALLS, Message
from .sandbox import canonical_prompt
from .tokenizers import PromptCounter


class AuxiliaryBudgetError(RuntimeError):
    """A strategy's auxiliary call (summary, compression) had a prompt over the budget; it was not sent."""

    def __init__(self, message: str, prompt_tokens: int) -> None:
        super().__init__(message)
        self.prompt_tokens = prompt_tokens


class CountError(TypeError):
    """The tokenizer returned something that is not a token count."""


@dataclass(frozen=True)
class Gated:
    """A canonical prompt with its exact count against one budget.

    ``chat_json`` is the prompt serialised once, as the JSON array of chat messages a server
    receives; the prompt hash (and whatever else needs the sent bytes) is made from it.
    """

    prompt: tuple[Message, ...]
    tokens: int
    budget: int
    chat_json: str
    metadata_dropped: list[str] = field(default_factory=list)

    @cached_property
    def prompt_hash(self) -> str:
        return hashlib.sha256(self.chat_json.encode("utf-8")).hexdigest()

    @property
    def admitted(self) -> bool:
        return self.tokens <= self.budget

    def messages(self) -> list[dict[str, Any]]:
        return [m.to_dict() for m in self.prompt]


def chat_json(messages: Sequence[Message]) -> str:
    """The messages as the JSON array of chat messages sent to a server. A long prompt's text
    is joined from each message's remembered JSON (the same text, byte for byte: the default
    separators), since every tier of an item sends most of the same history messages."""
    if sum(len(m.content) for m in messages) < _REMEMBER_FROM:
        return json.dumps([m.to_chat() for m in messages], ensure_ascii=False)
    return "[" + ", ".join(map(_chat_fragment, messages)) + "]"


def _chat_fragment(message: Message) -> str:
    """One message's JSON in ``chat_json``, remembered by all that ``Message.to_chat`` reads."""
    role, content = message.role, message.content
    calls = message.metadata.get(TOOL_CALLS) if role == "assistant" else None
    if role == "tool":
        key = (role, content, str(message.metadata.get(TOOL_CALL_ID, "")))
    elif isinstance(calls, str) and calls:
        key = (role, content, calls)
    else:  # role and content only: what json.dumps writes for them, without its per-call set-up
        return _sent.get((role, content), lambda: f'{{"role": {_string(role)}, "content": {_string(content)}}}')
    return _sent.get(key, lambda: json.dumps(message.to_chat(), ensure_ascii=False))


_string = json.encoder.encode_basestring  # a str as JSON with ensure_ascii=False: json.dumps's own function


_REMEMBER_FROM = 8192  # characters of content from which a prompt's messages are remembered
_sent = Fragments()


def exact_count(counter: PromptCounter, prompt: tuple[Message, ...]) -> int:
    tokens = counter.count(prompt)
    if isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < 0:
        raise CountError(
            f"tokenizer {counter.info.id!r} returned {type(tokens).__name__} {tokens!r}, not a token count"
        )
    return int.__index__(tokens)


def gate(messages: Any, budget: int, counter: PromptCounter) -> Gated:
    """Canonicalise ``messages`` (a list of Message, as a plugin gave it), count and hash it.

    Raises ``sandbox.PromptError`` for a malformed prompt. The caller sends ``prompt`` only
    when ``admitted``.
    """
    dropped: list[str] = []
    prompt = canonical_prompt(list(tuple.__iter__(messages)) if isinstance(messages, tuple) else messages, dropped)
    return admit(prompt, budget, counter, dropped)


def admit(prompt: tuple[Message, ...], budget: int, counter: PromptCounter, dropped: Sequence[str] = ()) -> Gated:
    """Count and hash a prompt that ``sandbox.canonical_prompt`` has just built: plain messages
    no plugin holds, so they are not copied again (on a 500-message history that second copy
    held the GIL as long as the strategy did). Anything a plugin handed over goes through ``gate``.
    """
    if type(prompt) is not tuple or not all(type(m) is Message for m in prompt):
        raise TypeError("admit takes the tuple of plain messages canonical_prompt built; use gate for anything else")
    tokens = exact_count(counter, prompt)
    return Gated(prompt, tokens, int(budget), chat_json(prompt), list(dropped))


def served_over_budget(served_prompt_tokens: int | None, budget: int) -> bool:
    """True when the server counted more prompt tokens than the budget allows (unknown is not over)."""
    return served_prompt_tokens is not None and served_prompt_tokens > budget
