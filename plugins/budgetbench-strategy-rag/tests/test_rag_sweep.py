"""Embed once per item: a budget sweep reuses the index; reset, a new item or a new store rebuild it."""

from __future__ import annotations

import json
import sys
import threading
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import rag_support  # noqa: E402
from budgetbench_strategy_rag.embedding import get_embedder  # noqa: E402

SWEEP = [2048, 512, 8192, 1024, 4096]


@pytest.fixture(scope="module")
def items():
    return rag_support.longmemeval_items("oracle", 3)


@pytest.fixture(scope="module")
def embedder():
    return get_embedder("all-MiniLM-L6-v2")


def sweep(strategy, item, counter, tmp_path, budgets=SWEEP):
    audits = []
    for budget in budgets:
        context = rag_support.context(item, budget, counter, tmp_path)
        strategy.apply(item.history, budget, context)
        audits.append(context.audit["retrieval"])
    return audits


@pytest.mark.parametrize("name", ["rag", "lean_retrieval"])
def test_rag_five_tier_sweep_embeds_each_history_once(name, items, counter, embedder, tmp_path):
    strategy = rag_support.strategy(name)
    first, second = items[0], items[1]
    calls, texts = embedder.calls, embedder.texts
    audits = sweep(strategy, first, counter, tmp_path)
    units = audits[0]["units"]
    assert embedder.calls - calls == 2, "one batch for the history, one for the query"
    assert embedder.texts - texts == units + 1
    assert [a["index"] for a in audits] == ["built"] + ["kept"] * 4
    assert audits[0]["embedded_texts"] == units + 1 and audits[0]["embed_s"] > 0
    assert all(a["embedded_texts"] == 0 for a in audits[1:])

    calls = embedder.calls
    sweep(strategy, second, counter, tmp_path)  # a new item without reset still gets its own index
    assert embedder.calls - calls == 2
    strategy.reset()
    calls = embedder.calls
    assert [a["index"] for a in sweep(strategy, second, counter, tmp_path)] == ["built"] + ["kept"] * 4
    assert embedder.calls - calls == 2


def test_rag_memory_store_forgets_the_item_on_reset(items, counter, tmp_path):
    strategy = rag_support.strategy("rag")
    sweep(strategy, items[0], counter, tmp_path, [1024])
    assert len(strategy.store.client.get_collections().collections) == 1
    strategy.reset()
    assert strategy.store.client.get_collections().collections == []


def test_rag_persistent_store_is_reused_by_other_instances(items, counter, embedder, tmp_path):
    store = f"path={tmp_path / 'qdrant'}"
    rag = rag_support.strategy("rag", vector_store=store)
    assert sweep(rag, items[2], counter, tmp_path, [1024])[0]["index"] == "built"
    rag.reset()
    lean = rag_support.strategy("lean_retrieval", vector_store=store)
    calls, texts = embedder.calls, embedder.texts
    assert sweep(lean, items[2], counter, tmp_path, [1024])[0]["index"] == "reused"
    assert (embedder.calls - calls, embedder.texts - texts) == (1, 1), "only the query is embedded"
    other_chunking = rag_support.strategy("rag", vector_store=store, chunk_tokens=64)
    assert sweep(other_chunking, items[2], counter, tmp_path, [1024])[0]["index"] == "built"


def test_rag_instances_on_worker_threads_share_one_model(items, counter, tmp_path):
    serial = {}
    for item in items:
        strategy = rag_support.strategy("rag")
        serial[item.id] = strategy.apply(item.history, 1024, rag_support.context(item, 1024, counter, tmp_path))
    parallel, errors = {}, []

    def work(item):
        try:
            strategy = rag_support.strategy("rag")
            parallel[item.id] = strategy.apply(item.history, 1024, rag_support.context(item, 1024, counter, tmp_path))
        except Exception as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(item,)) for item in items]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors and parallel == serial
    assert get_embedder("all-MiniLM-L6-v2") is get_embedder("all-MiniLM-L6-v2")


def test_rag_audit_explains_each_unit(items, counter, tmp_path):
    item = items[0]
    context = rag_support.context(item, 1024, counter, tmp_path)
    prompt = rag_support.strategy("lean_retrieval").apply(item.history, 1024, context)
    audit = context.audit["retrieval"]
    chosen = audit["chosen"]
    assert chosen and len(chosen) == len(prompt) - 2
    assert [c["score"] for c in chosen] == sorted((c["score"] for c in chosen), reverse=True)
    for unit in chosen:
        parts = 0.6 * unit["dense"] + 0.3 * unit["lexical"] + 0.1 * unit["recency"]
        assert unit["score"] == pytest.approx(parts, abs=1e-4)
    kept = {int(c["unit"]) for c in chosen}
    assert [m for i, m in enumerate(item.history) if i in kept] == prompt[1:-1]
    assert audit["embedding_model"] == "all-MiniLM-L6-v2" and audit["skipped_for_size"] >= 0


@pytest.mark.slow
def test_rag_through_the_cli_embeds_once_per_item(tmp_path):
    """A real run: two worker threads (two instances), two tiers, the embedded model answering."""
    from budgetbench_core import iter_events, read_manifest
    from budgetbench_core.testing import invoke_cli

    out = tmp_path / "run"
    result = invoke_cli(
        "run",
        "-t",
        "synthetic-memory",
        "-s",
        "rag",
        "-b",
        "512 1024",
        "-n",
        "2",
        "-j",
        "2",
        "-o",
        str(out),
        "--task-option",
        "items=2",
        "--task-option",
        "history_tokens=2000",
        "--strategy-param",
        "rag.chunk_tokens=64",
        "--no-report",
    )
    assert result.exit_code == 0, result.output
    manifest = read_manifest(out)
    described = manifest["strategies"]["rag"]
    assert described["embedding_model"]["name"] == "all-MiniLM-L6-v2"
    assert described["embedding_model"]["version"] == "0.1.0"
    assert described["params"]["chunk_tokens"] == 64 and described["distribution"] == "budgetbench-strategy-rag"
    events = list(iter_events(out))
    audits = [e for e in events if e["event"] == "prompt_audit"]
    assert len(audits) == 4
    for item_id in {e["item_id"] for e in audits}:
        indexes = sorted(e["strategy_audit"]["retrieval"]["index"] for e in audits if e["item_id"] == item_id)
        assert indexes == ["built", "kept"], json.dumps(indexes)
    results = [e for e in events if e["event"] == "result"]
    assert len(results) == 4 and all(r["prompt_tokens"] <= r["budget"] for r in results)
    assert all(r["served_count_matches"] for r in results)
