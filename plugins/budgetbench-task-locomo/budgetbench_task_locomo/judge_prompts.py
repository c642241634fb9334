"""The "J" judge: the CORRECT/WRONG prompt memory-layer papers report LoCoMo with, and its reading.

Categories 1-4 use ``ACCURACY_PROMPT`` of mem0's evaluation (github.com/mem0ai/mem0,
``evaluation/metrics/llm_judge.py`` at commit 2352a44; the same text from 2bb0653 until mem0
retired that folder in 9315e30), word for word, its typographic quotes and trailing spaces
included: the prompt behind the "J" columns of the mem0 paper
(arXiv:2504.19413) and of the systems compared with it. mem0 asks gpt-4o-mini at temperature 0
in JSON mode and scores 1 when the reply's JSON ``label`` is "CORRECT"; it skips category 5.

Category 5 (adversarial, only with ``adversarial=include``) has no published judge prompt:
``ADVERSARIAL_PROMPT`` is this plugin's own, worded after the one above. It is correct to
say the conversation does not tell, wrong to give the misleading answer or any other.

Reading a reply: the ``label`` of the first JSON object in it; a reply without readable JSON
is read by its last standalone CORRECT or WRONG (a small model seldom writes JSON); a reply
with neither is WRONG with ``label: null``. Change any text here only with a new version:
``PROMPTS_SHA256`` goes into the grader's version, so a changed prompt is a new grader.
"""

# ruff: noqa: W291 (the upstream prompt's trailing spaces are part of its text)
from __future__ import annotations

import hashlib
import json
import re

SOURCE = "mem0ai/mem0 evaluation/metrics/llm_judge.py@2352a44"
JUDGE_MAX_TOKENS = 256  # a one-sentence reason and the JSON label
PAPER_JUDGE_MODEL = "gpt-4o-mini"

ACCURACY_PROMPT = """
Your task is to label an answer to a question as \u2019CORRECT\u2019 or \u2019WRONG\u2019. You will be given the following data:
    (1) a question (posed by one user to another user), 
    (2) a \u2019gold\u2019 (ground truth) answer, 
    (3) a generated answer
which you will score as CORRECT/WRONG.

The point of the question is to ask about something one user should know about the other user based on their prior conversations.
The gold answer will usually be a concise and short answer that includes the referenced topic, for example:
Question: Do you remember what I got the last time I went to Hawaii?
Gold answer: A shell necklace
The generated answer might be much longer, but you should be generous with your grading - as long as it touches on the same topic as the gold answer, it should be counted as CORRECT. 

For time related questions, the gold answer will be a specific date, month, year, etc. The generated answer might be much longer or use relative time references (like "last Tuesday" or "next month"), but you should be generous with your grading - as long as it refers to the same date or time period as the gold answer, it should be counted as CORRECT. Even if the format differs (e.g., "May 7th" vs "7 May"), consider it CORRECT if it's the same date.

Now it's time for the real question:
Question: {question}
Gold answer: {gold_answer}
Generated answer: {generated_answer}

First, provide a short (one sentence) explanation of your reasoning, then finish with CORRECT or WRONG. 
Do NOT include both CORRECT and WRONG in your response, or it will break the evaluation script.

Just return the label CORRECT or WRONG in a json format with the key as "label".
"""

ADVERSARIAL_PROMPT = """
Your task is to label an answer to a question as 'CORRECT' or 'WRONG'. You will be given the following data:
    (1) a question (posed by one user to another user) that their prior conversations do not answer,
    (2) a misleading answer that the conversations do not support,
    (3) a generated answer
which you will score as CORRECT/WRONG.

The generated answer is CORRECT only if it says that the conversations do not mention or give this information. It is WRONG if it gives the misleading answer, or any other specific answer.

Question: {question}
Misleading answer: {adversarial_answer}
Generated answer: {generated_answer}

First, provide a short (one sentence) explanation of your reasoning, then finish with CORRECT or WRONG.
Do NOT include both CORRECT and WRONG in your response.

Just return the label CORRECT or WRONG in a json format with the key as "label".
"""


def _sha256(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


ACCURACY_SHA256 = _sha256(ACCURACY_PROMPT)
ADVERSARIAL_SHA256 = _sha256(ADVERSARIAL_PROMPT)
PROMPTS_SHA256 = _sha256(ACCURACY_PROMPT + ADVERSARIAL_PROMPT)

_JSON_OBJECT = re.compile(r"\{[^{}]*\}")
_LABEL_WORD = re.compile(r"\b(CORRECT|WRONG)\b")


def accuracy_prompt(question: str, gold_answer: str, generated_answer: str) -> str:
    return ACCURACY_PROMPT.format(question=question, gold_answer=gold_answer, generated_answer=generated_answer)


def adversarial_prompt(question: str, adversarial_answer: str, generated_answer: str) -> str:
    return ADVERSARIAL_PROMPT.format(
        question=question, adversarial_answer=adversarial_answer, generated_answer=generated_answer
    )


def read_label(reply: str) -> tuple[str | None, str | None]:
    """``(label, how)``: "CORRECT", "WRONG" or None, read from "json", "word" or nothing."""
    for match in _JSON_OBJECT.finditer(reply):
        try:
            value = json.loads(match.group(0)).get("label")
        except (json.JSONDecodeError, AttributeError):
            continue
        if isinstance(value, str) and value.strip().upper() in ("CORRECT", "WRONG"):
            return value.strip().upper(), "json"
    words = _LABEL_WORD.findall(reply)
    if words:
        return words[-1], "word"
    return None, None
