"""A memory system's retrieval per item, saved in the run directory by the engine (never by
the plugin): every budget tier, and a resumed run, reuse it instead of ingesting again.

What is saved decides the prompts of every tier, so each file carries a ``mac`` field: an HMAC
under the run's key (``integrity.record_mac``) of its path in the run and its content as
canonical JSON. A file that does not verify (edited, written by hand, copied from another run or
item) is refused (``integrity.IntegrityError``), never taken for "not saved".
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from .integrity import MAC_FIELD, RETRIEVALS, read_retrieval, retrieval_files, retrieval_mac
from .runlog import redact, safe_name

__all__ = ["RETRIEVALS", "read_retrieval", "retrieval_files"]  # verified by integrity, as verify_run does


def retrieval_path(run_dir: Path, strategy: str, item_id: str) -> Path:
    return run_dir / RETRIEVALS / safe_name(strategy) / f"{safe_name(item_id)}.json"


def write_retrieval(run_dir: Path, path: Path, record: dict[str, Any], key: bytes) -> None:
    """Write ``record`` at ``path`` atomically, redacted, with its MAC under ``key`` (a ``mac``
    field of the record itself is not kept)."""
    plain = json.loads(redact(json.dumps(record, ensure_ascii=False)))
    plain.pop(MAC_FIELD, None)
    text = json.dumps({**plain, MAC_FIELD: retrieval_mac(key, run_dir, path, plain)}, ensure_ascii=False, indent=1)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(path)


def load_retrieval(run_dir: Path, strategy: str, item_id: str, key: bytes) -> dict[str, Any] | None:
    """The saved retrieval of ``item_id``, or None when none is saved (see ``read_retrieval``)."""
    path = retrieval_path(run_dir, strategy, item_id)
    return read_retrieval(run_dir, path, key) if path.exists() else None


def save_retrieval(run_dir: Path, strategy: str, item_id: str, record: dict[str, Any], key: bytes) -> None:
    """Save ``record`` (the plugin's ingest report and ranked memories) as ``item_id``'s."""
    write_retrieval(run_dir, retrieval_path(run_dir, strategy, item_id), {**record, "item_id": item_id}, key)
