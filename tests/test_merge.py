"""``--shard i/N`` runs and ``budgetbench merge``: three shards merged are the one-process run.

The model is the deterministic loopback server (no faults), counted with
tiktoken:cl100k_base, so every run of the same configuration must agree row for row.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from budgetbench_core import RunConfig, read_manifest, run
from budgetbench_core.merge import MergeError, merge_runs
from budgetbench_core.report import write_report
from budgetbench_core.runlog import cell_files
from budgetbench_core.testing import FaultServer, comparable_rows, invoke_cli

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
    tampered = tmp_path / "shard1"
    shutil.copytree(shards[0], tampered)
    stray = next(line for path in cell_files(shards[1]) for line in path.read_text().splitlines())
    target = cell_files(tampered)[0]
    target.write_text(target.read_text() + stray + "\n")
    with pytest.raises(MergeError, match="does not belong to the shards"):
        merge_runs([tampered, shards[1], shards[2]], tmp_path / "merged")


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
