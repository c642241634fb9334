"""One rendering of a LongMemEval record, shared by every strategy and memory system.

Sessions are put in date order (as the official generation script does) and numbered
1..N. Their turns become chat messages; every user turn, and the first turn of every
session, starts with ``[Session <n>, <date>]`` so that whatever subset of turns a
strategy keeps or a memory system retrieves still says when it was said. Assistant
turns after the first carry no header: the model would otherwise learn to start its
own answer with one, and the header would cost tokens twice per exchange.

Turns the dataset flags ``has_answer`` carry the evidence mark (``metadata["evidence"]``, the
turn's text) that the report's evidence recall checks against each prompt.

In the official files the sessions holding the evidence are named ``answer_...``, which
would tell the model (and any memory system that showed or read ids) where the answer is.
So a message's ``session_id`` is the session's number in date order (``s1``, ``s2``, ...),
and the official id is kept under ``official_session_id``: like ``has_answer`` and the
evidence marks it is grading-only (``HIDDEN_METADATA``), withheld from every strategy's view
by the harness and never in the text.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from budgetbench_core import EVIDENCE_ID_KEY, EVIDENCE_KEY, Item, Message

from .loader import is_abstention, parse_date

SYSTEM_PROMPT = (
    "I will give you several history chats between you and a user. Please answer the question based on the "
    "relevant chat history. Each past message is marked with its session number and date."
)


OFFICIAL_SESSION_ID = "official_session_id"
HIDDEN_METADATA = frozenset({"has_answer", OFFICIAL_SESSION_ID})
"""Message metadata for measuring retrieval, not for answering (``Task.hidden_metadata``)."""


def session_header(number: int, date: str) -> str:
    return f"[Session {number}, {date}]"


def query_text(question: str, question_date: str) -> str:
    """The question last, with its date, worded as in the official answer prompt."""
    return f"Current Date: {question_date}\nQuestion: {question}\nAnswer:"


def unique_session_ids(ids: list[str]) -> list[str]:
    """Official ids, with ``#2``, ``#3`` appended to repeats (LongMemEval_S repeats a few filler sessions)."""
    counts: dict[str, int] = {}
    out = []
    for sid in ids:
        counts[sid] = counts.get(sid, 0) + 1
        out.append(sid if counts[sid] == 1 else f"{sid}#{counts[sid]}")
    return out


def to_item(record: dict[str, Any], path: Path, index: int) -> Item:
    """The Item for one checked record."""
    sessions = list(
        zip(record["haystack_dates"], unique_session_ids(record["haystack_session_ids"]), record["haystack_sessions"])
    )
    sessions.sort(key=lambda s: parse_date(s[0]))  # stable: equal dates keep file order
    history: list[Message] = []
    for number, (date, sid, turns) in enumerate(sessions, start=1):
        for position, turn in enumerate(turns):
            content = turn["content"]
            if turn["role"] == "user" or position == 0:
                content = f"{session_header(number, date)} {content}"
            metadata = {
                "session_id": f"s{number}",  # opaque: the official id names the evidence sessions
                OFFICIAL_SESSION_ID: sid,
                "timestamp": date,
                "session_number": number,
                "turn": position,
                "has_answer": bool(turn.get("has_answer", False)),
            }
            if metadata["has_answer"] and turn["content"].strip():
                # evidence recall (budgetbench_core.evidence): the turn's own text must reach the prompt
                metadata.update({EVIDENCE_KEY: turn["content"], EVIDENCE_ID_KEY: f"{sid}:{position}"})
            history.append(Message(turn["role"], content, metadata))
    qid = record["question_id"]
    return Item(
        id=qid,
        history=tuple(history),
        query=Message("user", query_text(record["question"], record["question_date"])),
        answer=record["answer"],
        system=Message("system", SYSTEM_PROMPT),
        category=record["question_type"],
        metadata={
            "question": record["question"],
            "question_type": record["question_type"],
            "question_date": record["question_date"],
            "abstention": is_abstention(qid),
            "answer_session_ids": list(record.get("answer_session_ids", [])),
            "source": {"file": str(path), "record": index},
        },
    )
