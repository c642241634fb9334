"""A run directory read for reporting: terminal rows, prompts, and the checks a report needs.

The one entry point of every command that reads a run (report, gate, compare, plan): the
directory is verified first (``integrity.verify_run``) and refused when it does not verify,
unless ``force``, which reads it with its problems listed in ``RunData.unverified``. Rows are
read as their ``events`` classes (``runlog.iter_rows``: a row of an older schema is migrated,
one no class describes is refused) and kept as the JSON objects they are. The terminal state
of a cell (``CellKey``) is its last result, violation or error; earlier attempts of a resumed
run do not count.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..events import SCHEMA_VERSION, Admitted, AuxCall, CellKey, PromptAudit, SchemaError, Terminal
from ..integrity import verify_run
from ..run_manifest import Manifest
from ..runlog import iter_rows, read_manifest

MISSING_VERSIONS = {None, "", "unknown"}


class ReportError(ValueError):
    """The run directory cannot be reported on; the message says why and what to fix."""


@dataclass
class RunData:
    run_dir: Path
    manifest: dict[str, Any]
    rows: dict[CellKey, dict[str, Any]]
    prompts: dict[CellKey, dict[str, Any] | None] = field(default_factory=dict)
    aux_calls: dict[CellKey, list[dict[str, Any]]] = field(default_factory=dict)
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


def check_versions(manifest: dict[str, Any], rows: dict[CellKey, dict[str, Any]], path: Path) -> None:
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
    try:  # a manifest of a newer schema, or with a field the schema lacks, is refused before anything else
        schema_version = Manifest.from_dict(manifest, str(run_dir / "manifest.json")).schema_version
    except SchemaError as exc:
        raise ReportError(str(exc)) from None
    verified = verify_run(run_dir, key_files, run_key=manifest.get("run_key") or "(none in manifest.json)")
    if not verified.ok and not force:
        raise ReportError(verified.refusal())  # no command reads one anyway (``force`` is for Python callers)
    data = RunData(run_dir, manifest, {}, unverified=verified.problems)
    pending_prompt: dict[CellKey, dict[str, Any]] = {}
    pending_aux: dict[CellKey, list[dict[str, Any]]] = defaultdict(list)
    try:
        for event in iter_rows(run_dir, schema_version or SCHEMA_VERSION):
            if isinstance(event, Terminal):
                data.rows[event.key] = event.row()
            if not with_prompts:
                continue
            if isinstance(event, PromptAudit):
                pending_prompt[event.key] = event.row()
            elif isinstance(event, AuxCall):
                pending_aux[event.key].append(event.row())
            elif isinstance(event, Terminal) and not isinstance(event, Admitted):
                # it closes the prompt and aux calls made for this attempt only
                data.prompts[event.key] = pending_prompt.pop(event.key, None)
                data.aux_calls[event.key] = pending_aux.pop(event.key, [])
    except SchemaError as exc:
        raise ReportError(str(exc)) from None
    if not data.rows:
        raise ReportError(f"{run_dir / 'cells'}: no result, violation or error rows yet")
    check_versions(manifest, data.rows, run_dir / "manifest.json")
    return data
