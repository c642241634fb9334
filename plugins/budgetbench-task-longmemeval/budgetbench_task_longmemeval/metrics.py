"""The accuracies LongMemEval's print_qa_metrics.py reports, with Wilson intervals.

Per question type; task-averaged (the mean of the per-type accuracies); overall (over
all questions); abstention (over the ``_abs`` questions, which also count in their type).
Upstream averages over all six types even when one is empty (giving nan); here the
task average is over the types present and says which. Every interval is a real Wilson
score interval (the core's ``wilson``), never a Wald one.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass

from .loader import QUESTION_TYPES, is_abstention

CONFIDENCE = 0.95


@dataclass
class Accuracy:
    correct: int
    n: int
    accuracy: float | None
    low: float | None
    high: float | None


def wilson(correct: int, n: int) -> Accuracy:
    if n == 0:
        return Accuracy(0, 0, None, None, None)
    from budgetbench_core import wilson as interval  # scipy loads when a summary is made, not with the plugin

    low, high = interval(correct, n, CONFIDENCE)
    return Accuracy(correct, n, correct / n, low, high)


def summarize(graded: Iterable[tuple[str, str, float]]) -> dict:
    """``graded``: (question_id, question_type, quality) with quality 0 or 1, violations as 0."""
    by_type: dict[str, list[int]] = {t: [] for t in QUESTION_TYPES}
    abstention: list[int] = []
    every: list[int] = []
    for question_id, question_type, quality in graded:
        if quality not in (0, 1):
            raise ValueError(
                f"question {question_id!r}: quality {quality} is not binary; LongMemEval accuracy needs a binary grader"
            )
        label = int(quality)
        by_type.setdefault(question_type, []).append(label)
        every.append(label)
        if is_abstention(question_id):
            abstention.append(label)
    per_type = {t: wilson(sum(v), len(v)) for t, v in by_type.items()}
    present = [a.accuracy for a in per_type.values() if a.n]
    return {
        "per_type": {t: asdict(a) for t, a in per_type.items()},
        "task_averaged": sum(present) / len(present) if present else None,
        "task_averaged_over": [t for t, a in per_type.items() if a.n],
        "overall": asdict(wilson(sum(every), len(every))),
        "abstention": asdict(wilson(sum(abstention), len(abstention))),
    }
