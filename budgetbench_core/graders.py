"""The Grader contract: turn a prediction into a quality score, with a versioned verdict."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from .messages import Item, Message

JudgeCall = Callable[[Sequence[Message], int], str]


@dataclass
class Verdict:
    """``quality`` in [0, 1]; ``binary`` graders only give 0 or 1 (reports use Wilson intervals)."""

    quality: float
    detail: dict[str, Any] = field(default_factory=dict)


@dataclass
class GradingContext:
    """``judge(messages, max_tokens)`` calls the configured judge model through the harness."""

    judge: JudgeCall
    judge_model: str | None


class Grader(ABC):
    """Base class for graders. Subclasses set ``name``, ``version`` and ``binary``."""

    name: ClassVar[str]
    version: ClassVar[str] = "1"
    binary: ClassVar[bool] = True
    description: ClassVar[str] = ""

    def __init__(self, **params: Any) -> None:
        self.params = params

    @abstractmethod
    def grade(self, item: Item, prediction: str, context: GradingContext) -> Verdict:
        """Score one prediction. Never count an empty prediction correct."""


def contains_answer(prediction: str, answer: str, max_extra_words: int) -> tuple[bool, bool]:
    """``(correct, too_long)`` for normalised texts: the answer appears as whole words in a
    prediction at most ``max_extra_words`` longer than it. An empty prediction or answer is
    never correct, and a long prediction proves nothing by containing the answer (the
    reference harness's defect 1)."""
    too_long = len(prediction.split()) > len(answer.split()) + max_extra_words
    found = bool(prediction) and bool(answer) and f" {answer} " in f" {prediction} "
    return found and not too_long, too_long
