"""The J judge: mem0's prompt word for word (pinned), how a reply is read, what the grader records.

The judge model itself is exercised by the slow end-to-end test; here the judge callable of
``GradingContext`` is a function that answers by rule, so each path of the grader is reached.
"""

import hashlib

import pytest
from budgetbench_task_locomo.graders import LoCoMoJudge
from budgetbench_task_locomo.judge_prompts import (
    ACCURACY_PROMPT,
    ACCURACY_SHA256,
    ADVERSARIAL_SHA256,
    PROMPTS_SHA256,
    accuracy_prompt,
    read_label,
)

from budgetbench_core import GradingContext, Item, Message

# sha256 of mem0's ACCURACY_PROMPT (evaluation/metrics/llm_judge.py), checked against upstream
# 2bb0653..aae5989 and 2352a44: a failing pin means the reviewed text changed.
PIN = "62395dd312a631dfd9355026a0b69cc936018274c3198b6365b5c2a5c9bca9e0"


def test_the_prompt_is_mem0s_and_its_hash_is_in_the_version():
    assert hashlib.sha256(ACCURACY_PROMPT.encode()).hexdigest() == ACCURACY_SHA256 == PIN
    assert (
        "\u2019CORRECT\u2019 or \u2019WRONG\u2019" in ACCURACY_PROMPT
        and "(posed by one user to another user), \n" in ACCURACY_PROMPT
    )
    assert LoCoMoJudge.version.endswith(PROMPTS_SHA256[:12]) and "mem0ai/mem0" in LoCoMoJudge.version
    prompt = accuracy_prompt("Where?", "Paris", "In Paris")
    assert (
        prompt.index("Question: Where?")
        < prompt.index("Gold answer: Paris")
        < prompt.index("Generated answer: In Paris")
    )


@pytest.mark.parametrize(
    "reply, label, how",
    [
        ('{"label": "CORRECT"}', "CORRECT", "json"),
        ('The answer matches.\n```json\n{"label": "WRONG"}\n```', "WRONG", "json"),
        ('{"label": "correct "}', "CORRECT", "json"),
        ("Same date, so CORRECT", "CORRECT", "word"),
        ('Not CORRECT at all: WRONG {"label": 3}', "WRONG", "word"),
        ("INCORRECT", None, None),
        ("", None, None),
    ],
)
def test_reading_a_reply(reply, label, how):
    assert read_label(reply) == (label, how)


def item(category, answer, **extra):
    metadata = {"question": "When did Caroline go to the group?", "category_number": category, **extra}
    return Item("conv-26_q000", (), Message("user", "q"), answer, metadata=metadata)


class RuleJudge:
    """Says CORRECT when the generated answer repeats the gold (or says 'not mentioned')."""

    def __init__(self):
        self.prompts = []

    def __call__(self, messages, max_tokens):
        text = messages[-1].content
        self.prompts.append(text)
        gold = text.split("Gold answer: ")[-1].split("\n")[0] if "Gold answer: " in text else "not mentioned"
        generated = text.split("Generated answer: ")[-1].split("\n")[0]
        return f'Reason.\n{{"label": "{"CORRECT" if gold.lower() in generated.lower() else "WRONG"}"}}'


def test_grading_with_the_accuracy_prompt_and_errata():
    judge = RuleJudge()
    context = GradingContext(judge=judge, judge_model="judge-x")
    verdict = LoCoMoJudge().grade(item(2, "7 May 2023", errata="8 May 2023"), "On 8 May 2023", context)
    assert verdict.quality == 0.0 and verdict.detail["label"] == "WRONG"
    assert verdict.detail["errata"] == {"answer": "8 May 2023", "quality": 1.0}
    assert verdict.detail["prompt_sha256"] == ACCURACY_SHA256 and verdict.detail["judge_model"] == "judge-x"
    assert len(judge.prompts) == 2 and judge.prompts[0] == accuracy_prompt(
        "When did Caroline go to the group?", "7 May 2023", "On 8 May 2023"
    )
    excluded = LoCoMoJudge().grade(item(4, "x", errata="exclude"), "x", context)
    assert excluded.quality == 1.0 and excluded.detail["errata"] == {"excluded": True}


def test_adversarial_questions_use_their_own_prompt_and_empty_answers_cost_no_call():
    judge = RuleJudge()
    context = GradingContext(judge=judge, judge_model="judge-x")
    adversarial = item(5, "Not mentioned in the conversation", adversarial_answer="self-care is important")
    assert LoCoMoJudge().grade(adversarial, "It is not mentioned.", context).quality == 1.0
    verdict = LoCoMoJudge().grade(adversarial, "Self-care is important", context)
    assert verdict.quality == 0.0 and verdict.detail["prompt_sha256"] == ADVERSARIAL_SHA256
    assert "Misleading answer: self-care is important" in judge.prompts[-1]
    calls = len(judge.prompts)
    empty = LoCoMoJudge().grade(item(2, "7 May 2023"), "  ", context)
    assert empty.quality == 0.0 and empty.detail["skipped"] == "empty prediction" and len(judge.prompts) == calls
