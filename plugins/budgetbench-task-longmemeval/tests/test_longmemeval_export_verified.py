"""``budgetbench longmemeval export`` refuses a run directory that was edited.

An answered run of the real task on the LongMemEval_S sample (two questions, two budgets, the
loopback server answering and judging, counted with tiktoken) is copied per test and edited:
one byte of a cell file changed, a line deleted, a forged row appended. The export refuses each
naming the file and line and writes nothing; the unedited copy is exported.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from budgetbench_core import RunConfig, read_run, run
from budgetbench_core.testing import FaultServer, invoke_cli

DATA = Path(__file__).resolve().parents[3] / ".." / "shared" / "data" / "longmemeval"
SAMPLE = DATA / "longmemeval_s_sample.json"
pytestmark = pytest.mark.skipif(not SAMPLE.is_file(), reason=f"LongMemEval data not found in {DATA}")


@pytest.fixture(scope="module")
def keys(tmp_path_factory):
    directory = tmp_path_factory.mktemp("keys")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("BUDGETBENCH_KEY_DIR", str(directory))
        yield directory


@pytest.fixture(scope="module")
def answered_run(tmp_path_factory, keys) -> Path:
    out = tmp_path_factory.mktemp("lme-verified") / "run"
    with FaultServer() as server:
        run(
            RunConfig(
                task="longmemeval",
                strategies=["truncation"],
                budgets=[512, 4096],
                out=out,
                api_base=server.url,
                model="openai/fault-model",
                tokenizer="tiktoken:cl100k_base",
                task_options={"path": str(SAMPLE)},
                limit=2,
                max_concurrency=1,
                retries=0,
            )
        )
    assert {row["event"] for row in read_run(out).rows.values()} == {"result"}
    return out


def _cell(run_dir: Path) -> Path:
    return sorted((run_dir / "cells").glob("*/*/*/r*.jsonl"))[-1]


def byte_changed(run_dir: Path) -> tuple[Path, int]:
    """The first answer's prediction changed by one byte."""
    path = _cell(run_dir)
    lines = path.read_bytes().split(b"\n")
    number = next(i for i, line in enumerate(lines, 1) if b'"event": "result"' in line)
    at = lines[number - 1].index(b'"prediction": "') + len(b'"prediction": "')
    lines[number - 1] = lines[number - 1][:at] + b"X" + lines[number - 1][at + 1 :]
    path.write_bytes(b"\n".join(lines))
    return path, number


def line_deleted(run_dir: Path) -> tuple[Path, int]:
    path = _cell(run_dir)
    lines = path.read_text(encoding="utf-8").splitlines(keepends=True)
    path.write_text("".join(lines[1:]), encoding="utf-8")
    return path, 1


def row_forged(run_dir: Path) -> tuple[Path, int]:
    """A result row with the right answer appended by hand after the cell's last row."""
    path = _cell(run_dir)
    lines = path.read_text(encoding="utf-8").splitlines()
    row = {k: v for k, v in json.loads(lines[-1]).items() if k != "chain"}
    path.write_text("\n".join([*lines, json.dumps({**row, "quality": 1.0})]) + "\n", encoding="utf-8")
    return path, len(lines) + 1


@pytest.mark.parametrize("tamper", [byte_changed, line_deleted, row_forged], ids=lambda t: t.__name__)
def test_export_refuses_an_edited_run_naming_the_file_and_line(tmp_path, answered_run, tamper):
    target = tmp_path / "run"
    shutil.copytree(answered_run, target)
    path, line = tamper(target)
    out = tmp_path / "export"
    outcome = invoke_cli("longmemeval", "export", str(target), "--out", str(out))
    assert outcome.exit_code == 2, outcome.output
    text = " ".join(outcome.output.split())
    assert "does not verify" in text and f"{path}: line {line} " in text, outcome.output
    assert not out.exists()


def test_export_of_the_unedited_run_writes_every_cell(tmp_path, answered_run):
    target = tmp_path / "run"
    shutil.copytree(answered_run, target)
    out = tmp_path / "export"
    outcome = invoke_cli("longmemeval", "export", str(target), "--out", str(out))
    assert outcome.exit_code == 0, outcome.output
    summary = json.loads((out / "summary.json").read_text())
    assert [(c["budget"], c["hypotheses"]) for c in summary["cells"]] == [(512, 2), (4096, 2)]
