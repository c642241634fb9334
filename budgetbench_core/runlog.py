"""The run directory on disk: per-cell JSONL event logs and the manifest.

Every event is one JSON line, written and flushed as soon as it happens, so a crash
loses at most the line being written. A torn last line (kill -9 mid-write) is skipped
by the reader and cut off before the next append; a bad line anywhere else is an error
naming the file and line, never silently ignored.
"""

from __future__ import annotations

import json
import os
import re
import threading
from collections.abc import Iterator
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

SCHEMA_VERSION = "1"
TERMINAL_EVENTS = ("result", "violation", "error")
FINAL_EVENTS = ("result", "violation")


class RunLogError(ValueError):
    """A run directory file that cannot be read; the message names the file and line."""


_SECRET_VARIABLE = re.compile(r"(KEY|TOKEN|SECRET|PASSWORD|CREDENTIALS?)$", re.IGNORECASE)


def redact(text: str) -> str:
    """``text`` with the value of every secret-looking environment variable (``*_API_KEY``,
    ``*_TOKEN``...) replaced by its name: servers and libraries quote keys back in error
    messages, and nothing written to a run directory may carry one. Read on every call,
    since keys may be set after import."""
    for name, value in os.environ.items():
        if len(value) >= 8 and _SECRET_VARIABLE.search(name) and value in text:
            text = text.replace(value, f"<{name} redacted>")
    return text


def safe_name(text: str) -> str:
    """A path component that cannot escape the run directory."""
    return re.sub(r"[^A-Za-z0-9_.@=-]", "_", str(text)) or "_"


def cell_path(run_dir: Path, task: str, strategy: str, budget: int, repeat: int) -> Path:
    return run_dir / "cells" / safe_name(task) / safe_name(strategy) / str(int(budget)) / f"r{int(repeat)}.jsonl"


def now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds")


def _cut_torn_tail(path: Path) -> None:
    """Drop a last line that has no newline: it was being written when the process died."""
    with open(path, "rb+") as handle:
        handle.seek(0, os.SEEK_END)
        size = handle.tell()
        if size == 0:
            return
        handle.seek(size - 1)
        if handle.read(1) == b"\n":
            return
        position = size - 1
        chunk = 65536
        while position > 0:
            start = max(0, position - chunk)
            handle.seek(start)
            data = handle.read(position - start)
            newline = data.rfind(b"\n")
            if newline >= 0:
                handle.truncate(start + newline + 1)
                return
            position = start
        handle.truncate(0)


class EventLog:
    """Appends events to the per-cell JSONL files of one run directory (thread-safe)."""

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = Path(run_dir)
        self._handles: dict[Path, Any] = {}
        self._lock = threading.Lock()

    def append(self, event: dict[str, Any]) -> None:
        path = cell_path(self.run_dir, event["task"], event["strategy"], event["budget"], event["repeat"])
        line = redact(json.dumps({"time": now(), **event}, ensure_ascii=False, default=str)) + "\n"
        with self._lock:
            handle = self._handles.get(path)
            if handle is None:
                path.parent.mkdir(parents=True, exist_ok=True)
                if path.exists():
                    _cut_torn_tail(path)
                handle = open(path, "a", encoding="utf-8")
                self._handles[path] = handle
            handle.write(line)
            handle.flush()

    def close(self) -> None:
        with self._lock:
            for handle in self._handles.values():
                handle.close()
            self._handles.clear()


def read_events(path: Path) -> Iterator[dict[str, Any]]:
    """Events of one JSONL file; a torn last line is skipped, any other bad line raises."""
    with open(path, "rb") as handle:
        data = handle.read()
    lines = data.split(b"\n")
    complete, torn = lines[:-1], lines[-1]
    for number, raw in enumerate(complete, start=1):
        if not raw.strip():
            continue
        try:
            yield json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise RunLogError(f"{path}: line {number} is not valid JSON ({exc})") from None
    del torn  # an unterminated last line is a write cut short by a crash


def cell_files(run_dir: Path) -> list[Path]:
    return sorted((Path(run_dir) / "cells").glob("*/*/*/r*.jsonl"))


def repair_torn_tails(run_dir: Path) -> None:
    """Cut every cell file's torn last line, including files no resumed cell will append to."""
    for path in cell_files(run_dir):
        _cut_torn_tail(path)


def iter_events(run_dir: Path) -> Iterator[dict[str, Any]]:
    for path in cell_files(run_dir):
        yield from read_events(path)


def final_rows(run_dir: Path) -> dict[tuple, dict[str, Any]]:
    """The last terminal event of every (task, strategy, budget, repeat, item_id).

    An ``error`` followed by a later ``result`` (after a resume) counts as the result.
    """
    rows: dict[tuple, dict[str, Any]] = {}
    for event in iter_events(run_dir):
        if event.get("event") in TERMINAL_EVENTS:
            key = (event["task"], event["strategy"], int(event["budget"]), int(event["repeat"]), str(event["item_id"]))
            rows[key] = event
    return rows


def write_json_atomic(path: Path, data: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(redact(json.dumps(data, indent=2, ensure_ascii=False, default=str)), encoding="utf-8")
    tmp.replace(path)


def read_manifest(run_dir: Path) -> dict[str, Any] | None:
    path = Path(run_dir) / "manifest.json"
    if not path.exists():
        return None
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise RunLogError(f"{path}: not valid JSON ({exc})") from None
