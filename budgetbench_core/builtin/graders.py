"""Deterministic graders: ``exact-match`` and ``contains-answer``.

Both normalise (lower case, punctuation and articles removed, whitespace collapsed). An
empty prediction is never correct, and ``contains-answer`` refuses predictions so long
that containing the answer proves nothing (the reference harness's defect 1).
"""

from __future__ import annotations

import re
import string

from budgetbench_core import Grader, Verdict, contains_answer, hookimpl

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCTUATION = str.maketrans({c: " " for c in string.punctuation if c != "-"})


def normalize(text: str) -> str:
    text = str(text).lower().translate(_PUNCTUATION)
    return " ".join(_ARTICLES.sub(" ", text).split())


class ExactMatch(Grader):
    """Correct when the normalised prediction equals the normalised answer."""

    name = "exact-match"
    version = "1"
    binary = True
    description = "Normalised prediction equals normalised answer; empty is never correct."

    def grade(self, item, prediction, context):
        got, want = normalize(prediction), normalize(item.answer)
        correct = bool(got) and bool(want) and got == want
        return Verdict(float(correct), {"normalized_prediction": got, "normalized_answer": want})


class ContainsAnswer(Grader):
    """Correct when the answer appears as whole words in a short prediction.

    ``max_extra_words`` bounds how much longer than the answer the prediction may be.
    """

    name = "contains-answer"
    version = "1"
    binary = True
    description = "Answer appears as whole words in a prediction at most a few words longer."

    def __init__(self, max_extra_words: int = 8, **params):
        super().__init__(max_extra_words=max_extra_words, **params)
        self.max_extra_words = int(max_extra_words)

    def grade(self, item, prediction, context):
        got, want = normalize(prediction), normalize(item.answer)
        correct, too_long = contains_answer(got, want, self.max_extra_words)
        return Verdict(float(correct), {"normalized_prediction": got, "normalized_answer": want, "too_long": too_long})


@hookimpl
def register_graders(register):
    register(ExactMatch)
    register(ContainsAnswer)
