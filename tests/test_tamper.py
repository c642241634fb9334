"""A run directory proves itself: every command that reads one refuses it forged, mixed or edited.

Run directories are made fast: prompts-only synthetic-memory runs counted with tiktoken (no
model call), and one answered run on the loopback server for the kill -9 case. Keys live in a
per-test key store (``BUDGETBENCH_KEY_DIR``), as on another machine they would not.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from budgetbench_core import RunConfig, run
from budgetbench_core.identity import ItemChangedError, ItemLedger
from budgetbench_core.integrity import INTEGRITY_FILE, KEY_DIR_ENV, verify_run
from budgetbench_core.loopback import FaultServer
from budgetbench_core.messages import Item, Message
from budgetbench_core.report.data import ReportError, load_run
from budgetbench_core.runlog import EventLog, cell_files, final_rows, read_events, read_manifest
from budgetbench_core.testing import invoke_cli

SETTINGS = dict(
    task="synthetic-memory",
    strategies=["truncation", "recency"],
    budgets=[60, 400],
    task_options={"items": 4, "history_tokens": 300},
    seed=3,
    max_concurrency=1,
    retries=0,
    timeout_s=10.0,
    tokenizer="tiktoken:cl100k_base",
    model="openai/fault-model",
)


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


@pytest.fixture(scope="module")
def honest(tmp_path_factory, keys, server) -> Path:
    out = tmp_path_factory.mktemp("honest") / "run"
    run(RunConfig(out=out, api_base=server.url, **SETTINGS))  # answered, so plan and gate have quality
    return out


@pytest.fixture(scope="module")
def other(tmp_path_factory, keys, server) -> Path:
    """The same experiment run again into another directory: another key, another run id."""
    out = tmp_path_factory.mktemp("other") / "run"
    run(RunConfig(out=out, api_base=server.url, **SETTINGS))
    return out


def _terminal_line(path: Path) -> tuple[int, dict]:
    for number, event in enumerate(read_events(path), start=1):
        if event["event"] in ("result", "violation"):
            return number, event
    raise AssertionError(f"{path}: no final row")


def edited(run_dir: Path, other: Path) -> tuple[Path, int]:
    """A quality changed by hand."""
    path = cell_files(run_dir)[0]
    number, _ = _terminal_line(path)
    lines = path.read_text().splitlines(keepends=True)
    row = json.loads(lines[number - 1])
    row["quality"] = 1.0 - float(row["quality"])
    lines[number - 1] = json.dumps(row, ensure_ascii=False) + "\n"
    path.write_text("".join(lines))
    return path, number


def mixed(run_dir: Path, other: Path) -> tuple[Path, int]:
    """A cell file swapped for the same cell of another run of the same experiment."""
    path = cell_files(run_dir)[1]
    shutil.copyfile(other / path.relative_to(run_dir), path)
    return path, 1


def duplicated(run_dir: Path, other: Path) -> tuple[Path, int]:
    """A second final row for a cell, chained with the run's own key (so only the duplicate is wrong)."""
    path = cell_files(run_dir)[0]
    _, row = _terminal_line(path)
    log = EventLog(run_dir)
    log.append({**row, "quality": 1.0}, path)
    log.close()
    return path, sum(1 for _ in read_events(path))


def foreign_key(run_dir: Path, other: Path) -> tuple[Path, int]:
    """A row of another run_key, chained with the run's own key."""
    path = cell_files(run_dir)[0]
    _, row = _terminal_line(path)
    log = EventLog(run_dir)
    log.append({**row, "item_id": "not-an-item", "run_key": "0123456789abcdef"}, path)
    log.close()
    return path, sum(1 for _ in read_events(path))


def truncated(run_dir: Path, other: Path) -> tuple[Path, int]:
    """The last row of a sealed file cut off (a lost cell)."""
    path = cell_files(run_dir)[-1]
    lines = path.read_text().splitlines(keepends=True)
    path.write_text("".join(lines[:-1]))
    return path, 0


TAMPERS = [edited, mixed, duplicated, foreign_key, truncated]


@pytest.mark.parametrize("tamper", TAMPERS)
def test_verify_names_the_file_and_line_of_each_tamper(tmp_path, honest, other, tamper):
    assert verify_run(honest, run_key=read_manifest(honest)["run_key"]).ok
    target = tmp_path / "run"
    shutil.copytree(honest, target)
    path, line = tamper(target, other)
    found = verify_run(target, run_key=read_manifest(target)["run_key"])
    assert not found.ok
    assert any(str(path) in p and (not line or f"line {line}" in p) for p in found.problems), found.problems


COMMANDS = {
    "report": lambda d, h: ["report", str(d), "--format", "json"],
    "gate": lambda d, h: ["gate", str(d)],
    "plan": lambda d, h: ["plan", str(d)],
    "compare": lambda d, h: ["compare", str(h), str(d), "-o", str(d.parent / "compared")],
    "merge": lambda d, h: ["merge", str(d), "-o", str(d.parent / "merged")],
}


@pytest.mark.parametrize("tamper", [edited, mixed, duplicated], ids=lambda t: t.__name__)
@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_every_command_refuses_a_forged_mixed_or_edited_run(tmp_path, honest, other, command, tamper):
    target = tmp_path / "run"
    shutil.copytree(honest, target)
    path, line = tamper(target, other)
    result = invoke_cli(*COMMANDS[command](target, honest))
    assert result.exit_code == 2, result.output
    text = " ".join(result.output.split())
    assert "does not verify" in text and path.name in text and f"line {line}" in text, result.output


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_every_command_reads_an_honest_run(tmp_path, honest, command):
    target = tmp_path / "run"
    shutil.copytree(honest, target)
    result = invoke_cli(*COMMANDS[command](target, honest))
    assert result.exit_code in (0, 1) and "does not verify" not in result.output, result.output


def test_force_reads_an_edited_run_marked_unverified(tmp_path, honest, other):
    target = tmp_path / "run"
    shutil.copytree(honest, target)
    path, line = edited(target, other)
    with pytest.raises(ReportError, match="does not verify"):
        load_run(target)
    data = load_run(target, force=True)
    assert data.unverified and f"line {line}" in data.unverified[0]


def test_without_the_key_a_run_is_refused_until_its_key_file_is_given(tmp_path, honest, keys, monkeypatch):
    record = json.loads((honest / INTEGRITY_FILE).read_text())
    monkeypatch.setenv(KEY_DIR_ENV, str(tmp_path / "another-machine"))
    found = verify_run(honest)
    assert not found.ok and record["run_id"] in found.problems[0] and "--key-file" in found.problems[0]
    assert verify_run(honest, key_files=[keys / record["run_id"]]).ok
    # Without the key the unkeyed chain is still checked: an edit is caught, not only "no key".
    target = tmp_path / "run"
    shutil.copytree(honest, target)
    path, line = edited(target, honest)
    assert any(f"line {line} does not match" in p for p in verify_run(target, need_key=False).problems)


def test_a_line_recomputed_without_the_key_is_refused(tmp_path, honest):
    """An editor who recomputes the SHA-256 chain still cannot make the HMAC."""
    import hashlib

    target = tmp_path / "run"
    shutil.copytree(honest, target)
    (target / INTEGRITY_FILE).write_text(
        json.dumps({k: v for k, v in json.loads((target / INTEGRITY_FILE).read_text()).items() if k != "sealed"})
    )
    path = cell_files(target)[0]
    data = path.read_bytes()
    head, last = data[: data.rstrip(b"\n").rfind(b"\n") + 1], data[data.rstrip(b"\n").rfind(b"\n") + 1 :]
    row = json.loads(last)
    del row["chain"]
    row["quality"] = 1.0
    body = json.dumps(row, ensure_ascii=False).encode()
    digest = hashlib.sha256(head + body).hexdigest()
    forged = body[:-1] + f', "chain": {{"sha256": "{digest}", "hmac": "{"0" * 64}"}}}}\n'.encode()
    path.write_bytes(head + forged)
    problems = verify_run(target).problems
    assert any("made without this run's key" in p for p in problems), problems


def _answered(out: Path, url: str) -> list[str]:
    command = [sys.executable, "-m", "budgetbench_core.cli", "run", "-o", str(out), "--api-base", url]
    command += ["-t", SETTINGS["task"], "-b", "60 400", "-j", "1", "--retries", "0", "--no-report"]
    command += ["-m", SETTINGS["model"], "--tokenizer", SETTINGS["tokenizer"], "--seed", "3", "--display", "none"]
    command += ["--no-preflight", "-s", "truncation", "-s", "recency", "-n", "6"]
    return command + ["--task-option", "items=6", "--task-option", "history_tokens=300"]


def test_a_run_killed_mid_write_then_resumed_verifies(tmp_path, keys):
    """kill -9 leaves unsealed rows and a torn line; the resume continues each chain and seals."""
    out = tmp_path / "run"
    env = {**os.environ, KEY_DIR_ENV: str(keys), "LITELLM_LOCAL_MODEL_COST_MAP": "True"}
    with FaultServer(latency_s=0.05) as server:
        process = subprocess.Popen(_answered(out, server.url), env=env, stderr=subprocess.PIPE)
        deadline = time.monotonic() + 60
        while len(server.requests) < 6 and process.poll() is None and time.monotonic() < deadline:
            time.sleep(0.01)
        os.kill(process.pid, signal.SIGKILL)
        process.wait()
        assert len(server.requests) < 24, "the run finished before the kill"
        with open(cell_files(out)[0], "ab") as handle:
            handle.write(b'{"event": "result", "task": "synthetic-memory", "strat')  # a torn write
        killed = verify_run(out, run_key=read_manifest(out)["run_key"])
        assert killed.ok, killed.problems
        resumed = subprocess.run(_answered(out, server.url), env=env, capture_output=True, timeout=120)
        assert resumed.returncode == 0, resumed.stderr.decode()[-2000:]
    found = verify_run(out, run_key=read_manifest(out)["run_key"])
    assert found.ok and not found.notes, (found.problems, found.notes)
    assert len(final_rows(out)) == 2 * 6 * 2
    assert load_run(out, with_prompts=False).unverified == []


def test_a_later_invocation_continues_the_chains_and_reseals(tmp_path, keys, server):
    """A second writer of a sealed directory (as a resume is) continues every chain and seals again."""
    out = tmp_path / "run"
    run(RunConfig(out=out, api_base=server.url, **{**SETTINGS, "task_options": {"items": 2, "history_tokens": 300}}))
    sealed = json.loads((out / INTEGRITY_FILE).read_text())["sealed"]
    log = EventLog(out)
    path = cell_files(out)[0]
    log.append({**_terminal_line(path)[1], "event": "error", "item_id": "extra", "phase": "model"}, path)
    log.close()
    again = json.loads((out / INTEGRITY_FILE).read_text())["sealed"]
    assert again["files"] != sealed["files"] and verify_run(out).ok


def _item(answer: str) -> Item:
    return Item(id="q1", history=(Message("user", "I live in Oslo."),), query=Message("user", "Where?"), answer=answer)


def test_a_changed_item_is_refused_naming_the_item_and_part(tmp_path, keys):
    log = EventLog(tmp_path)
    ItemLedger(tmp_path, log).check(_item("Oslo"), "k1")
    log.close()
    ledger = ItemLedger(tmp_path, EventLog(tmp_path), {"/data/q.json": "abc"})
    ledger.check(_item("Oslo"), "k1")  # the same content: accepted
    ledger.check(_item("Bergen"), "k2")  # another experiment: its own record
    with pytest.raises(ItemChangedError, match=r"item 'q1'.*answer \(sha256 .*/data/q.json"):
        ledger.check(_item("Bergen"), "k1")
    assert verify_run(tmp_path).ok
