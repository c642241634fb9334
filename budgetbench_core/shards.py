"""``--shard i/N``: a deterministic partition of a run's units, for runs split across machines.

A unit (a strategy on one item) belongs to shard ``i`` of ``N`` when a SHA-256 hash of its
key, ``(task, strategy, item id)``, is ``i - 1`` modulo ``N``. The hash depends only on those
strings, never on Python's per-process hash seed, the item order or the machine, so every
job of a CI matrix, Slurm array or Kubernetes Job computes the same partition on its own,
with nothing shared between jobs. Shards are numbered from 1 (``1/3``, ``2/3``, ``3/3``).
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass

_SPEC = re.compile(r"^\s*(\d+)\s*/\s*(\d+)\s*$")


class ShardError(ValueError):
    """A ``--shard`` value that does not name one shard of a partition."""


def unit_hash(task: str, strategy: str, item_id: str) -> int:
    """A 64-bit number fixed by the unit's key alone (JSON-encoded, so no two keys collide)."""
    payload = json.dumps([task, strategy, str(item_id)], ensure_ascii=False)
    return int.from_bytes(hashlib.sha256(payload.encode("utf-8", "surrogatepass")).digest()[:8], "big")


@dataclass(frozen=True)
class Shard:
    """Shard ``index`` (1-based) of ``count``."""

    index: int
    count: int

    def __post_init__(self) -> None:
        if self.count < 1 or not 1 <= self.index <= self.count:
            raise ShardError(f"shard {self.index}/{self.count} does not exist: use i/N with 1 <= i <= N")

    @classmethod
    def parse(cls, text: str) -> Shard:
        match = _SPEC.match(str(text))
        if not match:
            raise ShardError(f"--shard expects i/N (for example 2/3, shards numbered from 1), got {text!r}")
        return cls(int(match.group(1)), int(match.group(2)))

    def __str__(self) -> str:
        return f"{self.index}/{self.count}"

    def owns(self, task: str, strategy: str, item_id: str) -> bool:
        return unit_hash(task, strategy, item_id) % self.count == self.index - 1
