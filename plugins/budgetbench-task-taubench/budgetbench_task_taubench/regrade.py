"""``budgetbench taubench regrade RUN_DIR -o NEW_DIR``: rewards recomputed from the stored episodes.

After a fix to the task data (a wrong gold action, an assertion), the agent's replies need not be
asked again: every episode is played back from ``episodes.jsonl`` (``replay``) on the data folder
given (``--data``; default the run's own, fixed in place) and graded again, with no model call.
The run directory is never touched (it proves itself and only the harness writes it). ``NEW_DIR``
gets ``regrade.json`` (where the rewards come from: the source run and its key, the data folder
and the sha256 of its files, the plugin version; per cell pass^k before and after) and
``rewards.jsonl`` (per episode the reward before and after, the new outcome), under a new
``run_key`` that hashes the source key with the data and the plugin version: a regrade is a
new experiment identity, never the run's. A violation or error row stays 0, as in the run.
"""

from __future__ import annotations

import hashlib
import json
from collections import defaultdict
from importlib.metadata import version
from pathlib import Path
from typing import Any

from .plugin import DOMAIN_FILES
from .replay import ReplayError, play_run

DISTRIBUTION = "budgetbench-task-taubench"


def data_digest(folder: Path, domain: str) -> str:
    """sha256 over the domain's files (name and content) as they are in ``folder``."""
    digest = hashlib.sha256()
    for name in DOMAIN_FILES[domain]:
        path = folder / name
        if path.is_file():
            digest.update(name.encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def regrade(run_dir: Path, out: Path, data: str | None = None) -> dict[str, Any]:
    """Play every episode back on ``data`` (default the run's folder); write and return the summary."""
    from budgetbench_core import pass_k

    run_dir, out = Path(run_dir), Path(out)
    if out.resolve() == run_dir.resolve() or run_dir.resolve() in out.resolve().parents:
        raise ReplayError(f"{out}: the regrade goes to a new folder, never into the run directory {run_dir}")
    manifest, task, played = play_run(run_dir, data)
    digest = data_digest(task.folder, task.options["domain"])
    plugin_version = version(DISTRIBUTION)
    source_key = str(manifest.get("run_key"))
    run_key = hashlib.sha256(
        json.dumps(["regrade", source_key, digest, plugin_version, task.outcome_version]).encode()
    ).hexdigest()[:16]
    lines, before, after = [], defaultdict(lambda: defaultdict(dict)), defaultdict(lambda: defaultdict(dict))
    for p in played:
        _, strategy, budget, repeat, item = p.key
        new = float(p.outcome["reward"]) if p.outcome is not None else 0.0
        old = float(p.row.get("quality") or 0.0)
        if p.row["event"] != "error":
            before[(strategy, budget)][item][repeat] = old
            after[(strategy, budget)][item][repeat] = new
        lines.append(
            {
                "task": p.key[0],
                "strategy": strategy,
                "budget": budget,
                "repeat": repeat,
                "item_id": item,
                "run_key": run_key,
                "regraded_from_run_key": p.row.get("run_key"),
                "event": p.row["event"],
                "quality_before": old,
                "quality": new,
                "changed": new != old,
                "outcome": p.outcome,
            }
        )
    summary = {
        "run_key": run_key,
        "regraded_from": str(run_dir),
        "regraded_from_run_key": source_key,
        "note": "rewards recomputed from the stored episodes (no model call) on the data below",
        "data_folder": str(task.folder),
        "data_sha256": digest,
        "plugin_version": plugin_version,
        "outcome_version": task.outcome_version,
        "episodes": len(lines),
        "changed": sum(line["changed"] for line in lines),
        "cells": [
            {
                "strategy": strategy,
                "budget": budget,
                "before": pass_k(before[(strategy, budget)]),
                "after": pass_k(after[(strategy, budget)]),
            }
            for strategy, budget in sorted(after)
        ],
    }
    out.mkdir(parents=True, exist_ok=True)
    (out / "rewards.jsonl").write_text(
        "".join(json.dumps(line, ensure_ascii=False) + "\n" for line in lines), encoding="utf-8"
    )
    (out / "regrade.json").write_text(json.dumps(summary, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    return summary
