"""``locomo-f1`` equals the official ``eval_question_answering`` on 216 constructed triples.

``data/f1_reference.json`` holds (prediction, answer, category) triples, edge cases first,
then shapes built from the official questions, each with the score the official
task_eval/evaluation.py (snap-research/LoCoMo@3eb6f2c) gave it, run once outside this
repository (nltk 3.10.4, regex 2026.11.19, numpy 2.4.6). Equality is exact.
"""

import json
from pathlib import Path

import pytest
from budgetbench_task_locomo.graders import LoCoMoF1
from budgetbench_task_locomo.scoring import VERSION, category_score, normalize_answer, tokens

from budgetbench_core import GradingContext, Item, Message

REFERENCE = json.loads((Path(__file__).parent / "data" / "f1_reference.json").read_text(encoding="utf-8"))
TRIPLES = REFERENCE["triples"]


def test_the_reference_set_is_large_and_varied():
    assert len(TRIPLES) >= 200
    assert {t["category"] for t in TRIPLES} == {1, 2, 3, 4, 5}
    scores = [t["official"] for t in TRIPLES]
    assert (
        sum(s == 0 for s in scores) >= 20 and sum(s == 1 for s in scores) >= 20 and sum(0 < s < 1 for s in scores) >= 40
    )


def test_every_triple_scores_as_the_official_code():
    wrong = [
        (t["case"], t["prediction"], t["answer"], t["category"], t["official"], got)
        for t in TRIPLES
        if (got := category_score(t["prediction"], None if t["answer"] is None else str(t["answer"]), t["category"]))
        != t["official"]
    ]
    assert wrong == []


@pytest.mark.parametrize(
    "text, normal",
    [
        ("The cat, and a dog!", "cat dog"),
        ("U.S.A.", "usa"),
        ("mother-in-law", "motherinlaw"),
        ("“Charlotte’s Web”", "“charlotte’s web”"),  # only ASCII punctuation is removed
        ("Andrea   went\tthere", "andrea went there"),
    ],
)
def test_normalisation(text, normal):
    assert normalize_answer(text) == normal


def test_porter_stems_and_category_rules():
    assert tokens("Running paintings happily") == ["run", "paint", "happili"]
    assert category_score("Psychology", "Psychology; counseling", 3) == 1.0  # before the ';' only
    assert category_score("counseling", "Psychology; counseling", 3) == 0.0
    assert category_score("dogs", "dogs, cats", 1) == 0.5  # mean over the answer's parts
    assert category_score("dogs", "dogs, cats", 4) == pytest.approx(2 / 3)
    assert category_score("Not mentioned in the conversation", None, 5) == 1.0
    assert category_score("self-care is important", None, 5) == 0.0
    with pytest.raises(ValueError, match="needs an answer"):
        category_score("x", None, 2)


def test_the_grader_records_rules_and_the_adversarial_diagnostic():
    item = Item(
        "conv-x_q000",
        (),
        Message("user", "q"),
        "Not mentioned in the conversation",
        category="adversarial",
        metadata={"question": "q", "category_number": 5, "adversarial_answer": "self-care is important"},
    )
    context = GradingContext(judge=lambda messages, max_tokens: "", judge_model=None)
    verdict = LoCoMoF1().grade(item, "Self-care is important.", context)
    assert verdict.quality == 0.0 and verdict.detail["adversarial_answer_f1"] == 1.0
    assert verdict.detail["rules"] == VERSION == LoCoMoF1.version
