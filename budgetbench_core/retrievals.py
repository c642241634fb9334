"""A memory system's retrieval per item, saved in the run directory by the engine (never by
the plugin): every budget tier, and a resumed run, reuse it instead of ingesting again.

What is saved decides the prompts of every tier, so each file carries a ``mac`` field: an HMAC
under the run's key (``integrity.record_mac``) of its path in the run and its content as
canonical JSON. A file that does not verify (edited, written by hand, copied from another run or
item) is refused (``integrity.IntegrityError``), never taken for "not saved".
"""

from __future__ import annotations

import hmac
import json
from pathlib import Path
from typing import Any

from .integrity import IntegrityError, record_mac
from .runlog import redact, safe_name

RETRIEVALS = "retrievals"
MAC_FIELD = "mac"


def retrieval_path(run_dir: Path, strategy: str, item_id: str) -> Path:
    return run_dir / RETRIEVALS / safe_name(strategy) / f"{safe_name(item_id)}.json"


def _mac(key: bytes, run_dir: Path, path: Path, record: dict[str, Any]) -> str:
    content = json.dumps(record, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return record_mac(key, "retrieval", path.relative_to(run_dir).as_posix(), content)


def read_retrieval(run_dir: Path, path: Path, key: bytes) -> dict[str, Any]:
    """The record saved at ``path``, without its MAC; IntegrityError when it does not verify under ``key``."""
    try:
        saved = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise IntegrityError(f"{path}: a saved retrieval that cannot be read ({exc})") from None
    if not isinstance(saved, dict) or not isinstance(saved.get(MAC_FIELD), str):
        raise IntegrityError(f"{path}: a saved retrieval without a MAC (written by hand, or by an older budgetbench)")
    mac = saved.pop(MAC_FIELD)
    if not hmac.compare_digest(mac, _mac(key, run_dir, path, saved)):
        raise IntegrityError(
            f"{path}: a saved retrieval that does not verify under this run's key "
            f"(edited, or copied from another run or item)"
        )
    return saved


def write_retrieval(run_dir: Path, path: Path, record: dict[str, Any], key: bytes) -> None:
    """Write ``record`` at ``path`` atomically, redacted, with its MAC under ``key`` (a ``mac``
    field of the record itself is not kept)."""
    plain = json.loads(redact(json.dumps(record, ensure_ascii=False)))
    plain.pop(MAC_FIELD, None)
    text = json.dumps({**plain, MAC_FIELD: _mac(key, run_dir, path, plain)}, ensure_ascii=False, indent=1)
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


def retrieval_files(run_dir: Path) -> list[Path]:
    """Every saved retrieval of the run (a ``.tmp`` left by a write cut short is not one)."""
    root = run_dir / RETRIEVALS
    return sorted(p for p in root.rglob("*") if p.is_file() and p.suffix != ".tmp") if root.exists() else []


def retrieval_problems(run_dir: Path, key: bytes) -> list[str]:
    """Why each saved retrieval of ``run_dir`` does not verify under ``key`` (``integrity.verify_run``)."""
    problems = []
    for path in retrieval_files(run_dir):
        try:
            read_retrieval(run_dir, path, key)
        except IntegrityError as exc:
            problems.append(str(exc))
    return problems
