"""``budgetbench longmemeval export`` of a prompts-only run: refused, nothing written (issue 30).

A prompts-only run of the real task on the LongMemEval_S sample, against the loopback server
(which it must not call): there is no hypothesis to export, so the export says so.
"""

from pathlib import Path

import pytest

from budgetbench_core import RunConfig, final_rows, run
from budgetbench_core.testing import FaultServer, invoke_cli

DATA = Path(__file__).resolve().parents[3] / ".." / "shared" / "data" / "longmemeval"
SAMPLE = DATA / "longmemeval_s_sample.json"
pytestmark = pytest.mark.skipif(not SAMPLE.is_file(), reason=f"LongMemEval data not found in {DATA}")


@pytest.fixture(scope="module")
def prompts_only_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("lme-po") / "run"
    with FaultServer() as server:
        run(
            RunConfig(
                task="longmemeval",
                strategies=["truncation"],
                budgets=[512, 4096],
                out=out,
                api_base=server.url,
                model="openai/fault-model",
                tokenizer="tiktoken:cl100k_base",
                task_options={"path": str(SAMPLE)},
                limit=3,
                max_concurrency=1,
                retries=0,
                prompts_only=True,
            )
        )
        assert server.requests == []
    return out


def test_export_refuses_a_prompts_only_run_and_writes_nothing(prompts_only_run, tmp_path):
    rows = final_rows(prompts_only_run)
    assert rows and {r["event"] for r in rows.values()} <= {"admitted", "violation"}
    assert any(r["event"] == "admitted" for r in rows.values())
    out = tmp_path / "export"
    outcome = invoke_cli("longmemeval", "export", str(prompts_only_run), "--out", str(out))
    assert outcome.exit_code == 2, outcome.output
    assert "prompts-only run" in outcome.output and "no hypotheses" in outcome.output
    assert f"budgetbench report {prompts_only_run}" in outcome.output
    assert not out.exists()  # no empty hypothesis files, no summary.json
