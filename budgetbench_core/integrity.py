"""Tamper-evident run directories: every logged line carries a keyed digest of its file up to itself.

Each line of a run's logs (the cell files, ``episodes.jsonl``, ``late_calls.jsonl``,
``items.jsonl``) ends with ``"chain": {"sha256": D, "hmac": M}``: ``D`` is the SHA-256 of
every byte of the file before the line plus the line itself without that field, and ``M`` an
HMAC of ``D`` (and the file's path in the run) under a per-run secret kept outside the run
directory (``key_dir()``), which no plugin is given. When an invocation ends, the main process
seals the directory: ``integrity.json`` holds each file's length and SHA-256, under one HMAC,
so a truncated or deleted file is caught too. The records kept beside the logs that feed rows
(saved retrievals, cache entries) carry an HMAC under the same key (``record_mac``), checked by
``verify_run`` too.

Without the key, ``D`` still catches an edit by anyone who did not recompute the chain; with
the key, recomputing it is impossible. What is verified, and what is not (a rollback to an
earlier sealed state; lines cut off the end of a file written after the last finished
invocation), is in docs/reliability.md.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import re
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .events import TERMINAL_EVENTS

INTEGRITY_FILE = "integrity.json"
ITEMS_LOG = "items.jsonl"  # the digest of every item a run used (identity.ItemLedger)
RUN_LOGS = ("episodes.jsonl", "late_calls.jsonl", ITEMS_LOG)  # run-level logs, chained like cell files
KEY_ENV = "BUDGETBENCH_KEY_FILE"  # key files (os.pathsep-separated) for runs made on another machine
KEY_DIR_ENV = "BUDGETBENCH_KEY_DIR"
_FORMAT = 1
_HEAD = b', "chain": {"sha256": "'
_MIDDLE = b'", "hmac": "'
_TAIL = b'"}}'
_SUFFIX = re.compile(rb', "chain": \{"sha256": "([0-9a-f]{64})", "hmac": "([0-9a-f]{64})"\}\}')
_SUFFIX_LENGTH = len(_HEAD) + 64 + len(_MIDDLE) + 64 + len(_TAIL)
_SHOWN = 8  # problems quoted in a refusal


class IntegrityError(ValueError):
    """A run directory that does not verify; the message names the file and line."""


# ----------------------------------------------------------------- keys


def key_dir() -> Path:
    """Where run keys live: ``$BUDGETBENCH_KEY_DIR``, else ``$XDG_STATE_HOME/budgetbench/keys``,
    else ``~/.local/state/budgetbench/keys``; never inside a run directory."""
    if os.environ.get(KEY_DIR_ENV):
        return Path(os.environ[KEY_DIR_ENV])
    state = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(state) / "budgetbench" / "keys"


def key_id(key: bytes) -> str:
    """A public fingerprint of ``key``, to tell which key file belongs to which run."""
    return hashlib.sha256(b"budgetbench-key-id\0" + key).hexdigest()[:16]


def create_key(run_id: str) -> bytes:
    """A new random key for ``run_id``, written to ``key_dir()/run_id`` readable by its owner only."""
    directory = key_dir()
    path = directory / run_id
    key = os.urandom(32)
    try:
        directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        handle = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(handle, "w") as out:
            out.write(key.hex() + "\n")
    except OSError as exc:
        raise IntegrityError(
            f"cannot store the run's key at {path} ({exc}): set {KEY_DIR_ENV} to a private, writable directory"
        ) from None
    return key


def _read_key(path: Path) -> bytes | None:
    try:
        return bytes.fromhex(path.read_text(encoding="utf-8").strip())
    except (OSError, ValueError):
        return None


def find_key(run_id: str, wanted: str, key_files: Iterable[Path] = ()) -> bytes | None:
    """The key of ``run_id`` whose fingerprint is ``wanted``: from ``key_files``, the files named
    by ``$BUDGETBENCH_KEY_FILE``, or the key store; None when this machine does not have it."""
    named = [Path(p) for p in key_files]
    named += [Path(p) for p in os.environ.get(KEY_ENV, "").split(os.pathsep) if p]
    for path in [*named, key_dir() / run_id]:
        key = _read_key(path)
        if key is not None and key_id(key) == wanted:
            return key
    return None


# ----------------------------------------------------------------- one file's chain


def _mac(key: bytes, *parts: bytes) -> str:
    return hmac.new(key, b"\0".join((b"budgetbench-chain", *parts)), hashlib.sha256).hexdigest()


def record_mac(key: bytes, kind: str, *parts: str) -> str:
    """The HMAC under the run's key of a record kept beside the logs (``kind``: a saved retrieval,
    a cache entry), so that none can be edited, moved, or pass for a record of another kind."""
    return _mac(key, kind.encode(), *(part.encode("utf-8", "surrogatepass") for part in parts))


def key_of(run_dir: Path, key_files: Iterable[Path] = ()) -> bytes:
    """The key of the run in ``run_dir``, for a command that adds to a finished run (judge-audit's
    replies in its cache); an IntegrityError when the directory or this machine has none."""
    record = read_record(run_dir)
    key = None if record is None else find_key(record["run_id"], record["key_id"], key_files)
    if key is None:
        raise IntegrityError(
            f"{run_dir}: no key for this run on this machine (no {INTEGRITY_FILE}, or its key is not in {key_dir()})"
        )
    return key


class Chain:
    """The running digest of one file, extended one line at a time."""

    def __init__(self, relative: str, key: bytes | None) -> None:
        self.relative = relative.encode("utf-8")
        self.key = key
        self.state = hashlib.sha256()
        self.size = 0

    def line(self, body: bytes) -> bytes:
        """``body`` (one JSON object) as the next line of the file, with its chain field."""
        assert self.key is not None and body.endswith(b"}") and body != b"{}"
        probe = self.state.copy()
        probe.update(body)
        digest = probe.hexdigest()
        tag = _mac(self.key, self.relative, digest.encode())
        line = body[:-1] + _HEAD + digest.encode() + _MIDDLE + tag.encode() + _TAIL + b"\n"
        self.feed(line)
        return line

    def feed(self, line: bytes) -> None:
        self.state.update(line)
        self.size += len(line)

    def check(self, line: bytes) -> str | None:
        """Why ``line`` (without its newline) is not the next line of this chain; None if it is."""
        match = _SUFFIX.fullmatch(line[-_SUFFIX_LENGTH:]) if len(line) > _SUFFIX_LENGTH else None
        if match is None:
            return "carries no chain digest (written by hand, or by a budgetbench before schema 3)"
        probe = self.state.copy()
        probe.update(line[:-_SUFFIX_LENGTH] + b"}")
        if probe.hexdigest() != match.group(1).decode():
            return "does not match the digest of what precedes it: the file was edited at or before this line"
        if self.key is not None and not hmac.compare_digest(
            _mac(self.key, self.relative, match.group(1)), match.group(2).decode()
        ):
            return "carries a digest made without this run's key: the line was forged or copied from another run"
        return None


# ----------------------------------------------------------------- the seal


def chained_files(run_dir: Path) -> list[Path]:
    """Every file a run's chain covers: the cell files, then the run-level logs present."""
    run_dir = Path(run_dir)
    cells = sorted((run_dir / "cells").glob("*/*/*/r*.jsonl"))
    return cells + [run_dir / name for name in RUN_LOGS if (run_dir / name).is_file()]


def read_record(run_dir: Path) -> dict[str, Any] | None:
    path = Path(run_dir) / INTEGRITY_FILE
    if not path.exists():
        return None
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise IntegrityError(f"{path}: not readable ({exc})") from None
    if not isinstance(record, dict) or not record.get("run_id") or not record.get("key_id"):
        raise IntegrityError(f"{path}: no run_id or key_id")
    return record


def _seal_mac(key: bytes, files: dict[str, Any]) -> str:
    return _mac(key, b"seal", json.dumps(files, sort_keys=True, separators=(",", ":")).encode())


def write_record(run_dir: Path, run_id: str, key: bytes, chains: dict[str, Chain] | None, sealed_at: str) -> None:
    """``integrity.json``: the run id, the key's fingerprint and (when ``chains`` is given) the seal."""
    record: dict[str, Any] = {"format": _FORMAT, "run_id": run_id, "key_id": key_id(key)}
    if chains is not None:
        files = {rel: {"bytes": c.size, "sha256": c.state.hexdigest()} for rel, c in sorted(chains.items())}
        record["sealed"] = {"at": sealed_at, "files": files, "hmac": _seal_mac(key, files)}
    path = Path(run_dir) / INTEGRITY_FILE
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(record, indent=2), encoding="utf-8")
    tmp.replace(path)


def new_record(run_dir: Path) -> tuple[str, bytes]:
    """A fresh run id and key for a run directory that has none yet."""
    run_id = uuid.uuid4().hex
    key = create_key(run_id)
    write_record(run_dir, run_id, key, None, "")
    return run_id, key


# ----------------------------------------------------------------- verification


@dataclass
class Verification:
    """What ``verify_run`` found. ``problems`` refuse the directory; ``notes`` do not."""

    run_dir: Path
    run_id: str | None = None
    key: bytes | None = None
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    chains: dict[str, Chain] = field(default_factory=dict)  # relative path -> chain at the file's end
    lines: int = 0

    @property
    def ok(self) -> bool:
        return not self.problems

    def refusal(self, what: str = "read") -> str:
        shown = "; ".join(self.problems[:_SHOWN])
        more = f" (and {len(self.problems) - _SHOWN} more)" if len(self.problems) > _SHOWN else ""
        return f"{self.run_dir}: refusing to {what} a run directory that does not verify: {shown}{more}"


def _cell_key(event: dict[str, Any]) -> tuple:
    return (event.get("task"), event.get("strategy"), event.get("budget"), event.get("repeat"), event.get("item_id"))


def verify_run(
    run_dir: Path, key_files: Sequence[Path] = (), run_key: str | None = None, need_key: bool = True
) -> Verification:
    """Check every chained file of ``run_dir`` line by line, and the seal.

    Problems: a line without a chain digest or whose digest does not follow (edited, forged,
    copied from another run), a sealed file shortened, changed or deleted, a row without
    ``run_key`` or with another one than ``run_key`` (when given), a second terminal row for a
    cell that already had a final one, no key on this machine (when ``need_key``), and (with the
    key) a saved retrieval or a cache entry that does not verify under it. A torn last line and
    lines written after the seal (an invocation killed with -9) are notes."""
    run_dir = Path(run_dir)
    found = Verification(run_dir)
    files = chained_files(run_dir)
    try:
        record = read_record(run_dir)
    except IntegrityError as exc:
        found.problems.append(str(exc))
        return found
    if record is None:
        if files:
            found.problems.append(
                f"{run_dir / INTEGRITY_FILE}: missing, so no line of this run can be verified "
                f"(a run directory made by a budgetbench before schema 3, or assembled by hand)"
            )
        return found
    found.run_id = record["run_id"]
    found.key = find_key(record["run_id"], record["key_id"], key_files)
    if found.key is None and need_key:
        found.problems.append(
            f"this machine has no key for run {record['run_id']} (looked in {key_dir() / record['run_id']}): "
            f"copy that file from the machine that made the run, or pass --key-file (or set {KEY_ENV})"
        )
    seal = record.get("sealed") or {}
    sealed = seal.get("files") or {}
    if seal and found.key is not None and not hmac.compare_digest(_seal_mac(found.key, sealed), seal.get("hmac", "")):
        found.problems.append(f"{run_dir / INTEGRITY_FILE}: the seal was edited (its HMAC does not match)")
    present = {path.relative_to(run_dir).as_posix() for path in files}
    for relative in sorted(set(sealed) - present):
        found.problems.append(f"{run_dir / relative}: sealed at the end of the run, now missing")
    final: dict[tuple, str] = {}
    for path in files:
        relative = path.relative_to(run_dir).as_posix()
        _verify_file(path, relative, sealed.get(relative), found, run_key, final)
    if found.key is not None:
        found.problems += retrieval_problems(run_dir, found.key)
    return found


# ----------------------------------------------------------------- saved retrievals

RETRIEVALS = "retrievals"
MAC_FIELD = "mac"


def retrieval_mac(key: bytes, run_dir: Path, path: Path, record: dict[str, Any]) -> str:
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
    if not hmac.compare_digest(mac, retrieval_mac(key, run_dir, path, saved)):
        raise IntegrityError(
            f"{path}: a saved retrieval that does not verify under this run's key "
            f"(edited, or copied from another run or item)"
        )
    return saved


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


def _verify_file(
    path: Path,
    relative: str,
    sealed: dict[str, Any] | None,
    found: Verification,
    run_key: str | None,
    final: dict[tuple, str],
) -> None:
    data = path.read_bytes()
    chain = Chain(relative, found.key)
    found.chains[relative] = chain
    lines = data.split(b"\n")
    if lines[-1]:
        found.notes.append(f"{path}: a torn last line (a write cut short by a kill) is left out")
    is_cell = relative.startswith("cells/")
    broken = False
    seal_met = sealed is None
    foreign: list[int] = []  # lines of another run_key, or none
    what = ""
    for number, line in enumerate(lines[:-1], start=1):
        seal_met = seal_met or _meets_seal(chain, sealed, path, number, found)
        if not broken:
            why = chain.check(line)
            if why:
                found.problems.append(f"{path}: line {number} {why}")
                broken = True  # every later digest depends on this one: one problem per file
        chain.feed(line + b"\n")
        found.lines += 1
        try:
            event = json.loads(line)
        except (UnicodeDecodeError, json.JSONDecodeError):
            found.problems.append(f"{path}: line {number} is not valid JSON")
            continue
        if not isinstance(event, dict):
            found.problems.append(f"{path}: line {number} is not a JSON object")
            continue
        if run_key is not None and event.get("run_key") != run_key:
            foreign.append(number)
            if len(foreign) == 1:
                what = f"run_key {event['run_key']!r}" if event.get("run_key") else "no run_key"
        if is_cell and event.get("event") in TERMINAL_EVENTS:
            cell = _cell_key(event)
            before = final.get(cell)
            if before is not None and before != "error":
                found.problems.append(
                    f"{path}: line {number} is a second terminal row ({event.get('event')}) for item "
                    f"{event.get('item_id')!r}, which already had its {before} row"
                )
            final[cell] = event.get("event") or ""
    if foreign:
        more = f" (and {len(foreign) - 1} more lines)" if len(foreign) > 1 else ""
        found.problems.append(f"{path}: line {foreign[0]}{more} carries {what}, not this run's {run_key!r}")
    seal_met = seal_met or _meets_seal(chain, sealed, path, len(lines), found)
    if not seal_met:
        found.problems.append(
            f"{path}: {chain.size} bytes, not the {sealed['bytes']} bytes it had when it was sealed"  # type: ignore[index]
        )
    elif sealed is not None and chain.size > int(sealed["bytes"]):
        found.notes.append(f"{path}: lines after byte {sealed['bytes']} were written after the last seal")
    elif sealed is None and found.key is not None:
        found.notes.append(f"{path}: not sealed yet (written by an invocation that did not finish)")


def _meets_seal(chain: Chain, sealed: dict[str, Any] | None, path: Path, number: int, found: Verification) -> bool:
    """True when the file read so far ends where the seal says it ended (a problem if its digest differs)."""
    if sealed is None or chain.size != sealed.get("bytes"):
        return False
    if chain.state.hexdigest() != sealed.get("sha256"):
        found.problems.append(
            f"{path}: the lines before line {number} differ from the file sealed at the end of the run"
        )
    return True
