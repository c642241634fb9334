"""The run directory on disk: per-cell JSONL event logs and the manifest.

Every event is one JSON line, written and flushed as soon as it happens, so a crash
loses at most the line being written. A torn last line (kill -9 mid-write) is skipped
by the reader and cut off before the next append; a bad line anywhere else is an error
naming the file and line, never silently ignored.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import quote, quote_plus

from .events import FINAL_EVENTS, SCHEMA_VERSION, TERMINAL_EVENTS, CellKey, Event, from_row, migration
from .fragments import Fragments
from .integrity import Chain, IntegrityError, chained_files, new_record, read_record, verify_run, write_record
from .run_manifest import Manifest

__all__ = ["FINAL_EVENTS", "SCHEMA_VERSION", "TERMINAL_EVENTS"]


class RunLogError(ValueError):
    """A run directory file that cannot be read; the message names the file and line."""


_SECRET_VARIABLE = re.compile(r"(KEY|TOKEN|SECRET|PASSWORD|CREDENTIALS?)$", re.IGNORECASE)


def secret_variable(name: str) -> bool:
    """Whether an environment variable's name says it holds a credential (``HF_TOKEN``, ``*_API_KEY``)."""
    return bool(_SECRET_VARIABLE.search(name))


_AUTHORIZATION = re.compile(
    r"((?:authorization|proxy-authorization)[\"']?\s*[:=]\s*[\"']?\s*(?:bearer|basic|token)?\s*)"
    r"(?!<)[^\s\"',;}]+",
    re.IGNORECASE,
)  # (?!<): already redacted
_BEARER = re.compile(r"(\bbearer\s+)(?!<)[A-Za-z0-9._~+/=-]{8,}", re.IGNORECASE)
_PIECE = 12  # a piece of a key this long is redacted too (some providers quote part of it back)


_seen_environment: tuple[dict[Any, Any], list[tuple[str, str]]] = ({}, [])


def encodings(value: str) -> list[str]:
    """The forms a server may echo a key in: as is, JSON-escaped (``/`` as ``\\/`` too),
    URL-encoded, each also upper- and lower-cased; longest first, so a whole form is replaced
    before any part of it."""
    escaped = json.dumps(value, ensure_ascii=True)[1:-1]
    forms = {value, escaped, escaped.replace("/", "\\/"), quote(value, safe=""), quote_plus(value, safe="")}
    forms |= {form.lower() for form in forms} | {form.upper() for form in forms}
    return sorted(forms, key=lambda form: (-len(form), form))


def _secrets() -> list[tuple[str, str]]:
    """``(name, form)`` for every encoding of every secret-looking variable of the environment
    as it is now. Scanning it costs ~60 µs, several times per cell; it is rescanned whenever
    ``os.environ`` differs from the last scan (one C-level comparison of its raw data)."""
    global _seen_environment
    raw = getattr(os.environ, "_data", None)
    seen, secrets = _seen_environment
    if type(raw) is dict and raw == seen:
        return secrets
    secrets = [
        (name, form)
        for name, value in os.environ.items()
        if len(value) >= 8 and secret_variable(name)
        for form in encodings(value)
    ]
    if type(raw) is dict:
        _seen_environment = (dict(raw), secrets)
    return secrets


def _any_block(value: str, text: str) -> bool:
    """Whether ``text`` may hold a ``_PIECE``-long piece of ``value``: every such piece holds
    one of the value's aligned blocks of half that length, so a text holding none of them
    (a handful of scans instead of one per piece) holds no piece."""
    half = _PIECE // 2
    return any(value[start : start + half] in text for start in range(0, len(value) - half + 1, half))


def redact(text: str) -> str:
    """``text`` with every secret replaced, before anything is truncated or written.

    The value of every secret-looking environment variable (``*_API_KEY``, ``*_TOKEN``...), in
    every encoding a server may echo it in (``encodings``), and any 12-character piece of those
    become ``<NAME redacted>``; ``Authorization`` header
    and ``Bearer`` values become ``<redacted>``. Servers and libraries quote keys back in
    error messages and replies, and nothing written to a run directory may carry one. Keys
    are read on every call, since they may be set after import."""
    if not isinstance(text, str) or not text:
        return text
    secrets = _secrets()
    for name, form in secrets:  # every whole form first, then any piece of one
        if form in text:
            text = text.replace(form, f"<{name} redacted>")
    for name, form in secrets:
        if len(form) >= 16 and not any(c.isspace() for c in form) and _any_block(form, text):
            for start in range(len(form) - _PIECE + 1):
                piece = form[start : start + _PIECE]
                if piece in text:
                    text = text.replace(piece, f"<{name} redacted>")
    # The two patterns scan the whole text (tens of KB for a prompt audit); run each only
    # when its word occurs. ``re.IGNORECASE`` also matches "ı" and "İ" (lower: "i" + U+0307)
    # to "i", so those are folded first: the check finds a superset of what the pattern can.
    # Outside the dotted and dotless i, no character lowers to an ASCII letter of either word,
    # so lowering the UTF-8 bytes (ASCII letters only, several times faster than str.lower
    # on non-Latin-1 text) finds the same words.
    if "\u0130" in text or "\u0131" in text:
        lowered: str | bytes = text.lower().replace("\u0131", "i").replace("\u0307", "")
        words: tuple[str | bytes, str | bytes] = ("authorization", "bearer")
    else:
        lowered, words = text.encode("utf-8", "surrogatepass").lower(), (b"authorization", b"bearer")
    if words[0] in lowered:  # type: ignore[operator]
        text = _AUTHORIZATION.sub(lambda m: m.group(1) + "<redacted>", text)
    if words[1] in lowered:  # type: ignore[operator]
        text = _BEARER.sub(lambda m: m.group(1) + "<redacted>", text)
    return text


_PLAIN_NAME = re.compile(r"[a-z0-9_][a-z0-9_.-]{0,63}")
_HASH_DIGITS = 12


def safe_name(text: str) -> str:
    """A path component for ``text`` that cannot escape the run directory and is injective.

    Names of lower-case letters, digits, ``_``, ``.`` and ``-`` (not starting with ``.``,
    at most 64 characters) are kept as they are. Anything else becomes a readable prefix,
    ``~`` and 12 hex digits of the sha256 of the exact text; ``~`` never occurs in a kept
    name, so a kept name and a hashed one cannot meet, and lower case keeps names apart on
    case-insensitive file systems too."""
    text = str(text)
    if _PLAIN_NAME.fullmatch(text):
        return text
    digest = hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:_HASH_DIGITS]
    prefix = re.sub(r"[^A-Za-z0-9_.-]", "_", text)[:40].lstrip(".")
    return f"{prefix}~{digest}"


def cell_path(run_dir: Path, task: str, strategy: str, budget: int, repeat: int) -> Path:
    return run_dir / "cells" / safe_name(task) / safe_name(strategy) / str(int(budget)) / f"r{int(repeat)}.jsonl"


_second: tuple[int, str] = (-1, "")


def now() -> str:
    """UTC now, ISO 8601 to the millisecond (``datetime.isoformat`` of the whole second made
    once a second: it is on every event line)."""
    global _second
    moment = time.time()
    second = int(moment)
    if second != _second[0]:
        _second = (second, datetime.fromtimestamp(second, UTC).isoformat())
    text = _second[1]
    return f"{text[:19]}.{int((moment - second) * 1000):03d}{text[19:]}"


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


def _dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, default=str)


_REMEMBER_FROM = 8192  # characters of message content from which pieces are remembered
_logged = Fragments()
_KEYABLE = frozenset({str, int, bool, type(None)})


def _message_json(message: Any) -> str:
    """``_dumps(message)`` for one ``{role, content, metadata}`` dict, remembered: the tiers of
    an item audit the same history messages again and again."""
    role, content, metadata = message.get("role"), message.get("content"), message.get("metadata") or {}
    if (
        type(role) is not str
        or type(content) is not str
        or type(metadata) is not dict
        or not set(map(type, metadata.values())) <= _KEYABLE
    ):
        return _dumps(message)  # nested or float metadata (1 == 1.0 == True; -0.0 == 0.0): not remembered
    key = (role, content, tuple(metadata.items()), tuple(map(type, metadata.values())), tuple(message))
    return _logged.get(key, lambda: _dumps(message))


def _event_json(row: dict[str, Any]) -> str:
    """``_dumps(row)``, with a ``messages`` list (a prompt audit's tens of KB) joined from
    per-message pieces: the same text, byte for byte, as serialising the row whole."""
    messages = row.get("messages")
    if type(messages) is not list or not messages or not all(type(m) is dict for m in messages):
        return _dumps(row)
    if sum(len(c) for m in messages if type(c := m.get("content")) is str) < _REMEMBER_FROM:
        return _dumps(row)  # a short prompt: remembering its pieces costs more than it saves
    keys = list(row)
    at = keys.index("messages")
    head = _dumps({k: row[k] for k in keys[:at]}) if at else "{}"
    tail = _dumps({k: row[k] for k in keys[at + 1 :]})
    body = "[" + ", ".join(map(_message_json, messages)) + "]"
    return (head[:-1] + ", " if at else "{") + '"messages": ' + body + (", " + tail[1:] if len(tail) > 2 else "}")


class EventLog:
    """Appends events to the per-cell JSONL files of one run directory (thread-safe).

    Every line is chained (``integrity.Chain``): before the first row, the directory's logs
    are verified and each file's chain is continued from its end, so a resume (even after a
    kill -9) keeps the run verifiable and never extends a tampered file; ``close`` seals the
    directory (``integrity.json``)."""

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = Path(run_dir)
        self._handles: dict[Path, Any] = {}
        self._paths: dict[tuple, Path] = {}
        self._lock = threading.Lock()
        self._chains: dict[str, Chain] | None = None  # relative path -> its chain, once opened
        self._run_id = ""
        self._key = b""

    def open(self, what: str = "append to") -> None:
        """Verify what the directory holds and take up its chains (the first ``append`` does it
        too; calling it first refuses a tampered directory before any work is done: the runner
        does on a resume, ``what`` naming that in the refusal)."""
        with self._lock:
            self._open(what)

    @property
    def key(self) -> bytes:
        """The run's key, opening the directory first (as ``open`` does): the main process MACs the
        run's saved retrievals and cache entries with it. It is never given to a plugin."""
        with self._lock:
            self._open()
            return self._key

    def _open(self, what: str = "append to") -> None:
        if self._chains is not None:
            return
        self.run_dir.mkdir(parents=True, exist_ok=True)
        repair_torn_tails(self.run_dir)
        if read_record(self.run_dir) is None and not chained_files(self.run_dir):
            self._run_id, self._key = new_record(self.run_dir)
            self._chains = {}
            return
        found = verify_run(self.run_dir)
        if not found.ok or found.key is None or found.run_id is None:
            raise IntegrityError(found.refusal(what))
        self._run_id, self._key, self._chains = found.run_id, found.key, found.chains

    def append(self, event: dict[str, Any], path: Path | None = None) -> None:
        """Append ``event`` to its cell's file (or to ``path``, e.g. ``late_calls.jsonl``)."""
        if path is None:
            key = (event["task"], event["strategy"], event["budget"], event["repeat"])
            path = self._paths.get(key)
            if path is None:
                path = self._paths[key] = cell_path(self.run_dir, *key)
        body = redact(_event_json({"time": now(), **event})).encode("utf-8")
        with self._lock:
            self._open()
            assert self._chains is not None
            relative = path.relative_to(self.run_dir).as_posix()
            chain = self._chains.get(relative)
            if chain is None:
                if path.exists() and path.stat().st_size:
                    raise IntegrityError(f"{path}: appeared while the run was being written; it is not in its chain")
                chain = self._chains[relative] = Chain(relative, self._key)
            handle = self._handles.get(path)
            if handle is None:
                path.parent.mkdir(parents=True, exist_ok=True)
                handle = self._handles[path] = open(path, "ab")
            handle.write(chain.line(body))
            handle.flush()

    def close(self) -> None:
        """Close the files and seal the directory: each file's length and digest, under the key."""
        with self._lock:
            for handle in self._handles.values():
                handle.close()
            self._handles.clear()
            if self._chains is not None:
                write_record(self.run_dir, self._run_id, self._key, self._chains, now())


def _numbered(path: Path) -> Iterator[tuple[int, Any]]:
    """``(line number, JSON value)`` of every complete line of ``path``."""
    with open(path, "rb") as handle:
        data = handle.read()
    lines = data.split(b"\n")
    complete, torn = lines[:-1], lines[-1]
    for number, raw in enumerate(complete, start=1):
        if not raw.strip():
            continue
        try:
            event = json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise RunLogError(f"{path}: line {number} is not valid JSON ({exc})") from None
        if type(event) is dict:
            event.pop("chain", None)  # the file's integrity, not the event's (see integrity.py)
        yield number, event
    del torn  # an unterminated last line is a write cut short by a crash


def read_events(path: Path) -> Iterator[dict[str, Any]]:
    """Events of one JSONL file, without their ``chain`` field; a torn last line is skipped,
    any other bad line raises. Nothing is verified here: readers that decide (report, gate,
    compare, plan, merge) call ``integrity.verify_run`` first."""
    for _, event in _numbered(path):
        yield event


def read_rows(path: Path, schema_version: str = SCHEMA_VERSION) -> Iterator[Event]:
    """The rows of one JSONL file as their ``events`` classes, read as they were written: a row
    of an older ``schema_version`` is migrated first (``events.MIGRATIONS``), and a row no class
    describes (unknown kind or field) raises ``events.SchemaError`` naming the file and line."""
    upgrade = migration(schema_version, str(path))
    for number, event in _numbered(path):
        yield from_row(upgrade(event) if type(event) is dict else event, f"{path}: line {number}")


def cell_files(run_dir: Path) -> list[Path]:
    return sorted((Path(run_dir) / "cells").glob("*/*/*/r*.jsonl"))


def repair_torn_tails(run_dir: Path) -> None:
    """Cut every log's torn last line, including files no resumed cell will append to."""
    for path in chained_files(run_dir):
        _cut_torn_tail(path)


def iter_events(run_dir: Path) -> Iterator[dict[str, Any]]:
    for path in cell_files(run_dir):
        yield from read_events(path)


def iter_rows(run_dir: Path, schema_version: str = SCHEMA_VERSION) -> Iterator[Event]:
    """Every cell file's rows as their ``events`` classes (see ``read_rows``)."""
    for path in cell_files(run_dir):
        yield from read_rows(path, schema_version)


def final_rows(run_dir: Path) -> dict[CellKey, dict[str, Any]]:
    """The last terminal event of every cell (``CellKey``), as written.

    An ``error`` followed by a later ``result`` (after a resume) counts as the result.
    """
    rows: dict[CellKey, dict[str, Any]] = {}
    for event in iter_events(run_dir):
        if event.get("event") in TERMINAL_EVENTS:
            rows[CellKey.of(event)] = event
    return rows


def write_json_atomic(path: Path, data: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(redact(json.dumps(data, indent=2, ensure_ascii=False, default=str)), encoding="utf-8")
    tmp.replace(path)


def read_manifest(run_dir: Path) -> dict[str, Any] | None:
    """``manifest.json`` as the JSON object it is; None when there is none."""
    path = Path(run_dir) / "manifest.json"
    if not path.exists():
        return None
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise RunLogError(f"{path}: not valid JSON ({exc})") from None


def load_manifest(run_dir: Path) -> Manifest | None:
    """``manifest.json`` as a ``Manifest``; None when there is none. One of a schema this release
    cannot read (newer, unknown) or with an unknown field raises ``events.SchemaError``."""
    data = read_manifest(run_dir)
    return None if data is None else Manifest.from_dict(data, str(Path(run_dir) / "manifest.json"))
