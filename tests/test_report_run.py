"""Reports on real run directories written by the runner with the embedded model.

Run A: synthetic-memory, truncation + full_context (violations at small budgets) + a memory
system that loses a session of one item (fault injection through the public MemorySystem
contract). Run B: a task whose question and category hold HTML, counted with an approximate
tokenizer. Both use tiny budgets and 1-3 items so the model calls stay few.
"""

from __future__ import annotations

import csv
import json
import os
import shutil
import subprocess
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from budgetbench_core import (
    IngestFailure,
    IngestReport,
    Item,
    MemorySystem,
    Message,
    Regime,
    RetrievedItem,
    RunConfig,
    Task,
    hookimpl,
    run,
)
from budgetbench_core.cli import cli
from budgetbench_core.plugins import PluginInfo, load_registry
from budgetbench_core.report import ReportError, write_report
from budgetbench_core.runlog import final_rows

pytestmark = pytest.mark.slow

BUILTINS = "builtin-strategies,builtin-synthetic-memory,builtin-graders,builtin-local,builtin-tokenizers,builtin-litellm,builtin-executors"
LOSSY_ITEM = "synth-00001-knowledge-update"


def lossy_first_message() -> str:
    """LOSSY_ITEM's first message: how a memory system knows the item at ingest (a view's id is
    opaque, and ingest is not given the question)."""
    from budgetbench_core.builtin.synthetic_memory import SyntheticMemory

    items = SyntheticMemory(items=3, history_tokens=600).load(None, 0)
    return next(item.history[0].content for item in items if item.id == LOSSY_ITEM)


BUDGET = 160  # fits the system prompt, the query and a few messages; not the 600-token history
PROBE_QUESTION = "<script>alert('owned')</script> What is my dog called?"


class LossyMemory(MemorySystem):
    """Stores every session except the first session of LOSSY_ITEM; retrieves newest first."""

    name = "lossy-memory"
    regime = Regime.PERSISTENT_STATEFUL

    def reset(self):
        self.sessions = []

    def ingest(self, sessions, context):
        failures = (
            [IngestFailure(sessions[0].id, "injected: vector store refused the write")]
            if sessions[0].messages[0].content == lossy_first_message()
            else []
        )
        self.sessions = list(sessions)
        return IngestReport(len(sessions), len(sessions) - len(failures), failures)

    def retrieve(self, query, context):
        texts = [m.content for s in reversed(self.sessions) for m in reversed(s.messages)]
        return [RetrievedItem(text, score=1.0 / (rank + 1)) for rank, text in enumerate(texts)]


class HtmlProbe(Task):
    """One item whose question and category carry markup that must be escaped."""

    name = "html-probe"
    default_grader = "contains-answer"
    max_output_tokens = 8

    def load(self, limit, seed):
        yield Item(
            id="probe-<1>",
            history=(Message("user", "My dog is called <b>Rex</b>."), Message("assistant", "Noted.")),
            query=Message("user", PROBE_QUESTION),
            answer="Rex",
            system=Message("system", "Answer briefly."),
            category="<i>markup</i>",
        )


class ProbePlugins:
    @hookimpl
    def register_strategies(self, register):
        register(LossyMemory)

    @hookimpl
    def register_tasks(self, register):
        register(HtmlProbe)


@contextmanager
def _builtins_only():
    previous = os.environ.get("BUDGETBENCH_LOAD_PLUGINS")
    os.environ["BUDGETBENCH_LOAD_PLUGINS"] = BUILTINS
    try:
        yield
    finally:
        if previous is None:
            del os.environ["BUDGETBENCH_LOAD_PLUGINS"]
        else:
            os.environ["BUDGETBENCH_LOAD_PLUGINS"] = previous


@pytest.fixture(scope="module")
def registry():
    with _builtins_only():
        registry = load_registry()
    registry.add_plugin(ProbePlugins(), PluginInfo("report-test-plugins", "budgetbench-report-tests", "0.0.1"))
    return registry


@pytest.fixture(scope="module")
def run_a(tmp_path_factory, registry):
    out = tmp_path_factory.mktemp("report-run-a")
    run(
        RunConfig(
            task="synthetic-memory",
            strategies=["truncation", "full_context", "lossy-memory"],
            budgets=[BUDGET],
            out=out,
            limit=3,
            max_concurrency=1,
            max_output_tokens=6,
            task_options={"items": 3, "history_tokens": 600},
        ),
        registry=registry,
    )
    return out


@pytest.fixture(scope="module")
def run_b(tmp_path_factory, registry):
    out = tmp_path_factory.mktemp("report-run-b")
    run(
        RunConfig(
            task="html-probe",
            strategies=["truncation"],
            budgets=[BUDGET],
            out=out,
            max_concurrency=1,
            tokenizer="tiktoken:cl100k_base",
        ),
        registry=registry,
    )
    return out


def _csv(path: Path) -> list[dict[str, str]]:
    with open(path, newline="", encoding="utf-8") as handle:
        return list(csv.DictReader(handle))


def test_report_command_writes_every_output(run_a):
    result = CliRunner().invoke(cli, ["report", str(run_a)])
    assert result.exit_code == 0, result.output
    report = run_a / "report"
    for name in ("summary.csv", "paired.csv", "categories.csv", "errors.csv", "index.html", "report.md", "report.json"):
        assert (report / name).stat().st_size > 0, name
    for name in ("quality_vs_budget.png", "violations_vs_budget.png", "quality_vs_latency.png"):
        data = (report / name).read_bytes()
        assert data.startswith(b"\x89PNG") and len(data) > 10_000, name
    assert f"html: {report / 'index.html'}" in result.output
    json.loads((report / "report.json").read_text())  # valid JSON, no NaN


def test_both_denominators_match_the_rows(run_a):
    write_report(run_a, formats=["csv"])
    summary = {(r["strategy"], int(r["budget"])): r for r in _csv(run_a / "report" / "summary.csv")}
    rows = final_rows(run_a)
    assert len(summary) == 3
    for (strategy, budget), cell in summary.items():
        mine = [r for k, r in rows.items() if k[1] == strategy and k[2] == budget]
        scored = [r for r in mine if r["event"] in ("result", "violation")]
        admitted = [r["quality"] for r in mine if r["event"] == "result"]
        # The strategy's own errors (here the lossy memory's ingest loss) are failures, scored 0.
        failed = [
            r for r in mine if r["event"] == "error" and r["phase"] in ("reset", "strategy", "ingest", "retrieve")
        ]
        everything = [r["quality"] if r["event"] == "result" else 0.0 for r in scored] + [0.0] * len(failed)
        assert int(cell["quality_all_n"]) == len(everything)
        assert int(cell["quality_scored_n"]) == len(scored) and int(cell["plugin_errors"]) == len(failed)
        assert int(cell["quality_admitted_n"]) == len(admitted)
        assert int(cell["violations"]) == len(scored) - len(admitted)
        if everything:
            assert float(cell["quality_all"]) == pytest.approx(np.mean(everything))
        if admitted:
            assert float(cell["quality_admitted"]) == pytest.approx(np.mean(admitted))
            used = [r["prompt_tokens"] for r in mine if r["event"] == "result"]
            assert float(cell["utilisation_mean"]) == pytest.approx(np.mean(used) / budget)
        else:
            assert cell["quality_admitted"] == ""  # undefined, not 0
    # full_context cannot fit a 600-token history in the budget: all violations, scored 0.
    cell = summary[("full_context", BUDGET)]
    assert cell["violation_rate"] == "1.0" and cell["quality_all"] == "0.0" and cell["quality_all_n"] == "3"
    assert cell["quality_admitted_n"] == "0" and cell["quality_all_high"] != ""
    assert summary[("truncation", BUDGET)]["quality_admitted_n"] == "3"
    assert all(c["approximate_counts"] == "False" for c in summary.values())


def test_ingest_loss_drops_the_item_from_every_comparison(run_a):
    write_report(run_a, formats=["csv", "html"])
    report = run_a / "report"
    summary = {(r["strategy"], int(r["budget"])): r for r in _csv(report / "summary.csv")}
    lossy = summary[("lossy-memory", BUDGET)]
    assert lossy["errors"] == "1" and lossy["error_causes"] == "ingest: 1" and lossy["plugin_errors"] == "1"
    # The loss is the memory system's failure: 0 in its headline, left out of quality (scored).
    assert lossy["quality_all_n"] == "3" and lossy["quality_scored_n"] == "2" and lossy["incomplete"] == "False"
    paired = _csv(report / "paired.csv")
    assert {(r["strategy"], r["reference"]) for r in paired} == {
        ("full_context", f"truncation@{BUDGET}"),
        ("lossy-memory", f"truncation@{BUDGET}"),
    }
    for row in paired:
        assert (
            row["dropped_ingest_loss"] == "1" and row["paired_items"] == "2" and LOSSY_ITEM not in row["missing_items"]
        )
        assert row["result"] == "too few items" and int(row["needed_items"]) >= 4  # 2 paired items
    errors = _csv(report / "errors.csv")
    assert {(e["item_id"], e["phase"]) for e in errors} == {(LOSSY_ITEM, "ingest")}
    assert all("injected: vector store refused the write" in e["cause"] for e in errors)
    index = (report / "index.html").read_text()
    assert 'id="ingest-lost"' in index and LOSSY_ITEM in index


def test_reference_cell_option(run_a):
    result = CliRunner().invoke(cli, ["report", str(run_a), "--reference", f"lossy-memory@{BUDGET}", "--format", "csv"])
    assert result.exit_code == 0, result.output
    paired = _csv(run_a / "report" / "paired.csv")
    assert {r["reference"] for r in paired} == {f"lossy-memory@{BUDGET}"}
    assert {r["strategy"] for r in paired} == {"truncation", "full_context"}
    bad = CliRunner().invoke(cli, ["report", str(run_a), "--reference", "truncation@999"])
    assert bad.exit_code == 2 and "no cell truncation@999" in bad.output


def test_report_refuses_a_manifest_without_plugin_versions(run_a, tmp_path):
    copy = tmp_path / "copy"
    shutil.copytree(run_a, copy, ignore=shutil.ignore_patterns("report", "cache.sqlite"))
    manifest = json.loads((copy / "manifest.json").read_text())
    manifest["plugins_used"]["strategy:lossy-memory"]["version"] = ""
    (copy / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ReportError, match="strategy:lossy-memory"):
        write_report(copy)
    result = CliRunner().invoke(cli, ["report", str(copy)])
    assert result.exit_code == 2 and "refusing to write a report" in result.output
    assert not (copy / "report" / "index.html").exists()


def test_markup_is_escaped_and_approximate_counts_are_labelled(run_b):
    paths = write_report(run_b)
    pages = [paths["html"], *sorted((run_b / "report" / "items").glob("*.html"))]
    assert len(pages) == 2
    for page in pages:
        text = page.read_text()
        assert "<script" not in text and "<b>Rex" not in text and "<i>markup" not in text
    item_page = pages[1].read_text()
    assert "&lt;script&gt;alert(&#39;owned&#39;)&lt;/script&gt; What is my dog called?" in item_page
    assert "&lt;b&gt;Rex&lt;/b&gt;" in item_page
    index = paths["html"].read_text()
    assert 'id="approximate-banner"' in index
    for table_id in ("summary", "paired", "categories"):
        start = index.index(f'<table id="{table_id}">')
        assert "(approximate token counts)" in index[start : index.index("</caption>", start)]
    for name in ("summary_csv", "categories_csv"):
        assert all(r["approximate_counts"] == "True" for r in _csv(paths[name]))
    assert "APPROXIMATE" in paths["md"].read_text()
    # Served-count audit: tiktoken does not count SmolLM2's prompt the way the server does.
    (row,) = [r for r in final_rows(run_b).values() if r["event"] == "result"]
    report = json.loads(paths["json"].read_text())
    assert row["served_prompt_tokens"] != row["prompt_tokens"]
    assert [(m["prompt_tokens"], m["served_prompt_tokens"]) for m in report["served_mismatches"]] == [
        (row["prompt_tokens"], row["served_prompt_tokens"])
    ]
    assert any(f.startswith("Served-count audit: on 1 result rows") for f in report["findings"])


def test_run_command_writes_the_report_at_the_end(tmp_path):
    out = tmp_path / "auto"
    with _builtins_only():
        result = CliRunner().invoke(
            cli,
            [
                "run",
                "-t",
                "synthetic-memory",
                "-s",
                "truncation",
                "-b",
                str(BUDGET),
                "-n",
                "1",
                "--task-option",
                "items=1",
                "--task-option",
                "history_tokens=300",
                "--max-output-tokens",
                "6",
                "-j",
                "1",
                "-o",
                str(out),
            ],
        )
    assert result.exit_code == 0, result.output
    assert (out / "report" / "index.html").exists() and (out / "report" / "summary.csv").exists()


CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")


@pytest.mark.skipif(
    CHROMIUM is None,
    reason="no headless Chromium: apt-get install -y chromium (manual check in docs/reading-a-report.md)",
)
def test_index_renders_with_plots_in_headless_chromium(run_a, tmp_path):
    """Screenshot the report's own plots section (everything else hidden): the embedded PNGs must draw.

    A copy whose image data is corrupted is the control: Chromium then shows only alt texts.
    """
    from PIL import Image

    index = write_report(run_a, formats=["html"])["html"].read_text()
    only_plots = index.replace("</head>", "<style>body > :not(.plots) { display: none; }</style></head>", 1)
    broken = only_plots.replace("data:image/png;base64,", "data:image/png;base64,AAAA")

    def shoot(html: str, name: str) -> tuple[int, int]:
        page, shot = tmp_path / f"{name}.html", tmp_path / f"{name}.png"
        page.write_text(html)
        subprocess.run(
            [
                CHROMIUM,
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--hide-scrollbars",
                "--window-size=1400,1000",
                f"--screenshot={shot}",
                page.as_uri(),
            ],
            check=True,
            capture_output=True,
            timeout=180,
        )
        dark = np.asarray(Image.open(shot).convert("L")) < 200
        return int(dark.sum()), int(dark.any(axis=1).sum())

    pixels, rows = shoot(only_plots, "plots")
    broken_pixels, broken_rows = shoot(broken, "broken")
    assert rows > 250 and broken_rows < 100, (rows, broken_rows)  # three ~300-pixel-high plots vs one line of alt text
    assert pixels > broken_pixels, (pixels, broken_pixels)
