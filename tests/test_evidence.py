"""Evidence marks (metadata ``evidence``) on real task items, and what counts as kept."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from budgetbench_core import Message
from budgetbench_core.builtin.synthetic_memory import SyntheticMemory
from budgetbench_core.evidence import EVIDENCE_KEY, EvidenceMarkError, evidence_marks, evidence_outcome

ORACLE = Path(__file__).resolve().parents[1] / ".." / "shared" / "data" / "longmemeval" / "longmemeval_oracle.json"


def test_synthetic_memory_marks_the_sentence_that_holds_each_answer():
    items = list(SyntheticMemory(items=25, history_tokens=3000).load(None, 0))
    for item in items:
        marks = evidence_marks(item.history)
        if item.category == "abstention":
            assert marks == []  # nothing to find: no mark, so no evidence recall (never 0)
            continue
        (mark,) = marks
        assert str(item.answer) in mark.text, (item.id, mark.text, item.answer)
        assert evidence_outcome(marks, list(item.history)) == {"marked": 1, "kept": [mark.id], "dropped": []}
        assert evidence_outcome(marks, [item.system, item.query]) == {"marked": 1, "kept": [], "dropped": [mark.id]}


def test_kept_means_the_text_survives_whitespace_aside():
    history = (
        Message(
            "user",
            "[2023-01-02] Today I sold my old car! Any tips?",
            {EVIDENCE_KEY: "[2023-01-02] Today I sold my old car!"},
        ),
    )
    (mark,) = evidence_marks(history)
    quoted = [Message("user", "Earlier notes:\n- [2023-01-02]  Today I sold\nmy old car! Any tips?")]
    cut = [Message("user", "Today I sold my old car!")]  # the date the answer needs is gone
    assert evidence_outcome([mark], quoted)["kept"] == [mark.id]
    assert evidence_outcome([mark], cut)["dropped"] == [mark.id]
    assert evidence_outcome([], quoted) is None


def test_a_mark_the_message_does_not_contain_is_an_error():
    with pytest.raises(EvidenceMarkError, match=r"history\[0\]"):
        evidence_marks((Message("user", "I live in Lisbon.", {EVIDENCE_KEY: "I live in Osaka."}),))


@pytest.mark.skipif(not ORACLE.exists(), reason="shared LongMemEval data not present")
def test_longmemeval_marks_the_has_answer_turns():
    formatting = pytest.importorskip("budgetbench_task_longmemeval.formatting")
    records = json.loads(ORACLE.read_text())[:60]
    for index, record in enumerate(records):
        item = formatting.to_item(record, ORACLE, index)
        flagged = sum(
            bool(t.get("has_answer")) and bool(t["content"].strip())
            for session in record["haystack_sessions"]
            for t in session
        )
        marks = evidence_marks(item.history)
        assert len(marks) == flagged
        outcome = evidence_outcome(marks, list(item.history))
        assert outcome is None if not flagged else outcome["dropped"] == []
