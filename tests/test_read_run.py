"""``read_run``: the public reader of a run directory for plugins' commands, verified first.

A real run (synthetic memory task, answered by the loopback server, counted with tiktoken) is
read back row for row as the report reads it; edited copies (a byte changed, a line deleted, a
forged row appended) are refused naming the file and line; a run whose key is on another machine
is refused until its key file is given.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from budgetbench_core import RunConfig, RunReadError, VerifiedRun, final_rows, read_run, run
from budgetbench_core.integrity import INTEGRITY_FILE, KEY_DIR_ENV
from budgetbench_core.report.data import load_run
from budgetbench_core.testing import FaultServer, invoke_cli


@pytest.fixture(scope="module")
def keys(tmp_path_factory):
    directory = tmp_path_factory.mktemp("keys")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(KEY_DIR_ENV, str(directory))
        yield directory


@pytest.fixture(scope="module")
def server():
    with FaultServer() as server:
        yield server


def _config(out: Path, server: FaultServer) -> RunConfig:
    return RunConfig(
        out=out,
        api_base=server.url,
        model="openai/fault-model",
        tokenizer="tiktoken:cl100k_base",
        task="synthetic-memory",
        task_options={"items": 3, "history_tokens": 300},
        strategies=["truncation", "recency"],
        budgets=[60, 400],
        seed=3,
        max_concurrency=1,
        retries=0,
        timeout_s=10.0,
    )


@pytest.fixture(scope="module")
def honest(tmp_path_factory, keys, server) -> Path:
    out = tmp_path_factory.mktemp("read-run") / "run"
    run(_config(out, server))
    return out


def test_an_honest_run_reads_as_the_report_reads_it(honest):
    read = read_run(honest, logs=("items.jsonl", "episodes.jsonl"))
    assert isinstance(read, VerifiedRun) and read.run_dir == honest
    assert read.manifest == json.loads((honest / "manifest.json").read_text())
    report = load_run(honest, with_prompts=False)
    assert read.rows == report.rows and len(read.rows) == 3 * 2 * 2
    assert {row["event"] for row in read.rows.values()} <= {"result", "violation"}
    assert all("chain" not in row for row in read.rows.values())
    raw = final_rows(honest)  # the unverified event API: the same rows, in the form they were written
    assert set(raw) == set(read.rows)
    assert all(read.rows[key]["quality"] == raw[key]["quality"] for key in raw)
    # no episodic task and no late call: an absent log reads as no rows (tau-bench's tests read episodes.jsonl)
    assert read.logs == {"items.jsonl": [], "episodes.jsonl": []} and read.notes == ()


def _cell(run_dir: Path) -> Path:
    return sorted((run_dir / "cells").glob("*/*/*/r*.jsonl"))[0]


def byte_changed(run_dir: Path) -> tuple[Path, int]:
    path = _cell(run_dir)
    data = path.read_bytes()
    at = data.index(b'"item_id": "') + len(b'"item_id": "')
    path.write_bytes(data[:at] + b"X" + data[at + 1 :])
    return path, 1


def line_deleted(run_dir: Path) -> tuple[Path, int]:
    path = _cell(run_dir)
    lines = path.read_text(encoding="utf-8").splitlines(keepends=True)
    path.write_text("".join(lines[1:]), encoding="utf-8")
    return path, 1


def row_forged(run_dir: Path) -> tuple[Path, int]:
    path = _cell(run_dir)
    lines = path.read_text(encoding="utf-8").splitlines()
    row = {k: v for k, v in json.loads(lines[-1]).items() if k != "chain"}
    path.write_text(
        "\n".join([*lines, json.dumps({**row, "item_id": "forged", "quality": 1.0})]) + "\n", encoding="utf-8"
    )
    return path, len(lines) + 1


@pytest.mark.parametrize("tamper", [byte_changed, line_deleted, row_forged], ids=lambda t: t.__name__)
def test_an_edited_run_is_refused_naming_the_file_and_line(tmp_path, honest, tamper):
    target = tmp_path / "run"
    shutil.copytree(honest, target)
    path, line = tamper(target)
    with pytest.raises(RunReadError, match="does not verify") as refused:
        read_run(target)
    assert f"{path}: line {line} " in str(refused.value)
    assert isinstance(refused.value, ValueError)  # the CLI prints it as one line, exit 2


def test_a_run_without_its_key_is_refused_until_the_key_file_is_given(tmp_path, honest, keys, monkeypatch):
    run_id = json.loads((honest / INTEGRITY_FILE).read_text())["run_id"]
    monkeypatch.setenv(KEY_DIR_ENV, str(tmp_path / "another-machine"))
    with pytest.raises(RunReadError, match=f"no key for run {run_id}"):
        read_run(honest)
    assert len(read_run(honest, key_files=[keys / run_id]).rows) == 12


def test_what_is_not_a_run_directory_is_refused_by_name(tmp_path, honest):
    with pytest.raises(RunReadError, match="no such run directory"):
        read_run(tmp_path / "nowhere")
    target = tmp_path / "run"
    shutil.copytree(honest, target)
    (target / "manifest.json").unlink()
    with pytest.raises(RunReadError, match=r"manifest\.json: missing"):
        read_run(target)
    with pytest.raises(ValueError, match="not run-level logs"):
        read_run(honest, logs=("cells",))


@pytest.mark.parametrize("tamper", [byte_changed, row_forged], ids=lambda t: t.__name__)
def test_a_resume_of_an_edited_run_is_refused_before_it_decides_anything(tmp_path, honest, server, tamper):
    """Resuming reads which cells are done from the directory: an edited one is refused up front
    (before, a finished run resumed silently on its edited rows, and the run's summary showed them)."""
    target = tmp_path / "run"
    shutil.copytree(honest, target)
    path, line = tamper(target)
    before = (len(server.requests), path.read_bytes())
    with pytest.raises(ValueError, match="refusing to resume a run directory that does not verify") as refused:
        run(_config(target, server))
    assert f"{path}: line {line} " in str(refused.value)
    assert (len(server.requests), path.read_bytes()) == before  # no call made, nothing appended


def test_a_resume_of_an_unedited_run_makes_no_call(tmp_path, honest, server):
    target = tmp_path / "run"
    shutil.copytree(honest, target)
    calls = len(server.requests)
    summary = run(_config(target, server))
    assert summary.cells_skipped == 12 and len(server.requests) == calls
    assert len(read_run(target).rows) == 12


def test_the_reports_refusal_names_no_option_that_does_not_exist(tmp_path, honest):
    """It said "--force reads it anyway", an option no command has."""
    target = tmp_path / "run"
    shutil.copytree(honest, target)
    path, line = byte_changed(target)
    result = invoke_cli("report", str(target), "--format", "json")
    text = " ".join(result.output.split())
    assert result.exit_code == 2 and f"{path}: line {line} " in text and "--force" not in text, result.output
    assert "--force" not in invoke_cli("report", "--help").output
