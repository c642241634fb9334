"""Unified diffs: parsing (unidiff), path handling, and the similarity of two patches.

Paths lose one leading ``a/`` or ``b/`` as a prefix, never with ``str.lstrip`` (which
would turn ``b/build/a.py`` into ``uild/a.py``: the reference harness's defect 12).
``/dev/null`` marks an added or deleted file; a rename touches both its old and new path.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass

from unidiff import PatchSet
from unidiff.errors import UnidiffParseError

DEV_NULL = "/dev/null"
FENCE = re.compile(r"```[ \t]*(?:diff|patch|udiff)?[ \t]*\n(.*?)```", re.DOTALL)


class PatchParseError(ValueError):
    """Text that is not a well-formed unified diff."""


def strip_prefix(path: str) -> str:
    """``path`` without one leading ``a/`` or ``b/`` (git's default prefixes)."""
    for prefix in ("a/", "b/"):
        if path.startswith(prefix):
            return path[len(prefix) :]
    return path


@dataclass(frozen=True)
class FileChange:
    """One file of a patch: old and new path (None for /dev/null) and the changed lines."""

    old_path: str | None
    new_path: str | None
    removed: tuple[str, ...]
    added: tuple[str, ...]

    @property
    def paths(self) -> set[str]:
        return {p for p in (self.old_path, self.new_path) if p is not None}

    @property
    def status(self) -> str:
        if self.old_path is None:
            return "added"
        if self.new_path is None:
            return "deleted"
        return "renamed" if self.old_path != self.new_path else "modified"


def _path(header: str | None) -> str | None:
    if header is None or header == DEV_NULL:
        return None
    header = header.split("\t", 1)[0]
    if len(header) > 1 and header[0] == header[-1] == '"':
        header = header[1:-1]
    return strip_prefix(header)


def parse_patch(text: str) -> list[FileChange]:
    """The files a unified diff changes; raises PatchParseError on a malformed diff."""
    try:
        patch = PatchSet(text)
    except UnidiffParseError as exc:
        raise PatchParseError(str(exc)) from None
    changes = []
    for patched in patch:
        lines = [line for hunk in patched for line in hunk]
        changes.append(
            FileChange(
                old_path=_path(patched.source_file),
                new_path=_path(patched.target_file),
                removed=tuple(line.value.rstrip("\r\n") for line in lines if line.is_removed),
                added=tuple(line.value.rstrip("\r\n") for line in lines if line.is_added),
            )
        )
    return changes


def changed_lines(changes: list[FileChange]) -> Counter:
    """Multiset of (file, sign, line) over non-blank changed lines, trailing whitespace ignored."""
    lines: Counter = Counter()
    for change in changes:
        target = change.new_path or change.old_path
        for sign, texts in (("-", change.removed), ("+", change.added)):
            lines.update((target, sign, text.rstrip()) for text in texts if text.strip())
    return lines


def similarity(gold: str, prediction: str, file_weight: float = 0.4, line_weight: float = 0.6) -> tuple[float, dict]:
    """``file_weight`` x file recall + ``line_weight`` x changed-line F1, in [0, 1], with its parts.

    File recall is the share of the gold patch's files the prediction touches. Changed-line
    F1 compares (file, sign, line) multisets, so extra noise lowers it and lines changed in
    the wrong file count for nothing. An empty or malformed prediction scores 0.
    """
    gold_changes = parse_patch(gold)
    detail: dict = {"gold_files": sorted(set().union(*(c.paths for c in gold_changes)))}
    if not prediction.strip():
        return 0.0, {**detail, "predicted_files": [], "reason": "empty prediction"}
    try:
        predicted = parse_patch(prediction)
    except PatchParseError as exc:
        return 0.0, {**detail, "predicted_files": [], "reason": f"malformed diff: {exc}"}
    if not predicted:
        return 0.0, {**detail, "predicted_files": [], "reason": "no file changes found"}
    gold_files, predicted_files = set(detail["gold_files"]), set().union(*(c.paths for c in predicted))
    file_recall = len(gold_files & predicted_files) / len(gold_files) if gold_files else 0.0
    want, got = changed_lines(gold_changes), changed_lines(predicted)
    common = sum((want & got).values())
    total = sum(want.values()) + sum(got.values())
    line_f1 = 2 * common / total if total else 1.0  # neither changes a line (e.g. pure renames)
    quality = file_weight * file_recall + line_weight * line_f1
    return quality, {
        **detail,
        "predicted_files": sorted(predicted_files),
        "file_recall": file_recall,
        "line_f1": line_f1,
        "lines_matched": common,
        "gold_lines": sum(want.values()),
        "predicted_lines": sum(got.values()),
    }


def extract_patch(reply: str) -> str:
    """The diff inside a model reply: a fenced diff block, else from the first diff header on; else ""."""
    for block in FENCE.findall(reply):
        if re.search(r"^(diff --git |--- )", block, re.MULTILINE):
            return block
    match = re.search(r"^(diff --git |--- )", reply, re.MULTILINE)
    return reply[match.start() :] if match else ""
