"""The ``longbench-v2`` task: the context as fixed-size chunks, the question and choices last.

Each chunk is one history message (its own session), so strategies choose which parts
of the document to present; the official prompt's wording is kept: its first line as
the system prompt, and the question, the four choices and the answer-format line as the
query. ``max_natural_tokens`` keeps only items whose whole prompt fits, and says so in
the manifest, because results on such a subset are conditioned on the selection.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from budgetbench_core import Item, Message, Task, TaskDataError, balanced, resolve_data_file

from .chunking import ENCODING, chunk_text, count_tokens
from .data import CHOICES, Record, load_records

DATASET = "longbench_v2"
DEFAULT_FILE = "data.json"
CATEGORY_FIELDS = ("difficulty", "length", "domain")
SYSTEM_PROMPT = "Please read the following text and answer the question below."
ANSWER_FORMAT = 'Format your response as follows: "The correct answer is (insert answer here)".'
# OpenAI's published chat overhead, used only for the approximate natural-size estimate.
PER_MESSAGE_TOKENS = 3
REPLY_PRIMING_TOKENS = 3


def query_text(record: Record) -> str:
    choices = "\n".join(f"({letter}) {record.choices[letter]}" for letter in CHOICES)
    return f"What is the correct answer to this question: {record.question}\nChoices:\n{choices}\n\n{ANSWER_FORMAT}"


class LongBenchV2(Task):
    """Options: ``path`` (the official JSON), ``chunk_tokens`` (default 512), ``category``
    (difficulty, length or domain; default difficulty), ``max_natural_tokens`` (optional)."""

    name = "longbench-v2"
    default_grader = "longbench-choice"
    max_output_tokens = 128
    description = "LongBench v2 multiple choice; context in fixed token chunks; official answer extraction."

    def __init__(
        self,
        path: str | None = None,
        chunk_tokens: int = 512,
        category: str = "difficulty",
        max_natural_tokens: int | None = None,
        **options: Any,
    ) -> None:
        if options:
            raise ValueError(
                f"longbench-v2: unknown options {sorted(options)}; known: path, chunk_tokens, category, "
                f"max_natural_tokens"
            )
        if category not in CATEGORY_FIELDS:
            raise ValueError(f"longbench-v2: category must be one of {', '.join(CATEGORY_FIELDS)}, got {category!r}")
        if int(chunk_tokens) <= 0:
            raise ValueError(f"longbench-v2: chunk_tokens must be a positive integer, got {chunk_tokens!r}")
        if max_natural_tokens is not None and int(max_natural_tokens) <= 0:
            raise ValueError(f"longbench-v2: max_natural_tokens must be a positive integer, got {max_natural_tokens!r}")
        super().__init__(
            path=path,
            chunk_tokens=int(chunk_tokens),
            category=category,
            max_natural_tokens=None if max_natural_tokens is None else int(max_natural_tokens),
        )
        self.path = path
        self.chunk_tokens = int(chunk_tokens)
        self.category = category
        self.max_natural_tokens = self.options["max_natural_tokens"]
        self._notes: dict[str, Any] = {}

    def item(self, record: Record) -> Item:
        chunks, context_tokens = chunk_text(record.context, self.chunk_tokens)
        history = tuple(
            Message(
                "user",
                text,
                {
                    "session_id": f"chunk-{index:04d}",
                    "source_id": f"{record.id}/chunk-{index:04d}",
                    "chunk_index": index,
                    "chunk_count": len(chunks),
                },
            )
            for index, text in enumerate(chunks)
        )
        system, query = Message("system", SYSTEM_PROMPT), Message("user", query_text(record))
        natural = (
            REPLY_PRIMING_TOKENS
            + context_tokens
            + sum(PER_MESSAGE_TOKENS + count_tokens(m.role) for m in history)
            + sum(PER_MESSAGE_TOKENS + count_tokens(m.role) + count_tokens(m.content) for m in (system, query))
        )
        categories = {"difficulty": record.difficulty, "length": record.length, "domain": record.domain}
        return Item(
            id=record.id,
            history=history,
            query=query,
            answer=record.answer,
            system=system,
            category=categories[self.category],
            metadata={
                "categories": categories,
                "sub_domain": record.sub_domain,
                "natural_tokens": natural,
                "chunk_tokens": self.chunk_tokens,
            },
        )

    def load(self, limit: int | None, seed: int) -> Iterator[Item]:
        path = self.read_data_file(resolve_data_file(DATASET, DEFAULT_FILE, self.path))
        records = load_records(path)
        if self.max_natural_tokens is None:
            # Chunk only what is selected: chunking every context takes seconds.
            chosen = (
                records
                if limit is None
                else balanced(records, limit, seed, lambda r: getattr(r, self.category), "longbench-v2")
            )
            selected, fitting = [self.item(record) for record in chosen], len(records)
        else:
            items = [self.item(record) for record in records]
            fits = [i for i in items if i.metadata["natural_tokens"] <= self.max_natural_tokens]
            if not fits:
                smallest = min((i.metadata["natural_tokens"] for i in items), default=None)
                raise TaskDataError(
                    f"{path}: no item's full prompt fits max_natural_tokens={self.max_natural_tokens} "
                    f"(the smallest needs {smallest} {ENCODING} tokens)"
                )
            selected = fits if limit is None else balanced(fits, limit, seed, lambda i: i.category, "longbench-v2")
            fitting = len(fits)
        self._notes = {
            "data_file": str(path),
            "items_in_file": len(records),
            "items_fitting": fitting,
            "items_selected": len(selected),
        }
        yield from selected

    def manifest_notes(self) -> dict[str, Any]:
        notes: dict[str, Any] = {
            **super().manifest_notes(),
            **self._notes,
            "chunking": {
                "tokenizer": f"tiktoken:{ENCODING}",
                "chunk_tokens": self.chunk_tokens,
                "independent_of_budget": True,
            },
            "category_field": self.category,
            "category_fields": list(CATEGORY_FIELDS),
            "selection_conditioned": self.max_natural_tokens is not None,
        }
        if self.max_natural_tokens is not None:
            notes["selection"] = {
                "max_natural_tokens": self.max_natural_tokens,
                "counted_with": f"tiktoken:{ENCODING} plus {PER_MESSAGE_TOKENS} tokens per message and "
                f"{REPLY_PRIMING_TOKENS} for the reply (approximate: not the served model's count)",
                "label": (
                    f"selection-conditioned: only the {self._notes.get('items_fitting')} of "
                    f"{self._notes.get('items_in_file')} items whose full prompt is at most "
                    f"{self.max_natural_tokens} tokens; not comparable with results on all items"
                ),
            }
        return notes
