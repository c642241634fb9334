"""The deterministic diagnostic grader on real LongMemEval questions."""

from pathlib import Path

import pytest
from budgetbench_task_longmemeval.graders import LongMemEvalJudge, LongMemEvalMatch
from budgetbench_task_longmemeval.task import LongMemEval

from budgetbench_core import GradingContext, Item, Message

DATA = Path(__file__).resolve().parents[3] / ".." / "shared" / "data" / "longmemeval"
SAMPLE = DATA / "longmemeval_s_sample.json"
pytestmark = pytest.mark.skipif(not SAMPLE.is_file(), reason=f"LongMemEval data not found in {DATA}")


def refuse_judge(messages, max_tokens):
    raise AssertionError("the judge must not be called")


CONTEXT = GradingContext(judge=refuse_judge, judge_model="unused")


@pytest.fixture(scope="module")
def items():
    return {i.id: i for i in LongMemEval(path=str(SAMPLE)).load(None, 0)}


def first(items, question_type, abstention=False, answer_type=str):
    return next(
        i
        for i in items.values()
        if i.category == question_type and i.metadata["abstention"] == abstention and isinstance(i.answer, answer_type)
    )


def test_answer_inside_a_short_prediction_is_correct(items):
    item = first(items, "single-session-user")
    grader = LongMemEvalMatch()
    assert grader.grade(item, f"I think it was {item.answer}.", CONTEXT).quality == 1.0
    assert grader.grade(item, str(item.answer).upper() + "!", CONTEXT).quality == 1.0


def test_empty_and_trivially_short_predictions_are_never_correct(items):
    grader = LongMemEvalMatch()
    for item in items.values():
        for prediction in ("", "   ", ".", "a", "the"):
            assert grader.grade(item, prediction, CONTEXT).quality == 0.0, (item.id, prediction)
    item = first(items, "single-session-user")
    # a prediction that is only a piece of the answer is wrong (containment runs answer-in-prediction)
    word = str(item.answer).split()[0]
    if word != str(item.answer):
        assert LongMemEvalMatch().grade(item, word, CONTEXT).quality == 0.0


def test_numeric_answers_match_digits_and_number_words(items):
    item = first(items, "multi-session", answer_type=int)
    words = {2: "two", 3: "three", 4: "four", 5: "five"}
    assert LongMemEvalMatch().grade(item, f"{item.answer} times", CONTEXT).quality == 1.0
    if item.answer in words:
        assert LongMemEvalMatch().grade(item, f"{words[item.answer]} times", CONTEXT).quality == 1.0
    assert LongMemEvalMatch().grade(item, f"{item.answer + 1} times", CONTEXT).quality == 0.0


def test_rambling_prediction_that_contains_the_answer_is_not_credited(items):
    item = first(items, "single-session-user")
    rambling = " ".join(["maybe"] * 30) + f" {item.answer}"
    verdict = LongMemEvalMatch().grade(item, rambling, CONTEXT)
    assert verdict.quality == 0.0 and verdict.detail["too_long"]


def test_abstention_needs_an_explicit_unanswerable_phrase(items):
    item = first(items, "knowledge-update", abstention=True)
    grader = LongMemEvalMatch()
    assert grader.grade(item, "You did not mention that.", CONTEXT).quality == 1.0
    assert grader.grade(item, "There is not enough information to answer.", CONTEXT).quality == 1.0
    assert grader.grade(item, "You lead 5 engineers.", CONTEXT).quality == 0.0


def test_preference_questions_are_marked_not_applicable(items):
    item = first(items, "single-session-preference")
    verdict = LongMemEvalMatch().grade(item, str(item.answer), CONTEXT)
    assert verdict.quality == 0.0 and verdict.detail["applicable"] is False


def test_judge_scores_an_empty_prediction_zero_without_asking(items):
    item = first(items, "temporal-reasoning")
    verdict = LongMemEvalJudge().grade(item, "  ", CONTEXT)
    assert verdict.quality == 0.0 and verdict.detail["skipped"] == "empty prediction"


def test_graders_refuse_items_of_other_tasks():
    foreign = Item("x", (), Message("user", "q"), "a")
    with pytest.raises(ValueError, match="not a longmemeval item"):
        LongMemEvalMatch().grade(foreign, "a", CONTEXT)
