"""Reading the official LongMemEval files unchanged, one record at a time.

Every official file is one JSON list; LongMemEval_M is several gigabytes, so records are
streamed with ijson instead of loaded whole. Each record is checked before use and a bad
one stops the load with an error naming the file, the record index, its question_id and
the first bad field.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import ijson

from budgetbench_core import TaskDataError

QUESTION_TYPES = (
    "single-session-user",
    "single-session-assistant",
    "single-session-preference",
    "multi-session",
    "temporal-reasoning",
    "knowledge-update",
)

# --task-option split=<key> picks the official file name inside the data folder.
SPLITS = {
    "s": "longmemeval_s.json",
    "s_cleaned": "longmemeval_s_cleaned.json",
    "m": "longmemeval_m.json",
    "m_cleaned": "longmemeval_m_cleaned.json",
    "oracle": "longmemeval_oracle.json",
}

DATE_FORMAT = "%Y/%m/%d (%a) %H:%M"  # e.g. "2023/05/20 (Sat) 02:21", as in every official file


def is_abstention(question_id: str) -> bool:
    """The official rule (evaluate_qa.py): abstention questions have ``_abs`` in their id."""
    return "_abs" in question_id


def parse_date(text: str) -> datetime:
    return datetime.strptime(text, DATE_FORMAT)


def iter_raw(path: Path) -> Iterator[tuple[int, Any]]:
    """(index, record) for each element of the top-level JSON list, streamed."""
    with open(path, "rb") as handle:
        head = handle.read(64).lstrip()
        if not head.startswith(b"["):
            raise TaskDataError(f"{path}: expected a JSON list of LongMemEval records (the official format)")
        handle.seek(0)
        index = -1
        try:
            for index, record in enumerate(ijson.items(handle, "item", use_float=True)):
                yield index, record
        except ijson.JSONError as exc:
            raise TaskDataError(f"{path}: invalid JSON after record {index}: {exc}") from None


def check_record(path: Path, index: int, record: Any) -> dict[str, Any]:
    """The record, if it has every field the task uses with the right type; else TaskDataError."""
    qid = record.get("question_id") if isinstance(record, dict) else None

    def fail(field: str, problem: str) -> TaskDataError:
        return TaskDataError(f"{path}: record {index} (question_id {qid!r}): field {field!r} {problem}")

    if not isinstance(record, dict):
        raise fail("<record>", f"must be a JSON object, got {type(record).__name__}")
    for field in ("question_id", "question", "question_date"):
        if not isinstance(record.get(field), str) or not record[field].strip():
            raise fail(field, "is missing or not a non-empty string")
    if record.get("question_type") not in QUESTION_TYPES:
        raise fail("question_type", f"must be one of {list(QUESTION_TYPES)}, got {record.get('question_type')!r}")
    answer = record.get("answer")
    if isinstance(answer, bool) or not isinstance(answer, (str, int, float)) or str(answer).strip() == "":
        raise fail("answer", f"must be a non-empty string or number, got {answer!r}")
    try:
        parse_date(record["question_date"])
    except ValueError:
        raise fail(
            "question_date", f"must look like '2023/05/20 (Sat) 02:21', got {record['question_date']!r}"
        ) from None
    sessions, dates, ids = (record.get(f) for f in ("haystack_sessions", "haystack_dates", "haystack_session_ids"))
    for field, value in (("haystack_sessions", sessions), ("haystack_dates", dates), ("haystack_session_ids", ids)):
        if not isinstance(value, list):
            raise fail(field, f"must be a list, got {type(value).__name__}")
    if not len(sessions) == len(dates) == len(ids):
        raise fail(
            "haystack_sessions",
            f"has {len(sessions)} sessions but {len(dates)} haystack_dates and {len(ids)} haystack_session_ids",
        )
    for s, (session, date, sid) in enumerate(zip(sessions, dates, ids)):
        if not isinstance(sid, str) or not sid:
            raise fail(f"haystack_session_ids[{s}]", "must be a non-empty string")
        try:
            parse_date(date)
        except (TypeError, ValueError):
            raise fail(f"haystack_dates[{s}]", f"must look like '2023/05/20 (Sat) 02:21', got {date!r}") from None
        if not isinstance(session, list):
            raise fail(f"haystack_sessions[{s}]", "must be a list of turns")
        for t, turn in enumerate(session):
            where = f"haystack_sessions[{s}][{t}]"
            if not isinstance(turn, dict):
                raise fail(where, "must be an object with role and content")
            if turn.get("role") not in ("user", "assistant"):
                raise fail(where + ".role", f"must be 'user' or 'assistant', got {turn.get('role')!r}")
            if not isinstance(turn.get("content"), str):
                raise fail(where + ".content", "must be a string")
            if not isinstance(turn.get("has_answer", False), bool):
                raise fail(where + ".has_answer", "must be true or false when present")
    answer_ids = record.get("answer_session_ids", [])
    if not isinstance(answer_ids, list) or not all(isinstance(a, str) for a in answer_ids):
        raise fail("answer_session_ids", "must be a list of strings when present")
    return record


def round_robin(types: list[tuple[int, str]], limit: int, seed: int) -> list[int]:
    """``limit`` record indices taken in turn from each question type, shuffled with ``seed``.

    Types are visited in the official order; a type that runs out is skipped, so a small
    limit covers every type before repeating one.
    """
    rng = random.Random(f"longmemeval:{seed}")
    pools = []
    for qtype in QUESTION_TYPES:
        pool = [index for index, t in types if t == qtype]
        rng.shuffle(pool)
        pools.append(pool)
    chosen: list[int] = []
    while len(chosen) < limit and any(pools):
        for pool in pools:
            if pool and len(chosen) < limit:
                chosen.append(pool.pop(0))
    return chosen


def load_records(path: Path, limit: int | None, seed: int) -> Iterator[tuple[int, dict[str, Any]]]:
    """Checked (index, record) pairs: all in file order, or a round-robin selection of ``limit``.

    Every record is checked even when only a few are selected, so a malformed file is
    never half-used. Duplicate question ids are an error.
    """
    seen: dict[str, int] = {}

    def checked(index: int, record: Any) -> dict[str, Any]:
        record = check_record(path, index, record)
        qid = record["question_id"]
        if qid in seen:
            raise TaskDataError(f"{path}: record {index}: field 'question_id' {qid!r} repeats record {seen[qid]}")
        seen[qid] = index
        return record

    if limit is None:
        for index, record in iter_raw(path):
            yield index, checked(index, record)
        return
    types = [(index, checked(index, record)["question_type"]) for index, record in iter_raw(path)]
    order = round_robin(types, limit, seed)
    wanted = set(order)
    picked = {index: record for index, record in iter_raw(path) if index in wanted}
    for index in order:
        yield index, picked[index]
