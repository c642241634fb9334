"""The loader reads the official file as published: counts, categories, every evidence id resolved or reported."""

import json

import pytest
from budgetbench_task_locomo.data import CATEGORIES, load_conversations, read_evidence
from budgetbench_task_locomo.task import ABSTAIN, NOT_ANSWERABLE, LoCoMo

from budgetbench_core import EVIDENCE_ID_KEY, EVIDENCE_KEY, TaskDataError
from budgetbench_core.testing import strategy_context

UNRESOLVED = {"conv-42_q058": ["D10:19"], "conv-42_q088": ["D"], "conv-47_q038": ["D4:36"]}
REPAIRED = {
    "conv-26_q037": ("D8:6; D9:17", ["D8:6", "D9:17"]),
    "conv-43_q018": ("D:11:26", ["D11:26"]),
    "conv-49_q031": ("D9:1 D4:4 D4:6", ["D9:1", "D4:4", "D4:6"]),
    "conv-49_q038": ("D22:1 D22:2 D9:10 D9:11", ["D22:1", "D22:2", "D9:10", "D9:11"]),
    "conv-49_q046": ("D21:18 D21:22 D11:15 D11:19", ["D21:18", "D21:22", "D11:15", "D11:19"]),
    "conv-50_q069": ("D30:05", ["D30:5"]),
}


@pytest.fixture(scope="module")
def conversations(locomo_file):
    return load_conversations(locomo_file)


@pytest.fixture(scope="module")
def items(locomo_file):
    return {item.id: item for item in LoCoMo(path=str(locomo_file), adversarial="include").load(None, 0)}


def test_official_counts(conversations):
    questions = [q for c in conversations for q in c.questions]
    assert len(conversations) == 10 and len(questions) == 1986
    counts = {name: sum(q.category_name == name for q in questions) for name in CATEGORIES.values()}
    assert counts == {"multi-hop": 282, "temporal": 321, "open-domain": 96, "single-hop": 841, "adversarial": 446}
    assert [len(c.sessions) for c in conversations] == [19, 19, 32, 29, 29, 28, 31, 30, 25, 30]
    assert all(q.answer is not None for q in questions if q.category != 5)  # integers read as text
    assert all(q.adversarial_answer for q in questions if q.category == 5)


def test_every_evidence_id_is_resolved_or_reported(locomo_file, conversations):
    raw = json.loads(locomo_file.read_text())
    for conversation, record in zip(conversations, raw):
        turns = {t.dia_id for s in conversation.sessions for t in s.turns}
        for question, qa in zip(conversation.questions, record["qa"]):
            assert set(question.evidence) <= turns
            read = [i for entry, ids in question.repaired for i in ids]
            official = [e for e in qa["evidence"] if e not in dict(question.repaired)]
            # every official entry is a resolved id, a repaired entry, or reported unresolved
            assert set(official) <= set(question.evidence) | set(question.unresolved), question.key
            assert set(read) <= set(question.evidence)
    questions = {q.key: q for c in conversations for q in c.questions}
    assert {k: list(q.unresolved) for k, q in questions.items() if q.unresolved} == UNRESOLVED
    assert {k: (q.repaired[0][0], list(q.repaired[0][1])) for k, q in questions.items() if q.repaired} == REPAIRED
    # four questions list no evidence at all in the file: they have no evidence recall (never 0)
    no_evidence = ["conv-26_q030", "conv-26_q046", "conv-50_q039", "conv-50_q042"]
    assert sorted(k for k, q in questions.items() if not q.evidence) == no_evidence


def test_evidence_reading_rules():
    known = {"D1:3", "D2:5", "D11:26"}
    assert read_evidence(["D1:3"], known) == (["D1:3"], [], [])
    assert read_evidence(["D1:3; D2:5", "D1:3"], known) == (["D1:3", "D2:5"], [], [("D1:3; D2:5", ["D1:3", "D2:5"])])
    assert read_evidence(["D:11:26", "D2:05", "D9:9"], known) == (
        ["D11:26", "D2:5"],
        ["D9:9"],
        [("D:11:26", ["D11:26"]), ("D2:05", ["D2:5"])],
    )


def test_items_carry_the_dated_conversation_and_evidence_marks(conversations, items):
    assert len(items) == 1986
    conversation = conversations[0]
    question = conversation.questions[0]
    item = items[question.key]
    turns = [(s, t) for s in conversation.sessions for t in s.turns]
    assert len(item.history) == len(turns) == 419
    for message, (session, turn) in zip(item.history, turns):
        assert message.content.startswith(f"{session.date_time} | {turn.speaker}: {turn.text}")
        assert message.role == ("user" if turn.speaker == conversation.speaker_a else "assistant")
        assert message.metadata["session_id"] == f"session_{session.number}"
        assert message.metadata["timestamp"] == session.date_time
        if turn.caption:
            assert message.content.endswith(f"[shared {turn.caption}]")
    assert sum(bool(t.caption) for _, t in turns) > 0
    assert "Caroline and Melanie" in item.system.content
    assert evidence_ids(item.history) == list(question.evidence) == ["D1:3"]
    assert item.category == "temporal" and item.answer == "7 May 2023"
    for item in items.values():
        assert evidence_ids(item.history) == sorted(
            item.metadata["evidence_ids"], key=lambda i: tuple(int(n) for n in i[1:].split(":"))
        )


def evidence_ids(history) -> list[str]:
    """The dialogue ids of the messages the task marked as evidence, in order."""
    return [str(m.metadata[EVIDENCE_ID_KEY]) for m in history if m.metadata.get(EVIDENCE_KEY)]


def test_the_strategy_view_holds_no_grading_key(items):
    for key in ("conv-26_q000", "conv-26_q152"):  # temporal, adversarial
        item = items[key]
        view = strategy_context(item, 0, None, ".").item  # what a strategy is given
        assert view.answer is None and view.category is None and dict(view.metadata) == {}
        assert not any("evidence" in m.metadata or "evidence_id" in m.metadata for m in view.history)
        assert item.metadata.get("adversarial_answer") is None or item.category == "adversarial"
    adversarial = items["conv-26_q152"]
    assert adversarial.answer == NOT_ANSWERABLE and adversarial.metadata["adversarial_answer"]
    # One query wording for every category: the query does not tell the category.
    shapes = {i.query.content.replace(i.metadata["question"], "{q}") for i in items.values()}
    assert len(shapes) == 1 and ABSTAIN in shapes.pop()


def test_category_5_is_excluded_by_default_and_limit_is_balanced(locomo_file):
    task = LoCoMo(path=str(locomo_file))
    selected = list(task.load(8, 0))
    assert sorted(i.category for i in selected) == sorted(2 * ["multi-hop", "temporal", "open-domain", "single-hop"])
    assert all(ABSTAIN not in i.query.content for i in selected)
    notes = task.manifest_notes()
    assert notes["questions_in_file"]["5 adversarial"] == 446 and notes["questions_selected"]["5 adversarial"] == 0
    assert {u["question"]: u["ids"] for u in notes["evidence"]["unresolved"]} == UNRESOLVED
    assert len(notes["evidence"]["repaired"]) == 6 and len(notes["answer_prompt_sha256"]) == 64
    wanted = list(task.load_wanted(8, 0, lambda key: key == selected[3].id))
    assert [i.id for i in wanted] == [selected[3].id]


def test_bad_options_and_files_are_named(locomo_file, tmp_path):
    with pytest.raises(ValueError, match="adversarial must be exclude or include"):
        LoCoMo(path=str(locomo_file), adversarial="yes")
    with pytest.raises(ValueError, match="unknown task options"):
        LoCoMo(path=str(locomo_file), split="s")
    bad = tmp_path / "bad.json"
    record = json.loads(locomo_file.read_text())[0]
    record["qa"][3]["category"] = 7
    bad.write_text(json.dumps([record]))
    with pytest.raises(TaskDataError, match=r"bad.json: conversation 0 \(conv-26\): qa\[3\]: field 'category'"):
        list(LoCoMo(path=str(bad)).load(None, 0))
