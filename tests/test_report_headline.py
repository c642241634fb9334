"""The headline counts what the strategy caused: its errors are failures, the harness's leave a
cell incomplete; one ``summarise(rows)`` feeds the report and the terminal summary.

The run is synthetic-memory against a loopback fake server (``FaultServer``: no model to wait
for) with a strategy that raises on the items whose id it hashes odd, a full_context that
violates at the small budget, truncation whose large-budget prompts equal full_context's (cache
hits) and server faults (harness errors, retries off).
"""

from __future__ import annotations

import html as html_lib
import json
import math
import re
import zlib

import pytest

from budgetbench_core import MemoryStrategy, Regime, RunConfig, hookimpl, run
from budgetbench_core.plugins import PluginInfo, load_registry
from budgetbench_core.report import summarise, write_report
from budgetbench_core.report.data import load_run
from budgetbench_core.report.tables import summary_table
from budgetbench_core.runlog import final_rows
from budgetbench_core.testing import FaultServer

SMALL, LARGE = 300, 2000


class Loser(MemoryStrategy):
    """Keeps the whole history, but raises on half the items: the ones it "expects to lose"."""

    name = "loser"
    regime = Regime.LOCAL_ONLY

    def apply(self, history, budget, context):
        if zlib.crc32(context.item.query.content.encode()) % 2:  # its view's id is opaque: known by its question
            raise RuntimeError("injected: this item would score 0")
        return list(history)


class LoserPlugin:
    @hookimpl
    def register_strategies(self, register):
        register(Loser)


@pytest.fixture(scope="module")
def mixed_run(tmp_path_factory):
    registry = load_registry()
    registry.add_plugin(LoserPlugin(), PluginInfo("loser-test", "budgetbench-headline-tests", "0.0.1"))
    out = tmp_path_factory.mktemp("headline") / "run"
    with FaultServer(rate=0.15, faults=("500",), seed=3) as server:
        run(
            RunConfig(
                task="synthetic-memory",
                strategies=["truncation", "full_context", "loser"],
                budgets=[SMALL, LARGE],
                out=out,
                api_base=server.url,
                model="openai/fault-model",
                tokenizer="tiktoken:cl100k_base",
                task_options={"items": 8, "history_tokens": 600},
                retries=0,
                max_concurrency=1,
                timeout_s=30.0,
            ),
            registry=registry,
        )
    return out


def test_the_run_has_what_the_tests_need(mixed_run):
    rows = list(final_rows(mixed_run).values())
    phases = {r.get("phase") for r in rows if r["event"] == "error"}
    assert "strategy" in phases and "model" in phases, phases
    assert any(r["event"] == "violation" for r in rows)
    assert any(r["event"] == "result" and r.get("cached") for r in rows)


def test_a_strategy_error_counts_as_a_failure_in_the_headline(mixed_run):
    """Old code: the loser's errors were left out, so quality (all) was over its surviving items only."""
    data = load_run(mixed_run, with_prompts=False)
    cell = next(r for r in summary_table(data) if r["strategy"] == "loser" and r["budget"] == LARGE)
    rows = data.cells()[(cell["task"], "loser", LARGE)]
    failed = {str(r["item_id"]) for r in rows if r["event"] == "error" and r["phase"] == "strategy"}
    assert cell["plugin_errors"] == len(failed) > 0
    # quality (all) is over every item not lost to the harness, the failed ones at 0 ...
    harness = {str(r["item_id"]) for r in rows if r["event"] == "error" and r["phase"] != "strategy"}
    assert cell["quality_all_n"] == len({str(r["item_id"]) for r in rows} - harness)
    scored = [float(r["quality"]) for r in rows if r["event"] == "result"]
    assert cell["quality_all"] == pytest.approx(sum(scored) / cell["quality_all_n"])
    # ... and quality (scored), the second denominator, leaves them out.
    assert cell["quality_scored_n"] == cell["quality_all_n"] - len(failed)


def test_a_harness_error_leaves_the_cell_incomplete_and_the_headline_says_so(mixed_run):
    report = json.loads(write_report(mixed_run, formats=["json", "md"])["json"].read_text())
    incomplete = [r for r in report["summary"] if r["incomplete"]]
    assert incomplete and all(r["harness_errors"] > 0 for r in incomplete)
    assert report["findings"][0].startswith("INCOMPLETE: ")
    assert all(f"{r['strategy']}@{r['budget']}" in report["findings"][0] for r in incomplete)
    assert any("caused by the strategy under test, scored 0" in f for f in report["findings"])
    markdown = (mixed_run / "report" / "report.md").read_text()
    assert "err., incomplete" in markdown and "failed (0)" in markdown
    assert "quality (scored; strategy errors left out) [95%]" in markdown  # both denominators, side by side
    assert report["pass_k"] == {} and "pass^k" not in markdown  # one repeat: no pass^k section


def test_one_summarise_feeds_the_report_and_the_terminal_summary(mixed_run):
    """Every number of the report's summary comes from summarise(rows) over the same rows."""
    data = load_run(mixed_run, with_prompts=False)
    cells = summarise(list(final_rows(mixed_run).values()), binary=data.binary)
    for row in summary_table(data):
        mine = cells[(row["task"], row["strategy"], row["budget"])]
        for key, value in ((k, v) for k, v in mine.items() if k != "estimate"):
            same = value == row[key] or (isinstance(value, float) and math.isnan(value) and math.isnan(row[key]))
            assert same, (key, value, row[key])
        assert mine["estimate"].mean == row["quality_all"] or math.isnan(row["quality_all"])
    assert sum(c["cache_hits"] for c in cells.values()) > 0
    assert sum(c["violations"] for c in cells.values()) > 0 and sum(c["errors"] for c in cells.values()) > 0


def test_the_terminal_summary_shows_the_reports_numbers(mixed_run):
    """Old code: progress.outcome computed its own estimates, leaving the strategy's errors out."""
    from rich.console import Console

    from budgetbench_core.progress import outcome, outcome_table, print_outcome

    data = load_run(mixed_run, with_prompts=False)
    rows = list(final_rows(mixed_run).values())
    terminal = outcome(iter(rows), ["truncation", "full_context", "loser"], [SMALL, LARGE], data.binary)
    table = summary_table(data)
    assert {(r["strategy"], r["budget"]) for r in table} == set(terminal.cells)
    for row in table:
        cell = terminal.cells[(row["strategy"], row["budget"])]
        estimate = cell["estimate"]
        assert estimate is not None and estimate.mean == pytest.approx(row["quality_all"])
        assert estimate.n == row["quality_all_n"]
        assert (estimate.low, estimate.high) == pytest.approx((row["quality_all_low"], row["quality_all_high"]))
        assert (cell["result"], cell["violation"], cell["failed"], cell["error"]) == (
            row["results"],
            row["violations"],
            row["plugin_errors"],
            row["harness_errors"],
        )
    # the run has every kind of row the summary counts
    assert sum(c["violation"] for c in terminal.cells.values()) > 0
    assert (
        sum(c["failed"] for c in terminal.cells.values()) > 0 and sum(c["error"] for c in terminal.cells.values()) > 0
    )
    assert sum(r["cache_hits"] for r in table) > 0
    console = Console(width=200, record=True, color_system=None)
    console.print(outcome_table(terminal))
    shown = console.export_text()
    loser = next(r for r in table if r["strategy"] == "loser" and r["budget"] == LARGE)
    assert f"{loser['plugin_errors']}f" in shown and f"{loser['quality_all']:.2f}" in shown
    print_outcome(console, terminal)
    assert "f strategy failures (scored 0), e harness errors (cell incomplete; run again)" in console.export_text()


def test_markdown_and_html_render_the_summary_from_one_column_spec(mixed_run):
    """Issue 24: the two outputs listed their columns separately (the Markdown had field names,
    the HTML its own headings and fewer columns)."""
    from budgetbench_core.report.columns import USAGE, cell, summary_columns

    paths = write_report(mixed_run, formats=["md", "html", "json"])
    markdown, html = paths["md"].read_text(), paths["html"].read_text()
    summary = json.loads(paths["json"].read_text())["summary"]  # with the evidence columns the report adds
    for table_id, section, columns in (
        ("summary", "## Summary per cell", summary_columns(False, True)),  # synthetic-memory marks evidence
        ("usage", "## Budget use, time and tokens per cell", USAGE),
    ):
        lines = [line for line in markdown.split(section)[1].split("\n## ")[0].splitlines() if line.startswith("|")]
        assert lines[0] == "| " + " | ".join(c.heading for c in columns) + " |"
        body = html.split(f'id="{table_id}"')[1].split("</table>")[0]
        headings = [re.sub(r"<[^>]+>", "", h) for h in re.findall(r"<th[^>]*>(.*?)</th>", body)]
        assert headings == [c.heading for c in columns]
        html_rows = [re.findall(r"<td[^>]*>(.*?)</td>", row) for row in body.split("<tr>")[2:]]
        assert len(html_rows) == len(summary) == len(lines) - 2
        for row, md_line, html_cells in zip(summary, lines[2:], html_rows):
            texts = [cell(row, c) for c in columns]
            assert md_line == "| " + " | ".join(texts) + " |"
            assert [html_lib.unescape(t) for t in html_cells] == texts
    loser = next(r for r in summary if r["strategy"] == "loser" and r["budget"] == LARGE)
    shown = cell(loser, next(c for c in summary_columns(False, True) if c.key == "quality_all"))
    assert shown == f"{loser['quality_all']:.3f} [{loser['quality_all_low']:.3f}, {loser['quality_all_high']:.3f}]"
