"""A memory system's retrieval per item, saved in the run directory by the engine (never by
the plugin): every budget tier, and a resumed run, reuse it instead of ingesting again."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from .runlog import redact, safe_name


def retrieval_path(run_dir: Path, strategy: str, item_id: str) -> Path:
    return run_dir / "retrievals" / safe_name(strategy) / f"{safe_name(item_id)}.json"


def load_retrieval(run_dir: Path, strategy: str, item_id: str) -> dict[str, Any] | None:
    """The saved retrieval of ``item_id``, or None (none saved, or not this item's)."""
    path = retrieval_path(run_dir, strategy, item_id)
    try:
        saved = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return saved if isinstance(saved, dict) and saved.get("item_id") == item_id else None


def save_retrieval(run_dir: Path, strategy: str, item_id: str, record: dict[str, Any]) -> None:
    """Write ``record`` (the plugin's ingest report and ranked memories) atomically, redacted."""
    path = retrieval_path(run_dir, strategy, item_id)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(redact(json.dumps({**record, "item_id": item_id}, ensure_ascii=False, indent=1)), encoding="utf-8")
    tmp.replace(path)
