"""Official dataset files: where they live when a task is not given an explicit path.

``BUDGETBENCH_DATA_DIR`` (default ``~/.cache/budgetbench/data``) holds one folder per
dataset (``datasets.Dataset``); ``budgetbench data fetch NAME`` fills it when online, and
tells users which file to place where when offline.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from .datasets import Dataset
from .tasks import TaskDataError


@dataclass(frozen=True)
class FileStatus:
    """One file of a dataset: where its task reads it and whether it is there."""

    remote: str
    path: Path
    present: bool
    size: int | None


def dataset_status(dataset: Dataset, root: Path | None = None) -> list[FileStatus]:
    """Each file of ``dataset`` under ``root`` (default ``data_dir()``), present or missing."""
    folder = (root or data_dir()) / dataset.folder
    rows = []
    for remote, local in dataset.files.items():
        path = folder / local
        present = path.is_file()
        rows.append(FileStatus(remote, path, present, path.stat().st_size if present else None))
    return rows


def data_dir() -> Path:
    return Path(os.environ.get("BUDGETBENCH_DATA_DIR", Path.home() / ".cache" / "budgetbench" / "data"))


def resolve_data_file(dataset: str, filename: str, path: str | os.PathLike[str] | None) -> Path:
    """``path`` when given, else ``data_dir()/dataset/filename``; a clear error when missing."""
    candidate = Path(path) if path else data_dir() / dataset / filename
    if not candidate.is_file():
        raise TaskDataError(
            f"{dataset}: data file not found: {candidate}. Pass --task-option path=<file>, or {_fetch_hint(dataset)} "
            f"(or place {filename} in {data_dir() / dataset})."
        )
    return candidate


def _fetch_hint(folder: str) -> str:
    """``budgetbench data fetch NAME`` for the registered dataset stored in ``folder``."""
    from .plugins import get_registry

    names = [d.name for d in get_registry().datasets().values() if d.folder == folder]
    if names:
        return f"run `budgetbench data fetch {names[0]}`"
    return "see `budgetbench data fetch --help` for the datasets it can fetch"
