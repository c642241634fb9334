"""Reading the official ``locomo10.json`` unchanged, with clear errors on bad records.

The file is a list of conversations: two speakers, numbered dated sessions of turns
(``dia_id`` ``D<session>:<turn>``), and ``qa``: questions with an answer (a string, a few
integers), a category 1-5 and the ``dia_id``s of the turns that hold the answer
(``evidence``). Category 5 (adversarial) has an ``adversarial_answer`` instead: what a
model that invents an answer would say.

A handful of official evidence entries are malformed ("D8:6; D9:17", "D:11:26", "D30:05"):
they are read as the ids they plainly spell and listed as repaired. An id that names no turn
of the conversation is listed as unresolved. Both lists go to the run manifest; no question
is dropped for them (it keeps the evidence ids that resolve).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from budgetbench_core import TaskDataError

CATEGORIES = {1: "multi-hop", 2: "temporal", 3: "open-domain", 4: "single-hop", 5: "adversarial"}
ADVERSARIAL = 5
_SESSION_KEY = re.compile(r"session_(\d+)")
_DIA_ID = re.compile(r"D:?(\d+):(\d+)")
_EVIDENCE_SEPARATORS = re.compile(r"[;,\s]+")


@dataclass(frozen=True)
class Turn:
    speaker: str
    dia_id: str
    text: str
    caption: str | None  # ``blip_caption`` of a shared image


@dataclass(frozen=True)
class Session:
    number: int
    date_time: str
    turns: tuple[Turn, ...]


@dataclass(frozen=True)
class Question:
    key: str  # the item id: ``<sample_id>_q<index>``, the errata file's key
    sample_id: str
    index: int
    question: str
    answer: str | None  # str() of the official answer (a few are integers); None when absent
    adversarial_answer: str | None
    category: int
    evidence: tuple[str, ...]  # resolved dia_ids, in the order given
    unresolved: tuple[str, ...]  # evidence ids naming no turn of the conversation
    repaired: tuple[tuple[str, tuple[str, ...]], ...]  # (official entry, the ids read from it)

    @property
    def category_name(self) -> str:
        return CATEGORIES[self.category]


@dataclass(frozen=True)
class Conversation:
    sample_id: str
    speaker_a: str
    speaker_b: str
    sessions: tuple[Session, ...]
    questions: tuple[Question, ...]


def question_key(sample_id: str, index: int) -> str:
    return f"{sample_id}_q{index:03d}"


def read_evidence(entries: list[str], known: set[str]) -> tuple[list[str], list[str], list[tuple[str, list[str]]]]:
    """``(resolved, unresolved, repaired)`` for one question's official ``evidence`` list."""
    resolved: list[str] = []
    unresolved: list[str] = []
    repaired: list[tuple[str, list[str]]] = []
    for entry in entries:
        read = []
        for part in filter(None, _EVIDENCE_SEPARATORS.split(entry)):
            match = _DIA_ID.fullmatch(part)
            dia_id = f"D{int(match[1])}:{int(match[2])}" if match else part
            if dia_id in known:
                read.append(dia_id)
                if dia_id not in resolved:
                    resolved.append(dia_id)
            else:
                unresolved.append(part)
        if read and read != [entry]:
            repaired.append((entry, read))
    return resolved, unresolved, repaired


def _text(where: str, record: dict[str, Any], name: str) -> str:
    value = record.get(name)
    if not isinstance(value, str) or not value.strip():
        raise TaskDataError(f"{where}: field {name!r} is missing or not a non-empty string")
    return value


def _sessions(where: str, conversation: dict[str, Any], speakers: tuple[str, str]) -> tuple[Session, ...]:
    numbers = sorted(int(m[1]) for key in conversation if (m := _SESSION_KEY.fullmatch(key)))
    if not numbers:
        raise TaskDataError(f"{where}: 'conversation' has no session_<n> list")
    sessions = []
    for number in numbers:
        key = f"session_{number}"
        turns = conversation[key]
        date_time = _text(where, conversation, f"{key}_date_time")
        if not isinstance(turns, list):
            raise TaskDataError(f"{where}: field {key!r} must be a list of turns, got {type(turns).__name__}")
        parsed = []
        for position, turn in enumerate(turns):
            at = f"{where}: {key}[{position}]"
            if not isinstance(turn, dict):
                raise TaskDataError(f"{at}: expected a JSON object, got {type(turn).__name__}")
            speaker, dia_id = _text(at, turn, "speaker"), _text(at, turn, "dia_id")
            if speaker not in speakers:
                raise TaskDataError(f"{at}: field 'speaker' {speaker!r} is neither speaker_a nor speaker_b")
            if not isinstance(turn.get("text"), str):
                raise TaskDataError(f"{at}: field 'text' must be a string")
            caption = turn.get("blip_caption")
            parsed.append(Turn(speaker, dia_id, turn["text"], caption if isinstance(caption, str) else None))
        sessions.append(Session(number, date_time, tuple(parsed)))
    return tuple(sessions)


def _question(where: str, sample_id: str, index: int, qa: Any, known: set[str]) -> Question:
    at = f"{where}: qa[{index}]"
    if not isinstance(qa, dict):
        raise TaskDataError(f"{at}: expected a JSON object, got {type(qa).__name__}")
    category = qa.get("category")
    if category not in CATEGORIES:
        raise TaskDataError(f"{at}: field 'category' must be one of {sorted(CATEGORIES)}, got {category!r}")
    evidence = qa.get("evidence")
    if not isinstance(evidence, list) or not all(isinstance(e, str) for e in evidence):
        raise TaskDataError(f"{at}: field 'evidence' must be a list of dia_id strings")
    answer = qa.get("answer")
    if category == ADVERSARIAL:
        _text(at, qa, "adversarial_answer")
    elif not isinstance(answer, (str, int)) or isinstance(answer, bool):
        raise TaskDataError(f"{at}: field 'answer' must be a string or an integer, got {type(answer).__name__}")
    resolved, unresolved, repaired = read_evidence(evidence, known)
    return Question(
        key=question_key(sample_id, index),
        sample_id=sample_id,
        index=index,
        question=_text(at, qa, "question"),
        answer=None if answer is None else str(answer),
        adversarial_answer=qa.get("adversarial_answer"),
        category=category,
        evidence=tuple(resolved),
        unresolved=tuple(unresolved),
        repaired=tuple((entry, tuple(ids)) for entry, ids in repaired),
    )


def _conversation(path: Path, index: int, record: Any) -> Conversation:
    where = f"{path}: conversation {index}"
    if not isinstance(record, dict):
        raise TaskDataError(f"{where}: expected a JSON object, got {type(record).__name__}")
    sample_id = _text(where, record, "sample_id")
    where = f"{path}: conversation {index} ({sample_id})"
    conversation = record.get("conversation")
    if not isinstance(conversation, dict):
        raise TaskDataError(f"{where}: field 'conversation' is missing or not an object")
    speakers = (_text(where, conversation, "speaker_a"), _text(where, conversation, "speaker_b"))
    sessions = _sessions(where, conversation, speakers)
    known = {turn.dia_id for session in sessions for turn in session.turns}
    if not isinstance(record.get("qa"), list):
        raise TaskDataError(f"{where}: field 'qa' is missing or not a list")
    questions = tuple(_question(where, sample_id, i, qa, known) for i, qa in enumerate(record["qa"]))
    return Conversation(sample_id, *speakers, sessions, questions)


def load_conversations(path: Path) -> list[Conversation]:
    """Every conversation of an official LoCoMo file; a repeated ``sample_id`` is an error."""
    try:
        records = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise TaskDataError(f"{path}: not a readable JSON file ({exc})") from None
    if not isinstance(records, list):
        raise TaskDataError(f"{path}: expected a JSON list of conversations, got {type(records).__name__}")
    conversations = [_conversation(Path(path), i, record) for i, record in enumerate(records)]
    seen: set[str] = set()
    for conversation in conversations:
        if conversation.sample_id in seen:
            raise TaskDataError(f"{path}: sample_id {conversation.sample_id!r} appears twice")
        seen.add(conversation.sample_id)
    return conversations
