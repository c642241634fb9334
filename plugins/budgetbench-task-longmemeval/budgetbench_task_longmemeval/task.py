"""The ``longmemeval`` task: official LongMemEval files, one rendering, category = question type.

Options: ``path`` (a file; default: the data folder's file for ``split``) and ``split``
(``s``, ``s_cleaned``, ``m``, ``m_cleaned`` or ``oracle``; default ``s``). With ``--limit``
the items are a seeded round-robin selection across the six question types.
"""

from __future__ import annotations

import hashlib
from typing import Any

from budgetbench_core import Dataset, Param, Task, hookimpl, resolve_data_file

from .formatting import HIDDEN_METADATA, to_item
from .loader import SPLITS, load_records


def file_sha256(path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


class LongMemEval(Task):
    """LongMemEval from its official files: each question with its chat history of dated
    sessions; six question types plus abstention, selected round-robin across types."""

    name = "longmemeval"
    default_grader = "longmemeval-judge"
    max_output_tokens = 128
    description = "LongMemEval (official files): chat histories, dated sessions, six question types + abstention."
    hidden_metadata = HIDDEN_METADATA  # has_answer and the official session ids: never seen by strategies
    parameters = {  # help for `budgetbench describe`; the defaults come from the signature
        "path": Param(help="an official LongMemEval JSON file (default: the split's file in the data folder)"),
        "split": Param(help=f"which official file: {', '.join(SPLITS)} (s = LongMemEval_S, oracle = evidence only)"),
    }

    def __init__(self, path: str | None = None, split: str = "s", **options: Any) -> None:
        super().__init__(path=path, split=split, **options)
        if split not in SPLITS:
            raise ValueError(f"longmemeval: split must be one of {sorted(SPLITS)}, got {split!r}")
        unknown = sorted(options)
        if unknown:
            raise ValueError(f"longmemeval: unknown task options {unknown}; known: path, split")
        self.path = self.read_data_file(resolve_data_file("longmemeval", SPLITS[split], path))

    def load(self, limit, seed):
        for index, record in load_records(self.path, limit, seed):
            yield to_item(record, self.path, index)

    def load_wanted(self, limit, seed, wanted):
        """Build only the items still to run: a resumed or sharded run skips the rest unbuilt."""
        for index, record in load_records(self.path, limit, seed):
            if wanted(record["question_id"]):
                yield to_item(record, self.path, index)

    def manifest_notes(self) -> dict[str, Any]:
        return {
            **super().manifest_notes(),
            "file": str(self.path),
            "file_sha256": file_sha256(self.path),
            "selection": "round-robin across question types, shuffled with the run seed",
        }


@hookimpl
def register_tasks(register):
    register(LongMemEval)


@hookimpl
def register_datasets(register):
    register(
        Dataset(
            "longmemeval",
            "xiaowu0162/longmemeval",
            "longmemeval",
            {"longmemeval_oracle.json": "longmemeval_oracle.json", "longmemeval_s.json": "longmemeval_s.json"},
            "LongMemEval oracle and S splits (the task's default files)",
        )
    )
