"""The official judge prompts, one test per question type, plus abstention and the verdict rule.

The SHA-256 pins were taken after comparing every rendered prompt character for character
with evaluate_qa.py (get_anscheck_prompt) at upstream commit f466efe; a failing pin means the
reviewed text changed and PROMPT_VERSION must change with it.
"""

import hashlib

import pytest
from budgetbench_task_longmemeval.judge_prompts import JUDGE_MAX_TOKENS, TEMPLATES, judge_prompt, read_verdict

OPENING = (
    "I will give you a question, a correct answer, and a response from a model. Please answer yes if the "
    "response contains the correct answer. Otherwise, answer no."
)
STEPS = "If the response is equivalent to the correct answer or contains all the intermediate steps"
GRADED_END = "Is the model response correct? Answer yes or no only."
PINS = {
    "single-session-user": "e78befdfdaa051a0",
    "single-session-assistant": "e78befdfdaa051a0",
    "multi-session": "e78befdfdaa051a0",
    "temporal-reasoning": "e7735e3d222b2115",
    "knowledge-update": "1a0170f23c09b22a",
    "single-session-preference": "10f7b6ce535341ee",
}


def pin(question_type, abstention=False):
    text = judge_prompt(question_type, "{q}", "{a}", "{r}", abstention)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def fields_in_order(prompt, *labels_and_values):
    positions = [prompt.index(f"{label}: {value}") for label, value in labels_and_values]
    return positions == sorted(positions)


@pytest.mark.parametrize("question_type", ["single-session-user", "single-session-assistant", "multi-session"])
def test_fact_questions_use_the_plain_correct_answer_prompt(question_type):
    prompt = judge_prompt(question_type, "Where do I work?", "Acme", "You work at Acme.", False)
    assert prompt.startswith(OPENING) and STEPS in prompt and prompt.endswith(GRADED_END)
    assert "off-by-one" not in prompt and "updated answer" not in prompt
    assert fields_in_order(
        prompt, ("Question", "Where do I work?"), ("Correct Answer", "Acme"), ("Model Response", "You work at Acme.")
    )
    assert pin(question_type) == PINS[question_type]


def test_temporal_reasoning_allows_off_by_one_day_counts():
    prompt = judge_prompt("temporal-reasoning", "How many days ago?", 18, "19 days", False)
    assert prompt.startswith(OPENING) and STEPS in prompt
    assert "do not penalize off-by-one errors for the number of days" in prompt
    assert "predicting 19 days when the answer is 18" in prompt
    assert fields_in_order(
        prompt, ("Question", "How many days ago?"), ("Correct Answer", "18"), ("Model Response", "19 days")
    )
    assert pin("temporal-reasoning") == PINS["temporal-reasoning"]


def test_knowledge_update_accepts_earlier_information_with_the_updated_answer():
    prompt = judge_prompt("knowledge-update", "Where do I live now?", "Osaka", "First Lisbon, now Osaka.", False)
    assert prompt.startswith(OPENING) and STEPS not in prompt
    assert "previous information along with an updated answer" in prompt
    assert "as long as the updated answer is the required answer.\n\nQuestion:" in prompt
    assert pin("knowledge-update") == PINS["knowledge-update"]


def test_preference_is_judged_against_a_rubric():
    prompt = judge_prompt(
        "single-session-preference", "Any dinner ideas?", "The user prefers vegan food.", "Try a chickpea curry.", False
    )
    assert prompt.startswith("I will give you a question, a rubric for desired personalized response")
    assert "recalls and utilizes the user's personal information correctly" in prompt
    assert fields_in_order(
        prompt,
        ("Question", "Any dinner ideas?"),
        ("Rubric", "The user prefers vegan food."),
        ("Model Response", "Try a chickpea curry."),
    )
    assert "Correct Answer:" not in prompt and prompt.endswith(GRADED_END)
    assert pin("single-session-preference") == PINS["single-session-preference"]


@pytest.mark.parametrize("question_type", sorted(PINS))
def test_abstention_questions_use_the_unanswerable_prompt_whatever_their_type(question_type):
    prompt = judge_prompt(question_type, "What is my cat's name?", "You never mentioned a cat.", "I don't know.", True)
    assert prompt.startswith("I will give you an unanswerable question, an explanation")
    assert fields_in_order(
        prompt,
        ("Question", "What is my cat's name?"),
        ("Explanation", "You never mentioned a cat."),
        ("Model Response", "I don't know."),
    )
    assert prompt.endswith("Does the model correctly identify the question as unanswerable? Answer yes or no only.")
    assert pin(question_type, abstention=True) == "8d95193b43d8c0b0"


def test_every_type_has_a_prompt_and_unknown_types_are_refused():
    assert set(PINS) | {"abstention"} == set(TEMPLATES)
    with pytest.raises(ValueError, match="no LongMemEval judge prompt"):
        judge_prompt("open-domain", "q", "a", "r", False)


def test_braces_in_user_text_are_not_format_fields():
    prompt = judge_prompt("multi-session", "What is {name}?", "{0}", "{response}", False)
    assert "Question: What is {name}?" in prompt and "Correct Answer: {0}" in prompt


@pytest.mark.parametrize(
    "reply, label",
    [
        ("Yes", True),
        ("yes.", True),
        (" YES, it is", True),
        ("No", False),
        ("no, the answer is wrong", False),
        ("", False),
        ("eyes", True),
    ],
)
def test_verdict_is_yes_anywhere_in_the_lower_cased_reply(reply, label):
    assert read_verdict(reply) is label
    assert JUDGE_MAX_TOKENS == 10
