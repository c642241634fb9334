"""Suite-wide test order: the files that hold end-to-end (``slow``) tests run first.

The README's test command runs the suite on two pytest-xdist workers, one file per work unit
(``-n 2 --dist loadfile`` in pyproject's ``addopts``, so a file's module fixtures run once).
Files are handed out in collection order; starting the long end-to-end files first keeps one
worker from being left with a long file at the end while the other has finished. Within each
group, and within a file, the collection order is kept.
"""

from __future__ import annotations

import pytest


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    has_slow = {item.path for item in items if item.get_closest_marker("slow") is not None}
    first_seen: dict[object, int] = {}
    for index, item in enumerate(items):
        first_seen.setdefault(item.path, index)
    items.sort(key=lambda item: (item.path not in has_slow, first_seen[item.path]))
