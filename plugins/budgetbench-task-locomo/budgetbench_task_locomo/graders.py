"""The LoCoMo graders: the paper's token F1 (``locomo-f1``) and the J judge (``locomo-judge``).

Both score against the official key; for an item the errata file lists, ``detail["errata"]``
also holds the score against the correction (or ``excluded: true``), so one run gives both.
An empty prediction scores 0 without asking the judge.
"""

from __future__ import annotations

from budgetbench_core import Grader, Message, Verdict, hookimpl

from .data import ADVERSARIAL, CATEGORIES
from .errata import EXCLUDE
from .judge_prompts import (
    ACCURACY_SHA256,
    ADVERSARIAL_SHA256,
    JUDGE_MAX_TOKENS,
    PROMPTS_SHA256,
    SOURCE,
    accuracy_prompt,
    adversarial_prompt,
    read_label,
)
from .scoring import VERSION, category_score, token_f1


def _fields(item) -> tuple[str, int, str | None]:
    try:
        return item.metadata["question"], item.metadata["category_number"], item.metadata.get("adversarial_answer")
    except KeyError as exc:
        raise ValueError(
            f"item {item.id!r} is not a locomo item (metadata has no {exc}); LoCoMo graders only grade the locomo task"
        ) from None


def _errata_detail(item, score) -> dict:
    """``{"errata": ...}`` for an item the errata file lists: the score against the correction."""
    correction = item.metadata.get("errata")
    if correction is None:
        return {}
    if correction == EXCLUDE:
        return {"errata": {"excluded": True}}
    return {"errata": {"answer": correction, "quality": score(correction)}}


class LoCoMoF1(Grader):
    """The LoCoMo paper's token F1: official normalisation, Porter stems and per-category rules,
    against the official key (and the errata's correction in ``detail["errata"]``)."""

    name = "locomo-f1"
    version = VERSION
    binary = False
    description = "The LoCoMo paper's token F1 (official normalisation, Porter stems, per-category rules)."

    def grade(self, item, prediction, context):
        _, category, adversarial_answer = _fields(item)
        detail = {"category": CATEGORIES[category], "rules": VERSION}
        if category == ADVERSARIAL:
            # Diagnostic only: how much of the misleading answer the prediction repeats.
            detail["adversarial_answer_f1"] = token_f1(prediction, adversarial_answer or "")
        quality = category_score(prediction, item.answer, category)
        return Verdict(quality, {**detail, **_errata_detail(item, lambda a: category_score(prediction, a, category))})


class LoCoMoJudge(Grader):
    """The J score: mem0's CORRECT/WRONG judge prompt for categories 1-4, this plugin's own for
    category 5 (adversarial). An empty prediction scores 0 without asking the judge."""

    name = "locomo-judge"
    version = f"{SOURCE}+sha256:{PROMPTS_SHA256[:12]}"
    binary = True
    description = "J: mem0's CORRECT/WRONG judge prompt (categories 1-4); this plugin's own for category 5."

    def grade(self, item, prediction, context):
        question, category, adversarial_answer = _fields(item)
        adversarial = category == ADVERSARIAL
        detail = {
            "category": CATEGORIES[category],
            "judge_model": context.judge_model,
            "prompt": "adversarial" if adversarial else "accuracy",
            "prompt_sha256": ADVERSARIAL_SHA256 if adversarial else ACCURACY_SHA256,
        }

        def ask(gold: str) -> tuple[float, dict]:
            if not prediction.strip():
                return 0.0, {"label": None, "raw_verdict": None, "skipped": "empty prediction"}
            if adversarial:
                prompt = adversarial_prompt(question, adversarial_answer or "", prediction)
            else:
                prompt = accuracy_prompt(question, gold, prediction)
            reply = context.judge([Message("user", prompt)], JUDGE_MAX_TOKENS)
            label, read = read_label(reply)
            return float(label == "CORRECT"), {"label": label, "read_from": read, "raw_verdict": reply}

        quality, verdict = ask(item.answer)
        errata = _errata_detail(item, lambda answer: ask(answer)[0])
        return Verdict(quality, {**detail, **verdict, **errata})


@hookimpl
def register_graders(register):
    register(LoCoMoF1)
    register(LoCoMoJudge)
