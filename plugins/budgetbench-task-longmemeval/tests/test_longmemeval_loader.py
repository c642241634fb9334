"""The loader on the real official files, and its errors on malformed copies of them."""

import json
from collections import Counter
from pathlib import Path

import pytest
from budgetbench_task_longmemeval.loader import QUESTION_TYPES, load_records
from budgetbench_task_longmemeval.task import LongMemEval

from budgetbench_core import TaskDataError

DATA = Path(__file__).resolve().parents[3] / ".." / "shared" / "data" / "longmemeval"
SAMPLE = DATA / "longmemeval_s_sample.json"
ORACLE = DATA / "longmemeval_oracle.json"

pytestmark = pytest.mark.skipif(
    not SAMPLE.is_file() or not ORACLE.is_file(),
    reason=f"LongMemEval data not found in {DATA} (see ../shared/data/README.md)",
)


def test_all_records_of_the_official_files_load():
    oracle = list(LongMemEval(path=str(ORACLE)).load(None, 0))
    assert len(oracle) == 500
    assert Counter(i.category for i in oracle).keys() == set(QUESTION_TYPES)
    sample = list(LongMemEval(path=str(SAMPLE)).load(None, 0))
    assert len(sample) == 56
    assert sum(i.metadata["abstention"] for i in sample) == 8
    assert all(("_abs" in i.id) == i.metadata["abstention"] for i in sample)
    raw = json.loads(SAMPLE.read_text())
    assert [i.id for i in sample] == [r["question_id"] for r in raw]  # file order without a limit


def test_limit_is_round_robin_across_types_and_seeded():
    task = LongMemEval(path=str(SAMPLE))
    six = list(task.load(6, 0))
    assert [i.category for i in six] == list(QUESTION_TYPES)
    again = [i.id for i in task.load(6, 0)]
    assert again == [i.id for i in six]
    other_seeds = {tuple(i.id for i in task.load(6, seed)) for seed in range(1, 6)}
    assert any(ids != tuple(again) for ids in other_seeds)
    twelve = Counter(i.category for i in task.load(12, 3))
    assert set(twelve.values()) == {2}
    everything = list(task.load(1000, 0))
    assert len(everything) == 56 and len({i.id for i in everything}) == 56


def test_data_dir_and_split_resolve_the_official_file_name(tmp_path, monkeypatch):
    (tmp_path / "longmemeval").mkdir()
    (tmp_path / "longmemeval" / "longmemeval_oracle.json").symlink_to(ORACLE)
    monkeypatch.setenv("BUDGETBENCH_DATA_DIR", str(tmp_path))
    assert LongMemEval(split="oracle").path.name == "longmemeval_oracle.json"
    with pytest.raises(TaskDataError, match="longmemeval_s.json"):
        LongMemEval()
    with pytest.raises(ValueError, match="split must be one of"):
        LongMemEval(split="xl")


def _broken_copy(tmp_path, index, change):
    records = json.loads(ORACLE.read_text())[:5]
    change(records[index])
    path = tmp_path / "broken.json"
    path.write_text(json.dumps(records))
    return path, records[index]["question_id"]


@pytest.mark.parametrize(
    "change, field",
    [
        (lambda r: r.pop("question_date"), "'question_date'"),
        (lambda r: r.update(question_type="open-domain"), "'question_type'"),
        (lambda r: r.update(answer=None), "'answer'"),
        (lambda r: r["haystack_dates"].pop(), "'haystack_sessions'"),
        (lambda r: r["haystack_dates"].__setitem__(0, "May 20"), "'haystack_dates[0]'"),
        (lambda r: r["haystack_sessions"][0][1].update(role="bot"), "'haystack_sessions[0][1].role'"),
        (lambda r: r["haystack_sessions"][0][0].pop("content"), "'haystack_sessions[0][0].content'"),
        (lambda r: r["haystack_sessions"][0][0].update(has_answer="yes"), "'haystack_sessions[0][0].has_answer'"),
    ],
)
def test_malformed_record_names_file_record_id_and_field(tmp_path, change, field):
    path, qid = _broken_copy(tmp_path, 3, change)
    with pytest.raises(TaskDataError) as caught:
        list(load_records(path, 2, 0))  # even with a limit every record is checked
    message = str(caught.value)
    assert str(path) in message and "record 3" in message and repr(qid) in message and field in message


def test_not_a_list_and_truncated_json_are_clear_errors(tmp_path):
    obj = tmp_path / "obj.json"
    obj.write_text('{"question_id": "x"}')
    with pytest.raises(TaskDataError, match="expected a JSON list"):
        list(load_records(obj, None, 0))
    cut = tmp_path / "cut.json"
    cut.write_bytes(ORACLE.read_bytes()[:200_000])
    with pytest.raises(TaskDataError, match="invalid JSON after record"):
        list(load_records(cut, None, 0))


def test_duplicate_question_id_is_an_error(tmp_path):
    records = json.loads(ORACLE.read_text())[:3]
    records.append(records[0])
    path = tmp_path / "dup.json"
    path.write_text(json.dumps(records))
    with pytest.raises(TaskDataError, match="repeats record 0"):
        list(load_records(path, None, 0))


def test_load_wanted_builds_only_the_wanted_items_of_the_same_selection():
    task = LongMemEval(path=str(ORACLE))
    selected = list(task.load(12, 3))
    asked: list[str] = []
    keep = {item.id for item in selected[::3]}
    picked = list(task.load_wanted(12, 3, lambda item_id: asked.append(item_id) or item_id in keep))
    assert asked == [item.id for item in selected]  # asked once per selected item, in order
    assert picked == [item for item in selected if item.id in keep]
