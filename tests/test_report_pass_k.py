"""pass^k as tau2-bench computes it (mean over tasks of C(c, k) / C(n, k)) and the flip rate, and
the report's pass^k section on a loopback run with ``repeats=2`` (a server that answers some items
right by the call, violations, harness errors), recomputed from the raw rows."""

from __future__ import annotations

import itertools
import json
import math
import random
import zlib
from collections import defaultdict
from typing import Any

import pytest

from budgetbench_core import RunConfig, run
from budgetbench_core.report import write_report
from budgetbench_core.report.columns import fmt
from budgetbench_core.report.pass_k import pass_hat_k, pass_k, pass_k_section, pass_k_table
from budgetbench_core.runlog import final_rows
from budgetbench_core.testing import FaultServer


def test_hand_computed_values():
    # task a: 4/4, b: 2/4, c: 0/4
    rewards = {
        "a": {0: 1.0, 1: 1.0, 2: 1.0, 3: 1.0},
        "b": {0: 1.0, 1: 0.0, 2: 1.0, 3: 0.0},
        "c": {0: 0.0, 1: 0.0, 2: 0.0, 3: 0.0},
    }
    figures = pass_k(rewards)
    assert figures["tasks"] == 3 and figures["trials"] == [4]
    assert figures["pass_k"][1] == pytest.approx((1 + 0.5 + 0) / 3)
    assert figures["pass_k"][2] == pytest.approx((1 + 1 / 6 + 0) / 3)  # C(2,2)/C(4,2)
    assert figures["pass_k"][3] == pytest.approx(1 / 3) and figures["pass_k"][4] == pytest.approx(1 / 3)
    assert figures["flip_rate"] == pytest.approx(1 / 3) and figures["flipped_tasks"] == ["b"]


def test_pass_k_is_the_chance_that_k_trials_drawn_without_replacement_all_succeed():
    """The estimator against brute force over every k-subset of the trials."""
    generator = random.Random(7)
    for _ in range(50):
        n = generator.randint(1, 6)
        outcomes = [generator.random() < 0.6 for _ in range(n)]
        for k in range(1, n + 1):
            subsets = list(itertools.combinations(outcomes, k))
            assert pass_hat_k(n, sum(outcomes), k) == pytest.approx(sum(all(s) for s in subsets) / len(subsets))


def test_success_is_reward_one_within_upstreams_tolerance_and_partial_rewards_fail():
    figures = pass_k({"a": {0: 1 - 1e-7, 1: 0.999}, "b": {0: 0.5, 1: 1.0}})
    assert figures["pass_k"][1] == pytest.approx(0.5)
    assert figures["pass_k"][2] == 0.0
    assert figures["flip_rate"] == 1.0


def test_largest_k_is_the_smallest_trial_count_and_each_task_uses_its_own():
    figures = pass_k({"a": {0: 1.0, 1: 1.0, 2: 0.0}, "b": {0: 1.0, 1: 1.0}})
    assert sorted(figures["pass_k"]) == [1, 2] and figures["trials"] == [2, 3]
    assert figures["pass_k"][2] == pytest.approx((math.comb(2, 2) / math.comb(3, 2) + 1) / 2)
    assert sorted(pass_k({"a": {r: 1.0 for r in range(6)}}, max_k=4)["pass_k"]) == [1, 2, 3, 4]


def test_one_trial_has_no_flip_rate_and_no_trial_no_figures():
    assert pass_k({"a": {0: 1.0}})["flip_rate"] is None
    assert pass_k({}) == {} and pass_k({"a": {}}) == {}
    with pytest.raises(ValueError, match="k=3 with 2 trials"):
        pass_hat_k(2, 1, 3)


def test_table_over_cell_rows_counts_a_violation_as_a_failure_and_skips_errors():
    def row(event, item, repeat, quality=None):
        return {"event": event, "item_id": item, "repeat": repeat, "quality": quality}

    rows = [
        row("result", "t1", 0, 1.0),
        row("violation", "t1", 1, 0.0),
        row("result", "t2", 0, 1.0),
        row("result", "t2", 1, 1.0),
        row("error", "t3", 0),
        row("result", "t3", 1, 1.0),
    ]
    (figures,) = pass_k_table({("tau-bench", "truncation", 4096): rows})
    assert (figures["strategy"], figures["budget"], figures["tasks"]) == ("truncation", 4096, 3)
    assert figures["trials"] == [1, 2] and sorted(figures["pass_k"]) == [1]
    assert figures["pass_k"][1] == pytest.approx((0.5 + 1 + 1) / 3)
    assert figures["flipped_tasks"] == ["t1"]


BUDGETS = [200, 2000]  # full context (600-token histories) violates at 200
OPTIONS = {"items": 8, "history_tokens": 600}


def coin_reply():
    """Right on some queries every call, wrong on others, and on the rest by a hash of the call count."""
    from budgetbench_core.builtin.synthetic_memory import SyntheticMemory

    answers = {i.query.content: str(i.answer) for i in SyntheticMemory(**OPTIONS).load(None, 0)}
    calls: dict[str, int] = defaultdict(int)

    def reply(messages):
        query = messages[-1]["content"]
        calls[query] += 1
        kind = zlib.crc32(query.encode()) % 3
        right = kind == 0 or (kind == 1 and zlib.crc32(f"{query}{calls[query]}".encode()) % 2 == 0)
        return answers.get(query, "no idea") if right else "no idea"

    return reply


@pytest.fixture(scope="module")
def repeated_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("pass-k") / "run"
    with FaultServer(reply=coin_reply(), rate=0.1, faults=("500",), seed=5) as server:
        run(
            RunConfig(
                task="synthetic-memory",
                strategies=["truncation", "full_context"],
                budgets=BUDGETS,
                out=out,
                api_base=server.url,
                model="openai/fault-model",
                tokenizer="tiktoken:cl100k_base",
                task_options=OPTIONS,
                repeats=2,
                retries=0,
                max_concurrency=1,
                timeout_s=30.0,
            )
        )
    return out, write_report(out, formats=["json", "md", "html"])


def recomputed_pass_k(out) -> dict[tuple[str, int], dict[str, Any]]:
    """pass^k per cell from the raw terminal rows: successes = results of quality 1, a violation a
    failure, errors left out (the run has no strategy errors)."""
    trials: dict[tuple[str, int], dict[str, list[bool]]] = defaultdict(lambda: defaultdict(list))
    for row in final_rows(out).values():
        if row["event"] in ("result", "violation"):
            won = row["event"] == "result" and row["quality"] == 1
            trials[(row["strategy"], row["budget"])][row["item_id"]].append(won)
    figures = {}
    for cell, items in trials.items():
        largest = min(len(t) for t in items.values())
        figures[cell] = {
            "pass_k": {
                k: sum(math.comb(sum(t), k) / math.comb(len(t), k) for t in items.values()) / len(items)
                for k in range(1, largest + 1)
            },
            "flip": sum(0 < sum(t) < len(t) for t in items.values() if len(t) >= 2)
            / sum(len(t) >= 2 for t in items.values()),
        }
    return figures


def test_a_run_with_repeats_reports_pass_k_per_cell_in_every_format(repeated_run):
    out, paths = repeated_run
    rows = final_rows(out).values()
    assert any(r["event"] == "violation" for r in rows) and any(r["event"] == "error" for r in rows)
    expected = recomputed_pass_k(out)
    report = json.loads(paths["json"].read_text())
    section = report["pass_k"]
    assert section["k"] == [1, 2] and len(section["cells"]) == len(expected) == 4
    markdown, html = paths["md"].read_text(), paths["html"].read_text()
    assert "## pass^k from repeats" in markdown and "<th>pass^2</th>" in html
    table = html.split('id="pass-k"')[1].split("</table>")[0]
    for cell in section["cells"]:
        want = expected[(cell["strategy"], cell["budget"])]
        got = {int(k): v for k, v in cell["pass_k"].items()}
        assert got == pytest.approx(want["pass_k"]) and cell["flip_rate"] == pytest.approx(want["flip"])
        shown = [fmt(got.get(k)) for k in section["k"]]  # "–" past a cell's own largest k
        figures = " | ".join(shown)
        line = f"| {cell['strategy']} | {cell['budget']} | {cell['tasks']} |"
        assert line in markdown and f" | {figures} | {fmt(cell['flip_rate'])} |" in markdown
        assert "".join(f"<td>{v}</td>" for v in shown) + f"<td>{fmt(cell['flip_rate'])}</td>" in table
    full_small = expected[("full_context", BUDGETS[0])]
    assert full_small["pass_k"] == {1: 0.0, 2: 0.0}  # every trial a violation
    assert 0 < max(w["flip"] for w in expected.values()) < 1  # the server flips on some items only


def test_a_run_without_repeats_has_no_pass_k_section(repeated_run):
    out, _ = repeated_run
    once = [r for r in final_rows(out).values() if r["repeat"] == 0]
    cells: dict[tuple[str, str, int], list[dict[str, Any]]] = defaultdict(list)
    for row in once:
        cells[(row["task"], row["strategy"], row["budget"])].append(row)
    assert pass_k_table(cells) and pass_k_section(cells) == {}
