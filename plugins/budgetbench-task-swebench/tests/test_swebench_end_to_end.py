"""A small real run of ``swebench-verified`` on the embedded model, then the official-format export."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from budgetbench_core import RunConfig, final_rows, read_manifest, run

ROOT = Path(__file__).resolve().parents[3]
SAMPLE = ROOT.parent / "shared" / "data" / "swebench" / "swebench_verified_mini.jsonl"


@pytest.mark.slow
@pytest.mark.skipif(not SAMPLE.is_file(), reason=f"shared data not found at {SAMPLE}")
def test_truncation_run_and_export(tmp_path):
    out = tmp_path / "run"
    config = RunConfig(
        task="swebench-verified",
        strategies=["truncation"],
        budgets=[1024, 2048],
        out=out,
        model="local",
        limit=2,
        max_concurrency=1,
        task_options={"path": str(SAMPLE)},
        max_output_tokens=256,
        timeout_s=900,
    )  # short replies, generous timeout: shared CI machines
    summary = run(config)
    assert summary.errors == 0 and summary.results + summary.violations == 4

    rows = final_rows(out)
    for row in rows.values():
        assert row["event"] == "result" and row["prompt_tokens"] <= row["budget"]
        assert row["served_prompt_tokens"] == row["prompt_tokens"]
        assert 0.0 <= row["quality"] <= 1.0 and row["verdict"]["proxy"] is True
        assert row["verdict"]["gold_files"]
        # The prediction is the diff found in the reply, or nothing.
        assert row["prediction"] == "" or row["prediction"] in row["completion"]
    manifest = read_manifest(out)
    assert manifest["task"]["repository_files"]["included"] is False
    assert manifest["grader"] == {
        "name": "swebench-patch-similarity",
        "version": "1",
        "binary": False,
        "judge_model": None,
    }

    export = tmp_path / "preds"
    done = subprocess.run(
        [sys.executable, "-m", "budgetbench_core.cli", "swebench", "export", str(out), "-o", str(export)],
        capture_output=True,
        text=True,
        check=True,
    )
    assert "python -m swebench.harness.run_evaluation" in done.stdout
    files = sorted(export.glob("*.jsonl"))
    assert [f.name for f in files] == ["local__truncation__b1024__r0.jsonl", "local__truncation__b2048__r0.jsonl"]
    for file in files:
        lines = [json.loads(line) for line in file.read_text().splitlines()]
        budget = int(file.stem.split("__b")[1].split("__")[0])
        assert {line["instance_id"] for line in lines} == {key[4] for key in rows if key[2] == budget}
        for line in lines:
            assert set(line) == {"instance_id", "model_name_or_path", "model_patch"}
            assert (
                line["model_patch"]
                == rows[("swebench-verified", "truncation", budget, 0, line["instance_id"])]["prediction"]
            )
            assert line["model_name_or_path"] == f"budgetbench__{file.stem}"
