"""Reading official SWE-bench instance files (JSON, JSONL or parquet) unchanged.

``FAIL_TO_PASS`` and ``PASS_TO_PASS`` are JSON-encoded lists of test names in the
official files; they are decoded here (a list already decoded is accepted too).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from budgetbench_core import TaskDataError

REQUIRED_TEXT = ("repo", "instance_id", "base_commit", "patch", "problem_statement")
OPTIONAL_TEXT = ("hints_text", "test_patch", "version", "created_at", "environment_setup_commit")
TEST_LISTS = ("FAIL_TO_PASS", "PASS_TO_PASS")


@dataclass(frozen=True)
class Instance:
    """One SWE-bench task instance, fields as the official schema names them."""

    instance_id: str
    repo: str
    base_commit: str
    patch: str
    problem_statement: str
    hints_text: str
    test_patch: str
    version: str
    created_at: str
    environment_setup_commit: str
    FAIL_TO_PASS: tuple[str, ...]
    PASS_TO_PASS: tuple[str, ...]


def _rows(path: Path) -> list[Any]:
    suffix = path.suffix.lower()
    try:
        if suffix == ".parquet":
            import pandas

            frame = pandas.read_parquet(path)
            return [
                {k: (v.tolist() if hasattr(v, "tolist") else v) for k, v in row.items()}
                for row in frame.to_dict(orient="records")
            ]
        text = path.read_text(encoding="utf-8")
        if suffix == ".jsonl":
            rows = []
            for number, line in enumerate(text.splitlines()):
                if line.strip():
                    try:
                        rows.append(json.loads(line))
                    except json.JSONDecodeError as exc:
                        raise TaskDataError(
                            f"{path}: row {number} (line {number + 1}) is not valid JSON ({exc})"
                        ) from None
            return rows
        if suffix == ".json":
            rows = json.loads(text)
            if not isinstance(rows, list):
                raise TaskDataError(f"{path}: expected a JSON list of instances, got {type(rows).__name__}")
            return rows
    except TaskDataError:
        raise
    except Exception as exc:
        raise TaskDataError(
            f"{path}: could not be read as {suffix or 'a data file'} ({type(exc).__name__}: {exc})"
        ) from None
    raise TaskDataError(f"{path}: unsupported file type {suffix!r}; use .json, .jsonl or .parquet")


def _test_list(where: str, name: str, value: Any) -> tuple[str, ...]:
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as exc:
            raise TaskDataError(f"{where}: field {name!r} is not a JSON-encoded list ({exc})") from None
    if not isinstance(value, list) or not all(isinstance(test, str) for test in value):
        raise TaskDataError(f"{where}: field {name!r} must be a list of test names")
    return tuple(value)


def _instance(path: Path, index: int, row: Any) -> Instance:
    where = f"{path}: row {index}"
    if not isinstance(row, dict):
        raise TaskDataError(f"{where}: expected an object, got {type(row).__name__}")
    for name in REQUIRED_TEXT:
        if not isinstance(row.get(name), str) or not row[name].strip():
            problem = "is missing" if name not in row else f"must be a non-empty string, got {row[name]!r:.60}"
            raise TaskDataError(f"{where}: field {name!r} {problem}")
    where = f"{path}: row {index} (instance_id {row['instance_id']!r})"
    optional = {}
    for name in OPTIONAL_TEXT:
        value = row.get(name)
        if value is not None and not isinstance(value, str):
            raise TaskDataError(f"{where}: field {name!r} must be a string, got {type(value).__name__}")
        optional[name] = value or ""
    missing = [name for name in TEST_LISTS if name not in row]
    if missing:
        raise TaskDataError(f"{where}: field {missing[0]!r} is missing")
    tests = {name: _test_list(where, name, row[name]) for name in TEST_LISTS}
    return Instance(
        instance_id=row["instance_id"],
        repo=row["repo"],
        base_commit=row["base_commit"],
        patch=row["patch"],
        problem_statement=row["problem_statement"],
        **optional,
        **tests,
    )


def load_instances(path: Path) -> list[Instance]:
    """All instances of an official file; a repeated ``instance_id`` is an error."""
    instances = [_instance(Path(path), index, row) for index, row in enumerate(_rows(Path(path)))]
    seen: dict[str, int] = {}
    for index, instance in enumerate(instances):
        if instance.instance_id in seen:
            raise TaskDataError(
                f"{path}: row {index}: field 'instance_id' {instance.instance_id!r} "
                f"repeats row {seen[instance.instance_id]}"
            )
        seen[instance.instance_id] = index
    return instances
