"""Where official dataset files live when a task is not given an explicit path.

``BUDGETBENCH_DATA_DIR`` (default ``~/.cache/budgetbench/data``) holds one folder per
dataset; ``budgetbench data fetch`` fills it when online, and tells users which file to
place where when offline.
"""

from __future__ import annotations

import os
from pathlib import Path

from .tasks import TaskDataError


def data_dir() -> Path:
    return Path(os.environ.get("BUDGETBENCH_DATA_DIR", Path.home() / ".cache" / "budgetbench" / "data"))


def resolve_data_file(dataset: str, filename: str, path: str | os.PathLike | None) -> Path:
    """``path`` when given, else ``data_dir()/dataset/filename``; a clear error when missing."""
    candidate = Path(path) if path else data_dir() / dataset / filename
    if not candidate.is_file():
        raise TaskDataError(
            f"{dataset}: data file not found: {candidate}. Pass --task-option path=<file>, or run "
            f"`budgetbench data fetch {dataset}` (or place {filename} in {data_dir() / dataset})."
        )
    return candidate
