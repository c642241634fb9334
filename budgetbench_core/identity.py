"""Run identity: one ``run_key`` for everything that changes the experiment.

The key is stamped on every row; resume reuses only rows with the current key, whether or
not a manifest is present. ``identity.json`` in the run directory keeps the fields of every
key that wrote rows there, so a mismatch is refused naming the fields that differ (and, for
a data file, the file and both hashes).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from .runlog import RunLogError, write_json_atomic

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


def known_identities(run_dir: Path, manifest: Mapping[str, Any] | None) -> dict[str, dict[str, Any]]:
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
    if manifest and manifest.get("run_key") and manifest.get("identity"):
        known.setdefault(manifest["run_key"], manifest["identity"])
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
