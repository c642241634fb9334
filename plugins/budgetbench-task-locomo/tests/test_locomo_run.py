"""A small LoCoMo run on the embedded model, graded by the J judge (the same embedded model).

Two questions at 1024 tokens with truncation: the answers are the 135M model's (near 0 quality
is expected); what is checked is the path: budgeted prompts, the served-count audit, and a
judge verdict recorded with its model, prompt hash and raw reply.
"""

import pytest
from budgetbench_task_locomo.graders import LoCoMoJudge
from budgetbench_task_locomo.judge_prompts import ACCURACY_SHA256

from budgetbench_core import RunConfig, final_rows, read_manifest, run

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


def test_judged_run_on_the_embedded_model(locomo_file, tmp_path):
    config = RunConfig(
        task="locomo",
        strategies=["truncation"],
        budgets=[1024],
        out=tmp_path / "run",
        model="local",
        grader="locomo-judge",
        limit=2,
        max_concurrency=1,
        task_options={"path": str(locomo_file)},
        timeout_s=600,
    )
    summary = run(config)
    assert summary.errors == 0 and summary.results == 2
    rows = final_rows(tmp_path / "run")
    assert len(rows) == 2
    for row in rows.values():
        assert row["event"] == "result" and row["prompt_tokens"] <= 1024
        assert row["served_prompt_tokens"] == row["prompt_tokens"]
        verdict = row["verdict"]
        assert verdict["prompt_sha256"] == ACCURACY_SHA256 and verdict["judge_model"] == "local"
        assert verdict["label"] in ("CORRECT", "WRONG", None)
        assert row["quality"] == float(verdict["label"] == "CORRECT")
        assert verdict.get("skipped") or isinstance(verdict["raw_verdict"], str)
        assert row["evidence"]["marked"] >= 1
    manifest = read_manifest(tmp_path / "run")
    assert manifest["grader"]["version"] == LoCoMoJudge.version
    assert manifest["task"]["questions_selected"]["5 adversarial"] == 0
