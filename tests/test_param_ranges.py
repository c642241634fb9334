"""Declared parameter types and ranges (``Param(type=, minimum=, maximum=)``) are checked with
the names, before a run builds anything: ``checkpoint.tail_share=5`` never reaches a model."""

from __future__ import annotations

import subprocess
import sys

import pytest

from budgetbench_core.builtin.strategies import Checkpoint
from budgetbench_core.params import Param, ParameterError, check_run
from budgetbench_core.plugins import get_registry


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


# `budgetbench run` in a child process, which then says whether llama.cpp was ever imported: the
# embedded model (the default --model local) starts only after xllamacpp is imported.
RUN_THEN_TELL = (
    "import sys\nsys.argv = ['budgetbench', *sys.argv[1:]]\n"
    "from budgetbench_core.cli import main\n"
    "try:\n    main()\nexcept SystemExit as exc:\n    print('exit', exc.code, file=sys.stderr)\n"
    "print('xllamacpp imported:', 'xllamacpp' in sys.modules, file=sys.stderr)\n"
)


@pytest.mark.parametrize(("value", "shown"), [("5", "got 5"), ("abc", "got 'abc' (str)")])
def test_the_run_command_refuses_it_before_the_model_starts(tmp_path, value, shown):
    """Out of range or wrongly typed: exit 2 before the embedded model is even imported."""
    out = tmp_path / "run"
    args = ["run", "-t", "synthetic-memory", "-s", "checkpoint", "-b", "512", "-n", "1", "--no-report"]
    args += ["--strategy-param", f"checkpoint.tail_share={value}", "-o", str(out)]
    done = subprocess.run([sys.executable, "-c", RUN_THEN_TELL, *args], capture_output=True, text=True, timeout=600)
    assert "exit 2" in done.stderr, done.stderr
    assert f"strategy 'checkpoint': parameter tail_share must be a number from 0 to 1, {shown}" in done.stderr
    assert "--strategy-param checkpoint.tail_share=VALUE" in done.stderr
    assert "xllamacpp imported: False" in done.stderr, done.stderr
    assert not out.exists() or not any(out.iterdir()), "nothing written: no model, no cell"


def test_param_problem_reads_type_and_bounds():
    count = Param(3, "how many", type=int, minimum=1)
    assert count.problem(3) is None and count.problem(1) is None
    assert count.problem(0) == "must be an integer >= 1, got 0"
    assert count.problem(2.5) == "must be an integer >= 1, got 2.5 (float)"
    assert count.problem(True) == "must be an integer >= 1, got True (bool)"
    assert Param(0.5, type=float, maximum=1).problem(2) == "must be a number <= 1, got 2"
    assert Param("x", type=str).problem(1) == "must be a string, got 1 (int)"
    assert Param(0.4).problem("anything") is None, "nothing declared, nothing checked"
