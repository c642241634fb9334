"""pass^k as tau2-bench computes it (mean over tasks of C(c, k) / C(n, k)) and the flip rate."""

from __future__ import annotations

import itertools
import math
import random

import pytest

from budgetbench_core.report.pass_k import pass_hat_k, pass_k, pass_k_table


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
