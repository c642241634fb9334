"""Seeded, category-balanced selection of a task's items (``--limit``)."""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from typing import TypeVar

T = TypeVar("T")


def balanced(entries: Sequence[T], limit: int, seed: int, category: Callable[[T], object], salt: str) -> list[T]:
    """At most ``limit`` entries, taking categories in turn (sorted by name) so small ones
    are represented; each category is shuffled with ``random.Random(f"{salt}:{seed}:{name}")``,
    so the same seed gives the same selection and ``salt`` (the task's name) keeps two
    tasks' selections independent."""
    groups: dict[str, list[T]] = {}
    for entry in entries:
        groups.setdefault(str(category(entry)), []).append(entry)
    for name, group in groups.items():
        random.Random(f"{salt}:{seed}:{name}").shuffle(group)
    chosen: list[T] = []
    while len(chosen) < min(limit, len(entries)):
        for name in sorted(groups):
            if groups[name] and len(chosen) < limit:
                chosen.append(groups[name].pop())
    return chosen
