"""The served-count audit's finding says what the rows show, never a vacuous "all matched"."""

from __future__ import annotations

import json

from budgetbench_core import RunConfig, run
from budgetbench_core.report import write_report
from budgetbench_core.runlog import final_rows
from budgetbench_core.testing import FaultServer

BUDGET = 400


def audit_findings(tmp_path, **server) -> tuple[list[str], dict]:
    out = tmp_path / "run"
    with FaultServer(**server) as fault_server:
        run(
            RunConfig(
                task="synthetic-memory",
                strategies=["truncation"],
                budgets=[BUDGET],
                out=out,
                api_base=fault_server.url,
                model="openai/fault-model",
                tokenizer="tiktoken:cl100k_base",
                task_options={"items": 3, "history_tokens": 800},
                retries=0,
                timeout_s=30.0,
            )
        )
    report = json.loads(write_report(out, formats=["json"])["json"].read_text())
    return [f for f in report["findings"] if f.startswith("Served-count audit")], final_rows(out)


def test_when_the_server_counts_every_prompt_over_the_budget_the_audit_says_so(tmp_path):
    """Old code: "every server-reported prompt size matched our count" beside 3 served violations."""
    findings, rows = audit_findings(tmp_path, count_prompt=lambda messages: BUDGET + 50)
    assert all(r["event"] == "violation" and r["phase"] == "served" for r in rows.values())
    assert not any("matched" in f for f in findings), findings
    assert any("on 3 calls the server counted the prompt over the budget" in f for f in findings), findings


def test_a_server_that_reports_no_usage_is_not_called_a_match(tmp_path):
    findings, rows = audit_findings(tmp_path, rate=1.0, faults=("no_usage",))
    assert rows and all(r["event"] == "result" and r["served_prompt_tokens"] is None for r in rows.values())
    assert "Served-count audit: the server reported no prompt size, so nothing could be compared." in findings
    assert not any("matched" in f for f in findings), findings


def test_the_audit_counts_every_prompt_the_server_counted_served_violations_included(tmp_path):
    """Old code checked result rows only: prompts the server pushed over the budget were sent and
    counted by it, yet left out of the audit's total."""
    from budgetbench_core import Message, PromptCounter
    from budgetbench_core.testing import tokenizer_for

    counter = PromptCounter(tokenizer_for("tiktoken:cl100k_base"))  # the run's own count
    over = {"n": 0}

    def sometimes_over(messages):
        over["n"] += 1
        if over["n"] == 1:
            return BUDGET + 50
        return counter.count(tuple(Message(m["role"], m["content"]) for m in messages))

    findings, rows = audit_findings(tmp_path, count_prompt=sometimes_over)
    sent = [r for r in rows.values() if r["event"] == "result" or r.get("phase") == "served"]
    assert sum(r.get("phase") == "served" for r in rows.values()) == 1 and len(sent) == 3
    assert any("on 1 calls the server counted the prompt over the budget" in f for f in findings), findings
    report = json.loads((tmp_path / "run" / "report" / "report.json").read_text())
    assert report["served_checked"] == len(sent) == 3, "the over-budget prompt was sent and counted too"
    (cell,) = report["summary"]
    assert cell["model_calls"] == 3, "the served violation was a call: the cell's calls are the run's"
