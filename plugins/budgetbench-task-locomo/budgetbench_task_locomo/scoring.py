"""The LoCoMo paper's token F1, with its answer normalisation and per-category rules.

Reproduces the behaviour of ``task_eval/evaluation.py`` (``normalize_answer``, ``f1_score``,
``f1`` and the category branch of ``eval_question_answering``) in github.com/snap-research/LoCoMo
at commit 3eb6f2c, written here from reading it:

- normalisation: commas deleted, lower case, ASCII punctuation deleted, the words "a", "an",
  "the" and "and" removed (``regex`` word boundaries), whitespace collapsed;
- tokens are the normalised words stemmed with NLTK's Porter stemmer (its default mode);
  F1 over the multiset of tokens, 0 when nothing is shared;
- category 1 (multi-hop): prediction and answer are split at commas; the score is the mean,
  over the answer's parts, of the best F1 against any part of the prediction;
- categories 2, 3, 4: plain F1; for category 3 only the answer's text before the first ";";
- category 5 (adversarial): 1 when the lower-cased prediction contains "no information
  available" or "not mentioned", else 0.

Any change here changes what a score means: give ``VERSION`` a new value with it.
"""

from __future__ import annotations

import string
from collections import Counter
from functools import lru_cache

import numpy as np
import regex

VERSION = "locomo-evaluation.py@3eb6f2c"
ADVERSARIAL_PHRASES = ("no information available", "not mentioned")
_DELETED = str.maketrans("", "", string.punctuation)
_ARTICLES = regex.compile(r"\b(a|an|the|and)\b")


@lru_cache(maxsize=1)
def _stemmer():
    from nltk.stem import PorterStemmer  # imported on first use: nltk's import is slow

    return PorterStemmer()


def normalize_answer(text: str) -> str:
    text = text.replace(",", "").lower().translate(_DELETED)
    return " ".join(_ARTICLES.sub(" ", text).split())


@lru_cache(maxsize=65536)
def _stem(word: str) -> str:
    return _stemmer().stem(word)


def tokens(text: str) -> list[str]:
    return [_stem(word) for word in normalize_answer(text).split()]


def token_f1(prediction: str, answer: str) -> float:
    """F1 of the stemmed, normalised tokens (the official ``f1_score``)."""
    predicted, gold = tokens(prediction), tokens(answer)
    shared = sum((Counter(predicted) & Counter(gold)).values())
    if shared == 0:
        return 0.0
    precision, recall = shared / len(predicted), shared / len(gold)
    return (2 * precision * recall) / (precision + recall)


def multi_answer_f1(prediction: str, answer: str) -> float:
    """Category 1: each comma-separated part of the answer matched to its best predicted part."""
    predicted = [part.strip() for part in prediction.split(",")]
    gold = [part.strip() for part in answer.split(",")]
    return float(np.mean([max(token_f1(p, g) for p in predicted) for g in gold]))


def says_not_mentioned(prediction: str) -> bool:
    lowered = prediction.lower()
    return any(phrase in lowered for phrase in ADVERSARIAL_PHRASES)


def category_score(prediction: str, answer: str | None, category: int) -> float:
    """The official score of one prediction for a question of ``category`` (1-5)."""
    if category == 5:
        return float(says_not_mentioned(prediction))
    if answer is None:
        raise ValueError(f"category {category} needs an answer")
    if category == 1:
        return multi_answer_f1(prediction, answer)
    if category == 3:
        answer = answer.split(";")[0].strip()
    if category in (2, 3, 4):
        return token_f1(prediction, answer)
    raise ValueError(f"LoCoMo categories are 1-5, got {category!r}")
