"""``budgetbench swebench export`` refuses a run directory that was edited.

A run of the real task on the shared SWE-bench Verified mini sample (two instances, the loopback
server answering, counted with tiktoken) is copied and edited: a forged prediction appended to
a cell file, or one byte of a row changed. The export refuses naming the file and line and
writes nothing; the unedited copy is exported.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from budgetbench_core import RunConfig, read_run, run
from budgetbench_core.testing import FaultServer, invoke_cli

ROOT = Path(__file__).resolve().parents[3]
SAMPLE = ROOT.parent / "shared" / "data" / "swebench" / "swebench_verified_mini.jsonl"
pytestmark = pytest.mark.skipif(not SAMPLE.is_file(), reason=f"shared data not found at {SAMPLE}")


@pytest.fixture(scope="module")
def keys(tmp_path_factory):
    directory = tmp_path_factory.mktemp("keys")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("BUDGETBENCH_KEY_DIR", str(directory))
        yield directory


@pytest.fixture(scope="module")
def answered_run(tmp_path_factory, keys) -> Path:
    out = tmp_path_factory.mktemp("swe-verified") / "run"
    with FaultServer() as server:
        run(
            RunConfig(
                task="swebench-verified",
                strategies=["truncation"],
                budgets=[2048],
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
    assert len(read_run(out).rows) == 2
    return out


def _cell(run_dir: Path) -> Path:
    (path,) = sorted((run_dir / "cells").glob("*/*/*/r*.jsonl"))
    return path


def forged_patch(run_dir: Path) -> tuple[Path, int]:
    path = _cell(run_dir)
    lines = path.read_text(encoding="utf-8").splitlines()
    row = {k: v for k, v in json.loads(lines[-1]).items() if k != "chain"}
    row = {**row, "event": "result", "prediction": "diff --git a/x b/x\n"}
    path.write_text("\n".join([*lines, json.dumps(row)]) + "\n", encoding="utf-8")
    return path, len(lines) + 1


def byte_changed(run_dir: Path) -> tuple[Path, int]:
    path = _cell(run_dir)
    data = path.read_bytes()
    at = data.index(b'"run_key": "') + len(b'"run_key": "')
    path.write_bytes(data[:at] + b"X" + data[at + 1 :])
    return path, 1


@pytest.mark.parametrize("tamper", [forged_patch, byte_changed], ids=lambda t: t.__name__)
def test_export_refuses_an_edited_run_naming_the_file_and_line(tmp_path, answered_run, tamper):
    target = tmp_path / "run"
    shutil.copytree(answered_run, target)
    path, line = tamper(target)
    out = tmp_path / "preds"
    outcome = invoke_cli("swebench", "export", str(target), "-o", str(out))
    assert outcome.exit_code == 2, outcome.output
    text = " ".join(outcome.output.split())
    assert "does not verify" in text and f"{path}: line {line} " in text, outcome.output
    assert not out.exists()


def test_export_of_the_unedited_run_writes_its_predictions(tmp_path, answered_run):
    target = tmp_path / "run"
    shutil.copytree(answered_run, target)
    out = tmp_path / "preds"
    outcome = invoke_cli("swebench", "export", str(target), "-o", str(out))
    assert outcome.exit_code == 0, outcome.output
    (file,) = sorted(out.glob("*.jsonl"))
    assert len(file.read_text().splitlines()) == 2
