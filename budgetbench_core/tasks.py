"""The Task contract: load items from official files unchanged and read the answer out."""

from __future__ import annotations

from abc import ABC, abstractmethod
import os
from collections.abc import Iterator
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

    def __init__(self, **options: Any) -> None:
        self.options = options

    @abstractmethod
    def load(self, limit: int | None, seed: int) -> Iterator[Item]:
        """Yield items; with ``limit``, a seeded, category-balanced selection."""

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
