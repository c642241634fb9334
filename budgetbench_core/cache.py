"""Response cache keyed by (model, api base, messages, generation parameters).

Lives in the run directory (SQLite, committed per write) so a resumed run never pays
twice for a call whose reply arrived before a crash.
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
import threading
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path

from .backends import Completion, GenerationParams
from .messages import Message


def cache_key(model: str, api_base: str | None, messages: Sequence[Message], params: GenerationParams) -> str:
    payload = json.dumps(
        {"model": model, "api_base": api_base, "messages": [m.to_chat() for m in messages], "params": params.to_dict()},
        sort_keys=True,
        ensure_ascii=False,
    )
    return hashlib.sha256(payload.encode("utf-8", "surrogatepass")).hexdigest()


class ResponseCache:
    """Thread-safe get/put of completions."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self._db = sqlite3.connect(str(path), check_same_thread=False, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        # Survives a killed process (what resume is for); skips the fsync per write that
        # cost ~10 ms per model call. A power cut may lose the newest replies: they are re-asked.
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.execute("CREATE TABLE IF NOT EXISTS responses (key TEXT PRIMARY KEY, completion TEXT NOT NULL)")
        self._lock = threading.Lock()

    def get(self, key: str) -> Completion | None:
        with self._lock:
            row = self._db.execute("SELECT completion FROM responses WHERE key = ?", (key,)).fetchone()
        return Completion(**json.loads(row[0])) if row else None

    def put(self, key: str, completion: Completion) -> None:
        with self._lock:
            self._db.execute(
                "INSERT OR REPLACE INTO responses (key, completion) VALUES (?, ?)",
                (key, json.dumps(asdict(completion), ensure_ascii=False)),
            )

    def close(self) -> None:
        with self._lock:
            self._db.close()
