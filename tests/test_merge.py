"""``--shard i/N`` runs and ``budgetbench merge``: three shards merged are the one-process run.

The model is the deterministic loopback server (no faults), counted with
tiktoken:cl100k_base, so every run of the same configuration must agree row for row.
"""

from __future__ import annotations

import json
import re
import shutil
import sys
from pathlib import Path

import pytest

from budgetbench_core import Item, Message, RunConfig, read_manifest, run
from budgetbench_core.identity import ItemLedger
from budgetbench_core.integrity import KEY_DIR_ENV, verify_run
from budgetbench_core.merge import MergeError, merge_runs
from budgetbench_core.report import write_report
from budgetbench_core.report.data import load_run
from budgetbench_core.runlog import EventLog, cell_files, read_events
from budgetbench_core.testing import FaultServer, comparable_rows, invoke_cli, registry_with

sys.path.insert(0, str(Path(__file__).resolve().parent))  # test_episodes' documented example task

SETTINGS = dict(
    task="synthetic-memory",
    strategies=["truncation", "recency"],
    budgets=[60, 400],
    task_options={"items": 9, "history_tokens": 600},
    seed=5,
    max_concurrency=2,
    retries=0,
    timeout_s=10.0,
    tokenizer="tiktoken:cl100k_base",
    model="openai/fault-model",
)


@pytest.fixture(scope="module", autouse=True)
def keys(tmp_path_factory):
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(KEY_DIR_ENV, str(tmp_path_factory.mktemp("keys")))
        yield


@pytest.fixture(scope="module")
def server():
    with FaultServer() as server:
        yield server


@pytest.fixture(scope="module")
def shards(tmp_path_factory, server) -> list[Path]:
    root = tmp_path_factory.mktemp("shards")
    dirs = []
    for index in (1, 2, 3):
        out = root / f"shard{index}"
        run(RunConfig(out=out, api_base=server.url, shard=f"{index}/3", **SETTINGS))
        dirs.append(out)
    return dirs


def test_three_shards_merged_equal_one_run(tmp_path, server, shards):
    whole = tmp_path / "whole"
    run(RunConfig(out=whole, api_base=server.url, **SETTINGS))
    expected = comparable_rows(whole)
    assert len(expected) == 2 * 9 * 2
    per_shard = [comparable_rows(d) for d in shards]
    assert sum(map(len, per_shard)) == len(expected) and all(per_shard), "each shard ran a part, none all"
    merged = tmp_path / "merged"
    summary = merge_runs(shards, merged)
    assert (summary.shard_count, summary.shards, summary.missing_shards) == (3, [1, 2, 3], [])
    assert comparable_rows(merged) == expected
    manifest = read_manifest(merged)
    assert manifest["shards"] == {"count": 3, "merged": [1, 2, 3], "missing": []}
    assert manifest["config"]["shard"] is None
    assert len(manifest["invocations"]) == 3
    assert write_report(merged)  # the report reads a merged directory like any run
    # A run of the unsharded command on the merged directory finds every cell done.
    again = run(RunConfig(out=merged, api_base=server.url, **SETTINGS))
    assert again.model_calls == 0 and again.cells_skipped == len(expected)


def test_merge_refuses_another_experiment(tmp_path, server, shards):
    other = tmp_path / "other-seed"
    run(RunConfig(out=other, api_base=server.url, shard="2/3", **{**SETTINGS, "seed": 6}))
    with pytest.raises(MergeError, match="different run"):
        merge_runs([shards[0], other, shards[2]], tmp_path / "merged")
    assert not (tmp_path / "merged").exists()


def test_merge_refuses_a_shard_twice_and_missing_shards(tmp_path, shards):
    copy = tmp_path / "copy"
    shutil.copytree(shards[0], copy)
    with pytest.raises(MergeError, match="both hold shard 1/3"):
        merge_runs([shards[0], copy, shards[1]], tmp_path / "a")
    with pytest.raises(MergeError, match="shards 3/3 are missing"):
        merge_runs(shards[:2], tmp_path / "b")
    partial = merge_runs(shards[:2], tmp_path / "c", allow_partial=True)
    assert partial.missing_shards == [3]
    # a partial merge merges with the missing shard later
    assert merge_runs([tmp_path / "c", shards[2]], tmp_path / "d").missing_shards == []


def test_merge_refuses_rows_that_belong_to_another_shard(tmp_path, shards):
    """A row of another shard, chained with this shard's own key: only ownership is wrong."""
    tampered = tmp_path / "shard1"
    shutil.copytree(shards[0], tampered)
    stray = next(event for path in cell_files(shards[1]) for event in read_events(path))
    log = EventLog(tampered)
    log.append(stray, cell_files(tampered)[0])
    log.close()
    with pytest.raises(MergeError, match="does not belong to the shards"):
        merge_runs([tampered, shards[1], shards[2]], tmp_path / "merged")


def _rewrite_last_row(path: Path, change) -> None:
    lines = path.read_text().splitlines(keepends=True)
    row = json.loads(lines[-1])
    change(row)
    lines[-1] = json.dumps(row, ensure_ascii=False) + "\n"
    path.write_text("".join(lines))


@pytest.mark.parametrize(
    "change",
    [lambda row: row.pop("run_key"), lambda row: row.update(quality=1.0), lambda row: row.pop("chain")],
    ids=["lost-run-key", "edited", "unchained"],
)
def test_merge_refuses_a_shard_whose_rows_were_edited(tmp_path, shards, change):
    tampered = tmp_path / "shard2"
    shutil.copytree(shards[1], tampered)
    path = cell_files(tampered)[0]
    _rewrite_last_row(path, change)
    lines = len(path.read_text().splitlines())
    with pytest.raises(MergeError, match=rf"does not verify: {re.escape(str(path))}: line {lines} "):
        merge_runs([shards[0], tampered, shards[2]], tmp_path / "merged")
    assert not (tmp_path / "merged").exists()


def test_merge_refuses_a_duplicate_terminal_row(tmp_path, shards):
    """A second final row for a cell, validly chained: refused, never "the later one wins"."""
    tampered = tmp_path / "shard3"
    shutil.copytree(shards[2], tampered)
    path = cell_files(tampered)[0]
    final = next(e for e in read_events(path) if e["event"] in ("result", "violation"))
    log = EventLog(tampered)
    log.append({**final, "quality": 1.0}, path)
    log.close()
    with pytest.raises(MergeError, match="second terminal row"):
        merge_runs([shards[0], shards[1], tampered], tmp_path / "merged")


def test_merge_refuses_shards_that_read_different_items(tmp_path, shards):
    run_key = read_manifest(shards[0])["run_key"]
    copies = []
    for index, answer in ((0, "Oslo"), (1, "Bergen")):
        copies.append(tmp_path / f"shard{index + 1}")
        shutil.copytree(shards[index], copies[-1])
        log = EventLog(copies[-1])
        item = Item(id="q1", history=(), query=Message("user", "Where?"), answer=answer)
        ItemLedger(copies[-1], log).check(item, run_key)
        log.close()
    with pytest.raises(MergeError, match="item 'q1' has other content.*read different data"):
        merge_runs([*copies, shards[2]], tmp_path / "merged")


def test_merged_rows_verify_under_the_merge_key(tmp_path, shards):
    merged = tmp_path / "merged"
    merge_runs(shards, merged)
    assert verify_run(merged, run_key=read_manifest(merged)["run_key"]).ok
    sources = {entry["run_id"] for entry in read_manifest(merged)["merged"]["from"]}
    assert len(sources) == 3 and json.loads((merged / "integrity.json").read_text())["run_id"] not in sources


def test_sharded_episodic_runs_merge(tmp_path, server):
    """Two shards of an agent-episode run: episodes.jsonl is merged by cell key."""
    from test_episodes import doc_example

    registry = registry_with(doc_example())
    settings = dict(
        task="countdown",
        strategies=["truncation", "recency", "full_context", "checkpoint"],
        budgets=[200],
        model="openai/fault-model",
        tokenizer="tiktoken:cl100k_base",
        api_base=server.url,
        max_concurrency=1,
        retries=0,
    )
    halves = []
    for index in (1, 2):
        halves.append(tmp_path / f"half{index}")
        run(RunConfig(out=halves[-1], shard=f"{index}/2", **settings), registry=registry)
    turns = [len((d / "episodes.jsonl").read_text().splitlines()) for d in halves]
    assert all(turns), "each shard ran episodes"
    merged = tmp_path / "merged"
    merge_runs(halves, merged)
    assert len((merged / "episodes.jsonl").read_text().splitlines()) == sum(turns)
    whole = tmp_path / "whole"
    run(RunConfig(out=whole, **settings), registry=registry)
    assert comparable_rows(merged) == comparable_rows(whole)
    assert load_run(merged, with_prompts=False).unverified == []


def test_a_shard_directory_cannot_be_resumed_as_another_shard(server, shards):
    from budgetbench_core.runner import RunConfigError

    with pytest.raises(RunConfigError, match="shard"):
        run(RunConfig(out=shards[0], api_base=server.url, shard="2/3", **SETTINGS))


def test_merge_command(tmp_path, shards):
    result = invoke_cli("merge", *map(str, shards), "-o", str(tmp_path / "merged"))
    assert result.exit_code == 0, result.output
    assert "shards 1/3, 2/3, 3/3" in result.output
    refused = invoke_cli("merge", str(shards[0]), str(shards[0]), "-o", str(tmp_path / "again"))
    assert refused.exit_code == 2 and "given twice" in refused.output
    busy = invoke_cli("merge", str(shards[0]), "-o", str(tmp_path / "merged"))
    assert busy.exit_code == 2 and "not empty" in busy.output


def test_merge_writes_the_merged_runs_report_unless_no_report(tmp_path, shards):
    merged = tmp_path / "merged"
    result = invoke_cli("merge", *map(str, shards), "-o", str(merged))
    assert result.exit_code == 0, result.output
    assert f"report: {merged / 'report' / 'index.html'}" in result.output
    report = json.loads((merged / "report" / "report.json").read_text(encoding="utf-8"))
    cells = {(r["strategy"], int(r["budget"])) for r in report["summary"]}
    assert cells == {(s, b) for s in SETTINGS["strategies"] for b in SETTINGS["budgets"]}
    assert (merged / "report" / "report.md").exists() and (merged / "report" / "summary.csv").exists()

    bare = tmp_path / "bare"
    quiet = invoke_cli("merge", *map(str, shards), "-o", str(bare), "--no-report")
    assert quiet.exit_code == 0, quiet.output
    assert "report:" not in quiet.output and not (bare / "report").exists()
