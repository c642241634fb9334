"""A small real run of ``longbench-v2`` on the embedded model: tiers share chunk boundaries."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from budgetbench_task_longbench.task import LongBenchV2

from budgetbench_core import RunConfig, final_rows, read_manifest, run

ROOT = Path(__file__).resolve().parents[3]
SAMPLE = ROOT.parent / "shared" / "data" / "longbench_v2" / "longbench_v2_short_sample.json"


@pytest.mark.slow
@pytest.mark.skipif(not SAMPLE.is_file(), reason=f"shared data not found at {SAMPLE}")
def test_truncation_run_on_the_local_model(tmp_path):
    # 256-token chunks: at 1024 a chunk or two fit beside a long question and its choices.
    options = {"path": str(SAMPLE), "max_natural_tokens": 12000, "chunk_tokens": 256}
    config = RunConfig(
        task="longbench-v2",
        strategies=["truncation"],
        budgets=[1024, 2048],
        out=tmp_path / "run",
        model="local",
        limit=2,
        max_concurrency=1,
        task_options=options,
        timeout_s=900,
    )  # generous: CI machines may be shared
    summary = run(config)
    assert summary.errors == 0 and summary.results + summary.violations == 4

    rows = final_rows(tmp_path / "run")
    assert {(key[2], key[4]) for key in rows} == {(b, i) for b in (1024, 2048) for i in {k[4] for k in rows}}
    for row in rows.values():
        assert row["event"] == "result" and row["prompt_tokens"] <= row["budget"]
        assert row["served_prompt_tokens"] == row["prompt_tokens"]
        assert row["verdict"]["answer"] in "ABCD" and row["quality"] in (0.0, 1.0)
        assert row["quality"] == float(row["verdict"]["extracted"] == row["answer"])

    items = {item.id: item for item in LongBenchV2(**options).load(None, 0)}
    audits = [
        json.loads(line)
        for path in (tmp_path / "run" / "cells").rglob("*.jsonl")
        for line in path.read_text().splitlines()
    ]
    kept = {}
    for audit in (a for a in audits if a["event"] == "prompt_audit"):
        item = items[audit["item_id"]]
        messages = audit["messages"]
        assert messages[0]["content"] == item.system.content and messages[-1]["content"] == item.query.content
        chunks = [m["content"] for m in messages[1:-1]]
        # The kept chunks are, verbatim, the newest chunks of the one fixed chunking.
        assert chunks and chunks == [m.content for m in item.history[-len(chunks) :]]
        kept[(audit["item_id"], audit["budget"])] = chunks
    for item_id in {key[0] for key in kept}:
        small, large = kept[(item_id, 1024)], kept[(item_id, 2048)]
        assert len(large) > len(small) and large[-len(small) :] == small

    manifest = read_manifest(tmp_path / "run")
    notes = manifest["task"]
    assert notes["selection_conditioned"] is True and notes["items_selected"] == 2
    assert notes["chunking"] == {
        "tokenizer": "tiktoken:cl100k_base",
        "chunk_tokens": 256,
        "independent_of_budget": True,
    }
    assert "selection-conditioned" in notes["selection"]["label"]
