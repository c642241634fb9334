"""The report's header says how the run ran: the task with every option it resolved (defaults
included, so a mode left at its default is named) and where plugins ran (isolation, sandbox).

Real runs against the deterministic loopback server, counted with tiktoken:cl100k_base.
"""

from __future__ import annotations

import pytest

from budgetbench_core import RunConfig, run
from budgetbench_core.host.pool import sandbox_name
from budgetbench_core.report import write_report
from budgetbench_core.report.writer import run_header
from budgetbench_core.runlog import read_manifest
from budgetbench_core.testing import FaultServer

SETTINGS = dict(
    task="synthetic-memory",
    strategies=["truncation"],
    budgets=[400],
    task_options={"items": 1},  # history_tokens left at its default
    max_concurrency=1,
    retries=0,
    timeout_s=10.0,
    tokenizer="tiktoken:cl100k_base",
    model="openai/fault-model",
)


@pytest.mark.parametrize("isolation", ["process", "none"])
def test_header_names_every_task_option_and_where_plugins_ran(tmp_path, isolation):
    out = tmp_path / "run"
    with FaultServer() as server:
        run(RunConfig(out=out, api_base=server.url, isolation=isolation, **SETTINGS))
    write_report(out, formats=("md", "html"))
    header = run_header(read_manifest(out))
    assert '"history_tokens": ' in header["task"] and '"items": 1' in header["task"]  # the default is named
    sandbox = sandbox_name() if isolation == "process" else "none"
    assert header["plugins ran"] == f"isolation {isolation}, sandbox {sandbox}"
    assert f"- plugins ran: isolation {isolation}, sandbox {sandbox}" in (out / "report" / "report.md").read_text()
    html = (out / "report" / "index.html").read_text()
    assert f'<th class="text">plugins ran</th><td class="text">isolation {isolation}, sandbox {sandbox}</td>' in html


def test_a_manifest_without_isolation_says_it_was_not_recorded():
    assert run_header({"identity": {}})["plugins ran"] == "not recorded (a run of an older release)"
