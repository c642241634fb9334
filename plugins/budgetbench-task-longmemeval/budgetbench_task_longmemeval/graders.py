"""LongMemEval graders: the official LLM judge, and a deterministic match diagnostic.

``longmemeval-judge`` asks the judge model (``--judge-model``, default the answering
model; the paper used gpt-4o-2024-08-06) with the official prompt of the question's type
and records judge model, prompt version and the raw reply in every row. An empty
prediction is scored 0 without asking the judge (upstream would ask; a judge can say
"yes" to nothing on an abstention question).

``longmemeval-match`` needs no model: the normalised gold answer must appear as whole
words in a prediction at most ``max_extra_words`` longer; abstention questions need an
explicit "not enough information"-style phrase. Preference questions are graded against a
rubric, which no string match can do: they score 0 with ``applicable: false``. Use it to
sanity-check a run, never as the headline number.
"""

from __future__ import annotations

import re
import string
import unicodedata

from budgetbench_core import Grader, Message, Param, Verdict, contains_answer, hookimpl

from .judge_prompts import JUDGE_MAX_TOKENS, PROMPT_VERSION, judge_prompt, prompt_kind, read_verdict


def _question_fields(item) -> tuple[str, str, bool]:
    try:
        return item.metadata["question"], item.metadata["question_type"], bool(item.metadata["abstention"])
    except KeyError as exc:
        raise ValueError(
            f"item {item.id!r} is not a longmemeval item (metadata has no {exc}); "
            f"LongMemEval graders only grade the longmemeval task"
        ) from None


class LongMemEvalJudge(Grader):
    """The official LongMemEval LLM judge: the prompt of the question's type, temperature 0, the
    label is 'yes' in the reply. The judge is ``--judge-model`` (default: the answering model; the
    paper used gpt-4o-2024-08-06). An empty prediction scores 0 without asking the judge."""

    name = "longmemeval-judge"
    version = PROMPT_VERSION
    binary = True
    description = "Official LongMemEval LLM judge: per-type prompt, temperature 0, label = 'yes' in reply."

    def grade(self, item, prediction, context):
        question, question_type, abstention = _question_fields(item)
        detail = {
            "judge_model": context.judge_model,
            "prompt_version": PROMPT_VERSION,
            "prompt": prompt_kind(question_type, abstention),
            "question_type": question_type,
            "abstention": abstention,
        }
        if not prediction.strip():
            return Verdict(0.0, {**detail, "raw_verdict": None, "label": False, "skipped": "empty prediction"})
        prompt = judge_prompt(question_type, question, item.answer, prediction, abstention)
        reply = context.judge([Message("user", prompt)], JUDGE_MAX_TOKENS)
        label = read_verdict(reply)
        return Verdict(float(label), {**detail, "raw_verdict": reply, "label": label})


_PUNCTUATION = str.maketrans({c: " " for c in string.punctuation})
_ARTICLES = re.compile(r"\b(a|an|the)\b")
_NUMBERS = {
    word: str(value)
    for value, word in enumerate(
        "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen sixteen "
        "seventeen eighteen nineteen twenty".split()
    )
}
ABSTAIN_PHRASES = (
    "not enough information",
    "no information",
    "not mentioned",
    "never mentioned",
    "did not mention",
    "didn t mention",
    "do not know",
    "don t know",
    "cannot answer",
    "can t answer",
    "unable to answer",
    "not provided",
    "not specified",
    "unknown",
    "no record",
    "not sure",
)


def normalize(text: object) -> str:
    """Lower case, NFKC, punctuation and articles removed, number words as digits."""
    text = unicodedata.normalize("NFKC", str(text)).lower().translate(_PUNCTUATION)
    words = _ARTICLES.sub(" ", text).split()
    return " ".join(_NUMBERS.get(w, w) for w in words)


class LongMemEvalMatch(Grader):
    """A diagnostic that needs no model: the normalised gold answer appears as whole words in a
    prediction at most ``max_extra_words`` longer; abstention questions need an explicit "not
    enough information"-style phrase; preference questions score 0, not applicable. Never the
    headline number."""

    name = "longmemeval-match"
    version = "1"
    binary = True
    description = "Diagnostic, no model: normalised answer contained in a short prediction; never an empty one."
    parameters = {"max_extra_words": Param(help="words a prediction may have beyond the gold answer's and still match")}

    def __init__(self, max_extra_words: int = 12, **params):
        super().__init__(max_extra_words=max_extra_words, **params)
        self.max_extra_words = int(max_extra_words)

    def grade(self, item, prediction, context):
        _, question_type, abstention = _question_fields(item)
        got = normalize(prediction)
        detail = {
            "normalized_prediction": got,
            "question_type": question_type,
            "abstention": abstention,
            "applicable": True,
        }
        if not got:
            return Verdict(0.0, {**detail, "reason": "empty prediction"})
        if abstention:
            phrase = next((p for p in ABSTAIN_PHRASES if f" {p} " in f" {got} "), None)
            return Verdict(float(phrase is not None), {**detail, "abstain_phrase": phrase})
        if question_type == "single-session-preference":
            return Verdict(0.0, {**detail, "applicable": False, "reason": "graded against a rubric; use the judge"})
        want = normalize(item.answer)
        correct, too_long = contains_answer(got, want, self.max_extra_words)
        return Verdict(float(correct), {**detail, "normalized_answer": want, "too_long": too_long})


@hookimpl
def register_graders(register):
    register(LongMemEvalJudge)
    register(LongMemEvalMatch)
