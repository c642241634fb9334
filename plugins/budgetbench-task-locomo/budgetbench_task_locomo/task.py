"""The ``locomo`` task: one item per question, the whole dated conversation as its history.

Every turn of every session, in order, is one message: ``<session date-time> | <speaker>:
<text>`` (the line format of mem0's LoCoMo RAG baseline), and an image turn adds ``[shared
<caption>]`` (its BLIP caption, as the LoCoMo code does), so whatever subset a strategy keeps
still says who said what when. Speaker A's turns are ``user`` messages and speaker B's
``assistant`` ones, as mem0's evaluation hands them to a memory layer; a message's
``session_id`` and ``timestamp`` are its session's, so memory systems ingest the same sessions.

Evidence marks (``budgetbench_core.evidence``) are the turns the question's ``evidence`` names:
the turn's own text must reach the prompt. Options: ``path`` (``locomo10.json``), ``adversarial``
(``exclude``, the default, as published results do, or ``include``) and ``errata`` (a JSON file,
see ``errata.py``). With ``--limit``, a seeded round-robin selection across the categories.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Iterator
from typing import Any

from budgetbench_core import EVIDENCE_ID_KEY, EVIDENCE_KEY, Item, Message, Task, balanced, resolve_data_file

from .data import ADVERSARIAL, CATEGORIES, Conversation, Question, load_conversations
from .errata import EXCLUDE, ceiling, load_errata

DATASET = "locomo"
DEFAULT_FILE = "locomo10.json"
ADVERSARIAL_CHOICES = ("exclude", "include")
# The system prompt follows the LoCoMo code's CONV_START_PROMPT, the query its QA_PROMPT.
SYSTEM_PROMPT = (
    "Below is a conversation between two people: {a} and {b}. The conversation takes place over multiple days "
    "and every message starts with the date and time of its conversation."
)
QUERY = (
    "Based on the above context, write an answer in the form of a short phrase for the following question. "
    "Answer with exact words from the context whenever possible.{abstain}\n\nQuestion: {question} Short answer:"
)
# Only with adversarial=include, on every question alike (the wording must not reveal the category).
ABSTAIN = " If the conversation does not say, answer that it is not mentioned in the conversation."
NOT_ANSWERABLE = "Not mentioned in the conversation"  # the official correct option of a category 5 question


def turn_text(date_time: str, speaker: str, text: str, caption: str | None) -> str:
    line = f"{date_time} | {speaker}: {text}"
    return f"{line} [shared {caption}]" if caption else line


class LoCoMo(Task):
    """Options: ``path`` (the official locomo10.json), ``adversarial`` (exclude or include
    category 5; default exclude) and ``errata`` (a JSON file: question key -> corrected answer or "exclude")."""

    name = "locomo"
    default_grader = "locomo-f1"
    max_output_tokens = 64
    description = "LoCoMo (official locomo10.json): dated two-speaker conversations, questions in 5 categories."

    def __init__(
        self, path: str | None = None, adversarial: str = "exclude", errata: str | None = None, **options: Any
    ) -> None:
        if options:
            raise ValueError(f"locomo: unknown task options {sorted(options)}; known: path, adversarial, errata")
        if adversarial not in ADVERSARIAL_CHOICES:
            raise ValueError(f"locomo: adversarial must be exclude or include, got {adversarial!r}")
        super().__init__(path=path, adversarial=adversarial, errata=errata)
        self.adversarial = adversarial == "include"
        self.path = self.read_data_file(resolve_data_file(DATASET, DEFAULT_FILE, path))
        self.errata_path = self.read_data_file(errata) if errata else None
        self._notes: dict[str, Any] = {}

    def query_text(self, question: str) -> str:
        return QUERY.format(abstain=ABSTAIN if self.adversarial else "", question=question)

    def item(self, conversation: Conversation, question: Question, errata: dict[str, str]) -> Item:
        evidence = set(question.evidence)
        history = []
        for session in conversation.sessions:
            for turn in session.turns:
                metadata = {
                    "session_id": f"session_{session.number}",
                    "timestamp": session.date_time,
                    "speaker": turn.speaker,
                    "dia_id": turn.dia_id,
                }
                if turn.dia_id in evidence:
                    metadata.update(
                        {EVIDENCE_KEY: turn.text if turn.text.strip() else True, EVIDENCE_ID_KEY: turn.dia_id}
                    )
                role = "user" if turn.speaker == conversation.speaker_a else "assistant"
                history.append(
                    Message(role, turn_text(session.date_time, turn.speaker, turn.text, turn.caption), metadata)
                )
        metadata = {
            "question": question.question,
            "category_number": question.category,
            "sample_id": question.sample_id,
            "evidence_ids": list(question.evidence),
            "unresolved_evidence": list(question.unresolved),
            "source": {"file": str(self.path), "conversation": question.sample_id, "qa": question.index},
        }
        if question.category == ADVERSARIAL:
            metadata["adversarial_answer"] = question.adversarial_answer
        if question.key in errata:
            metadata["errata"] = errata[question.key]
        return Item(
            id=question.key,
            history=tuple(history),
            query=Message("user", self.query_text(question.question)),
            answer=NOT_ANSWERABLE if question.category == ADVERSARIAL else question.answer,
            system=Message("system", SYSTEM_PROMPT.format(a=conversation.speaker_a, b=conversation.speaker_b)),
            category=question.category_name,
            metadata=metadata,
        )

    def _selection(self, limit: int | None, seed: int) -> tuple[list[tuple[Conversation, Question]], dict[str, str]]:
        conversations = load_conversations(self.path)
        every = [(c, q) for c in conversations for q in c.questions]
        errata = load_errata(self.errata_path, {q.key for _, q in every}) if self.errata_path else {}
        for _, question in every:
            if question.category == ADVERSARIAL and errata.get(question.key, EXCLUDE) != EXCLUDE:
                raise ValueError(
                    f"locomo: {self.errata_path}: {question.key} is a category 5 (adversarial) question: "
                    f"its only erratum can be {EXCLUDE!r}"
                )
        eligible = [(c, q) for c, q in every if self.adversarial or q.category != ADVERSARIAL]
        chosen = eligible if limit is None else balanced(eligible, limit, seed, lambda e: e[1].category_name, "locomo")
        self._notes = self._describe(conversations, every, [q for _, q in chosen], errata)
        return chosen, errata

    def load(self, limit: int | None, seed: int) -> Iterator[Item]:
        chosen, errata = self._selection(limit, seed)
        for conversation, question in chosen:
            yield self.item(conversation, question, errata)

    def load_wanted(self, limit, seed, wanted):
        """Build only the items still to run: a resumed or sharded run skips the rest unbuilt."""
        chosen, errata = self._selection(limit, seed)
        for conversation, question in chosen:
            if wanted(question.key):
                yield self.item(conversation, question, errata)

    def _describe(self, conversations, every, selected, errata) -> dict[str, Any]:
        def by_category(questions):
            counts = Counter(q.category for q in questions)
            return {f"{n} {name}": counts.get(n, 0) for n, name in CATEGORIES.items()}

        notes: dict[str, Any] = {
            "data_file": str(self.path),
            "conversations": len(conversations),
            "questions_in_file": by_category([q for _, q in every]),
            "questions_selected": by_category(selected),
            "adversarial": "included" if self.adversarial else "excluded (category 5, as published results do)",
            "evidence": {
                "repaired": [
                    {"question": q.key, "official": entry, "read_as": list(ids)}
                    for _, q in every
                    for entry, ids in q.repaired
                ],
                "unresolved": [{"question": q.key, "ids": list(q.unresolved)} for _, q in every if q.unresolved],
                "questions_without_evidence": [q.key for _, q in every if not q.evidence],
            },
            "answer_prompt_sha256": hashlib.sha256((SYSTEM_PROMPT + QUERY + ABSTAIN).encode()).hexdigest(),
        }
        if self.errata_path:
            notes["errata"] = {"file": str(self.errata_path), **ceiling(errata, [q.key for q in selected])}
        return notes

    def manifest_notes(self) -> dict[str, Any]:
        return {**super().manifest_notes(), **self._notes}
