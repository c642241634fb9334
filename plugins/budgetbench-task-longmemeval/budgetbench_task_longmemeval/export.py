"""``budgetbench longmemeval export RUN_DIR``: official hypothesis files and the official summary.

For every cell (strategy, budget, repeat) of the ``longmemeval`` task it writes
``hypotheses/<strategy>/<budget>/r<k>.jsonl`` with one ``{"question_id", "hypothesis"}``
line per question, the format LongMemEval's evaluate_qa.py reads, so the upstream
evaluator can re-grade a cell unchanged. A budget violation is written with an empty
hypothesis (it was never sent, and scores 0 here as upstream would score an empty
answer), so accuracy is never computed over only the questions that fit. A question that
any arm failed to ingest is left out of every arm's file and listed; other error rows
(a model call that failed after its retries) are left out of their own cell and listed.
``summary.json`` holds per-type, task-averaged, overall and abstention accuracy with
Wilson intervals, computed from the run's own grades. A prompts-only run (``--prompts-only``)
has no hypotheses: it is refused, and nothing is written. So is a run directory that does not
verify (``budgetbench_core.read_run``: an edited, truncated or forged cell file), naming the
file and line.
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.table import Table

from budgetbench_core import hookimpl, read_run

from .loader import QUESTION_TYPES
from .metrics import summarize

CEILING_ARMS = frozenset({"full_context"})  # the whole history, no memory choice: reported as the ceiling
_SHORT = {
    "single-session-user": "SSU",
    "single-session-assistant": "SSA",
    "single-session-preference": "SSP",
    "multi-session": "MS",
    "temporal-reasoning": "TR",
    "knowledge-update": "KU",
}


def ingest_drops(rows: dict[tuple, dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """question_id -> one entry per arm that failed to ingest it (with the cause)."""
    dropped: dict[str, dict[str, dict[str, Any]]] = defaultdict(dict)
    for (_, strategy, _budget, _repeat, qid), row in sorted(rows.items()):
        if row["event"] == "error" and row.get("phase") == "ingest":
            dropped[qid].setdefault(strategy, {"strategy": strategy, "cause": row.get("cause")})
    return {qid: list(arms.values()) for qid, arms in sorted(dropped.items())}


def export(run_dir: Path, out: Path, task: str = "longmemeval") -> dict[str, Any]:
    """Write the hypothesis files and summary.json under ``out``; return the summary."""
    run_dir, out = Path(run_dir), Path(out)
    read = read_run(run_dir)  # verified first: an edited run is refused naming the file and line (RunReadError)
    manifest = read.manifest
    rows = {key: row for key, row in read.rows.items() if key[0] == task}
    if not rows:
        raise ValueError(
            f"{run_dir}: no {task!r} rows to export (tasks in this run: {sorted({k[0] for k in read.rows}) or 'none'})"
        )
    if (manifest.get("config") or {}).get("prompts_only") or any(row["event"] == "admitted" for row in rows.values()):
        raise ValueError(
            f"{run_dir} is a prompts-only run (--prompts-only): no model answered, so there are no hypotheses "
            f"to export. Its evidence recall is in `budgetbench report {run_dir}`; for hypothesis files, run "
            "the same command without --prompts-only (into another --out)."
        )
    questions = sorted({key[4] for key in rows})
    dropped = ingest_drops(rows)
    cells: dict[tuple[str, int, int], dict[str, dict[str, Any]]] = defaultdict(dict)
    for (_, strategy, budget, repeat, qid), row in rows.items():
        cells[(strategy, budget, repeat)][qid] = row
    order = {s: i for i, s in enumerate(manifest.get("config", {}).get("strategies", []))}
    summaries = []
    for strategy, budget, repeat in sorted(cells, key=lambda c: (order.get(c[0], len(order)), c[0], c[1], c[2])):
        cell = cells[(strategy, budget, repeat)]
        lines, graded, excluded, missing, violations = [], [], [], [], 0
        for qid in questions:
            row = cell.get(qid)
            if qid in dropped:
                continue
            if row is None:
                missing.append(qid)
            elif row["event"] == "result":
                lines.append({"question_id": qid, "hypothesis": row["prediction"]})
                graded.append((qid, row["category"], row["quality"]))
            elif row["event"] == "violation":
                violations += 1
                lines.append({"question_id": qid, "hypothesis": ""})
                graded.append((qid, row["category"], 0))
            else:
                excluded.append({"question_id": qid, "phase": row.get("phase"), "cause": row.get("cause")})
        path = out / "hypotheses" / strategy / str(budget) / f"r{repeat}.jsonl"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("".join(json.dumps(line, ensure_ascii=False) + "\n" for line in lines), encoding="utf-8")
        summaries.append(
            {
                "strategy": strategy,
                "budget": budget,
                "repeat": repeat,
                "ceiling": strategy in CEILING_ARMS,
                "hypothesis_file": str(path.relative_to(out)),
                "hypotheses": len(lines),
                "violations": violations,
                "excluded": excluded,
                "missing": missing,
                **summarize(graded),
            }
        )
    summary = {
        "run_dir": str(run_dir),
        "task": task,
        "grader": manifest.get("grader"),
        "questions": len(questions),
        "dropped_for_ingest_loss": dropped,
        "cells": summaries,
    }
    out.mkdir(parents=True, exist_ok=True)
    (out / "summary.json").write_text(json.dumps(summary, indent=2, ensure_ascii=False), encoding="utf-8")
    return summary


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f}"


def summary_table(summary: dict[str, Any]) -> Table:
    grader = (summary.get("grader") or {}).get("name", "?")
    table = Table(title=f"LongMemEval accuracy (%), grader {grader}; 95% Wilson intervals in summary.json")
    for column in (
        "arm",
        "budget",
        "r",
        "n",
        "overall [95% CI]",
        "task-avg",
        "abstention",
        *(_SHORT[t] for t in QUESTION_TYPES),
        "viol.",
        "excl.",
    ):
        table.add_column(column)
    for cell in summary["cells"]:
        overall = cell["overall"]
        interval = "" if overall["n"] == 0 else f" [{_pct(overall['low'])}, {_pct(overall['high'])}]"
        table.add_row(
            cell["strategy"] + (" (ceiling)" if cell["ceiling"] else ""),
            str(cell["budget"]),
            str(cell["repeat"]),
            str(overall["n"]),
            _pct(overall["accuracy"]) + interval,
            _pct(cell["task_averaged"]),
            _pct(cell["abstention"]["accuracy"]),
            *(_pct(cell["per_type"][t]["accuracy"]) for t in QUESTION_TYPES),
            str(cell["violations"]),
            str(len(cell["excluded"])),
        )
    return table


@hookimpl
def register_commands(cli):
    @cli.group("longmemeval")
    def longmemeval():
        """LongMemEval: export hypotheses in the official format, with the official summary."""

    @longmemeval.command("export")
    @click.argument("run_dir", type=click.Path(path_type=Path, exists=True, file_okay=False))
    @click.option(
        "--out",
        "-o",
        type=click.Path(path_type=Path),
        default=None,
        help="Output folder (default RUN_DIR/longmemeval).",
    )
    @click.option("--task", default="longmemeval", show_default=True, help="Task name in the run.")
    def export_command(run_dir, out, task):
        """Write hypotheses/<arm>/<budget>/r<k>.jsonl (question_id, hypothesis) and summary.json."""
        out = out or run_dir / "longmemeval"
        summary = export(run_dir, out, task)
        console = Console()
        console.print(summary_table(summary))
        for qid, arms in summary["dropped_for_ingest_loss"].items():
            console.print(
                f"dropped for every arm (ingest loss): {qid}: "
                + "; ".join(f"{a['strategy']}: {a['cause']}" for a in arms)
            )
        console.print(f"hypothesis files and summary.json written to {out}")
