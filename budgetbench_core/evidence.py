"""Evidence recall: did the prompt a strategy built keep the evidence the answer needs?

A task marks evidence on the history messages that hold it, with the metadata key
``evidence`` (``EVIDENCE_KEY``):

- ``True``: the whole content of the message is the evidence;
- a string: the exact part of the content that must survive (the sentence stating the fact,
  with the date when the answer is a date); it must occur in the message's content.

``evidence_id`` in the same metadata names the piece (default ``history[<index>]``). A piece
is *kept* when its text occurs in the content of one message of the prompt, compared with
runs of whitespace collapsed, so a strategy may move, quote or regroup messages but not cut
or rewrite the evidence. Items without marks have no evidence recall (never 0); a task whose
items carry no marks reports none. The runner records the outcome on every prompt it gates.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .messages import Message

EVIDENCE_KEY = "evidence"
EVIDENCE_ID_KEY = "evidence_id"


class EvidenceMarkError(ValueError):
    """A task marked evidence that its own message does not contain."""


@dataclass(frozen=True)
class EvidenceMark:
    id: str
    text: str


def _normal(text: str) -> str:
    return " ".join(text.split())


def evidence_marks(history: Sequence[Message]) -> list[EvidenceMark]:
    """The evidence marked in ``history``, in order; a mark its message does not contain is an error."""
    marks = []
    for index, message in enumerate(history):
        value = message.metadata.get(EVIDENCE_KEY)
        if value is None or value is False:
            continue
        mark_id = str(message.metadata.get(EVIDENCE_ID_KEY) or f"history[{index}]")
        if value is True:
            text = message.content
        elif isinstance(value, str):
            if _normal(value) not in _normal(message.content):
                raise EvidenceMarkError(
                    f"history[{index}] marks evidence {value[:60]!r} that its content does not contain"
                )
            text = value
        else:
            raise EvidenceMarkError(
                f"history[{index}]: metadata {EVIDENCE_KEY!r} must be true or a string, got {type(value).__name__}"
            )
        if _normal(text):
            marks.append(EvidenceMark(mark_id, _normal(text)))
    return marks


def evidence_outcome(marks: Sequence[EvidenceMark], prompt: Sequence[Message]) -> dict[str, Any] | None:
    """``{"marked", "kept", "dropped"}`` (kept and dropped are evidence ids); None without marks."""
    if not marks:
        return None
    contents = [_normal(m.content) for m in prompt]
    kept: list[str] = []
    dropped: list[str] = []
    for mark in marks:
        (kept if any(mark.text in content for content in contents) else dropped).append(mark.id)
    return {"marked": len(marks), "kept": kept, "dropped": dropped}
