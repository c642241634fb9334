"""What crosses between the harness and a plugin worker: JSON frames back, never pickles.

The harness never unpickles anything a worker sends (a pickle is code); every frame a worker
sends is a JSON object, bounded in size, decoded into plain dicts, lists, strings and numbers.
The harness's own frames to a worker (its view, the answers to its requests) are ``marshal``
data of the same plain values: the worker trusts the harness, and the harness never reads a
marshalled frame. A LongMemEval_S view (550 KB) marshals in 0.2 ms against 1.7 ms as JSON,
and loads in 0.3 ms against 1.0.
"""

from __future__ import annotations

import json
import marshal
import math
from collections.abc import Mapping, Sequence
from multiprocessing.connection import Connection
from typing import Any

from ..memory_systems import IngestFailure, IngestReport, RetrievedItem
from ..messages import TOOL_CALLS, Item, Message

MAX_FRAME = 256 * 1024 * 1024  # a 1M-token history is ~4 MB of JSON; anything far larger is hostile

# What a worker may send back is bounded by what it was sent: its requests and its prompt are
# made from its view (and the replies of its calls), so a frame far larger than the largest it
# received is hostile, and decoding one costs the harness's memory (a 256 MB frame of empty
# objects decodes into gigabytes). The floor leaves room for a small view's strategy.
REPLY_FRAME_FACTOR, REPLY_FRAME_FLOOR = 8, 16 * 1024 * 1024
# A history reference is a few bytes that stand for a whole message, so the text a prompt or a
# count request stands for is bounded apart from its frame: at most this many times its view's
# text and a floor (summaries and other text a strategy made), or the harness would render and
# tokenise gigabytes for a 14 MB frame of references to one long message.
PROMPT_TEXT_FACTOR, PROMPT_TEXT_FLOOR = 8, 1_000_000


class WireError(RuntimeError):
    """A frame that is not a bounded JSON object."""


class FrameTooLarge(WireError):
    """A frame over the receiver's limit: the connection reads nothing more."""


def send(conn: Connection, frame: dict[str, Any]) -> int:
    """``frame`` as ASCII JSON (other characters as ``\\u`` escapes); returns its size in bytes.
    For the mostly English text of the benchmarks' histories, ASCII encoding takes half the time
    and decoding 55% (a 550 KB LongMemEval_S view: 3.0 -> 1.7 ms and 1.6 -> 0.9 ms); text mostly
    in other scripts doubles in size and decodes slower."""
    data = json.dumps(frame, separators=(",", ":")).encode("ascii")
    conn.send_bytes(data)
    return len(data)


def send_to_worker(conn: Connection, frame: dict[str, Any]) -> int:
    """The harness's ``frame`` for a worker (plain values only); returns its size in bytes."""
    try:
        data = marshal.dumps(frame)
    except ValueError as exc:  # an object of a class (a Path in a strategy's parameters, say)
        raise WireError(f"a frame for the worker holds more than plain data ({exc})") from None
    conn.send_bytes(data)
    return len(data)


def receive_from_harness(conn: Connection) -> dict[str, Any]:
    """In a worker: the harness's next frame (``send_to_worker``); ``EOFError`` once it is gone."""
    frame = marshal.loads(conn.recv_bytes())
    if not isinstance(frame, dict):
        raise WireError(f"a frame must be a dict, got {type(frame).__name__}")
    return frame


def reply_limit(largest_sent: int) -> int:
    """The largest frame a worker may send after receiving frames of at most ``largest_sent`` bytes."""
    return max(REPLY_FRAME_FLOOR, REPLY_FRAME_FACTOR * largest_sent)


def receive(conn: Connection, limit: int = MAX_FRAME) -> dict[str, Any]:
    """The next frame; ``EOFError`` when the other side is gone, ``FrameTooLarge`` for a frame
    over ``limit`` bytes (refused before it is read)."""
    try:
        data = conn.recv_bytes(limit)
    except OSError:
        if not conn.readable:  # recv_bytes stops reading a connection that announced too long a frame
            raise FrameTooLarge(f"a frame over the limit of {limit:,} bytes") from None
        raise
    try:
        frame = json.loads(data)
    except (UnicodeDecodeError, ValueError) as exc:
        raise WireError(f"not a JSON frame: {exc}") from None
    if not isinstance(frame, dict):
        raise WireError(f"a frame must be a JSON object, got {type(frame).__name__}")
    return frame


def message_to_wire(message: Message) -> dict[str, Any]:
    return message.to_dict()


def message_from_wire(data: Any) -> Message:
    if not isinstance(data, dict):
        raise WireError(f"a message must be an object, got {type(data).__name__}")
    return Message.from_dict(data)


def prompt_to_wire(messages: Sequence[Message], history_at: Mapping[int, int]) -> list[dict[str, Any]]:
    """Messages as plain data, a message of the item's history (the very object, found in
    ``history_at`` by ``id``) as ``{"history": i}``: a prompt kept from a long history does not
    cross as text, and the harness takes its own copy of the message."""
    return [{"history": history_at[id(m)]} if id(m) in history_at else message_to_wire(m) for m in messages]


def prompt_from_wire(data: Any, history: Sequence[Message], text: ViewText) -> list[Message]:
    """A prompt as a worker sent it (``prompt_to_wire``); a history reference is the item's own
    message, so a worker can name only messages it was given. Refused past ``text.limit``
    characters, before anything renders or counts it."""
    if not isinstance(data, list):
        raise WireError(f"a prompt must be a list, got {type(data).__name__}")
    prompt = []
    total = 0
    for entry in data:
        if isinstance(entry, dict) and len(entry) == 1 and "history" in entry:
            index = entry["history"]
            if type(index) is not int or not 0 <= index < len(history):
                raise WireError(f"no history message {index!r} (the item has {len(history)})")
            message = history[index]
            total += text.history[index]
        else:
            message = message_from_wire(entry)
            total += message_text(message)
        if total > text.limit:
            raise WireError(
                f"a prompt of more than {text.limit:,} characters, more than its view can make "
                f"({PROMPT_TEXT_FACTOR} times the view's text and {PROMPT_TEXT_FLOOR:,}): refused uncounted"
            )
        prompt.append(message)
    return prompt


def message_text(message: Message) -> int:
    """Characters of a message that a rendered prompt holds: its content and tool-call text."""
    calls = message.metadata.get(TOOL_CALLS) if message.role == "assistant" else None
    return len(message.content) + (len(calls) if isinstance(calls, str) else 0)


class ViewText:
    """A view's text in characters: each history message's (what a reference stands for), and
    ``limit``, the most a prompt or count request made from the view may stand for."""

    def __init__(self, view: Item) -> None:
        self.history = [message_text(m) for m in view.history]
        others = [view.query, *([view.system] if view.system is not None else [])]
        self.limit = PROMPT_TEXT_FACTOR * (sum(self.history) + sum(map(message_text, others))) + PROMPT_TEXT_FLOOR


def ingest_report_from_wire(data: Any) -> IngestReport:
    """A memory system's ingest report as its worker sent it, every field checked."""
    try:
        failures = [
            IngestFailure(_text(f["session_id"]), _text(f["cause"]), _count(f.get("attempts", 1)))
            for f in data["failures"]
        ]
        return IngestReport(_count(data["sessions"]), _count(data["stored"]), failures, _number(data.get("seconds", 0)))
    except (KeyError, TypeError, WireError) as exc:
        raise WireError(f"not an ingest report ({type(exc).__name__}: {exc})") from None


def ranked_from_wire(data: Any) -> list[RetrievedItem]:
    """A memory system's ranked memories as its worker sent them, every field checked."""
    try:
        return [
            RetrievedItem(
                _text(r["text"]),
                _number(r["score"]),
                None if r.get("source_id") is None else _text(r["source_id"]),
                r.get("metadata") if isinstance(r.get("metadata"), dict) else {},
            )
            for r in data
        ]
    except (KeyError, TypeError, WireError) as exc:
        raise WireError(f"not a list of retrieved memories ({type(exc).__name__}: {exc})") from None


def _text(value: Any) -> str:
    if not isinstance(value, str):
        raise WireError(f"expected a string, got {type(value).__name__}")
    return value


def _count(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise WireError(f"expected a count, got {value!r:.50}")
    return value


def _number(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise WireError(f"expected a finite number, got {value!r:.50}")
    return float(value)


def view_to_wire(item: Item) -> dict[str, Any]:
    """A strategy's view of an item (already without its grading key) as plain data."""
    return {
        "id": item.id,
        "history": [message_to_wire(m) for m in item.history],
        "query": message_to_wire(item.query),
        "system": message_to_wire(item.system) if item.system is not None else None,
    }


def view_from_wire(data: dict[str, Any]) -> Item:
    return Item(
        id=data["id"],
        history=tuple(message_from_wire(m) for m in data["history"]),
        query=message_from_wire(data["query"]),
        answer=None,
        system=message_from_wire(data["system"]) if data.get("system") is not None else None,
    )
