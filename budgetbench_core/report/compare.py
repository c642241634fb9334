"""One report across several runs: cells aligned by task/strategy/budget, paired over shared items.

Runs may differ in model, server, strategy versions or settings; they must have been made on
the same task data (the manifests' ``data_files`` hashes, or the task name, options and seed for a
generated task that reads no file), unless ``allow_different_data`` is given. Each run's cell is
compared with the same cell of the reference run (the first one) over the items both
scored; items only one side has are listed, never silently paired.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from . import stats, tables
from .data import ReportError, RunData, load_run
from .evidence import evidence_columns, has_evidence, prompts_only_summary
from .pairing import pair_values


def is_prompts_only(data: RunData) -> bool:
    return bool(data.manifest.get("config", {}).get("prompts_only")) or any(
        r["event"] == "admitted" for r in data.rows.values()
    )


def data_identity(manifest: dict[str, Any]) -> tuple[str, str]:
    """(what was compared, a hash of it): the task data hashes when recorded, else name/options/seed."""
    task = manifest.get("task") or {}
    config = manifest.get("config") or {}
    hashes = manifest.get("data_files")
    if hashes:
        basis, payload = (
            "data file hashes",
            {"task": task.get("name") or config.get("task"), "hashes": sorted(hashes.values())},
        )
    else:
        # --limit only selects among the same items, so it is not part of the data
        basis, payload = (
            "task name, options and seed",
            {
                "task": task.get("name") or config.get("task"),
                "options": task.get("options", config.get("task_options")),
                "seed": config.get("seed"),
            },
        )
    digest = hashlib.sha256(json.dumps(payload, sort_keys=True, default=str).encode()).hexdigest()[:16]
    return basis, digest


def _labels(runs: Sequence[RunData], labels: Sequence[str]) -> list[str]:
    if labels and len(labels) != len(runs):
        raise ValueError(f"--label given {len(labels)} times for {len(runs)} runs: give one per run or none")
    names = list(labels) or [r.run_dir.name or str(r.run_dir) for r in runs]
    if len(set(names)) != len(names):
        names = [f"{i + 1}:{n}" for i, n in enumerate(names)]
    return names


def _model_name(manifest: dict[str, Any]) -> str:
    model = manifest.get("model") or {}
    return str(
        model.get("model") or model.get("name") or model.get("id") or (manifest.get("config") or {}).get("model")
    )


def compare_runs(
    run_dirs: Sequence[Path],
    labels: Sequence[str] = (),
    allow_different_data: bool = False,
) -> dict[str, Any]:
    """The comparison as plain data (the JSON output); refuses runs on different task data."""
    if len(run_dirs) < 2:
        raise ValueError("compare needs at least two run directories")
    runs = [load_run(Path(d), with_prompts=False) for d in run_dirs]
    names = _labels(runs, labels)
    identities = [data_identity(r.manifest) for r in runs]
    different = [(n, i) for n, i in zip(names, identities) if i[1] != identities[0][1]]
    if different and not allow_different_data:
        listed = "; ".join(f"{n}: {i[1]} ({i[0]})" for n, i in zip(names, identities))
        raise ReportError(
            f"the runs were made on different task data ({listed}); items with the same id may "
            "differ. Pass --allow-different-data to compare them anyway."
        )
    run_rows = []
    for name, data, identity in zip(names, runs, identities):
        manifest = data.manifest
        run_rows.append(
            {
                "run": name,
                "run_dir": str(data.run_dir),
                "model": _model_name(manifest),
                "tokenizer": (manifest.get("tokenizer") or {}).get("id"),
                "tokenizer_exact": (manifest.get("tokenizer") or {}).get("exact"),
                "grader": (manifest.get("grader") or {}).get("name"),
                "grader_version": (manifest.get("grader") or {}).get("version"),
                "core_version": (manifest.get("versions") or {}).get("budgetbench"),
                "git_commit": manifest.get("git_commit"),
                "data_basis": identity[0],
                "data_hash": identity[1],
                "approximate": data.approximate,
                "prompts_only": bool((manifest.get("config") or {}).get("prompts_only")),
            }
        )
    prompts_only = [is_prompts_only(r) for r in runs]
    evidence = any(has_evidence(r.rows.values()) for r in runs)
    summary = []
    for name, data, only in zip(names, runs, prompts_only):
        for (task, strategy, budget), rows in data.cells().items():
            columns = (
                prompts_only_summary(rows, budget)
                if only
                else {**tables.cell_summary(rows, data.binary, budget), **(evidence_columns(rows) if evidence else {})}
            )
            summary.append({"run": name, "task": task, "strategy": strategy, "budget": budget, **columns})
    # Quality when every run has it; evidence recall (all evidence kept) when any run is prompts-only.
    metric = "evidence_all" if any(prompts_only) else "quality_all"
    if metric == "evidence_all" and not evidence:
        raise ReportError("a prompts-only run has no quality, and the task marks no evidence: nothing to compare")
    reference, ref_name = runs[0], names[0]
    ref_cells = reference.cells()
    paired, unmatched = [], []
    for name, data in zip(names[1:], runs[1:]):
        cells = data.cells()
        for cell in sorted(set(cells) | set(ref_cells)):
            if cell not in cells or cell not in ref_cells:
                unmatched.append(
                    {
                        "task": cell[0],
                        "strategy": cell[1],
                        "budget": cell[2],
                        "only_in": ref_name if cell in ref_cells else name,
                        "other": name if cell in ref_cells else ref_name,
                    }
                )
                continue
            dropped = set(reference.ingest_losses().get(cell[0], {})) | set(data.ingest_losses().get(cell[0], {}))
            pair = pair_values(
                cells[cell], ref_cells[cell], dropped, "quality" if metric == "quality_all" else "evidence"
            )
            delta = stats.paired_delta(pair.candidate, pair.reference)
            paired.append(
                {
                    "task": cell[0],
                    "strategy": cell[1],
                    "budget": cell[2],
                    "run": name,
                    "reference_run": ref_name,
                    "paired_items": delta.n,
                    "run_quality": float(sum(pair.candidate) / len(pair.candidate)) if pair.items else math.nan,
                    "reference_quality": float(sum(pair.reference) / len(pair.reference)) if pair.items else math.nan,
                    "delta": delta.mean,
                    "delta_low": delta.low,
                    "delta_high": delta.high,
                    "result": stats.verdict(delta),
                    "missing_in_run": len(pair.missing_in_candidate),
                    "missing_in_reference": len(pair.missing_in_reference),
                    "missing_items": " ".join(sorted(set(pair.missing_in_candidate) | set(pair.missing_in_reference))),
                    "dropped_ingest_loss": len(dropped),
                }
            )
    return {
        "title": f"BudgetBench comparison of {len(runs)} runs",
        "written": datetime.now(UTC).isoformat(timespec="seconds"),
        "runs": run_rows,
        "reference_run": ref_name,
        "different_data": bool(different),
        "metric": metric,
        "summary": summary,
        "paired": paired,
        "unmatched": unmatched,
    }
