"""Response cache keyed by (model, api base, generation parameters, the messages' chat JSON).

The parameters include the tool schemas sent with the messages (``GenerationParams.tools``).

Lives in the run directory (SQLite, committed per write) so a resumed run never pays
twice for a call whose reply arrived before a crash. Replies are redacted before they are
stored (a server may echo a key). A corrupt entry is a miss: it is dropped, reported to the
caller as a warning, and asked again; a cache file SQLite cannot read stops the run with an
error saying what to do.
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
import threading
from dataclasses import fields
from pathlib import Path
from typing import Any

from .backends import Completion, GenerationParams
from .runlog import RunLogError, redact

_NAMES = tuple(f.name for f in fields(Completion))
_FIELDS = frozenset(_NAMES)


class CacheError(RunLogError):
    """The cache file cannot be read at all; the message says how to recover."""


_HEADS: dict[tuple[Any, ...], Any] = {}


def cache_key(model: str, api_base: str | None, chat_json: str, params: GenerationParams) -> str:
    """sha256 of (model, api base, parameters) then the messages' chat JSON as sent
    (``gate.chat_json``, serialised once per prompt; never serialised again here). The
    hash of the head is made once per (model, api base, parameters) and copied; the memo's
    key holds each parameter's type too (``temperature=0`` and ``0.0`` serialise apart)."""
    memo = (model, api_base, *((type(v), v) for v in vars(params).values()))
    head = _HEADS.get(memo)
    if head is None:
        text = json.dumps({"model": model, "api_base": api_base, "params": params.to_dict()}, sort_keys=True)
        head = hashlib.sha256(text.encode("utf-8", "surrogatepass"))
        head.update(b"\n")
        if len(_HEADS) < 1024:  # a run has a handful; a sweep of parameters is not kept for ever
            _HEADS[memo] = head
    digest = head.copy()
    digest.update(chat_json.encode("utf-8", "surrogatepass"))
    return digest.hexdigest()


def _decode(text: str) -> Completion:
    """A stored completion, checked field by field (ValueError when it is not one)."""
    data = json.loads(text)
    if (
        not isinstance(data, dict)
        or not {"text", "prompt_tokens", "completion_tokens", "latency_s"} <= set(data)
        or set(data) - _FIELDS
    ):
        raise ValueError("not a stored completion")
    if not isinstance(data["text"], str):
        raise ValueError("text is not a string")
    for name in ("prompt_tokens", "completion_tokens", "cached_tokens"):
        value = data.get(name)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
            raise ValueError(f"{name} is not an integer")
    if not isinstance(data["latency_s"], (int, float)):
        raise ValueError("latency_s is not a number")
    if not isinstance(data.get("tool_calls") or [], list):
        raise ValueError("tool_calls is not a list")
    return Completion(**data)


class ResponseCache:
    """Thread-safe lookup/put of completions."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        try:
            self._db = sqlite3.connect(str(path), check_same_thread=False, isolation_level=None)
            self._db.execute("PRAGMA journal_mode=WAL")
            # Survives a killed process (what resume is for); skips the fsync per write that
            # cost ~10 ms per model call. A power cut may lose the newest replies: they are re-asked.
            self._db.execute("PRAGMA synchronous=NORMAL")
            self._db.execute("CREATE TABLE IF NOT EXISTS responses (key TEXT PRIMARY KEY, completion TEXT NOT NULL)")
        except sqlite3.Error as exc:
            raise self._unreadable(exc) from None
        self._lock = threading.Lock()

    def _unreadable(self, exc: Exception) -> CacheError:
        return CacheError(
            f"{self.path}: the response cache cannot be read ({type(exc).__name__}: {exc}). It only "
            f"saves repeated model calls: move it away (or delete it) and run again; the rows in "
            f"cells/ are kept"
        )

    def lookup(self, key: str) -> tuple[Completion | None, str | None]:
        """(completion, None) on a hit, (None, None) on a miss, (None, warning) for a corrupt entry (dropped)."""
        try:
            with self._lock:
                row = self._db.execute("SELECT completion FROM responses WHERE key = ?", (key,)).fetchone()
        except sqlite3.Error as exc:
            raise self._unreadable(exc) from None
        if row is None:
            return None, None
        try:
            return _decode(row[0] if isinstance(row[0], str) else bytes(row[0]).decode("utf-8")), None
        except (ValueError, TypeError, UnicodeDecodeError) as exc:
            with self._lock:
                self._db.execute("DELETE FROM responses WHERE key = ?", (key,))
            return None, f"cache entry {key[:12]} in {self.path.name} could not be read ({exc}): dropped, asked again"

    def get(self, key: str) -> Completion | None:
        return self.lookup(key)[0]

    def put(self, key: str, completion: Completion) -> None:
        # Its fields are plain values (``plain_completion``): no deep copy (``asdict``) needed.
        text = redact(json.dumps({name: getattr(completion, name) for name in _NAMES}, ensure_ascii=False))
        try:
            with self._lock:
                self._db.execute("INSERT OR REPLACE INTO responses (key, completion) VALUES (?, ?)", (key, text))
        except sqlite3.Error as exc:
            raise self._unreadable(exc) from None

    def close(self) -> None:
        with self._lock:
            self._db.close()
