"""An errata file: the answers of the official key known to be wrong, and what to do about them.

Format (``--task-option errata=FILE``): one JSON object mapping a question key (the item id,
``conv-26_q012``) to the corrected answer (a non-empty string) or to ``"exclude"`` (the question
cannot be graded: ambiguous, or its evidence contradicts the key). Graders score every item
against the official key as usual and, for the items listed, also against the correction
(``detail["errata"]``), so a report can show both; the share of the selected key listed here is
the *ceiling* note: a system that is right on every question still loses that share on the
official key.
"""

from __future__ import annotations

import json
from pathlib import Path

from budgetbench_core import TaskDataError

EXCLUDE = "exclude"


def load_errata(path: Path, known_keys: set[str]) -> dict[str, str]:
    """The errata, checked: every key a question of the data file, every value a string."""
    try:
        errata = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise TaskDataError(f"{path}: not a readable JSON errata file ({exc})") from None
    if not isinstance(errata, dict):
        raise TaskDataError(f"{path}: an errata file is a JSON object (question key -> answer or 'exclude')")
    for key, value in errata.items():
        if key not in known_keys:
            example = min(known_keys) if known_keys else "conv-26_q000"
            raise TaskDataError(f"{path}: {key!r} is not a question of the data file (keys look like {example!r})")
        if not isinstance(value, str) or not value.strip():
            raise TaskDataError(f"{path}: {key!r}: the value must be a corrected answer or {EXCLUDE!r}")
    return errata


def ceiling(errata: dict[str, str], keys: list[str]) -> dict[str, float | int]:
    """How much of the key for ``keys`` the errata mark wrong, and the best score left possible."""
    listed = [key for key in keys if key in errata]
    share = len(listed) / len(keys) if keys else 0.0
    return {
        "questions": len(keys),
        "corrected": sum(errata[key] != EXCLUDE for key in listed),
        "excluded": sum(errata[key] == EXCLUDE for key in listed),
        "known_wrong_share": round(share, 6),
        "ceiling": round(1.0 - share, 6),
    }
