"""``budgetbench gate``, ``plan`` and ``compare`` through the CLI, on real run directories.

The pilot run is synthetic-memory at a budget that the full history cannot fit (full_context
violates on every item) on the embedded model; the second run asks the same embedded server
through litellm as an OpenAI-compatible model, so the two runs have different models on the
same items. The planner's formulas are checked against simulations of the report's own
intervals (``report.stats``): the simulated sample size must be within 10% of the plan.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from budgetbench_core import MemoryStrategy, Regime, RunConfig, hookimpl, run
from budgetbench_core.cli import cli
from budgetbench_core.plugins import PluginInfo, load_registry
from budgetbench_core.report import stats, write_report
from budgetbench_core.report.data import load_run
from budgetbench_core.report.pairing import pair_cells
from budgetbench_core.report.plan import binary_items_needed, graded_items_needed

BUILTINS = "builtin-strategies,builtin-synthetic-memory,builtin-graders,builtin-local,builtin-tokenizers,builtin-litellm,builtin-executors"
BUDGET = "160"
TASK = [
    "-t",
    "synthetic-memory",
    "-b",
    BUDGET,
    "-n",
    "4",
    "--task-option",
    "items=4",
    "--max-output-tokens",
    "4",
    "-j",
    "1",
]


@pytest.fixture(autouse=True, scope="module")
def builtins_only():
    previous = os.environ.get("BUDGETBENCH_LOAD_PLUGINS")
    os.environ["BUDGETBENCH_LOAD_PLUGINS"] = BUILTINS
    yield
    if previous is None:
        os.environ.pop("BUDGETBENCH_LOAD_PLUGINS", None)
    else:
        os.environ["BUDGETBENCH_LOAD_PLUGINS"] = previous


def _run(*args: str) -> None:
    result = CliRunner().invoke(cli, ["run", *args])
    assert result.exit_code == 0, result.output


@pytest.fixture(scope="module")
def pilot(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("pilot") / "local"
    _run(
        *TASK,
        "--task-option",
        "history_tokens=600",
        "-s",
        "truncation",
        "-s",
        "full_context",
        "-s",
        "recency",
        "-o",
        str(out),
    )
    return out


@pytest.fixture(scope="module")
def served(tmp_path_factory, local_backend) -> Path:
    """The same items asked of the embedded server as an OpenAI-compatible model through litellm."""
    out = tmp_path_factory.mktemp("served") / "served"
    _run(
        *TASK,
        "--task-option",
        "history_tokens=600",
        "-s",
        "truncation",
        "-s",
        "recency",
        "-o",
        str(out),
        "--model",
        "openai/smollm2-served",
        "--api-base",
        local_backend.api_base,
        "--tokenizer",
        f"server:{local_backend.server_url}",
    )
    return out


def _invoke(*args: str):
    return CliRunner().invoke(cli, list(args))


# ----------------------------------------------------------------------------- gate


@pytest.mark.slow
def test_gate_fails_on_a_violation_and_passes_a_compliant_cell(pilot):
    result = _invoke("gate", str(pilot))
    assert result.exit_code == 1, result.output
    assert f"FAIL  violation rate  full_context@{BUDGET}: 1.000 (4 of 4 rows) > 0.000" in result.output
    assert f"PASS  violation rate  truncation@{BUDGET}: 0.000 (0 of 4 rows) <= 0.000" in result.output
    assert "gate FAILED" in result.output
    ok = _invoke("gate", str(pilot), "--candidate", f"truncation@{BUDGET}")
    assert ok.exit_code == 0, ok.output
    assert "full_context" not in ok.output and "gate passed: 2 of 2 checks passed" in ok.output
    tolerant = _invoke("gate", str(pilot), "--max-violation-rate", "1", "--json")
    assert tolerant.exit_code == 0, tolerant.output
    assert json.loads(tolerant.output)["passed"] is True


@pytest.mark.slow
def test_gate_on_too_few_items_fails_and_says_how_many(pilot):
    result = _invoke("gate", str(pilot), "--candidate", f"truncation@{BUDGET}", "--min-items", "10")
    assert result.exit_code == 1
    assert "FAIL  items" in result.output and "4 scored items < --min-items 10: needs 6 more" in result.output
    checks = json.loads(
        _invoke("gate", str(pilot), "--candidate", f"truncation@{BUDGET}", "--min-items", "10", "--json").output
    )["checks"]
    assert [c["needed_items"] for c in checks if c["name"] == "items"] == [10]


@pytest.mark.slow
def test_gate_non_inferiority_uses_the_paired_interval(pilot):
    data = load_run(pilot, with_prompts=False)
    task = "synthetic-memory"
    pair = pair_cells(data, (task, "recency", int(BUDGET)), (task, "truncation", int(BUDGET)))
    delta = stats.paired_delta(pair.candidate, pair.reference)
    args = ["gate", str(pilot), "--candidate", f"recency@{BUDGET}", "--reference", f"truncation@{BUDGET}"]
    for margin in (0.05, 0.99):
        result = _invoke(*args, "--margin", str(margin))
        expected = delta.low > -margin
        assert result.exit_code == (0 if expected else 1), result.output
        assert f"lower bound {delta.low:+.3f}" in result.output
    # 4 items cannot show non-inferiority at a 0.05 margin: the gate says how many would.
    narrow = _invoke(*args, "--margin", "0.05")
    assert "needed" in narrow.output and "FAIL  non-inferiority" in narrow.output


@pytest.mark.slow
def test_gate_usage_errors_exit_2(pilot):
    assert _invoke("gate", str(pilot), "--margin", "0.1").exit_code == 2
    missing = _invoke("gate", str(pilot), "--candidate", "truncation@999")
    assert (
        missing.exit_code == 2
        and "no cell truncation@999" in missing.output
        and f"truncation@{BUDGET}" in missing.output
    )
    assert _invoke("gate", str(pilot), "--candidate", "truncation").exit_code == 2


# ----------------------------------------------------------------------------- plan


@pytest.mark.slow
def test_plan_prints_a_row_per_pair_and_tier(pilot):
    result = _invoke("plan", str(pilot), "--margin", "0.1", "--json")
    assert result.exit_code == 0, result.output
    rows = json.loads(result.output)
    assert {(r["candidate"], r["reference"]) for r in rows} == {
        ("full_context", "truncation"),
        ("recency", "truncation"),
        ("recency", "full_context"),
    }
    data = load_run(pilot, with_prompts=False)
    for row in rows:
        pair = pair_cells(
            data, ("synthetic-memory", row["candidate"], 160), ("synthetic-memory", row["reference"], 160)
        )
        d = np.asarray(pair.candidate) - np.asarray(pair.reference)
        expected = binary_items_needed(float(np.mean(d != 0)), float(d.mean()), 0.1)
        assert row["goal"] == "non-inferiority" and row["pilot_items"] == 4
        assert row["needed"] == max(stats.MIN_PAIRED_ITEMS, int(np.ceil(expected)))
    table = _invoke("plan", str(pilot), "--delta", "0.2")
    assert table.exit_code == 0 and "synthetic-memory @ 160" in table.output and "recency" in table.output
    assert _invoke("plan", str(pilot), "--delta", "0.2", "--margin", "0.1").exit_code == 2


RNG = np.random.default_rng(20261201)
SIMULATIONS = 4000


def _binary_power(n: int, p10: float, p01: float, margin: float | None) -> float:
    """Share of simulated paired samples the report's own binary method calls a result."""
    counts = RNG.multinomial(n, [p10, p01, 1 - p10 - p01], size=SIMULATIONS)
    both = RNG.binomial(counts[:, 2], 0.5)
    neither = counts[:, 2] - both
    if margin is None:
        code = stats.paired_binary_verdicts(both, counts[:, 0], counts[:, 1], neither)[2]
        return float(np.mean(code == np.sign(p10 - p01)))
    low, _ = stats.newcombe_paired_bounds(both, counts[:, 0], counts[:, 1], neither)
    return float(np.mean(low > -margin))


def _graded_power(n: int, mean: float, sd: float, margin: float | None) -> float:
    d = np.clip(RNG.normal(mean, sd, size=(SIMULATIONS, n)), -1, 1)
    low, _, code = stats.graded_verdicts(d.sum(axis=1), (d * d).sum(axis=1), n)
    return float(np.mean(code == 1)) if margin is None else float(np.mean(low > -margin))


def _simulated_n(power) -> int:
    """Smallest n whose simulated power reaches 80% (doubling, then bisection)."""
    high = 4
    while power(high) < 0.8:
        high *= 2
    low = high // 2
    while low < high:
        middle = (low + high) // 2
        low, high = (low, middle) if power(middle) >= 0.8 else (middle + 1, high)
    return high


@pytest.mark.parametrize(
    "p10, p01, margin", [(0.25, 0.05, None), (0.15, 0.05, None), (0.4, 0.2, None), (0.1, 0.1, 0.1), (0.2, 0.1, 0.05)]
)
def test_binary_plan_agrees_with_a_simulation(p10, p01, margin):
    planned = binary_items_needed(p10 + p01, p10 - p01, margin)
    simulated = _simulated_n(lambda n: _binary_power(n, p10, p01, margin))
    assert abs(planned - simulated) <= 0.10 * simulated, (planned, simulated)


@pytest.mark.parametrize(
    "mean, sd, margin", [(0.1, 0.3, None), (0.05, 0.2, None), (0.2, 0.4, None), (0.0, 0.3, 0.1), (0.0, 0.2, 0.05)]
)
def test_graded_plan_agrees_with_a_simulation(mean, sd, margin):
    population = np.clip(RNG.normal(mean, sd, size=1_000_000), -1, 1)  # the truth after clipping
    planned = graded_items_needed(float(population.std()), float(population.mean()), margin)
    simulated = _simulated_n(lambda n: _graded_power(n, mean, sd, margin))
    assert abs(planned - simulated) <= 0.10 * simulated, (planned, simulated)


# ----------------------------------------------------------------------------- compare


@pytest.mark.slow
def test_compare_two_models_gives_one_report_with_both(pilot, served, tmp_path):
    out = tmp_path / "cmp"
    result = _invoke("compare", str(pilot), str(served), "-o", str(out), "--label", "local", "--label", "served")
    assert result.exit_code == 0, result.output
    report = json.loads((out / "report.json").read_text())
    assert [r["run"] for r in report["runs"]] == ["local", "served"]
    assert report["runs"][0]["model"] == "local" and report["runs"][1]["model"] == "openai/smollm2-served"
    paired = {(r["strategy"], r["budget"]): r for r in report["paired"]}
    assert set(paired) == {("truncation", 160), ("recency", 160)}
    assert all(r["paired_items"] == 4 and r["reference_run"] == "local" for r in paired.values())
    assert report["unmatched"] == [
        {"task": "synthetic-memory", "strategy": "full_context", "budget": 160, "only_in": "local", "other": "served"}
    ]
    assert {(r["run"], r["strategy"]) for r in report["summary"]} == {
        ("local", "truncation"),
        ("local", "full_context"),
        ("local", "recency"),
        ("served", "truncation"),
        ("served", "recency"),
    }
    index = (out / "index.html").read_text()
    assert "openai/smollm2-served" in index and 'id="unmatched"' in index
    assert (out / "quality_vs_budget.png").read_bytes().startswith(b"\x89PNG")


@pytest.mark.slow
def test_compare_pairs_shared_items_only_and_refuses_other_data(pilot, tmp_path):
    fewer = tmp_path / "fewer"
    _run(
        "-t",
        "synthetic-memory",
        "-b",
        BUDGET,
        "-n",
        "2",
        "--task-option",
        "items=4",
        "--max-output-tokens",
        "4",
        "-j",
        "1",
        "--task-option",
        "history_tokens=600",
        "-s",
        "truncation",
        "-o",
        str(fewer),
    )
    other = tmp_path / "other"
    _run(*TASK, "--task-option", "history_tokens=700", "-s", "truncation", "-o", str(other))
    refused = _invoke("compare", str(pilot), str(other), "-o", str(tmp_path / "no"))
    assert (
        refused.exit_code == 2
        and "different task data" in refused.output
        and "--allow-different-data" in refused.output
    )
    assert not (tmp_path / "no" / "index.html").exists()
    forced = _invoke("compare", str(pilot), str(other), "-o", str(tmp_path / "yes"), "--allow-different-data")
    assert forced.exit_code == 0, forced.output
    assert 'id="different-data"' in (tmp_path / "yes" / "index.html").read_text()
    # A run over 2 of the 4 items: the comparison uses the 2 shared items and lists the others.
    partial = _invoke("compare", str(pilot), str(fewer), "-o", str(tmp_path / "partial"))
    assert partial.exit_code == 0, partial.output
    (row,) = [
        r
        for r in json.loads((tmp_path / "partial" / "report.json").read_text())["paired"]
        if r["strategy"] == "truncation"
    ]
    pilot_items = {k[4] for k in load_run(pilot, with_prompts=False).rows}
    fewer_items = {k[4] for k in load_run(fewer, with_prompts=False).rows}
    assert row["paired_items"] == len(fewer_items) == 2 and row["missing_in_run"] == 2
    assert set(row["missing_items"].split()) == pilot_items - fewer_items


# ------------------------------------------------------------------- all-error report


class Broken(MemoryStrategy):
    """Fails on every item, so every cell of the run is an error row."""

    name = "broken"
    regime = Regime.LOCAL_ONLY

    def apply(self, history, budget, context):
        raise RuntimeError("injected: index unavailable")


class BrokenPlugin:
    @hookimpl
    def register_strategies(self, register):
        register(Broken)


@pytest.mark.slow
def test_a_run_where_every_cell_errored_still_gets_a_report(tmp_path):
    registry = load_registry()
    registry.add_plugin(BrokenPlugin(), PluginInfo("broken-test", "budgetbench-decisions-tests", "0.0.1"))
    out = tmp_path / "broken"
    run(
        RunConfig(
            task="synthetic-memory",
            strategies=["broken"],
            budgets=[160, 320],
            out=out,
            limit=2,
            max_concurrency=1,
            task_options={"items": 2, "history_tokens": 600},
        ),
        registry=registry,
    )
    result = _invoke("report", str(out))
    assert result.exit_code == 0, result.output
    report = json.loads((out / "report" / "report.json").read_text())
    assert len(report["errors"]) == 4 and all("injected: index unavailable" in e["cause"] for e in report["errors"])
    # Every error is the strategy's own: a failure scored 0 over both items, never called best.
    assert [(r["quality_all"], r["quality_all_n"], r["plugin_errors"]) for r in report["summary"]] == [(0.0, 2, 2)] * 2
    assert [g["best"][b]["status"] for g in report["pivot"] for b in ("160", "320")] == ["only", "only"]
    for name in ("quality_vs_budget.png", "violations_vs_budget.png", "quality_by_category.png"):
        assert (out / "report" / name).read_bytes().startswith(b"\x89PNG")
    assert 'id="errors"' in (out / "report" / "index.html").read_text()
    assert write_report(out, formats=["md"])["md"].read_text().count("the only strategy scored") == 2


@pytest.mark.slow
def test_the_run_command_reports_a_run_where_every_cell_errored(tmp_path, monkeypatch):
    """``run`` writes that report itself at its end, as ``report`` does, and exits 1."""
    from budgetbench_core import plugins
    from budgetbench_core.cli import execute

    # The command uses the process-wide registry: this test's own, so no later test sees "broken".
    registry = plugins.Registry.discover()
    registry.add_plugin(BrokenPlugin(), PluginInfo("broken-test", "budgetbench-decisions-tests", "0.0.1"))
    monkeypatch.setattr(plugins, "_registry", registry)
    out = tmp_path / "broken"
    config = RunConfig(
        task="synthetic-memory",
        strategies=["broken"],
        budgets=[160],
        out=out,
        limit=2,
        max_concurrency=1,
        task_options={"items": 2, "history_tokens": 600},
    )
    assert execute(config, display="none") == 1
    report = json.loads((out / "report" / "report.json").read_text())
    assert len(report["errors"]) == 2 and report["summary"][0]["plugin_errors"] == 2
