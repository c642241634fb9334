"""Declared parameter types and ranges (``Param(type=, minimum=, maximum=)``) are checked with
the names, before a run builds anything: ``checkpoint.tail_share=5`` never reaches a model."""

from __future__ import annotations

import time

import pytest

from budgetbench_core.builtin.strategies import Checkpoint
from budgetbench_core.params import Param, ParameterError, check_run
from budgetbench_core.plugins import get_registry
from budgetbench_core.testing import invoke_cli


def check(value):
    check_run(get_registry(), "synthetic-memory", {}, ["checkpoint"], {"checkpoint": {"tail_share": value}})


@pytest.mark.parametrize("value", [5, -0.1, 1.5, "abc", True, None, [0.5]])
def test_checkpoint_tail_share_out_of_range_or_mistyped_is_refused(value):
    with pytest.raises(ParameterError, match=r"parameter tail_share must be a number from 0 to 1, got"):
        check(value)


@pytest.mark.parametrize("value", [0, 0.0, 0.25, 1, 1.0])
def test_checkpoint_tail_share_in_range_is_accepted(value):
    check(value)


def test_checkpoint_built_directly_refuses_it_too():
    with pytest.raises(ValueError, match="tail_share must be a number from 0 to 1, got 5"):
        Checkpoint(tail_share=5)
    assert Checkpoint(tail_share=0.5).describe()["params"] == {"tail_share": 0.5}


def test_the_run_command_refuses_it_before_anything_starts(tmp_path):
    out = tmp_path / "run"
    started = time.monotonic()
    result = invoke_cli(
        "run", "-t", "synthetic-memory", "-s", "checkpoint", "-b", "512", "-n", "1",
        "--strategy-param", "checkpoint.tail_share=5", "-o", str(out), "--no-report",
    )  # fmt: skip
    elapsed = time.monotonic() - started
    assert result.exit_code == 2, result.output
    assert "strategy 'checkpoint': parameter tail_share must be a number from 0 to 1, got 5" in result.output
    assert "--strategy-param checkpoint.tail_share=VALUE" in result.output
    assert not out.exists() or not any(out.iterdir()), "nothing written: no model, no cell"
    assert elapsed < 30, f"refused after {elapsed:.1f} s: something started first"


def test_param_problem_reads_type_and_bounds():
    count = Param(3, "how many", type=int, minimum=1)
    assert count.problem(3) is None and count.problem(1) is None
    assert count.problem(0) == "must be an integer >= 1, got 0"
    assert count.problem(2.5) == "must be an integer >= 1, got 2.5 (float)"
    assert count.problem(True) == "must be an integer >= 1, got True (bool)"
    assert Param(0.5, type=float, maximum=1).problem(2) == "must be a number <= 1, got 2"
    assert Param("x", type=str).problem(1) == "must be a string, got 1 (int)"
    assert Param(0.4).problem("anything") is None, "nothing declared, nothing checked"
