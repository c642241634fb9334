"""Predictions of a run in the official SWE-bench format, one JSONL file per cell.

The official evaluation takes one prediction per instance, so every (strategy, budget,
repeat) becomes its own file of ``{instance_id, model_name_or_path, model_patch}`` lines.
A violation (prompt over budget, never sent) is exported with an empty patch, so it counts
as unresolved as it counts 0 here; an error row has no prediction and is left out and listed. The run directory is verified first
(``budgetbench_core.read_run``): one that was edited is refused, naming the file and line.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path

from budgetbench_core import read_run

TASK = "swebench-verified"
EVALUATE = (
    "python -m swebench.harness.run_evaluation --dataset_name princeton-nlp/SWE-bench_Verified "
    "--predictions_path {path} --max_workers 4 --run_id {run_id}"
)


@dataclass
class ExportedCell:
    path: Path
    model_name_or_path: str
    predictions: int
    violations: int
    errors: list[str] = field(default_factory=list)

    @property
    def evaluate_command(self) -> str:
        return EVALUATE.format(path=self.path, run_id=self.path.stem)


def _safe(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", text)


def export_predictions(run_dir: Path, out_dir: Path) -> list[ExportedCell]:
    read = read_run(run_dir)  # verified first: an edited run is refused naming the file and line (RunReadError)
    model = str(read.manifest.get("config", {}).get("model", "model"))
    cells: dict[tuple[str, int, int], list[dict]] = {}
    for (task, strategy, budget, repeat, _), row in read.rows.items():
        if task == TASK:
            cells.setdefault((strategy, budget, repeat), []).append(row)
    if not cells:
        raise ValueError(f"{run_dir} has no {TASK} rows to export")
    out_dir.mkdir(parents=True, exist_ok=True)
    exported = []
    for (strategy, budget, repeat), rows in sorted(cells.items()):
        name = _safe(f"{model}__{strategy}__b{budget}__r{repeat}")
        cell = ExportedCell(out_dir / f"{name}.jsonl", f"budgetbench__{name}", 0, 0)
        lines = []
        for row in sorted(rows, key=lambda r: str(r["item_id"])):
            if row["event"] == "error":
                cell.errors.append(str(row["item_id"]))
                continue
            patch = (row.get("prediction") or "") if row["event"] == "result" else ""
            cell.predictions += 1
            cell.violations += row["event"] == "violation"
            lines.append(
                json.dumps(
                    {
                        "instance_id": row["item_id"],
                        "model_name_or_path": cell.model_name_or_path,
                        "model_patch": patch,
                    },
                    ensure_ascii=False,
                )
            )
        cell.path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
        exported.append(cell)
    return exported
