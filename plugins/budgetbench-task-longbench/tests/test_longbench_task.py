"""LongBench v2 task: loader, chunking, selection and manifest notes on the shared sample."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from budgetbench_task_longbench.chunking import chunk_text, count_tokens
from budgetbench_task_longbench.data import load_records
from budgetbench_task_longbench.task import ANSWER_FORMAT, LongBenchV2

from budgetbench_core import TaskDataError

ROOT = Path(__file__).resolve().parents[3]
SAMPLE = ROOT.parent / "shared" / "data" / "longbench_v2" / "longbench_v2_short_sample.json"
needs_data = pytest.mark.skipif(not SAMPLE.is_file(), reason=f"shared data not found at {SAMPLE}")


@pytest.fixture(scope="module")
def items():
    return list(LongBenchV2(path=str(SAMPLE)).load(None, 0))


@needs_data
def test_loader_reads_the_official_file_unchanged():
    records = load_records(SAMPLE)
    raw = json.loads(SAMPLE.read_text(encoding="utf-8"))
    assert len(records) == len(raw) == 50
    for record, row in zip(records, raw):
        assert record.id == row["_id"] and record.answer == row["answer"] and record.context == row["context"]
        assert record.choices == {k: row[f"choice_{k}"] for k in "ABCD"}


@needs_data
def test_items_have_chunks_question_last_and_categories(items):
    raw = {row["_id"]: row for row in json.loads(SAMPLE.read_text(encoding="utf-8"))}
    item = items[0]
    row = raw[item.id]
    assert "".join(m.content for m in item.history) == row["context"]
    assert [m.metadata["chunk_index"] for m in item.history] == list(range(len(item.history)))
    assert len({m.metadata["session_id"] for m in item.history}) == len(item.history)
    assert item.query.content.startswith(f"What is the correct answer to this question: {row['question']}")
    for letter in "ABCD":
        assert f"({letter}) {row['choice_' + letter]}" in item.query.content
    assert item.query.content.endswith(ANSWER_FORMAT)
    assert item.category == row["difficulty"]
    assert item.metadata["categories"] == {
        "difficulty": row["difficulty"],
        "length": row["length"],
        "domain": row["domain"],
    }
    by_domain = list(LongBenchV2(path=str(SAMPLE), category="domain").load(10, 0))
    assert all(i.category == raw[i.id]["domain"] for i in by_domain)
    assert len({i.category for i in by_domain}) == len({r["domain"] for r in raw.values()}) == 5


@needs_data
def test_chunks_have_the_fixed_token_size_and_join_back(items):
    context = "".join(m.content for m in items[1].history)
    for size in (128, 512, 2000):
        chunks, total = chunk_text(context, size)
        assert "".join(chunks) == context
        assert len(chunks) == math.ceil(total / size)
        # Re-encoding a slice can merge or split a token at its edges, nothing more.
        assert all(abs(count_tokens(c) - size) <= 3 for c in chunks[:-1])


def test_chunk_cuts_never_split_a_character():
    text = "Ünïcödé 日本語のテキスト 🙂🙂 done. " * 20
    for size in range(1, 9):
        chunks, _ = chunk_text(text, size)
        assert "".join(chunks) == text and all(chunks)


@needs_data
def test_defect_05_chunking_does_not_depend_on_anything_but_chunk_tokens(items):
    again = {i.id: i for i in LongBenchV2(path=str(SAMPLE), category="length").load(3, 7)}
    for item in items:
        if item.id in again:
            assert [m.content for m in again[item.id].history] == [m.content for m in item.history]
    smaller = {i.id: i for i in LongBenchV2(path=str(SAMPLE), chunk_tokens=256).load(None, 0)}
    assert all(len(smaller[i.id].history) > len(i.history) for i in items)


@needs_data
def test_limit_is_seeded_and_takes_categories_in_turn():
    first = [i.id for i in LongBenchV2(path=str(SAMPLE)).load(6, 1)]
    assert first == [i.id for i in LongBenchV2(path=str(SAMPLE)).load(6, 1)]
    assert first != [i.id for i in LongBenchV2(path=str(SAMPLE)).load(6, 2)]
    categories = [i.category for i in LongBenchV2(path=str(SAMPLE)).load(6, 1)]
    assert categories.count("easy") == categories.count("hard") == 3


@needs_data
def test_max_natural_tokens_selects_and_labels(items, tmp_path):
    subset = tmp_path / "subset.json"  # the first 8 official rows: the same checks, less chunking
    subset.write_text(json.dumps(json.loads(SAMPLE.read_text(encoding="utf-8"))[:8]), encoding="utf-8")
    sizes = sorted(i.metadata["natural_tokens"] for i in items[:8])
    cut = sizes[4]
    task = LongBenchV2(path=str(subset), max_natural_tokens=cut)
    chosen = list(task.load(None, 0))
    assert len(chosen) == 5 and all(i.metadata["natural_tokens"] <= cut for i in chosen)
    notes = task.manifest_notes()
    assert notes["selection_conditioned"] is True
    assert notes["items_fitting"] == 5 and notes["items_in_file"] == 8 and notes["items_selected"] == 5
    assert notes["selection"]["max_natural_tokens"] == cut and "selection-conditioned" in notes["selection"]["label"]
    unrestricted = LongBenchV2(path=str(subset))
    list(unrestricted.load(2, 0))
    assert unrestricted.manifest_notes()["selection_conditioned"] is False
    with pytest.raises(TaskDataError, match=f"smallest needs {sizes[0]}"):
        list(LongBenchV2(path=str(subset), max_natural_tokens=sizes[0] - 1).load(None, 0))


def _write(tmp_path, rows):
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(rows), encoding="utf-8")
    return path


def _row(**changes):
    row = {
        "_id": "x1",
        "domain": "d",
        "sub_domain": "s",
        "difficulty": "easy",
        "length": "short",
        "question": "q?",
        "choice_A": "a",
        "choice_B": "b",
        "choice_C": "c",
        "choice_D": "d",
        "answer": "B",
        "context": "text",
    }
    row.update(changes)
    return {k: v for k, v in row.items() if v is not None}


@pytest.mark.parametrize(
    "rows, message",
    [
        ([_row(), _row(_id="x2", choice_C=None)], r"bad.json: row 1: field 'choice_C' is missing"),
        ([_row(answer="E")], r"row 0 \(_id 'x1'\): field 'answer' must be one of A, B, C, D"),
        ([_row(context=5)], r"row 0: field 'context' must be a string"),
        ([_row(), _row()], r"row 1: field '_id' 'x1' repeats row 0"),
        ({"not": "a list"}, r"expected a JSON list"),
        (["text"], r"row 0: expected a JSON object"),
    ],
)
def test_malformed_rows_name_file_row_and_field(tmp_path, rows, message):
    with pytest.raises(TaskDataError, match=message):
        list(LongBenchV2(path=str(_write(tmp_path, rows))).load(None, 0))


def test_bad_options_and_missing_file_are_clear(tmp_path):
    with pytest.raises(ValueError, match="category must be one of"):
        LongBenchV2(category="sub_domain")
    with pytest.raises(ValueError, match="unknown options"):
        LongBenchV2(chunk_size=5)
    with pytest.raises(ValueError, match="chunk_tokens must be a positive"):
        LongBenchV2(chunk_tokens=0)
    with pytest.raises(TaskDataError, match="data file not found"):
        list(LongBenchV2(path=str(tmp_path / "missing.json")).load(None, 0))


def test_registered_through_the_entry_point():
    from budgetbench_core.testing import entry_point

    module = entry_point("budgetbench-task-longbench").load()  # exactly one, named after the distribution
    registered = []
    module.register_tasks(registered.append)
    module.register_graders(registered.append)
    assert [cls.__name__ for cls in registered] == ["LongBenchV2", "LongBenchChoice"]
