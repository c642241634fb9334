"""``read_run``: a run directory read for a command that presents or exports it, verified first.

The one public way for a plugin (and the core's own readers) to read a finished run: the
directory is verified (``integrity.verify_run``: every line of the cell files and run-level
logs chained under the run's key, the seal, every row of the manifest's ``run_key``) and a
directory that does not verify is refused with a ``RunReadError`` whose message names the file
and line at fault. Rows are then read as the report reads them: as their ``events`` classes
(``runlog.read_rows``: a row of an older schema is migrated, one no class describes is refused)
and handed back as the JSON objects those classes write, without the ``chain`` field.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .events import SCHEMA_VERSION, CellKey, SchemaError, Terminal
from .integrity import RUN_LOGS, verify_run
from .run_manifest import Manifest
from .runlog import RunLogError, cell_files, read_manifest, read_rows


class RunReadError(ValueError):
    """A run directory that cannot be read: not one, of a schema this release cannot read, or one
    that does not verify (edited, forged, truncated, mixed with another run, or its key missing on
    this machine); the message names the file (and line) at fault."""


@dataclass(frozen=True)
class VerifiedRun:
    """What ``read_run`` read from a run directory that verified."""

    run_dir: Path
    manifest: dict[str, Any]
    rows: dict[CellKey, dict[str, Any]]  # per cell (task, strategy, budget, repeat, item_id): its last terminal row
    logs: dict[str, list[dict[str, Any]]] = field(default_factory=dict)  # run-level log name -> its rows, in order
    notes: tuple[str, ...] = ()  # what verification noted without refusing (a torn last line, an unsealed file)


def read_run(run_dir: Path, logs: Sequence[str] = (), key_files: Sequence[Path] = ()) -> VerifiedRun:
    """Verify ``run_dir`` and read its terminal rows and the run-level ``logs`` asked for
    (``"episodes.jsonl"``, ``"late_calls.jsonl"``, ``"items.jsonl"``; an absent log reads as no
    rows). ``key_files`` are key files of a run made on another machine (as ``--key-file``; the
    key store and ``$BUDGETBENCH_KEY_FILE`` are looked in too). Raises ``RunReadError`` naming
    the file and line when the directory does not verify; nothing of it is read then."""
    run_dir = Path(run_dir)
    unknown = sorted(set(logs) - set(RUN_LOGS))
    if unknown:
        raise ValueError(f"read_run: {unknown} are not run-level logs (those are {', '.join(RUN_LOGS)})")
    if not run_dir.is_dir():
        raise RunReadError(f"{run_dir}: no such run directory")
    try:
        manifest = read_manifest(run_dir)
        if manifest is None:
            raise RunReadError(f"{run_dir / 'manifest.json'}: missing; is {run_dir} a budgetbench run directory?")
        schema_version = Manifest.from_dict(manifest, str(run_dir / "manifest.json")).schema_version
    except (SchemaError, RunLogError) as exc:
        raise RunReadError(str(exc)) from None
    verified = verify_run(run_dir, key_files, run_key=manifest.get("run_key") or "(none in manifest.json)")
    if not verified.ok:
        raise RunReadError(verified.refusal())
    version = schema_version or SCHEMA_VERSION
    rows: dict[CellKey, dict[str, Any]] = {}
    read: dict[str, list[dict[str, Any]]] = {}
    try:
        for path in cell_files(run_dir):
            for event in read_rows(path, version):
                if isinstance(event, Terminal):
                    rows[event.key] = event.row()
        for name in logs:
            path = run_dir / name
            read[name] = [event.row() for event in read_rows(path, version)] if path.is_file() else []
    except (SchemaError, RunLogError) as exc:
        raise RunReadError(str(exc)) from None
    return VerifiedRun(run_dir, manifest, rows, read, tuple(verified.notes))
