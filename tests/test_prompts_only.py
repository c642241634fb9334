"""``budgetbench run --prompts-only`` and evidence recall, through the CLI on real runs.

A prompts-only run against a loopback OpenAI-compatible server must send it nothing; on the
embedded model its evidence recall must equal a full run's of the same configuration, row for
row; a task that marks no evidence reports none.
"""

from __future__ import annotations

import csv
import json
import os
from pathlib import Path

import pytest
from click.testing import CliRunner

from budgetbench_core import Item, Message, Task, hookimpl
from budgetbench_core.cli import cli
from budgetbench_core.loopback import FaultServer
from budgetbench_core.runlog import final_rows, iter_events

BUILTINS = "builtin-strategies,builtin-synthetic-memory,builtin-graders,builtin-local,builtin-tokenizers,builtin-litellm,builtin-executors"
SYNTH = [
    "-t",
    "synthetic-memory",
    "-s",
    "truncation",
    "-s",
    "checkpoint",
    "-s",
    "full_context",
    "-b",
    "160 256",
    "-n",
    "6",
    "--task-option",
    "items=6",
    "--task-option",
    "history_tokens=600",
    "--max-output-tokens",
    "4",
    "-j",
    "1",
    "--display",
    "none",
]


@pytest.fixture(autouse=True)
def builtins_only(monkeypatch):
    monkeypatch.setenv("BUDGETBENCH_LOAD_PLUGINS", BUILTINS)


def _run(*args: str):
    return CliRunner().invoke(cli, ["run", *args])


def _csv(path: Path) -> list[dict[str, str]]:
    with open(path, newline="", encoding="utf-8") as handle:
        return list(csv.DictReader(handle))


def test_prompts_only_sends_nothing_and_reports_no_quality(tmp_path):
    out = tmp_path / "po"
    with FaultServer(rate=0.0) as server:
        result = _run(
            *SYNTH,
            "--prompts-only",
            "--model",
            "openai/fault-model",
            "--api-base",
            server.url,
            "--tokenizer",
            "tiktoken:cl100k_base",
            "-o",
            str(out),
        )
        assert result.exit_code == 0, result.output
        assert server.requests == []  # the server saw no completion request
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["calls_made"] == 0 and manifest["config"]["prompts_only"] is True
    rows = final_rows(out)
    assert len(rows) == 3 * 2 * 6 and {r["event"] for r in rows.values()} == {"admitted", "violation"}
    assert all(r["strategy"] == "full_context" for r in rows.values() if r["event"] == "violation")
    summary = _csv(out / "report" / "summary.csv")
    assert summary and not any(c.startswith("quality") for c in summary[0])  # absent, not 0
    marked = sum(1 for i in range(6) if i % 5 != 4)  # abstention items (every 5th) mark no evidence
    for row in summary:
        assert int(row["evidence_all_n"]) == marked and row["evidence_all_low"] != ""
        if row["strategy"] == "full_context":
            assert row["violation_rate"] == "1.0" and float(row["evidence_all"]) == 0.0
    index = (out / "report" / "index.html").read_text()
    assert 'id="prompts-only"' in index and 'id="evidence-pivot"' in index and "quality (all" not in index
    # gate and plan read a prompts-only run: admitted rows count as gated, quality is not invented.
    gate = CliRunner().invoke(cli, ["gate", str(out)])
    assert gate.exit_code == 1 and "FAIL  violation rate  full_context@160: 1.000 (6 of 6 rows)" in gate.output
    ok = CliRunner().invoke(cli, ["gate", str(out), "--candidate", "checkpoint@160"])
    assert ok.exit_code == 0 and "0.000 (0 of 6 rows)" in ok.output, ok.output
    plan = CliRunner().invoke(cli, ["plan", str(out)])
    assert plan.exit_code == 2 and "prompts-only run" in plan.output
    # compare pairs prompts-only runs on evidence recall, over the items both have.
    other = tmp_path / "po-truncation"
    with FaultServer(rate=0.0) as server:
        assert (
            _run(
                *SYNTH[:2],
                "-s",
                "truncation",
                *SYNTH[8:],
                "--prompts-only",
                "--model",
                "openai/fault-model",
                "--api-base",
                server.url,
                "--tokenizer",
                "tiktoken:cl100k_base",
                "-o",
                str(other),
            ).exit_code
            == 0
        )
    compared = CliRunner().invoke(cli, ["compare", str(out), str(other), "-o", str(tmp_path / "cmp")])
    assert compared.exit_code == 0, compared.output
    report = json.loads((tmp_path / "cmp" / "report.json").read_text())
    assert report["metric"] == "evidence_all"
    assert {(r["strategy"], r["delta"], r["paired_items"]) for r in report["paired"]} == {
        ("truncation", 0.0, marked)
    }  # same prompts, same evidence
    # The same directory cannot be resumed as a full run: nothing of a prompts-only run is reused.
    with FaultServer(rate=0.0) as server:
        full = _run(
            *SYNTH,
            "--model",
            "openai/fault-model",
            "--api-base",
            server.url,
            "--tokenizer",
            "tiktoken:cl100k_base",
            "-o",
            str(out),
        )
        assert full.exit_code == 2 and "prompts_only" in full.output, full.output
        assert server.requests == []


@pytest.mark.slow
def test_prompts_only_evidence_equals_a_full_run(tmp_path):
    full, only = tmp_path / "full", tmp_path / "only"
    assert _run(*SYNTH, "-o", str(full)).exit_code == 0
    assert _run(*SYNTH, "--prompts-only", "-o", str(only)).exit_code == 0
    assert json.loads((only / "manifest.json").read_text())["calls_made"] == 0
    assert json.loads((full / "manifest.json").read_text())["calls_made"] > 0

    def by_cell(run_dir: Path) -> dict:
        return {k[1:]: (r["event"], r.get("evidence")) for k, r in final_rows(run_dir).items()}

    full_rows, only_rows = by_cell(full), by_cell(only)
    assert set(full_rows) == set(only_rows)
    for cell, (event, evidence) in full_rows.items():
        assert only_rows[cell][1] == evidence, cell
        assert only_rows[cell][0] == ("violation" if event == "violation" else "admitted"), cell
    audits = {
        lambda_key: e["prompt_hash"]
        for lambda_key, e in (
            ((e["strategy"], e["budget"], e["item_id"]), e) for e in iter_events(full) if e["event"] == "prompt_audit"
        )
    }
    assert audits == {
        (e["strategy"], e["budget"], e["item_id"]): e["prompt_hash"]
        for e in iter_events(only)
        if e["event"] == "prompt_audit"
    }
    # Both reports show the same evidence recall per cell; the full one also has quality.
    full_summary = {(r["strategy"], r["budget"]): r for r in _csv(full / "report" / "summary.csv")}
    only_summary = {(r["strategy"], r["budget"]): r for r in _csv(only / "report" / "summary.csv")}
    for cell, row in only_summary.items():
        assert row["evidence_all"] == full_summary[cell]["evidence_all"]
        assert full_summary[cell]["quality_all"] != ""
    kept = {c: e for c, (ev, e) in full_rows.items() if e}
    assert any(e["dropped"] for e in kept.values()) and any(not e["dropped"] for e in kept.values())
    page = next((full / "report" / "items").glob("*single-session*.html")).read_text()
    assert "kept: single-session:" in page or "dropped: single-session:" in page


class Unmarked(Task):
    """Two items whose history marks no evidence."""

    name = "unmarked"
    default_grader = "contains-answer"
    max_output_tokens = 4

    def load(self, limit, seed):
        for i in range(2):
            yield Item(
                id=f"u{i}",
                history=(Message("user", f"My locker is number {i}."), Message("assistant", "Noted.")),
                query=Message("user", "What is my locker number?"),
                answer=str(i),
                system=Message("system", "Answer briefly."),
            )


class UnmarkedPlugin:
    @hookimpl
    def register_tasks(self, register):
        register(Unmarked)


def test_a_task_without_marks_reports_no_evidence(tmp_path):
    from budgetbench_core import RunConfig, run
    from budgetbench_core.plugins import PluginInfo, load_registry
    from budgetbench_core.report import write_report

    registry = load_registry()
    registry.add_plugin(UnmarkedPlugin(), PluginInfo("unmarked-test", "budgetbench-unmarked-tests", "0.0.1"))
    out = tmp_path / "unmarked"
    with FaultServer(rate=0.0) as server:
        run(
            RunConfig(
                task="unmarked",
                strategies=["truncation"],
                budgets=[128],
                out=out,
                prompts_only=True,
                model="openai/fault-model",
                api_base=server.url,
                tokenizer="tiktoken:cl100k_base",
                max_concurrency=1,
            ),
            registry=registry,
        )
        assert server.requests == []
    assert all(r.get("evidence") is None for r in final_rows(out).values())
    paths = write_report(out)
    (row,) = _csv(paths["summary_csv"])
    assert row["evidence_all"] == "" and row["evidence_all_n"] == "0"  # nothing, never 0
    report = json.loads(paths["json"].read_text())
    assert "The task marks no evidence: no evidence recall is reported." in report["findings"]
    assert "all evidence kept" not in paths["html"].read_text()
    assert os.path.exists(out / "report" / "quality_by_category.png")


def test_prompts_only_terminal_shows_admitted_prompts_not_errors(tmp_path):
    """The final table of a prompts-only run counts admitted prompts; it never calls them errors
    nor claims the server gave no usage (nothing was sent)."""
    with FaultServer(rate=0.0) as server:
        result = _run(
            *SYNTH[:-2],
            "--display",
            "plain",
            "--prompts-only",
            "--model",
            "openai/fault-model",
            "--api-base",
            server.url,
            "--tokenizer",
            "tiktoken:cl100k_base",
            "-o",
            str(tmp_path / "po"),
        )
    assert result.exit_code == 0, result.output
    assert "admitted prompt=" in result.output and "error (" not in result.output
    assert "cells, by cause" not in result.output and "prompts only, no prompt was sent" in result.output
    assert "prompts admitted" in result.output and "6v" in result.output  # full_context: 6 violations a tier
