"""A run directory read for reporting: terminal rows, prompts, and the checks a report needs.

The one entry point of every command that reads a run (report, gate, compare, plan): the
directory is verified first (``integrity.verify_run``) and refused when it does not verify,
unless ``force``, which reads it with its problems listed in ``RunData.unverified``. The
terminal state of a row is the last result, violation or error of its
(task, strategy, budget, repeat, item); earlier attempts of a resumed run do not count.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..integrity import verify_run
from ..runlog import final_rows, iter_events, read_manifest

Key = tuple[str, str, int, int, str]  # task, strategy, budget, repeat, item_id
MISSING_VERSIONS = {None, "", "unknown"}


class ReportError(ValueError):
    """The run directory cannot be reported on; the message says why and what to fix."""


@dataclass
class RunData:
    run_dir: Path
    manifest: dict[str, Any]
    rows: dict[Key, dict[str, Any]]
    prompts: dict[Key, dict[str, Any] | None] = field(default_factory=dict)
    aux_calls: dict[Key, list[dict[str, Any]]] = field(default_factory=dict)
    unverified: list[str] = field(default_factory=list)  # why the directory did not verify (read with force)

    @property
    def binary(self) -> bool:
        return bool(self.manifest.get("grader", {}).get("binary"))

    @property
    def approximate(self) -> bool:
        """True when any row, or the manifest, was counted with an approximate tokenizer."""
        if self.manifest.get("tokenizer", {}).get("exact") is False:
            return True
        return any((row.get("tokenizer") or {}).get("exact") is False for row in self.rows.values())

    def strategy_order(self) -> list[str]:
        configured = list(self.manifest.get("config", {}).get("strategies", []))
        seen = sorted({key[1] for key in self.rows} - set(configured))
        return [s for s in configured if any(k[1] == s for k in self.rows)] + seen

    def cells(self) -> dict[tuple[str, str, int], list[dict[str, Any]]]:
        grouped: dict[tuple[str, str, int], list[dict[str, Any]]] = defaultdict(list)
        for key, row in self.rows.items():
            grouped[key[:3]].append(row)
        order = {s: i for i, s in enumerate(self.strategy_order())}
        return dict(sorted(grouped.items(), key=lambda kv: (kv[0][0], order[kv[0][1]], kv[0][2])))

    def ingest_losses(self) -> dict[str, dict[str, dict[str, Any]]]:
        """task -> item_id -> the first ingest error row: these items leave every paired comparison."""
        lost: dict[str, dict[str, dict[str, Any]]] = defaultdict(dict)
        for key, row in sorted(self.rows.items()):
            if row["event"] == "error" and row.get("phase") == "ingest":
                lost[key[0]].setdefault(key[4], row)
        return dict(lost)

    def served_checked(self) -> list[dict[str, Any]]:
        """Rows whose prompt reached the server and whose size the server reported: results, and
        the violations of phase ``served`` (sent, then found over the budget by the server's count)."""
        return [
            row
            for row in self.rows.values()
            if row["event"] in ("result", "violation")
            and (row["event"] == "result" or row.get("phase") == "served")
            and row.get("served_prompt_tokens") is not None
        ]

    def served_mismatches(self) -> list[dict[str, Any]]:
        """Result rows whose server-reported prompt size differs from our count (a served violation
        differs by definition: it is counted apart)."""
        return [
            row
            for row in self.served_checked()
            if row["event"] == "result" and row["served_prompt_tokens"] != row.get("prompt_tokens")
        ]

    def served_unreported(self) -> int:
        return sum(
            1 for row in self.rows.values() if row["event"] == "result" and row.get("served_prompt_tokens") is None
        )


def check_versions(manifest: dict[str, Any], rows: dict[Key, dict[str, Any]], path: Path) -> None:
    """Refuse a report whose rows came from plugins the manifest does not version."""
    used = manifest.get("plugins_used") or {}
    versions = manifest.get("versions") or {}
    needed: set[str] = set()
    for row in rows.values():
        needed.add(f"task:{row['task']}")
        needed.add(f"strategy:{row['strategy']}")
        grader = (row.get("grader") or {}).get("name")
        if grader:
            needed.add(f"grader:{grader}")
    problems = []
    for plugin in sorted(needed):
        entry = used.get(plugin)
        if not entry:
            problems.append(f"{plugin} produced rows but is not in plugins_used")
        elif entry.get("version") in MISSING_VERSIONS:
            problems.append(f"{plugin} ({entry.get('distribution')}) has no version")
        elif versions.get(entry.get("distribution")) in MISSING_VERSIONS:
            problems.append(f"{plugin}: distribution {entry.get('distribution')!r} is missing from versions")
    if versions.get("budgetbench") in MISSING_VERSIONS:
        problems.append("the core (budgetbench) has no version")
    if problems:
        raise ReportError(
            f"{path}: refusing to write a report, results could not be reproduced: " + "; ".join(problems)
        )


def load_run(run_dir: Path, with_prompts: bool = True, force: bool = False, key_files: Sequence[Path] = ()) -> RunData:
    """Read, verify and check a run directory; raises ReportError naming the file (and line) at
    fault. ``force`` reads a directory that does not verify, its problems kept in ``unverified``."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise ReportError(f"{run_dir}: no such run directory")
    manifest = read_manifest(run_dir)
    if manifest is None:
        raise ReportError(f"{run_dir / 'manifest.json'}: missing; is this a budgetbench run directory?")
    verified = verify_run(run_dir, key_files, run_key=manifest.get("run_key") or "(none in manifest.json)")
    if not verified.ok and not force:
        raise ReportError(verified.refusal() + "; --force reads it anyway, marked unverified")
    rows = final_rows(run_dir)
    if not rows:
        raise ReportError(f"{run_dir / 'cells'}: no result, violation or error rows yet")
    check_versions(manifest, rows, run_dir / "manifest.json")
    data = RunData(run_dir, manifest, rows, unverified=verified.problems)
    if with_prompts:
        pending_prompt: dict[Key, dict[str, Any]] = {}
        pending_aux: dict[Key, list[dict[str, Any]]] = defaultdict(list)
        for event in iter_events(run_dir):
            kind = event.get("event")
            if kind not in ("prompt_audit", "aux_call", "result", "violation", "error"):
                continue
            key = (event["task"], event["strategy"], int(event["budget"]), int(event["repeat"]), str(event["item_id"]))
            if kind == "prompt_audit":
                pending_prompt[key] = event
            elif kind == "aux_call":
                pending_aux[key].append(event)
            else:  # a terminal row closes the prompt and aux calls made for this attempt only
                data.prompts[key] = pending_prompt.pop(key, None)
                data.aux_calls[key] = pending_aux.pop(key, [])
    return data
