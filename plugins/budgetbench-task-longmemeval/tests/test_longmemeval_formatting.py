"""One rendering for every strategy: dated, numbered sessions in date order; the dated question last."""

import json
import re
from pathlib import Path

import pytest
from budgetbench_task_longmemeval.formatting import SYSTEM_PROMPT, to_item
from budgetbench_task_longmemeval.loader import parse_date
from budgetbench_task_longmemeval.task import LongMemEval

DATA = Path(__file__).resolve().parents[3] / ".." / "shared" / "data" / "longmemeval"
SAMPLE = DATA / "longmemeval_s_sample.json"

pytestmark = pytest.mark.skipif(not SAMPLE.is_file(), reason=f"LongMemEval data not found in {DATA}")
HEADER = re.compile(r"^\[Session (\d+), (\d{4}/\d\d/\d\d \(\w{3}\) \d\d:\d\d)\] ")


@pytest.fixture(scope="module")
def records():
    return json.loads(SAMPLE.read_text())


@pytest.fixture(scope="module")
def items():
    return list(LongMemEval(path=str(SAMPLE)).load(None, 0))


def test_every_turn_is_kept_in_date_order_with_its_session_metadata(records, items):
    for record, item in zip(records, items):
        assert len(item.history) == sum(len(s) for s in record["haystack_sessions"])
        dates = [parse_date(m.metadata["timestamp"]) for m in item.history]
        assert dates == sorted(dates)
        sessions = item.sessions()
        assert len(sessions) == len(record["haystack_sessions"])  # repeated official ids stay separate sessions
        assert [s.date for s in sessions] == sorted(record["haystack_dates"], key=parse_date)
        evidence = {m.metadata["official_session_id"] for m in item.history if m.metadata["has_answer"]}
        assert evidence <= set(record["answer_session_ids"])
        # the id a strategy sees is the session's number in date order, one per session
        assert [s.id for s in sessions] == [f"s{n}" for n in range(1, len(sessions) + 1)]
        assert sum(m.metadata["has_answer"] for m in item.history) == sum(
            bool(t.get("has_answer")) for s in record["haystack_sessions"] for t in s
        )


def test_headers_carry_number_and_date_on_user_turns_and_session_starts(items):
    for item in items:
        for message in item.history:
            match = HEADER.match(message.content)
            needs_header = message.role == "user" or message.metadata["turn"] == 0
            assert bool(match) == needs_header, message.content[:80]
            if match:
                assert int(match[1]) == message.metadata["session_number"]
                assert match[2] == message.metadata["timestamp"]


def test_session_ids_never_reach_the_prompt_text(items):
    # Evidence sessions are named answer_... upstream: showing ids would reveal where the answer is.
    for item in items:
        ids = {m.metadata["official_session_id"] for m in item.history}
        texts = [m.content for m in item.history] + [item.query.content, item.system.content]
        leaked = [sid for sid in ids if sid.startswith("answer_") and any(sid in t for t in texts)]
        assert not leaked


def test_query_is_the_dated_question_and_system_prompt_is_shared(records, items):
    for record, item in zip(records, items):
        assert item.query.role == "user"
        assert item.query.content == f"Current Date: {record['question_date']}\nQuestion: {record['question']}\nAnswer:"
        assert item.system.content == SYSTEM_PROMPT
        assert item.category == record["question_type"]
        assert item.metadata["question"] == record["question"]
        frame = item.frame(list(item.history[-3:]))
        assert frame[0] == item.system and frame[-1] == item.query


def test_rendering_does_not_depend_on_the_strategy_or_the_limit(records):
    first = to_item(records[5], SAMPLE, 5)
    again = next(i for i in LongMemEval(path=str(SAMPLE)).load(56, 9) if i.id == first.id)
    assert [m.to_dict() for m in again.history] == [m.to_dict() for m in first.history]
    assert again.query == first.query
