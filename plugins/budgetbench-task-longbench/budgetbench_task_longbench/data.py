"""Reading the official LongBench v2 JSON file unchanged, with clear errors on bad rows."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from budgetbench_core import TaskDataError

CHOICES = ("A", "B", "C", "D")
TEXT_FIELDS = (
    "_id",
    "domain",
    "sub_domain",
    "difficulty",
    "length",
    "question",
    "context",
    *(f"choice_{letter}" for letter in CHOICES),
)


@dataclass(frozen=True)
class Record:
    """One LongBench v2 question, exactly as the official file states it."""

    id: str
    domain: str
    sub_domain: str
    difficulty: str
    length: str
    question: str
    choices: dict[str, str]
    answer: str
    context: str


def _record(path: Path, index: int, row: object) -> Record:
    where = f"{path}: row {index}"
    if not isinstance(row, dict):
        raise TaskDataError(f"{where}: expected a JSON object, got {type(row).__name__}")
    for name in (*TEXT_FIELDS, "answer"):
        if name not in row:
            raise TaskDataError(f"{where}: field {name!r} is missing")
        if not isinstance(row[name], str):
            raise TaskDataError(f"{where}: field {name!r} must be a string, got {type(row[name]).__name__}")
    where = f"{path}: row {index} (_id {row['_id']!r})"
    if row["answer"] not in CHOICES:
        raise TaskDataError(f"{where}: field 'answer' must be one of A, B, C, D, got {row['answer']!r}")
    for name in ("_id", "question", "context"):
        if not row[name].strip():
            raise TaskDataError(f"{where}: field {name!r} is empty")
    return Record(
        id=row["_id"],
        domain=row["domain"],
        sub_domain=row["sub_domain"],
        difficulty=row["difficulty"],
        length=row["length"],
        question=row["question"],
        choices={letter: row[f"choice_{letter}"] for letter in CHOICES},
        answer=row["answer"],
        context=row["context"],
    )


def load_records(path: Path) -> list[Record]:
    """All records of an official LongBench v2 file (a JSON list); duplicate ids are an error."""
    try:
        rows = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise TaskDataError(f"{path}: not a readable JSON file ({exc})") from None
    if not isinstance(rows, list):
        raise TaskDataError(f"{path}: expected a JSON list of questions, got {type(rows).__name__}")
    records = [_record(Path(path), index, row) for index, row in enumerate(rows)]
    seen: dict[str, int] = {}
    for index, record in enumerate(records):
        if record.id in seen:
            raise TaskDataError(f"{path}: row {index}: field '_id' {record.id!r} repeats row {seen[record.id]}")
        seen[record.id] = index
    return records
