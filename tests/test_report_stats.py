"""Report statistics on constructed inputs: Wilson, bootstraps, paired deltas, scoring rules."""

from __future__ import annotations

import math

import numpy as np
import pytest

from budgetbench_core.report import ReportError
from budgetbench_core.report.data import check_versions
from budgetbench_core.report.plots import pareto_front
from budgetbench_core.report.stats import bounded_t, estimate, paired_delta, verdict, wilson
from budgetbench_core.report.tables import cell_summary, item_values, parse_reference


def test_defect_09_wilson_known_values():
    low, high = wilson(8, 10)
    # Wilson's lower bound; the upper is Brown-Cai-DasGupta's Poisson bound for 2 failures of 10.
    assert round(low, 3) == 0.490 and round(high, 3) == 0.964
    # Not Wald (defect 9): Wald gives 0.8 +- 0.248 = [0.552, 1.048].
    assert abs(low - 0.552) > 0.05 and high < 1
    assert round(wilson(5, 10)[0], 3) == 0.237 and round(wilson(5, 10)[1], 3) == 0.763  # plain Wilson
    assert wilson(0, 10)[0] == pytest.approx(0.0, abs=1e-12) and wilson(0, 10)[1] == pytest.approx(0.2775, abs=1e-4)
    assert wilson(10, 10)[1] == pytest.approx(1.0) and wilson(10, 10)[0] == pytest.approx(0.7225, abs=1e-4)
    # 1 success in 8: Wilson's lower bound 0.022 would miss p = 0.02 whenever X = 1 (coverage 85%).
    assert wilson(1, 8)[0] < 0.01


def test_estimate_picks_wilson_only_for_binary_per_item_values():
    assert estimate([1, 1, 0, 1, 1, 1, 1, 0, 1, 1], binary=True).method == "wilson"
    # A repeat-averaged item (0.5) is no longer a Bernoulli outcome: bounded t instead.
    assert estimate([1, 0.5, 0, 1], binary=True).method == "bounded-t"
    assert estimate([0.2, 0.9, 0.4], binary=False).method == "bounded-t"
    assert estimate([], binary=True).n == 0


def test_graded_interval_is_never_degenerate():
    """Three graded items all 0 used to give [0, 0]; equal values say little about the spread."""
    for values in ([0.0] * 3, [0.0] * 29, [0.5] * 29, [1.0] * 10):
        est = estimate(values, binary=False)
        assert est.high - est.low > 0.05 and est.low <= est.mean <= est.high
    assert math.isnan(estimate([0.3], binary=False).low)  # one item: no interval
    # Wide spread, many items: close to the ordinary t-interval.
    values = np.linspace(0, 1, 200)
    low, high = bounded_t(values)
    half = 1.972 * values.std(ddof=1) / math.sqrt(values.size)
    assert low == pytest.approx(values.mean() - half, abs=0.004) and high == pytest.approx(
        values.mean() + half, abs=0.004
    )


def test_the_issue_examples():
    """Two items all one way are too few; 3 of 4 is too few to separate (no outcome of 4 items
    is a result: the exact sign test needs 6 discordant items), never a tie."""
    two = paired_delta([1, 1], [0, 0])
    assert two.verdict == "too few items" and verdict(two) == "too few items"
    assert two.n == 2 and two.needed_n >= 3
    four = paired_delta([1, 1, 1, 0], [0, 0, 0, 0])
    assert four.verdict == "too few items to separate" and four.p_value == pytest.approx(0.25)
    assert four.needed_n == 8  # the same proportions (6 of 8 discordant, all one way) give p = 0.031
    assert paired_delta([1, 1, 1, 1, 1, 1, 0, 0], [0] * 8).verdict == "higher"
    assert paired_delta([0] * 8, [1, 1, 1, 1, 1, 1, 0, 0]).verdict == "lower"
    empty = paired_delta([], [])
    assert empty.verdict == "too few items" and empty.n == 0


def test_paired_graded_delta_on_constructed_example():
    """Item difficulty varies a lot, the gain is steady: pairing finds what separate intervals cannot."""
    reference = np.linspace(0.0, 0.8, 60)
    gains = np.array([0.05, 0.15] * 30)
    candidate = reference + gains
    separate_a, separate_b = estimate(candidate, binary=False), estimate(reference, binary=False)
    assert separate_a.low < separate_b.high  # the unpaired intervals overlap
    delta = paired_delta(candidate, reference)
    assert delta.mean == pytest.approx(0.1) and delta.method == "bounded-t"
    assert 0 < delta.low < 0.1 < delta.high < 0.2
    assert verdict(delta) == "higher" and delta.needed_n is None
    assert verdict(paired_delta(reference, candidate)) == "lower"


def test_paired_delta_not_distinguished_when_interval_spans_zero():
    reference = np.full(12, 0.5)
    candidate = reference + np.array([0.5, -0.5] * 6)  # better on half the items, worse on the other half
    delta = paired_delta(candidate, reference)
    assert delta.mean == pytest.approx(0.0) and delta.low < 0 < delta.high
    assert verdict(delta) == "not distinguished" and delta.needed_n is None
    assert verdict(paired_delta([1.0], [0.0])) == "too few items"  # one item proves nothing
    # Equal values on every item: still an interval of non-zero width around 0.
    same = paired_delta([0.4] * 30, [0.4] * 30)
    assert same.low < 0 < same.high and same.verdict == "not distinguished"
    with pytest.raises(ValueError, match="same items"):
        paired_delta([1, 0], [1])


def _row(event, item, repeat=0, quality=None, **extra):
    row = {"event": event, "item_id": item, "repeat": repeat, "task": "t", "strategy": "s", "budget": 100}
    if quality is not None:
        row["quality"] = quality
    return row | extra


def test_defect_08_item_values_average_repeats_and_never_score_errors():
    rows = [
        _row("result", "a", 0, 1.0, prompt_tokens=90),
        _row("result", "a", 1, 0.0, prompt_tokens=80),
        _row("violation", "b", 0, 0, prompt_tokens=120),
        _row("result", "b", 1, 1.0, prompt_tokens=95),
        _row("error", "c", 0, phase="model", cause="boom"),
        _row("error", "c", 1, phase="model", cause="boom"),
    ]
    assert item_values(rows) == {"a": 0.5, "b": 0.5}
    assert item_values(rows, admitted_only=True) == {"a": 0.5, "b": 1.0}
    summary = cell_summary(rows, binary=True, budget=100)
    assert summary["n_items"] == 3 and summary["errors"] == 2 and summary["error_causes"] == "model: 2"
    assert summary["quality_all"] == 0.5 and summary["quality_all_n"] == 2
    assert summary["quality_admitted"] == 0.75 and summary["quality_admitted_n"] == 2
    assert summary["violation_rate"] == 0.25
    # Used budget over admitted rows only (defect 8: no zeros from failed items).
    assert summary["used_tokens_mean"] == pytest.approx((90 + 80 + 95) / 3) and summary["used_tokens_max"] == 95


def test_pareto_front():
    points = [(1.0, 0.5), (2.0, 0.7), (1.5, 0.4), (3.0, 0.7), (0.5, 0.1)]
    assert pareto_front(points) == [0, 1, 4]


def test_reference_parsing():
    assert parse_reference("rag@2048") == ("rag", 2048)
    assert parse_reference("rag") == ("rag", None)
    with pytest.raises(ValueError, match="integer"):
        parse_reference("rag@big")


def test_report_refuses_unversioned_plugins(tmp_path):
    rows = {("t", "s", 1, 0, "i"): {"task": "t", "strategy": "s", "event": "result", "grader": {"name": "g"}}}
    manifest = {
        "versions": {"budgetbench": "0.1.0", "dist-a": "1.0"},
        "plugins_used": {
            "task:t": {"distribution": "dist-a", "version": "1.0"},
            "strategy:s": {"distribution": "dist-a", "version": "1.0"},
            "grader:g": {"distribution": "dist-a", "version": "1.0"},
        },
    }
    check_versions(manifest, rows, tmp_path / "manifest.json")
    manifest["plugins_used"]["strategy:s"]["version"] = "unknown"
    with pytest.raises(ReportError, match="strategy:s"):
        check_versions(manifest, rows, tmp_path / "manifest.json")
    del manifest["plugins_used"]["strategy:s"]
    with pytest.raises(ReportError, match="strategy:s produced rows but is not in plugins_used"):
        check_versions(manifest, rows, tmp_path / "manifest.json")


def test_report_of_a_directory_that_is_not_a_run(tmp_path):
    from budgetbench_core.report import write_report

    with pytest.raises(ReportError, match="manifest.json: missing"):
        write_report(tmp_path)
    with pytest.raises(ReportError, match="unknown report format"):
        write_report(tmp_path, formats=["pdf"])


def _cell(strategy, budget, quality, low, high, violations=0):
    return {
        "task": "t",
        "strategy": strategy,
        "budget": budget,
        "quality_all": quality,
        "quality_all_low": low,
        "quality_all_high": high,
        "violations": violations,
    }


def _grids(per_cell: dict[tuple[str, int], list[float]], violations: dict[tuple[str, int], int] | None = None):
    from budgetbench_core.report.pivot import best_at_each_budget

    violations = violations or {}
    summary = [_cell(s, b, float(np.mean(v)), 0, 1, violations.get((s, b), 0)) for (s, b), v in per_cell.items()]
    return best_at_each_budget(summary, lambda cell: {str(i): x for i, x in enumerate(per_cell[cell[1:]])})


def test_crossover_only_where_paired_deltas_separate_and_ties_are_ties():
    from budgetbench_core.report.tables import crossovers

    ones, zeros, mixed = [1.0] * 30, [0.0] * 30, [1.0, 0.0] * 15
    grids = _grids(
        {
            ("rag", 512): ones,
            ("recency", 512): zeros,
            ("rag", 1024): mixed,
            ("recency", 1024): ones,
            ("rag", 2048): ones,
            ("recency", 2048): ones[:29] + [0.0],
        }
    )
    notes = crossovers(grids)
    assert notes[0] == (
        "t: crossover, the best strategy changes from rag at budget 512 to recency at budget 1024 "
        "(each distinguished from every other strategy by paired deltas)."
    )
    assert "t: tie (not distinguished, no best strategy) at budget 2048 (rag, recency)." in notes
    # 1024 -> 2048 is not a crossover: 2048 is a tie.
    assert sum("crossover" in n for n in notes) == 1


def test_a_three_way_tie_at_zero_is_no_crossover_and_violators_are_never_best():
    from budgetbench_core.report.tables import crossovers

    zeros = [0.0] * 6
    grids = _grids({(s, b): zeros for s in ("a", "b", "c") for b in (512, 1024)}, violations={("c", 512): 6})
    notes = crossovers(grids)
    assert notes[0].startswith("No crossover")
    assert "t: tie (not distinguished, no best strategy) at budget 512 (a, b); 1024 (a, b, c)." in notes
    assert "t: never called best because they exceeded the budget: at budget 512 (c)." in notes
    # A violator with the highest admitted quality is still not the best.
    grids = _grids({("a", 512): [0.0] * 30, ("c", 512): [1.0] * 30}, violations={("c", 512): 3})
    assert grids[0]["best"][512]["strategies"] == ["a"] and grids[0]["best"][512]["excluded"] == ["c"]
    # Too few items is said so.
    grids = _grids({("a", 512): [1.0, 1.0], ("b", 512): [0.0, 0.0]})
    assert "t: too few items to separate at budget 512 (a, b)." in crossovers(grids)


def test_latency_percentiles_only_over_rows_that_called_the_model():
    rows = [
        _row("result", "a", 0, 1.0, prompt_tokens=10, latency_s=29.6, cached=False),
        _row("result", "b", 0, 1.0, prompt_tokens=10, latency_s=29.6, cached=True),
        _row("result", "c", 0, 1.0, prompt_tokens=10, latency_s=29.6, cached=True),
        _row("result", "d", 0, 1.0, prompt_tokens=10, latency_s=1.0, cached=False),
        _row("violation", "e", 0, 0, prompt_tokens=120),
    ]
    summary = cell_summary(rows, binary=True, budget=100)
    assert summary["model_calls"] == 2 and summary["cache_hits"] == 2
    assert summary["latency_p50_s"] == pytest.approx((29.6 + 1.0) / 2)  # not 29.6: the hits are not calls


def test_non_monotone_curves_are_called_out():
    from budgetbench_core.report.tables import non_monotone

    summary = [
        _cell("rag", 512, 0.6, 0.5, 0.7),
        _cell("rag", 1024, 0.62, 0.52, 0.72),
        _cell("rag", 2048, 0.3, 0.2, 0.4),
        _cell("recency", 512, 0.4, 0.3, 0.5),
        _cell("recency", 1024, 0.5, 0.4, 0.6),
        _cell("recency", 2048, 0.7, 0.6, 0.8),
    ]
    assert non_monotone(summary) == [
        ("t: rag drops from 0.620 at budget 1024 to 0.300 at budget 2048 (intervals do not overlap).")
    ]
    summary[2] = _cell("rag", 2048, 0.55, 0.45, 0.65)
    assert non_monotone(summary) == [
        ("t: rag drops from 0.620 at budget 1024 to 0.550 at budget 2048 (intervals overlap: not distinguished).")
    ]


def test_an_item_with_no_row_at_all_is_reported_missing(tmp_path):
    from budgetbench_core.report.data import RunData
    from budgetbench_core.report.tables import completeness, summary_table

    rows = {
        ("t", s, 100, 0, item): _row("result", item, 0, 1.0, strategy=s, prompt_tokens=10)
        for s in ("a", "b")
        for item in ("i1", "i2")
    }
    rows[("t", "b", 100, 0, "i2")] = _row("error", "i2", 0, strategy="b", phase="model", cause="down")
    manifest = {"selected_items": {"t": {"count": 3, "ids": ["i1", "i2", "i3"]}}, "config": {"strategies": ["a", "b"]}}
    data = RunData(tmp_path, manifest, rows)
    notes = completeness(data, summary_table(data))
    assert notes[0] == "t: 1 of the 3 selected items have no row at all (missing): i3."
    assert notes[1].startswith(
        "t: incomplete run, these cells have rows for fewer than the 3 items selected (manifest)"
    )
    data.manifest["selected_items"]["t"]["complete"] = False  # a streamed selection cut short
    assert any(
        n.startswith("t: the run stopped while its items were still") for n in completeness(data, summary_table(data))
    )
    # Without the manifest's list (an older run) the missing item cannot be seen: only rows count.
    data.manifest = {"config": {"strategies": ["a", "b"]}}
    assert completeness(data, summary_table(data)) == []
