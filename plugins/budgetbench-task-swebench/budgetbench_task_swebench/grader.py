"""The ``swebench-patch-similarity`` grader: a deterministic proxy, never a resolved rate.

Whether a patch resolves an issue is decided only by running the repository's tests
(the official harness, in Docker). This grader measures how close a predicted patch is
to the gold patch, so strategies can be compared cheaply; reports must label it a proxy.
"""

from __future__ import annotations

import math

from budgetbench_core import Grader, Verdict

from .patches import PatchParseError, similarity


class PatchSimilarity(Grader):
    """``file_weight`` x file recall + ``line_weight`` x changed-line F1 (defaults 0.4 / 0.6)."""

    name = "swebench-patch-similarity"
    version = "1"
    binary = False
    description = (
        "Proxy: similarity of the predicted patch to the gold patch (file recall, changed-line F1); not resolved rate."
    )

    def __init__(self, file_weight: float = 0.4, line_weight: float = 0.6, **params):
        file_weight, line_weight = float(file_weight), float(line_weight)
        if file_weight < 0 or line_weight < 0 or not math.isclose(file_weight + line_weight, 1.0):
            raise ValueError(
                f"file_weight and line_weight must be non-negative and sum to 1, got {file_weight} and {line_weight}"
            )
        super().__init__(file_weight=file_weight, line_weight=line_weight, **params)
        self.file_weight, self.line_weight = file_weight, line_weight

    def grade(self, item, prediction, context):
        try:
            quality, detail = similarity(item.answer, prediction, self.file_weight, self.line_weight)
        except PatchParseError as exc:
            raise ValueError(f"gold patch of {item.id} is not a valid diff: {exc}") from None
        return Verdict(min(1.0, quality), {**detail, "proxy": True})
