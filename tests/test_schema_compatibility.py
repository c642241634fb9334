"""A run written by the previous release (schema 3, made by commit 1bfb6fb of this repository
against a loopback server; its key beside it, as a user copies one from the machine that made
the run) still verifies and reports with today's code, figure for figure."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from budgetbench_core import final_rows, read_manifest
from budgetbench_core.testing import invoke_cli

FIXTURE = Path(__file__).resolve().parent / "data" / "schema3-run"


def test_a_run_of_the_previous_release_still_reports(tmp_path):
    run_dir = tmp_path / "run"
    shutil.copytree(FIXTURE / "run", run_dir)
    assert read_manifest(run_dir)["schema_version"] == "3"
    refused = invoke_cli("report", str(run_dir), env={"BUDGETBENCH_KEY_DIR": str(tmp_path / "no-keys")})
    assert refused.exit_code != 0 and "no key for run" in refused.output, "verified, not taken on trust"
    env = {"BUDGETBENCH_KEY_FILE": str(FIXTURE / "run.key")}
    result = invoke_cli("report", str(run_dir), "--format", "json", env=env)
    assert result.exit_code == 0, result.output
    report = json.loads((run_dir / "report" / "report.json").read_text())
    rows = final_rows(run_dir)
    assert len(rows) == 12 and all(r["event"] == "result" for r in rows.values())
    for cell in report["summary"]:
        mine = [r for k, r in rows.items() if (k[1], k[2]) == (cell["strategy"], cell["budget"])]
        assert cell["results"] == len(mine) == 3
        assert cell["quality_all"] == sum(r["quality"] for r in mine) / 3
    assert "unverified" not in json.dumps(report["findings"]).lower()
