"""Remembered JSON texts of prompt messages: a long history's tiers send and log the same
messages again and again, and serialising one costs far more than finding it again."""

from __future__ import annotations

from collections.abc import Callable, Hashable


class Fragments:
    """Texts made by ``make()``, remembered by ``key`` until they hold ``limit`` characters
    in all (then all are forgotten at once: a long run's items rarely share messages)."""

    def __init__(self, limit: int = 16_000_000) -> None:
        self.limit = limit
        self._texts: dict[Hashable, str] = {}
        self._chars = 0

    def get(self, key: Hashable, make: Callable[[], str]) -> str:
        text = self._texts.get(key)
        if text is None:
            text = make()
            if self._chars + len(text) > self.limit:
                self._texts.clear()
                self._chars = 0
            self._texts[key] = text
            self._chars += len(text)
        return text
