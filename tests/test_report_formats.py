"""``budgetbench report RUN --format F``: only the outputs asked for are written (issue 30).

The run is a real one, against the deterministic loopback server, counted with
tiktoken:cl100k_base; its report is then rewritten format by format.
"""

from __future__ import annotations

import pytest

from budgetbench_core import RunConfig, run
from budgetbench_core.report import FORMATS, write_report
from budgetbench_core.report.plots import PLOTS
from budgetbench_core.testing import FaultServer, invoke_cli

SETTINGS = dict(
    task="synthetic-memory",
    strategies=["truncation", "recency"],
    budgets=[60, 400],
    task_options={"items": 3, "history_tokens": 400},
    max_concurrency=1,
    retries=0,
    timeout_s=10.0,
    tokenizer="tiktoken:cl100k_base",
    model="openai/fault-model",
)

# The plots are written by report/writer.py (which this change may not edit): write_report must
# call write_plots only when "png" or "html" (which embeds them) is among the formats.


@pytest.fixture(scope="module")
def report_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("formats") / "run"
    with FaultServer() as server:
        run(RunConfig(out=out, api_base=server.url, **SETTINGS))
    write_report(out)
    return out / "report"


def _plots(report_dir):
    return sorted(p.name for p in report_dir.glob("*.png"))


def _remove_outputs(report_dir):
    for path in report_dir.iterdir():
        if path.is_file():
            path.unlink()


def test_format_md_writes_only_the_markdown(report_dir):
    assert set(_plots(report_dir)) <= set(PLOTS.values()) and _plots(report_dir)  # the full report drew them
    _remove_outputs(report_dir)
    result = invoke_cli("report", str(report_dir.parent), "--format", "md")
    assert result.exit_code == 0, result.output
    assert sorted(p.name for p in report_dir.iterdir() if p.is_file()) == ["report.md"]
    assert _plots(report_dir) == []  # the plots were not rewritten
    assert [line.split(":")[0] for line in result.output.splitlines()] == ["md"]


def test_format_png_writes_the_plots_and_html_writes_them_too(report_dir):
    assert "png" in FORMATS
    _remove_outputs(report_dir)
    paths = write_report(report_dir.parent, formats=["png"])
    assert len(_plots(report_dir)) >= 3 and all(name.startswith("plot_") for name in paths), paths
    assert sorted(path.name for path in paths.values()) == _plots(report_dir)
    assert not (report_dir / "report.md").exists() and not (report_dir / "index.html").exists()
    _remove_outputs(report_dir)
    paths = write_report(report_dir.parent, formats=["html"])
    assert (report_dir / "index.html").exists() and _plots(report_dir)  # the page embeds them


def test_a_runs_notes_come_first_in_its_findings_and_never_in_its_identity(tmp_path):
    """``run --note TEXT``: kept in the manifest and shown first in every format's findings."""
    import json

    from budgetbench_core import RunConfig, read_manifest, run
    from budgetbench_core.report import write_report

    common = dict(
        task="synthetic-memory",
        strategies=["truncation"],
        budgets=[300],
        prompts_only=True,
        task_options={"items": 2, "history_tokens": 600},
        tokenizer="tiktoken:cl100k_base",
    )
    run(RunConfig(out=tmp_path / "noted", notes=["made to check the gate, not to rank"], **common))
    run(RunConfig(out=tmp_path / "plain", **common))
    noted, plain = read_manifest(tmp_path / "noted"), read_manifest(tmp_path / "plain")
    assert noted["run_key"] == plain["run_key"], "a note changes what the run is called, not what it measures"
    paths = write_report(tmp_path / "noted")
    findings = json.loads(paths["json"].read_text())["findings"]
    assert findings[0] == "Note: made to check the gate, not to rank"
    assert "- Note: made to check the gate, not to rank" in paths["md"].read_text()
    assert "Note: made to check the gate, not to rank" in paths["html"].read_text()
