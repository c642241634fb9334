"""Retrievable units: whole history messages, or fixed-size chunks of them.

Chunk size is a strategy parameter counted in the embedding model's tokens and never
depends on the budget, so every tier retrieves from the same units (a chunk size that
follows the budget would make tiers incomparable). A chunk never spans two messages, so
it keeps its message's role and metadata, and adjacent chunks of one message join back
into exactly the original text.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from budgetbench_core import Message


@dataclass(frozen=True)
class Unit:
    """One retrievable piece of history: ``message_index`` in the history, ``chunk`` within it."""

    index: int
    message_index: int
    chunk: int
    chunks: int
    text: str

    @property
    def label(self) -> str:
        """Stable name used in the audit: ``"12"`` for message 12, ``"12:1"`` for its second chunk."""
        return str(self.message_index) if self.chunks == 1 else f"{self.message_index}:{self.chunk}"


def split_text(text: str, chunk_tokens: int, tokenizer: Any) -> list[str]:
    """``text`` cut every ``chunk_tokens`` tokens; the pieces concatenate back to ``text``."""
    offsets = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True, verbose=False)["offset_mapping"]
    starts = [offsets[i][0] for i in range(chunk_tokens, len(offsets), chunk_tokens)]
    bounds = [0, *starts, len(text)]
    return [text[a:b] for a, b in zip(bounds, bounds[1:]) if b > a] or [text]


def make_units(history: Sequence[Message], chunk_tokens: int, tokenizer: Any) -> list[Unit]:
    """Units in history order. ``chunk_tokens == 0`` keeps whole messages."""
    units: list[Unit] = []
    for message_index, message in enumerate(history):
        pieces = split_text(message.content, chunk_tokens, tokenizer) if chunk_tokens else [message.content]
        for chunk, piece in enumerate(pieces):
            units.append(Unit(len(units), message_index, chunk, len(pieces), piece))
    return units


def unit_message(unit: Unit, history: Sequence[Message]) -> Message:
    """A unit as a prompt message: its message's role and metadata, its own text."""
    source = history[unit.message_index]
    if unit.chunks == 1:
        return source
    return Message(source.role, unit.text, {**source.metadata, "chunks": [unit.chunk], "of_chunks": unit.chunks})


def assemble(chosen: Sequence[Unit], history: Sequence[Message]) -> list[Message]:
    """Chosen units in chronological order; adjacent chunks of one message become one message."""
    messages: list[Message] = []
    groups: list[list[Unit]] = []
    for unit in sorted(chosen, key=lambda u: u.index):
        last = groups[-1][-1] if groups else None
        if last is not None and last.message_index == unit.message_index and last.chunk + 1 == unit.chunk:
            groups[-1].append(unit)
        else:
            groups.append([unit])
    for group in groups:
        source = history[group[0].message_index]
        if len(group) == group[0].chunks:
            messages.append(source)
        elif len(group) == 1:
            messages.append(unit_message(group[0], history))
        else:
            messages.append(
                Message(
                    source.role,
                    "".join(u.text for u in group),
                    {**source.metadata, "chunks": [u.chunk for u in group], "of_chunks": group[0].chunks},
                )
            )
    return messages
