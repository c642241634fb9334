"""SWE-bench loader: the official JSONL, the same rows as JSON and parquet, and bad rows."""

from __future__ import annotations

import json
from pathlib import Path

import pandas
import pytest
from budgetbench_task_swebench.data import load_instances
from budgetbench_task_swebench.task import SWEBenchVerified

from budgetbench_core import TaskDataError

ROOT = Path(__file__).resolve().parents[3]
SAMPLE = ROOT.parent / "shared" / "data" / "swebench" / "swebench_verified_mini.jsonl"
needs_data = pytest.mark.skipif(not SAMPLE.is_file(), reason=f"shared data not found at {SAMPLE}")


def _raw():
    return [json.loads(line) for line in SAMPLE.read_text(encoding="utf-8").splitlines() if line.strip()]


@needs_data
def test_official_jsonl_loads_with_test_lists_decoded():
    instances, raw = load_instances(SAMPLE), _raw()
    assert len(instances) == len(raw) == 40
    for instance, row in zip(instances, raw):
        assert instance.instance_id == row["instance_id"] and instance.patch == row["patch"]
        assert list(instance.FAIL_TO_PASS) == json.loads(row["FAIL_TO_PASS"]) and instance.FAIL_TO_PASS
        assert list(instance.PASS_TO_PASS) == json.loads(row["PASS_TO_PASS"])


@needs_data
def test_json_and_parquet_give_the_same_instances(tmp_path):
    raw = _raw()
    as_json = tmp_path / "verified.json"
    as_json.write_text(json.dumps(raw), encoding="utf-8")
    as_parquet = tmp_path / "test-00000-of-00001.parquet"
    pandas.DataFrame(raw).to_parquet(as_parquet)
    expected = load_instances(SAMPLE)
    assert load_instances(as_json) == expected
    assert load_instances(as_parquet) == expected


@needs_data
def test_items_without_repo_cache_hold_issue_and_hints_only():
    task = SWEBenchVerified(path=str(SAMPLE))
    items = list(task.load(None, 0))
    raw = {row["instance_id"]: row for row in _raw()}
    for item in items:
        row = raw[item.id]
        kinds = [m.metadata["kind"] for m in item.history]
        assert kinds == (["hints", "issue"] if row["hints_text"].strip() else ["issue"])
        assert item.history[-1].content.endswith(row["problem_statement"])
        assert item.answer == row["patch"] and item.category == row["repo"]
        assert item.metadata["context_files"] == []
    notes = task.manifest_notes()
    assert notes["repository_files"]["included"] is False
    assert "problem statement and hints only" in notes["repository_files"]["note"]
    assert "not the resolved rate" in notes["quality"]


@needs_data
def test_limit_is_seeded_and_takes_repositories_in_turn():
    first = [i.category for i in SWEBenchVerified(path=str(SAMPLE)).load(4, 3)]
    assert sorted(first) == ["django/django"] * 2 + ["sphinx-doc/sphinx"] * 2
    ids = [i.id for i in SWEBenchVerified(path=str(SAMPLE)).load(4, 3)]
    assert ids == [i.id for i in SWEBenchVerified(path=str(SAMPLE)).load(4, 3)]
    assert ids != [i.id for i in SWEBenchVerified(path=str(SAMPLE)).load(4, 4)]


def _row(**changes):
    row = {
        "repo": "o/r",
        "instance_id": "o__r-1",
        "base_commit": "abc",
        "patch": "diff",
        "problem_statement": "bug",
        "hints_text": "",
        "FAIL_TO_PASS": '["t1"]',
        "PASS_TO_PASS": "[]",
    }
    row.update(changes)
    return {k: v for k, v in row.items() if v is not None}


@pytest.mark.parametrize(
    "name, content, message",
    [
        (
            "a.jsonl",
            json.dumps(_row()) + "\n" + json.dumps(_row(instance_id="o__r-2", patch=None)),
            r"a.jsonl: row 1: field 'patch' is missing",
        ),
        (
            "a.jsonl",
            json.dumps(_row(FAIL_TO_PASS="[not json")),
            r"row 0 \(instance_id 'o__r-1'\): field 'FAIL_TO_PASS' is not a JSON-encoded list",
        ),
        ("a.jsonl", json.dumps(_row(PASS_TO_PASS='{"a": 1}')), r"field 'PASS_TO_PASS' must be a list of test names"),
        ("a.jsonl", json.dumps(_row(PASS_TO_PASS=None)), r"field 'PASS_TO_PASS' is missing"),
        ("a.jsonl", json.dumps(_row(hints_text=3)), r"field 'hints_text' must be a string"),
        ("a.jsonl", json.dumps(_row(base_commit="")), r"field 'base_commit' must be a non-empty string"),
        ("a.jsonl", json.dumps(_row()) + "\n{oops", r"a.jsonl: row 1 \(line 2\) is not valid JSON"),
        (
            "a.jsonl",
            json.dumps(_row()) + "\n" + json.dumps(_row()),
            r"row 1: field 'instance_id' 'o__r-1' repeats row 0",
        ),
        ("a.json", json.dumps({"instances": []}), r"expected a JSON list of instances"),
        ("a.json", json.dumps(["x"]), r"a.json: row 0: expected an object"),
        ("a.csv", "repo,instance_id", r"unsupported file type '.csv'"),
        ("a.parquet", "not parquet", r"a.parquet: could not be read as .parquet"),
    ],
)
def test_malformed_rows_name_file_row_and_field(tmp_path, name, content, message):
    path = tmp_path / name
    path.write_text(content, encoding="utf-8")
    with pytest.raises(TaskDataError, match=message):
        list(SWEBenchVerified(path=str(path)).load(None, 0))


def test_bad_options_are_clear(tmp_path):
    with pytest.raises(ValueError, match="unknown options"):
        SWEBenchVerified(repo_dir=str(tmp_path))
    with pytest.raises(ValueError, match="repo_cache .* is not a folder"):
        SWEBenchVerified(repo_cache=str(tmp_path / "nowhere"))
    with pytest.raises(ValueError, match="max_files must be a positive integer"):
        SWEBenchVerified(max_files=0)


def test_registered_through_the_entry_point():
    from budgetbench_core.testing import entry_point

    module = entry_point("budgetbench-task-swebench").load()  # exactly one, named after the distribution
    registered = []
    module.register_tasks(registered.append)
    module.register_graders(registered.append)
    assert [cls.__name__ for cls in registered] == ["SWEBenchVerified", "PatchSimilarity"]
    import click

    group = click.Group()
    module.register_commands(group)
    assert list(group.commands) == ["swebench"] and list(group.commands["swebench"].commands) == ["export"]


@needs_data
def test_without_path_the_fetched_parquet_is_read_else_a_hand_placed_jsonl(tmp_path, monkeypatch):
    monkeypatch.setenv("BUDGETBENCH_DATA_DIR", str(tmp_path))
    folder = tmp_path / "swebench"
    folder.mkdir()
    with pytest.raises(TaskDataError, match="data fetch swebench-verified"):
        list(SWEBenchVerified().load(None, 0))
    (folder / "swebench_verified.jsonl").write_text(SAMPLE.read_text(encoding="utf-8"), encoding="utf-8")
    from_jsonl = [item.id for item in SWEBenchVerified().load(3, 0)]
    raw = _raw()[:5]
    pandas.DataFrame(raw).to_parquet(folder / "swebench_verified.parquet")  # the file `data fetch` writes
    task = SWEBenchVerified()
    from_parquet = [item.id for item in task.load(None, 0)]
    assert from_parquet == [row["instance_id"] for row in raw]
    assert task.manifest_notes()["data_file"].endswith("swebench_verified.parquet")
    assert len(from_jsonl) == 3
