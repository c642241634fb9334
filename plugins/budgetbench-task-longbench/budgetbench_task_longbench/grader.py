"""The official LongBench v2 answer extraction and the ``longbench-choice`` grader.

Extraction follows the official ``extract_answer``: strip ``*``, then look for
``The correct answer is (X)``, then ``The correct answer is X``; anything else is no
answer and is scored wrong. There is no fallback to the first character or a lone
letter, so a reply such as "A person..." is never read as answer A (defect 12).

One deliberate tightening of the official second pattern: the letter must not be
followed by another letter, so "The correct answer is Apparently..." is no answer rather
than A (the official regex reads the first letter of that word). "The correct answer is
A person..." still reads A, as officially: it cannot be told apart from "...is A because".
``detail['pattern']`` records which pattern matched so a reader can audit every row.
"""

from __future__ import annotations

import re

from budgetbench_core import Grader, Verdict

PARENTHESISED = re.compile(r"The correct answer is \(([A-D])\)")
BARE = re.compile(r"The correct answer is ([A-D])(?![A-Za-z])")


def extract_answer(reply: str) -> tuple[str | None, str | None]:
    """``(letter, pattern)``: the extracted letter and which pattern found it, or ``(None, None)``."""
    text = reply.replace("*", "")
    for label, pattern in (("parenthesised", PARENTHESISED), ("bare", BARE)):
        match = pattern.search(text)
        if match:
            return match.group(1), label
    return None, None


class LongBenchChoice(Grader):
    """Correct when the letter extracted from the reply equals the gold letter."""

    name = "longbench-choice"
    version = "1"
    binary = True
    description = "LongBench v2 official answer extraction ('The correct answer is (X)'); no answer is wrong."

    def grade(self, item, prediction, context):
        letter, pattern = extract_answer(prediction)
        correct = letter is not None and letter == item.answer
        return Verdict(float(correct), {"extracted": letter, "pattern": pattern, "answer": item.answer})
