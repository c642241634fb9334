"""`budgetbench taubench regrade` and `export` refuse a run directory that was edited.

Both play the run back from ``episodes.jsonl`` and its cell rows; an edited log would be
regraded or exported as if it were the run. One fast real run (retail, scripted user, two
tasks, answered by the loopback server, counted with tiktoken: no embedded model) is copied
per test and edited as someone might: one byte of ``episodes.jsonl`` changed, a line of it
deleted, a forged row appended to a cell file, one byte of a cell file changed. Every edit is
refused by both commands with an error naming the file and the line; the unedited copy works.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest

from budgetbench_core import RunConfig, read_run, run
from budgetbench_core.testing import FaultServer, invoke_cli

sys.path.insert(0, str(Path(__file__).resolve().parent))
from taubench_support import DATA, needs_data  # noqa: E402

pytestmark = needs_data


@pytest.fixture(scope="module")
def keys(tmp_path_factory):
    directory = tmp_path_factory.mktemp("keys")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("BUDGETBENCH_KEY_DIR", str(directory))
        yield directory


@pytest.fixture(scope="module")
def honest(tmp_path_factory, keys) -> Path:
    out = tmp_path_factory.mktemp("tau-verified") / "run"
    with FaultServer() as server:
        run(
            RunConfig(
                out=out,
                api_base=server.url,
                model="openai/fault-model",
                tokenizer="tiktoken:cl100k_base",
                task="tau-bench",
                task_options={"domain": "retail", "user": "scripted", "path": str(DATA / "retail"), "max_turns": 2},
                strategies=["truncation"],
                budgets=[6144],
                limit=2,
                seed=0,
                max_concurrency=1,
                retries=0,
                timeout_s=60.0,
            )
        )
    read = read_run(out, logs=("episodes.jsonl",))
    assert len(read.rows) == 2 and len(read.logs["episodes.jsonl"]) >= 2  # something to play back
    return out


def _cell_file(run_dir: Path) -> Path:
    (path,) = sorted((run_dir / "cells").glob("*/*/*/r*.jsonl"))
    return path


def _change_a_byte(path: Path, number: int, field: str) -> None:
    lines = path.read_bytes().split(b"\n")
    at = lines[number - 1].index(f'"{field}": '.encode()) + len(field) + 4
    lines[number - 1] = lines[number - 1][:at] + b"X" + lines[number - 1][at + 1 :]
    path.write_bytes(b"\n".join(lines))


def episode_byte(run_dir: Path) -> tuple[Path, int]:
    """The agent's reply of the first turn changed by one byte."""
    path = run_dir / "episodes.jsonl"
    _change_a_byte(path, 1, "reply")
    return path, 1


def episode_line_deleted(run_dir: Path) -> tuple[Path, int]:
    """The first turn deleted: the next line no longer follows what precedes it."""
    path = run_dir / "episodes.jsonl"
    lines = path.read_text(encoding="utf-8").splitlines(keepends=True)
    path.write_text("".join(lines[1:]), encoding="utf-8")
    return path, 1


def forged_row(run_dir: Path) -> tuple[Path, int]:
    """A second, rewarded result row appended to a cell file by hand."""
    path = _cell_file(run_dir)
    lines = path.read_text(encoding="utf-8").splitlines()
    row = next(json.loads(line) for line in reversed(lines) if json.loads(line)["event"] in ("result", "violation"))
    row.pop("chain")
    path.write_text("\n".join([*lines, json.dumps({**row, "quality": 1.0})]) + "\n", encoding="utf-8")
    return path, len(lines) + 1


def cell_byte(run_dir: Path) -> tuple[Path, int]:
    """One byte of the cell file's first row (its run_key) changed."""
    path = _cell_file(run_dir)
    _change_a_byte(path, 1, "run_key")
    return path, 1


COMMANDS = {
    "regrade": lambda d: ["taubench", "regrade", str(d), "-o", str(d.parent / "regraded")],
    "export": lambda d: [
        "taubench",
        "export",
        str(d),
        "-o",
        str(d.parent / "submission" / "submission.json"),
        "--model-organization",
        "HuggingFace",
        "--submitting-organization",
        "BudgetBench tests",
    ],
}


@pytest.mark.parametrize(
    "tamper", [episode_byte, episode_line_deleted, forged_row, cell_byte], ids=lambda t: t.__name__
)
@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_an_edited_run_is_refused_naming_the_file_and_line(tmp_path, honest, command, tamper):
    target = tmp_path / "run"
    shutil.copytree(honest, target)
    path, line = tamper(target)
    result = invoke_cli(*COMMANDS[command](target))
    assert result.exit_code == 2, result.output
    text = " ".join(result.output.split())
    assert "does not verify" in text and f"{path}: line {line} " in text, result.output
    assert not (tmp_path / "regraded").exists() and not (tmp_path / "submission").exists()


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_the_unedited_run_is_regraded_and_exported(tmp_path, honest, command):
    target = tmp_path / "run"
    shutil.copytree(honest, target)
    result = invoke_cli(*COMMANDS[command](target))
    assert result.exit_code == 0, result.output
    if command == "regrade":
        summary = json.loads((tmp_path / "regraded" / "regrade.json").read_text())
        assert summary["episodes"] == 2 and summary["changed"] == 0
    else:
        submission = json.loads((tmp_path / "submission" / "submission.json").read_text())
        assert set(submission["results"]) == {"retail"}
