"""The ``swebench-verified`` task: the issue, its hints and repository files as retrievable messages.

History, oldest first: repository files (least relevant first, each file cut into pieces
of ``file_chunk_lines`` lines, one message per piece), then the hints, then the problem
statement, so newest-first strategies keep the issue and the most relevant files. The
query asks for a unified diff. Without ``repo_cache`` there are no repository files and
the manifest says so. The task never trims anything to the budget: strategies do.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

from budgetbench_core import Item, Message, Task, TaskDataError, balanced, data_dir, resolve_data_file

from .data import Instance, load_instances
from .patches import extract_patch
from .repo import RepoFile, find_clone, select_files

DATASET = "swebench"
DEFAULT_FILE = "swebench_verified.parquet"  # what `budgetbench data fetch swebench-verified` writes
HAND_PLACED_FILE = "swebench_verified.jsonl"  # the official JSONL, placed in the data folder by hand
SYSTEM_PROMPT = (
    "You are a software engineer. You are given an issue from the repository {repo} and, when available, hints "
    "and files of the repository at the commit the fix must apply to. Fix the issue."
)
QUERY = (
    "Write a patch that resolves the issue above. Reply with a single unified diff as printed by `git diff` "
    "(paths relative to the repository root with a/ and b/ prefixes, correct hunk headers) and nothing else."
)


def file_messages(file: RepoFile, commit: str, chunk_lines: int) -> list[Message]:
    lines = file.text.splitlines(keepends=True) or [""]
    messages = []
    for start in range(0, len(lines), chunk_lines):
        end = min(start + chunk_lines, len(lines))
        header = f"File {file.path}, lines {start + 1}-{end} of {len(lines)}, at commit {commit[:12]}:\n"
        messages.append(
            Message(
                "user",
                header + "".join(lines[start:end]),
                {
                    "session_id": f"file:{file.path}",
                    "source_id": f"{file.path}#L{start + 1}-L{end}",
                    "kind": "file",
                    "path": file.path,
                    "reason": file.reason,
                    "score": file.score,
                },
            )
        )
    return messages


class SWEBenchVerified(Task):
    """Options: ``path`` (official JSON/JSONL/parquet), ``repo_cache`` (folder of clones), ``max_files``
    (default 6), ``file_chunk_lines`` (default 150), ``max_file_bytes`` (default 200000)."""

    name = "swebench-verified"
    default_grader = "swebench-patch-similarity"
    max_output_tokens = 768
    description = (
        "SWE-bench Verified: issue, hints and repo files as context; patch-similarity proxy (not resolved rate)."
    )

    def __init__(
        self,
        path: str | None = None,
        repo_cache: str | None = None,
        max_files: int = 6,
        file_chunk_lines: int = 150,
        max_file_bytes: int = 200_000,
        **options: Any,
    ) -> None:
        if options:
            raise ValueError(
                f"swebench-verified: unknown options {sorted(options)}; known: path, repo_cache, "
                f"max_files, file_chunk_lines, max_file_bytes"
            )
        for name, value in (
            ("max_files", max_files),
            ("file_chunk_lines", file_chunk_lines),
            ("max_file_bytes", max_file_bytes),
        ):
            if int(value) <= 0:
                raise ValueError(f"swebench-verified: {name} must be a positive integer, got {value!r}")
        if repo_cache is not None and not Path(repo_cache).is_dir():
            raise ValueError(f"swebench-verified: repo_cache {repo_cache} is not a folder")
        super().__init__(
            path=path,
            repo_cache=repo_cache,
            max_files=int(max_files),
            file_chunk_lines=int(file_chunk_lines),
            max_file_bytes=int(max_file_bytes),
        )
        self.path = path
        self.repo_cache = Path(repo_cache) if repo_cache is not None else None
        self.max_files = int(max_files)
        self.file_chunk_lines = int(file_chunk_lines)
        self.max_file_bytes = int(max_file_bytes)
        self._notes: dict[str, Any] = {}

    def item(self, instance: Instance) -> Item:
        files: list[RepoFile] = []
        if self.repo_cache is not None:
            clone = find_clone(self.repo_cache, instance.repo)
            issue = f"{instance.problem_statement}\n{instance.hints_text}"
            try:
                files = select_files(clone, instance.base_commit, issue, self.max_files, self.max_file_bytes)
            except TaskDataError as exc:
                raise TaskDataError(f"instance {instance.instance_id}: {exc}") from None
        history = [
            message
            for file in reversed(files)
            for message in file_messages(file, instance.base_commit, self.file_chunk_lines)
        ]
        if instance.hints_text.strip():
            history.append(
                Message(
                    "user",
                    f"Hints from the issue discussion:\n{instance.hints_text}",
                    {"session_id": "hints", "source_id": "hints_text", "kind": "hints"},
                )
            )
        history.append(
            Message(
                "user",
                f"Issue in {instance.repo}:\n{instance.problem_statement}",
                {"session_id": "issue", "source_id": "problem_statement", "kind": "issue"},
            )
        )
        return Item(
            id=instance.instance_id,
            history=tuple(history),
            query=Message("user", QUERY),
            answer=instance.patch,
            system=Message("system", SYSTEM_PROMPT.format(repo=instance.repo)),
            category=instance.repo,
            metadata={
                "repo": instance.repo,
                "base_commit": instance.base_commit,
                "version": instance.version,
                "FAIL_TO_PASS": list(instance.FAIL_TO_PASS),
                "PASS_TO_PASS": list(instance.PASS_TO_PASS),
                "context_files": [{"path": f.path, "reason": f.reason, "score": f.score} for f in files],
            },
        )

    def _default_file(self) -> str:
        """The fetched parquet; the hand-placed JSONL when only that one is there."""
        folder = data_dir() / DATASET
        if not (folder / DEFAULT_FILE).is_file() and (folder / HAND_PLACED_FILE).is_file():
            return HAND_PLACED_FILE
        return DEFAULT_FILE

    def load(self, limit: int | None, seed: int) -> Iterator[Item]:
        path = self.read_data_file(resolve_data_file(DATASET, self._default_file(), self.path))
        instances = load_instances(path)
        selected = (
            instances if limit is None else balanced(instances, limit, seed, lambda i: i.repo, "swebench-verified")
        )
        self._notes = {"data_file": str(path), "items_in_file": len(instances), "items_selected": len(selected)}
        for instance in selected:
            yield self.item(instance)

    def extract_prediction(self, item: Item, completion: str) -> str:
        return extract_patch(completion)

    def manifest_notes(self) -> dict[str, Any]:
        if self.repo_cache is None:
            files = {
                "included": False,
                "note": "no repo_cache: the context is the problem statement and hints only, no repository files",
            }
        else:
            files = {
                "included": True,
                "repo_cache": str(self.repo_cache),
                "max_files": self.max_files,
                "file_chunk_lines": self.file_chunk_lines,
                "max_file_bytes": self.max_file_bytes,
                "selection": "files the issue mentions, then BM25 (bm25s) over text files at base_commit",
            }
        return {
            **super().manifest_notes(),
            **self._notes,
            "repository_files": files,
            "quality": "patch similarity to the gold patch: a proxy, not the resolved rate; export predictions "
            "with `budgetbench swebench export` and run the official swebench evaluation",
        }
