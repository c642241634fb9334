"""The Task contract: load items from official files unchanged and read the answer out."""

from __future__ import annotations

import inspect
import os
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, ClassVar

from .messages import Item


class TaskDataError(ValueError):
    """Malformed input data. The message names the file, the record and the field at fault."""


class Task(ABC):
    """Base class for tasks. Subclasses set ``name`` and ``default_grader``.

    A task never trims its prompt to the budget: that is the strategies' job. ``options``
    are the task's own parameters (a data path, a chunk size); ``manifest_notes`` is
    recorded in the run manifest so readers know how items were selected.
    """

    name: ClassVar[str]
    default_grader: ClassVar[str]
    max_output_tokens: ClassVar[int] = 64
    description: ClassVar[str] = ""
    hidden_metadata: ClassVar[frozenset[str]] = frozenset()
    """Message metadata keys that are grading-only (LongMemEval's ``has_answer``): no strategy
    or memory system sees them. The answer, ``category``, the item's ``metadata`` and the
    evidence marks are withheld from every task's strategies anyway (``sandbox.PrivateView``)."""

    def __init__(self, **options: Any) -> None:
        self.options = options

    @abstractmethod
    def load(self, limit: int | None, seed: int) -> Iterator[Item]:
        """Yield items; with ``limit``, a seeded, category-balanced selection."""

    def load_wanted(self, limit: int | None, seed: int, wanted: Callable[[str], bool]) -> Iterator[Item]:
        """The items of ``load(limit, seed)``, in the same order, for which ``wanted(item_id)`` is
        true; ``wanted`` is called for every item of the selection, in order.

        The runner reads items through this, lazily, and asks ``wanted`` whether a unit of the
        item is still to run (not finished on disk, owned by this shard). This default builds
        every item and drops the unwanted ones; a task that knows an item's id before building
        it overrides it, so that a resumed or sharded run never builds the items it skips.
        """
        for item in self.load(limit, seed):
            if wanted(item.id):
                yield item

    def extract_prediction(self, item: Item, completion: str) -> str:
        """The answer inside the model's reply. Default: the reply, stripped."""
        return completion.strip()

    def read_data_file(self, path: str | os.PathLike) -> Path:
        """Declare that this task reads ``path`` (returned as a Path): its sha256 becomes part
        of the run identity, so a changed file at the same path is never mixed into a resumed run."""
        declared = self.__dict__.setdefault("_data_files", [])
        path = Path(path)
        if path not in declared:
            declared.append(path)
        return path

    def data_files(self) -> list[Path]:
        """Every data file the task read (called after ``load``). A task that reads files calls
        ``read_data_file`` for each, or overrides this; a task that generates its items returns []."""
        return list(self.__dict__.get("_data_files", []))

    def manifest_notes(self) -> dict[str, Any]:
        return {"name": self.name, "options": self.options}


def hidden_metadata_keys(task: Task) -> frozenset[str]:
    """The task's ``hidden_metadata``, checked: a set of str keys. Read without running the
    task's code (a property is not called); anything else is a ``TypeError`` naming the task."""
    declared = inspect.getattr_static(task, "hidden_metadata", frozenset())
    name = inspect.getattr_static(task, "name", None)
    where = f"task {name if type(name) is str else type(task).__name__!r}: hidden_metadata"
    if not isinstance(declared, (frozenset, set, tuple, list)):
        raise TypeError(f"{where} must be a frozenset of metadata keys (str), got {type(declared).__name__}")
    wrong = sorted({type(key).__name__ for key in declared if type(key) is not str})
    if wrong:
        raise TypeError(f"{where} must hold metadata keys (str), got {', '.join(wrong)}")
    return frozenset(declared)
