"""One paired method per kind of score, exact `needed_items`, no vacuous findings, no "tie"
where the items cannot separate, and gate / plan on evidence recall (prompts-only runs)."""

from __future__ import annotations

import html
import json
import re
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from budgetbench_core import RunConfig, run
from budgetbench_core.cli import cli
from budgetbench_core.report import stats, write_report
from budgetbench_core.report.columns import summary_columns
from budgetbench_core.report.data import RunData
from budgetbench_core.report.pivot import best_at_each_budget
from budgetbench_core.report.plan import plan_pair
from budgetbench_core.report.release_gate import gate
from budgetbench_core.report.tables import monotone_note, paired_table, summary_table
from budgetbench_core.runlog import final_rows
from budgetbench_core.testing import FaultServer

# ------------------------------------------------------------------ one paired method


def _graded_run(candidate: list[float], reference: list[float]) -> RunData:
    """A run whose grader is graded (binary false) though every value happens to be 0 or 1."""
    rows = {}
    for strategy, values in (("ref", reference), ("cand", candidate)):
        for i, value in enumerate(values):
            key = ("t", strategy, 512, 0, f"i{i}")
            rows[key] = {
                "event": "result",
                "task": "t",
                "strategy": strategy,
                "budget": 512,
                "repeat": 0,
                "item_id": f"i{i}",
                "quality": value,
                "prompt_tokens": 100,
            }
    manifest = {"grader": {"binary": False}, "config": {"strategies": ["ref", "cand"]}}
    return RunData(Path("graded-run"), manifest, rows)


def test_a_graded_grader_with_0_1_values_gets_one_method_in_table_grid_and_gate():
    """Old code: the paired table used bounded t (a tie) while the grid and gate used Newcombe +
    sign (a result) for the same pair."""
    candidate, reference = [1.0] * 10 + [0.0] * 10, [0.0] * 20
    data = _graded_run(candidate, reference)
    (row,) = paired_table(data, "ref")
    assert row["interval"] == "newcombe+sign" and row["result"] == "higher"
    values = {(c[0], c[1], c[2]): {str(r["item_id"]): r["quality"] for r in rs} for c, rs in data.cells().items()}
    (grid,) = best_at_each_budget(summary_table(data), lambda cell: values[cell])
    assert grid["best"][512]["status"] == "best" and grid["best"][512]["strategies"] == ["cand"]
    checks = gate(data, candidate="cand@512", reference="ref@512", margin=0.0).checks
    (inferiority,) = [c for c in checks if c.name == "non-inferiority"]
    assert inferiority.passed and f"[{row['delta_low']:+.3f}, {row['delta_high']:+.3f}]" in inferiority.figure
    plan = plan_pair(candidate, reference)
    assert plan.spread_kind == "discordance"  # plan follows the same method


# ------------------------------------------------------------------ exact needed_items


def _brute_force_needed(candidate, reference) -> int:
    counts = np.array(
        [
            sum(a == 1 and b == 1 for a, b in zip(candidate, reference)),
            sum(a == 1 and b == 0 for a, b in zip(candidate, reference)),
            sum(a == 0 and b == 1 for a, b in zip(candidate, reference)),
            sum(a == 0 and b == 0 for a, b in zip(candidate, reference)),
        ],
        dtype=float,
    )
    n = len(candidate)
    for size in range(n, 10_000):
        scaled = np.round(counts * size / n)
        if stats.paired_binary_verdicts(*scaled)[2] in (1, -1):
            return size
    raise AssertionError("not reached")


@pytest.mark.parametrize(
    "cand_only, ref_only, both, neither",
    [(6, 1, 0, 1), (1, 6, 0, 13), (6, 1, 2, 3), (5, 2, 4, 9), (3, 0, 0, 1)],
)
def test_needed_items_is_the_smallest_n(cand_only, ref_only, both, neither):
    """Old code bisected a verdict that is not monotone in n: 13 instead of 10 items for 6 vs 1 of 8."""
    candidate = [1] * cand_only + [0] * ref_only + [1] * both + [0] * neither
    reference = [0] * cand_only + [1] * ref_only + [1] * both + [0] * neither
    delta = stats.paired_delta(candidate, reference)
    assert delta.verdict not in (stats.HIGHER, stats.LOWER)
    assert delta.needed_n == max(_brute_force_needed(candidate, reference), stats.separating_n(delta.method))


def test_needed_items_of_the_worst_case_of_the_old_search():
    delta = stats.paired_delta([1] * 6 + [0, 0], [0] * 6 + [1, 0])
    assert delta.needed_n == 10


# ------------------------------------------------------------------ too few to separate


def test_0_of_4_against_4_of_4_is_too_few_items_to_separate_not_a_tie():
    four = stats.paired_delta([0.0] * 4, [1.0] * 4)
    assert four.verdict == stats.UNSEPARABLE and four.needed_n == 6
    summary = [
        {"task": "t", "strategy": s, "budget": 512, "quality_all": q, "violations": 0, "errors": 0}
        for s, q in (("a", 1.0), ("b", 0.0))
    ]
    values = {"a": [1.0] * 4, "b": [0.0] * 4}
    (grid,) = best_at_each_budget(summary, lambda cell: dict(enumerate(values[cell[1]])))
    assert grid["best"][512]["status"] == "too few items"
    assert grid["best"][512]["text"] == "too few items to separate a, b"
    # Six items all one way do separate: the sign test reaches p = 0.031.
    assert stats.paired_delta([1.0] * 6, [0.0] * 6).verdict == stats.HIGHER


# ------------------------------------------------------------------ vacuous findings


def test_no_quality_means_no_monotone_claim():
    nothing = [
        {"task": "t", "strategy": "a", "budget": b, "quality_all": float("nan"), "quality_all_low": float("nan")}
        for b in (256, 512)
    ]
    assert monotone_note(nothing) == []
    rising = [
        {"task": "t", "strategy": "a", "budget": b, "quality_all": q, "quality_all_low": q, "quality_all_high": q}
        for b, q in ((256, 0.2), (512, 0.4))
    ]
    assert monotone_note(rising) == ["Every strategy's quality is non-decreasing in the budget."]


# ------------------------------------------------------------------ evidence recall in gate and plan


@pytest.fixture(scope="module")
def prompts_only(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("evidence") / "run"
    with FaultServer() as server:
        run(
            RunConfig(
                task="synthetic-memory",
                strategies=["truncation", "full_context"],
                budgets=[300],
                out=out,
                prompts_only=True,
                model="openai/fault-model",
                api_base=server.url,
                tokenizer="tiktoken:cl100k_base",
                task_options={"items": 8, "history_tokens": 600},
                max_concurrency=1,
            )
        )
        assert server.requests == []
    return out


def _marked(run_dir: Path) -> int:
    """Items the task marks evidence for (an abstention item has none)."""
    return len({k[4] for k, r in final_rows(run_dir).items() if (r.get("evidence") or {}).get("marked")})


def test_gate_on_evidence_recall_of_a_prompts_only_run(prompts_only):
    """Old code: a prompts-only run had no quality to gate on, so non-inferiority always failed."""
    args = ["gate", str(prompts_only), "--candidate", "truncation@300", "--reference", "full_context@300"]
    refused = CliRunner().invoke(cli, [*args, "--margin", "0.1", "--max-violation-rate", "1"])
    assert refused.exit_code == 2 and "--metric evidence" in refused.output
    result = CliRunner().invoke(cli, [*args, "--margin", "1", "--max-violation-rate", "1", "--metric", "evidence"])
    assert result.exit_code == 0, result.output
    assert "non-inferiority (evidence recall)" in result.output
    assert f"over {_marked(prompts_only)} paired items" in result.output


def test_plan_on_evidence_recall_of_a_prompts_only_run(prompts_only):
    result = CliRunner().invoke(cli, ["plan", str(prompts_only), "--metric", "evidence", "--delta", "0.2", "--json"])
    assert result.exit_code == 0, result.output
    (row,) = json.loads(result.output)
    assert row["pilot_items"] == _marked(prompts_only) and row["spread_kind"] == "discordance" and row["needed"] >= 4
    refused = CliRunner().invoke(cli, ["plan", str(prompts_only)])
    assert refused.exit_code == 2 and "--metric evidence" in refused.output


def test_a_prompts_only_report_labels_its_tables_as_evidence_recall(prompts_only):
    """Old code: "Summary per cell" and "Quality per category" over a run that has no quality."""
    paths = write_report(prompts_only, formats=["md", "html"])
    markdown, page = paths["md"].read_text(), paths["html"].read_text()
    assert "## Evidence recall and compliance per cell (prompts only)" in markdown
    assert "## Evidence recall per category (prompts only)" in markdown
    assert "Summary per cell" not in markdown and "Quality per category" not in page
    assert "Evidence recall per category (prompts only)" in page
    # one column spec for both outputs: the same headings, compliance and evidence, no quality
    headings = [c.heading for c in summary_columns(True, True)]
    assert "| " + " | ".join(headings) + " |" in markdown
    body = page.split('id="summary"')[1].split("</table>")[0]
    shown = [re.sub(r"<[^>]+>", "", h) for h in re.findall(r"<th[^>]*>(.*?)</th>", body)]
    assert [html.unescape(h) for h in shown] == headings
    assert "all evidence kept [95%]" in headings and not any(h.startswith("quality") for h in headings)
