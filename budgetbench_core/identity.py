"""Run identity: one ``run_key`` for everything that changes the experiment.

The key is stamped on every row; resume reuses only rows with the current key, whether or
not a manifest is present. ``identity.json`` in the run directory keeps the fields of every
key that wrote rows there, so a mismatch is refused naming the fields that differ (and, for
a data file, the file and both hashes).

The declared data files say in readable form what the run read; the items themselves are
the identity by content: ``ItemLedger`` records the digest of every item a run used and
refuses an item id whose content changed, whatever the task declares.
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from .events import ItemRecord
from .integrity import ITEMS_LOG
from .messages import Item, Message
from .run_manifest import Manifest
from .runlog import EventLog, RunLogError, read_events, write_json_atomic

KEY_LENGTH = 16


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def data_hashes(declared: Iterable[Any], options: Mapping[str, Any]) -> dict[str, str]:
    """sha256 of every file the task declared it read, and of any task option naming an
    existing file (a task that forgot to declare its file is still covered)."""
    paths = {Path(p) for p in declared}
    for value in options.values():
        if isinstance(value, str) and value and len(value) < 4096:
            candidate = Path(value)
            try:
                if candidate.is_file():
                    paths.add(candidate)
            except OSError:
                pass
    return {str(p.resolve()): file_sha256(p) for p in sorted(paths, key=str)}


def run_key(identity: Mapping[str, Any]) -> str:
    """The short hash of ``identity`` (canonical JSON: sorted keys, no whitespace)."""
    payload = json.dumps(identity, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)
    return hashlib.sha256(payload.encode("utf-8")).hexdigest()[:KEY_LENGTH]


def differences(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[str]:
    """Human-readable differences, one per field; data files name the file and both hashes."""
    out = []
    for name in sorted(set(old) | set(new)):
        before, after = old.get(name), new.get(name)
        if before == after:
            continue
        if name == "data_files" and isinstance(before, dict) and isinstance(after, dict):
            for path in sorted(set(before) | set(after)):
                if before.get(path) != after.get(path):
                    out.append(
                        f"data file {path}: sha256 {before.get(path) or '(not read)'} -> "
                        f"{after.get(path) or '(not read)'}"
                    )
            continue
        out.append(f"{name}: {json.dumps(before, default=str)} -> {json.dumps(after, default=str)}")
    return out


IDENTITY_FILE = "identity.json"


def known_identities(run_dir: Path, manifest: Manifest | None) -> dict[str, dict[str, Any]]:
    known: dict[str, dict[str, Any]] = {}
    path = Path(run_dir) / IDENTITY_FILE
    if path.exists():
        try:
            known.update(json.loads(path.read_text(encoding="utf-8")))
        except (OSError, json.JSONDecodeError) as exc:
            raise RunLogError(
                f"{path}: not readable ({exc}); it records which experiments wrote this "
                f"directory: restore it or choose another --out"
            ) from None
    if manifest and manifest.run_key and manifest.identity:
        known.setdefault(manifest.run_key, manifest.identity)
    return known


def record_identity(run_dir: Path, key: str, identity: Mapping[str, Any], known: Mapping[str, dict[str, Any]]) -> None:
    write_json_atomic(Path(run_dir) / IDENTITY_FILE, {**known, key: dict(identity)})


def mismatch_message(
    run_dir: Path,
    key: str,
    identity: Mapping[str, Any],
    foreign: Mapping[str, int],
    known: Mapping[str, dict[str, Any]],
) -> str:
    """Why ``run_dir`` cannot be resumed with ``identity``: which fields differ, per foreign key."""
    parts = []
    for other, count in sorted(foreign.items(), key=lambda kv: str(kv[0])):
        if other is None:
            parts.append(f"{count} rows carry no run_key (written by an older budgetbench)")
        elif other in known:
            parts.append(
                f"{count} rows of run_key {other} differ in: " + "; ".join(differences(known[other], identity))
            )
        else:
            parts.append(f"{count} rows of run_key {other}, whose identity record is missing")
    return (
        f"{run_dir} holds rows of a different experiment (this command's run_key is {key}): "
        + " | ".join(parts)
        + ". Resume with the same settings and data, or choose another --out."
    )


# ----------------------------------------------------------------- identity by content


def _canonical(value: Any) -> Any:
    """``value`` as plain JSON data: messages as ``{role, content, metadata}``, mappings as dicts."""
    if isinstance(value, Message):
        return {"role": value.role, "content": value.content, "metadata": _canonical(value.metadata)}
    if isinstance(value, Mapping):
        return {str(k): _canonical(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_canonical(v) for v in value]
    return value


def _sha256(value: Any) -> str:
    payload = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=repr)
    return hashlib.sha256(payload.encode("utf-8", "surrogatepass")).hexdigest()


ITEM_PARTS = ("system", "history", "query", "answer", "category", "metadata")


def item_digest(item: Item) -> tuple[str, dict[str, str]]:
    """The item's content hash (what strategies see and the grading key: every field, canonical
    form) and a short hash per field, to say which part changed."""
    parts = {name: _sha256(_canonical(getattr(item, name)))[:16] for name in ITEM_PARTS}
    return _sha256([item.id, parts]), parts


class ItemChangedError(ValueError):
    """An item's content differs from what this run directory recorded for the same item id."""


class ItemLedger:
    """The digest of every item a run used, per run_key, in ``items.jsonl`` (chained like the
    cell files). A task may read data the run identity does not know about; this catches a
    changed item whatever the task does. ``check(item, run_key)`` for each item the run uses."""

    def __init__(self, run_dir: Path, log: EventLog, data_files: Mapping[str, str] | None = None) -> None:
        self.path = Path(run_dir) / ITEMS_LOG
        self.log = log
        self.data_files = dict(data_files or {})
        self.known: dict[tuple[Any, Any], dict[str, Any]] = {}
        if self.path.exists():
            for row in read_events(self.path):
                self.known[(row.get("run_key"), row.get("item_id"))] = row
        self._lock = threading.Lock()

    def check(self, item: Item, run_key: str) -> str:
        """Record ``item``'s digest, or refuse it when the same id was recorded with other content."""
        digest, parts = item_digest(item)
        with self._lock:
            known = self.known.get((run_key, item.id))
            if known is None:
                row = ItemRecord(item_id=item.id, run_key=run_key, digest=digest, parts=parts).row()
                self.known[(run_key, item.id)] = row
                self.log.append(row, self.path)
                return digest
        if known.get("digest") != digest:
            before = known.get("parts") or {}
            changed = [f"{n} (sha256 {before.get(n)} -> {parts[n]})" for n in ITEM_PARTS if before.get(n) != parts[n]]
            files = ", ".join(sorted(self.data_files)) or "none declared"
            raise ItemChangedError(
                f"item {item.id!r} differs from the one this run directory recorded under run_key {run_key}: "
                f"{'; '.join(changed) or 'its id'}. The task's data changed under the same run identity "
                f"(declared data files: {files}): restore the data, or choose another --out"
            )
        return digest
