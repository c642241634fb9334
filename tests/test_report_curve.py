"""Budget curves in the report (issue 29): effective budget, area under the curve, the noise floor.

Each figure in ``report.json`` is recomputed here from the run's terminal rows
(``runlog.final_rows``), written out plainly: per-item evidence recall or quality, the
trapezoid over log(budget), the 85% rule, the test inversion of the effective-budget range
with the report's bounded t (``stats.bounded_t``), the flip rate between repeats, and the
items ``plan`` asks for a single-repeat run. No function of ``report.curve`` or
``report.noise`` is called by the recomputation.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections import defaultdict
from pathlib import Path

import pytest

from budgetbench_core import RunConfig, run
from budgetbench_core.builtin.synthetic_memory import SyntheticMemory
from budgetbench_core.report import stats, write_report
from budgetbench_core.report.plan import binary_items_needed
from budgetbench_core.runlog import final_rows
from budgetbench_core.testing import FaultServer, invoke_cli

SHARE = 0.85
BUDGETS = [128, 256, 512]
TASK_OPTIONS = {"items": 10, "history_tokens": 600}


def _config(out: Path, url: str, strategies: list[str], **extra) -> RunConfig:
    options = {"max_concurrency": 2, "retries": 0, "timeout_s": 30.0} | extra
    return RunConfig(
        task="synthetic-memory",
        strategies=strategies,
        budgets=BUDGETS,
        out=out,
        model="openai/fault-model",
        api_base=url,
        tokenizer="tiktoken:cl100k_base",
        task_options=TASK_OPTIONS,
        **options,
    )


# --- the plain recomputation ------------------------------------------------------------------


def evidence_values(rows: dict, strategy: str, budget: int) -> dict[str, float]:
    """item -> 1 if the prompt kept every marked piece (a violation keeps nothing), mean over repeats."""
    per_item: dict[str, list[float]] = defaultdict(list)
    for row in rows.values():
        if (row["strategy"], row["budget"]) != (strategy, budget) or row["event"] not in ("admitted", "violation"):
            continue
        marks = row.get("evidence")
        if not marks or not marks["marked"]:
            continue
        kept_all = row["event"] == "admitted" and len(marks["kept"]) == marks["marked"]
        per_item[row["item_id"]].append(1.0 if kept_all else 0.0)
    return {item: sum(v) / len(v) for item, v in per_item.items()}


def trapezoid_weights(budgets: list[int]) -> list[float]:
    logs = [math.log(b) for b in budgets]
    width = logs[-1] - logs[0]
    weights = [0.0] * len(budgets)
    for i in range(len(budgets) - 1):
        gap = logs[i + 1] - logs[i]
        weights[i] += gap / 2 / width
        weights[i + 1] += gap / 2 / width
    return weights


def recompute_curve(values_per_tier: list[dict[str, float]], budgets: list[int]) -> dict:
    items = sorted(set.intersection(*(set(v) for v in values_per_tier)))
    matrix = [[v[i] for v in values_per_tier] for i in items]
    k, n = len(budgets), len(items)
    scores = [sum(row[t] for row in matrix) / n for t in range(k)]
    weights = trapezoid_weights(budgets)
    areas = [sum(w * x for w, x in zip(weights, row)) for row in matrix]
    auc_low, auc_high = stats.bounded_t(areas)
    best = max(scores)
    point = next(t for t in range(k) if scores[t] >= SHARE * best - 1e-12)
    falls_short, shown = [], []
    for t in range(k):
        bounds = [stats.bounded_t([row[t] - SHARE * row[u] for row in matrix], -SHARE, 1.0) for u in range(k) if u != t]
        falls_short.append(any(high < 0 for _, high in bounds))
        shown.append(all(low > 0 for low, _ in bounds) and scores[t] > 0)
    low = next(t for t in range(k) if not falls_short[t])
    high = next((t for t in range(k) if shown[t]), None)
    return {
        "items": items,
        "scores": scores,
        "areas": dict(zip(items, areas)),
        "auc": sum(areas) / n,
        "auc_low": auc_low,
        "auc_high": auc_high,
        "effective_budget": budgets[point],
        "effective_low": budgets[low],
        "effective_high": None if high is None else budgets[max(high, point)],
    }


# --- a prompts-only run: truncation, checkpoint, rag ---------------------------------------------


@pytest.fixture(scope="module")
def prompts_only_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("curve") / "po"
    with FaultServer(rate=0.0) as server:
        run(_config(out, server.url, ["truncation", "checkpoint", "rag"], prompts_only=True, max_concurrency=1))
        assert server.requests == []
    paths = write_report(out)
    return out, final_rows(out), json.loads(paths["json"].read_text()), paths


def test_effective_budget_and_auc_equal_a_recomputation_from_the_rows(prompts_only_run):
    _, rows, report, _ = prompts_only_run
    curves = {c["strategy"]: c for c in report["curves"]}
    assert set(curves) == {"truncation", "checkpoint", "rag"}
    found = {}
    for strategy, curve in curves.items():
        expected = recompute_curve([evidence_values(rows, strategy, b) for b in BUDGETS], BUDGETS)
        found[strategy] = expected
        assert curve["metric"] == "evidence_all" and curve["budgets"] == BUDGETS and not curve["control"]
        assert curve["n_items"] == len(expected["items"]) == 8  # abstention items mark no evidence
        assert curve["scores"] == pytest.approx(expected["scores"], abs=1e-12)
        assert curve["auc"] == pytest.approx(expected["auc"], abs=1e-12)
        assert curve["auc_low"] == pytest.approx(expected["auc_low"], abs=1e-12)
        assert curve["auc_high"] == pytest.approx(expected["auc_high"], abs=1e-12)
        assert curve["effective_status"] == "reached"
        for key in ("effective_budget", "effective_low", "effective_high"):
            assert curve[key] == expected[key], (strategy, key, curve, expected)
    # The run tells the strategies apart: a flat check would pass on any curve.
    assert found["truncation"]["auc"] < found["checkpoint"]["auc"]
    assert found["truncation"]["effective_budget"] > found["rag"]["effective_budget"]
    assert len({round(f["auc"], 9) for f in found.values()}) == 3


def test_the_headline_ranks_by_auc_and_says_so(prompts_only_run):
    _, rows, report, paths = prompts_only_run
    aucs = {c["strategy"]: c["auc"] for c in report["curves"]}
    ranking = report["ranking"]
    assert [r["strategy"] for r in ranking] == sorted(aucs, key=lambda s: -aucs[s])
    assert [r["rank"] for r in ranking] == [1, 2, 3]
    top, second = ranking[0], ranking[1]
    mine = recompute_curve([evidence_values(rows, top["strategy"], b) for b in BUDGETS], BUDGETS)["areas"]
    theirs = recompute_curve([evidence_values(rows, second["strategy"], b) for b in BUDGETS], BUDGETS)["areas"]
    shared = sorted(set(mine) & set(theirs))
    differences = [mine[i] - theirs[i] for i in shared]
    assert top["paired_items"] == len(shared)
    assert top["delta_next"] == pytest.approx(sum(differences) / len(shared), abs=1e-12)
    assert (top["delta_next_low"], top["delta_next_high"]) == pytest.approx(
        stats.bounded_t(differences, -1.0, 1.0), abs=1e-12
    )
    assert top["mde"] is not None and 0 < top["mde"] <= 1 and ranking[-1]["next"] is None
    headline = next(f for f in report["findings"] if "ranked by area under the budget curve" in f)
    assert headline.index(ranking[0]["strategy"]) < headline.index(ranking[-1]["strategy"])
    markdown = paths["md"].read_text()
    assert "## Headline: strategies ranked by area under the budget curve (AUC)" in markdown
    assert markdown.index("## Headline") < markdown.index("## Best at each budget")
    first = (
        f"| 1 | synthetic-memory | {top['strategy']} | {top['auc']:.3f} [{top['auc_low']:.3f}, {top['auc_high']:.3f}]"
    )
    assert first in markdown
    html = paths["html"].read_text()
    assert 'id="ranking"' in html and 'id="curves"' in html and f"{top['auc']:.3f}" in html
    for curve in report["curves"]:
        assert curve["effective_text"] in markdown and curve["effective_text"] in html


# --- repeats against a loopback server whose answers flip -------------------------------------------


def flaky_reply():
    """Right on some items every time, wrong on others every time, and on the rest right or wrong
    by the call: the n-th call for a query is right when a hash of (query, n) is even."""
    answers = {i.query.content: str(i.answer) for i in SyntheticMemory(**TASK_OPTIONS).load(None, 0)}
    calls: dict[str, int] = defaultdict(int)

    def reply(messages):
        query = messages[-1]["content"]
        calls[query] += 1
        kind = int(hashlib.sha256(query.encode()).hexdigest(), 16) % 3
        flip = int(hashlib.sha256(f"{query}#{calls[query]}".encode()).hexdigest(), 16) % 2
        right = kind == 0 or (kind == 2 and flip == 0)
        return answers.get(query, "no idea") if right else "no idea"

    return reply


@pytest.fixture(scope="module")
def repeats_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("curve") / "repeats"
    with FaultServer(reply=flaky_reply()) as server:
        run(_config(out, server.url, ["truncation", "recency"], repeats=3, max_concurrency=1))
    paths = write_report(out)
    return out, final_rows(out), json.loads(paths["json"].read_text()), paths


def outcomes_by_repeat(rows: dict, strategy: str, budget: int) -> dict[str, dict[int, float]]:
    per_item: dict[str, dict[int, float]] = defaultdict(dict)
    for row in rows.values():
        if (row["strategy"], row["budget"]) == (strategy, budget) and row["event"] in ("result", "violation"):
            per_item[row["item_id"]][row["repeat"]] = float(row["quality"]) if row["event"] == "result" else 0.0
    return per_item


def test_repeats_give_a_flip_rate_equal_to_a_recomputation(repeats_run):
    _, rows, report, paths = repeats_run
    noise = {(r["strategy"], r["budget"]): r for r in report["noise"]}
    assert set(noise) == {(s, b) for s in ("truncation", "recency") for b in BUDGETS}
    rates, floors = [], 0
    for (strategy, budget), figures in noise.items():
        outcomes = outcomes_by_repeat(rows, strategy, budget)
        flipped = [item for item, by_repeat in outcomes.items() if len(set(by_repeat.values())) > 1]
        assert figures["repeats"] == 3 and figures["items_repeated"] == len(outcomes) == 10
        assert figures["flipped_items"] == len(flipped)
        assert figures["flip_rate"] == pytest.approx(len(flipped) / len(outcomes), abs=1e-12)
        pairs = [(r[a], r[b]) for r in outcomes.values() for a in r for b in r if a < b]
        discordance = sum(x != y for x, y in pairs) / len(pairs)
        assert figures["spread_kind"] == "discordance"
        assert figures["repeat_spread"] == pytest.approx(discordance, abs=1e-12)
        floor = figures["noise_floor"]
        if floor is not None:  # the floor is the smallest delta these n items detect with 80% power
            assert (
                binary_items_needed(discordance, floor)
                <= len(outcomes)
                < binary_items_needed(discordance, floor * 0.97)
            )
            floors += 1
        rates.append(figures["flip_rate"])
    assert 0 < max(rates) < 1  # the server flips on some items only: the figure could be anything
    assert floors >= 1
    assert "## Noise floor from repeats" in paths["md"].read_text() and 'id="noise"' in paths["html"].read_text()
    assert any(f.startswith("Noise floor from 3 repeats") for f in report["findings"])


def test_paired_comparisons_carry_the_minimum_detectable_effect(repeats_run):
    _, _, report, paths = repeats_run
    assert report["paired"] and all("mde" in r for r in report["paired"])
    for row in report["paired"]:
        if row["mde"] is not None:
            assert 0 < row["mde"] <= 1
    assert "| result | mde |" in paths["md"].read_text()
    assert "MDE (80% power)" in paths["html"].read_text()


def test_plan_uses_the_flip_rate(repeats_run):
    out, rows, _, _ = repeats_run
    result = invoke_cli("plan", str(out), "--delta", "0.3", "--json")
    assert result.exit_code == 0, result.output
    plans = json.loads(result.output)
    assert {(p["candidate"], p["reference"], p["budget"]) for p in plans} == {
        ("recency", "truncation", b) for b in BUDGETS
    }
    for plan in plans:
        cand = outcomes_by_repeat(rows, "recency", plan["budget"])
        ref = outcomes_by_repeat(rows, "truncation", plan["budget"])
        flips = [sum(len(set(o.values())) > 1 for o in outcomes.values()) / len(outcomes) for outcomes in (cand, ref)]
        assert plan["repeats"] == 3 and plan["flip_rate"] == pytest.approx(max(flips), abs=1e-12)
        # A single-repeat run is planned from repeat k of one cell against repeat k of the other.
        single = [(cand[i][k], ref[i][k]) for i in sorted(cand) for k in sorted(cand[i]) if i in ref and k in ref[i]]
        discordance = sum(a != b for a, b in single) / len(single)
        expected = max(stats.MIN_PAIRED_ITEMS, math.ceil(binary_items_needed(discordance, 0.3)))
        assert plan["needed_one_repeat"] == expected, plan


def test_the_worked_examples_in_the_docs_hold():
    """docs/reading-a-report.md's worked examples, through the report's own functions."""
    from budgetbench_core.report import curve
    from budgetbench_core.report.power import detectable_effect

    docs = " ".join((Path(__file__).parents[1] / "docs" / "reading-a-report.md").read_text().split())
    budgets = [512, 1024, 2048, 4096]
    for n, expected_range, auc_text in (
        (30, "[1024, 4096]", "[0.519, 0.793]"),
        (300, "[2048, 2048]", "[0.625, 0.707]"),
    ):
        right = [round(n * share) for share in (0.3, 19 / 30, 0.8, 25 / 30)]
        values = [[1.0 if i < r else 0.0 for r in right] for i in range(n)]
        point, low, high = (int(x) for x in curve.effective_tiers(values))
        assert budgets[point] == 2048 and f"[{budgets[low]}, {budgets[high]}]" == expected_range
        areas = curve.item_areas(values, budgets)
        low_a, high_a = curve.area_bounds(areas)
        assert f"{areas.mean():.3f}" == "0.667" and f"[{low_a:.3f}, {high_a:.3f}]" == auc_text
        assert expected_range in docs and auc_text in docs
    assert f"{detectable_effect(4 / 30, 'discordance', 10):.2f}" == "0.69" and "**0.69**" in docs
    assert f"{detectable_effect(4 / 30, 'discordance', 100):.2f}" == "0.11"
    assert f"{detectable_effect(0.3, 'discordance', 200):.3f}" == "0.110" and "MDE **0.110**" in docs
    assert math.ceil(binary_items_needed(0.3, 0.1)) == 243 and "asks for 243 items" in docs
    assert math.ceil(binary_items_needed(0.3 + 0.4 / 3, 0.1)) == 348
    low_w, high_w = stats.wilson(50, 88)
    assert f"**0.568 [{low_w:.3f}, {high_w:.3f}]**" in docs
