"""The official answer extraction: no fallback reads the article "A" or a first letter (defect 12)."""

from __future__ import annotations

import pytest
from budgetbench_task_longbench.grader import LongBenchChoice, extract_answer

from budgetbench_core import GradingContext, Item, Message


@pytest.mark.parametrize(
    "reply, letter",
    [
        ("The correct answer is (B)", "B"),
        ("**The correct answer is (C)**", "C"),
        ("The correct answer is **(D)**.", "D"),
        ("Reasoning first. The correct answer is A.", "A"),
        ("The correct answer is D", "D"),
        ("The correct answer is (A) because the text says so. The correct answer is (B)", "A"),
        ("The correct answer is B, not (A).", "B"),
    ],
)
def test_official_patterns_extract(reply, letter):
    assert extract_answer(reply)[0] == letter


@pytest.mark.parametrize(
    "reply",
    [
        "A person who reads the text would say B.",
        "A",
        "(A)",
        "Answer: A",
        "A. The basic terms of the main agreement are defined.",
        "The correct answer is Apparently (C).",
        "The correct answer is (E)",
        "the correct answer is (a)",
        "",
        "   ",
    ],
)
def test_defect_12_no_answer_without_the_official_sentence(reply):
    assert extract_answer(reply) == (None, None)


def test_after_the_official_sentence_a_letter_and_space_is_an_answer():
    """As in the official extraction: "is A person" cannot be told apart from "is A because"."""
    assert extract_answer("The correct answer is A because of the second case.") == ("A", "bare")
    assert extract_answer("The correct answer is A person who knows the law.") == ("A", "bare")


def _item(answer):
    return Item(id="q", history=(), query=Message("user", "question"), answer=answer)


def test_grader_scores_only_the_extracted_letter():
    grader, context = LongBenchChoice(), GradingContext(judge=None, judge_model=None)
    assert grader.grade(_item("A"), "The correct answer is (A)", context).quality == 1.0
    assert grader.grade(_item("B"), "The correct answer is (A)", context).quality == 0.0
    for reply in ("A person", "A", "", "The correct answer is Apparently unclear"):
        verdict = grader.grade(_item("A"), reply, context)
        assert verdict.quality == 0.0 and verdict.detail["extracted"] is None
    verdict = grader.grade(_item("C"), "*The correct answer is C*", context)
    assert verdict.quality == 1.0 and verdict.detail["pattern"] == "bare"
