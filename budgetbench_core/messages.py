"""Messages and items: the immutable data every plugin exchanges.

Inputs are frozen so a strategy cannot mutate what it receives; the runner also
compares a snapshot before and after each call to catch in-place edits of metadata.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

CHAT_ROLES = ("system", "user", "assistant")  # what a strategy's model call through the gateway may send
ROLES = (*CHAT_ROLES, "tool")  # "tool": a native tool call's result in an agent episode (tool_call_id in metadata)
# Native tool calls in the OpenAI chat form, carried in flat metadata: an assistant message's
# calls as the JSON text of its ``tool_calls`` array, and a ``tool`` message's ``tool_call_id``.
TOOL_CALLS = "tool_calls"
TOOL_CALL_ID = "tool_call_id"


def _frozen(mapping: Mapping[str, Any] | None) -> Mapping[str, Any]:
    return MappingProxyType(dict(mapping or {}))


@dataclass(frozen=True, eq=True)
class Message:
    """One chat message. ``metadata`` may hold timestamp, session_id and source_id."""

    role: str
    content: str
    metadata: Mapping[str, Any] = field(default_factory=dict, compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.role, str) or not isinstance(self.content, str):
            raise TypeError(
                f"Message role and content must be str, got role={type(self.role).__name__} "
                f"content={type(self.content).__name__}"
            )
        object.__setattr__(self, "metadata", _frozen(self.metadata))

    def __hash__(self) -> int:
        return hash((self.role, self.content))

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"role": self.role, "content": self.content}
        if self.metadata:
            out["metadata"] = dict(self.metadata)
        return out

    def to_chat(self) -> dict[str, Any]:
        """The OpenAI chat form sent to servers: role and content; an assistant message with
        ``metadata["tool_calls"]`` (JSON text) also has its ``tool_calls``, and a ``tool``
        message its ``tool_call_id``."""
        chat: dict[str, Any] = {"role": self.role, "content": self.content}
        if self.role == "assistant":
            calls = self.metadata.get(TOOL_CALLS)
            if isinstance(calls, str) and calls:
                chat[TOOL_CALLS] = json.loads(calls)
        elif self.role == "tool":
            chat[TOOL_CALL_ID] = str(self.metadata.get(TOOL_CALL_ID, ""))
        return chat

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Message:
        return cls(data["role"], data["content"], data.get("metadata") or {})


@dataclass(frozen=True)
class Session:
    """A group of history messages that a memory system ingests together."""

    id: str
    messages: tuple[Message, ...]
    date: str | None = None


@dataclass(frozen=True)
class Item:
    """One benchmark question: the history to remember, the query, and the gold answer.

    ``system`` and ``query`` are kept apart from ``history`` so every strategy places
    them the same way and differs only in which history it keeps.
    """

    id: str
    history: tuple[Message, ...]
    query: Message
    answer: Any
    system: Message | None = None
    category: str | None = None
    metadata: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "history", tuple(self.history))
        object.__setattr__(self, "metadata", _frozen(self.metadata))

    def sessions(self) -> list[Session]:
        """History grouped by ``metadata['session_id']`` in order of first appearance."""
        groups: dict[str, list[Message]] = {}
        dates: dict[str, str | None] = {}
        for index, message in enumerate(self.history):
            sid = str(message.metadata.get("session_id", f"message-{index}"))
            groups.setdefault(sid, []).append(message)
            dates.setdefault(sid, message.metadata.get("timestamp"))
        return [Session(sid, tuple(msgs), dates[sid]) for sid, msgs in groups.items()]

    def frame(self, kept: list[Message]) -> list[Message]:
        """The prompt as sent: system prompt, the kept history, then the query."""
        head = [self.system] if self.system is not None else []
        return [*head, *kept, self.query]


class SentMessages(tuple[Message, ...]):
    """The messages of one model call as the harness hands them to a backend: a tuple of
    ``Message`` (so a backend cannot change what a retry sends) with ``chat_json``, the JSON
    array of chat messages (``[{"role": ..., "content": ...}]``) serialised once, which a
    backend that posts JSON can put in its request body as it is."""

    chat_json: str

    def __new__(cls, messages: Any, chat_json: str) -> SentMessages:
        self = super().__new__(cls, messages)
        self.chat_json = chat_json
        return self
