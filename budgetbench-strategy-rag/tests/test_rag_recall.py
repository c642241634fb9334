"""Gold-evidence recall at 4096 tokens on LongMemEval_S histories (~115K tokens each).

A question counts as recalled when at least one of its ``has_answer`` turns (or a chunk of
one) is in the 4096-token prompt; questions without such turns (most abstention ones) are
left out of the denominator. Embedding a ~115K-token history costs about a minute of CPU
on this 2-core machine, so the test takes a round-robin selection across the six question
types (``BUDGETBENCH_RAG_RECALL_ITEMS``, default 6; 56 = the whole sample). The floors are
the recall we measured on that default selection; benchmarks/bench_rag.py measures the
whole sample (docs/performance.md).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import rag_support  # noqa: E402

BUDGET = 4096
ITEMS = int(os.environ.get("BUDGETBENCH_RAG_RECALL_ITEMS", "6"))
FLOORS = {"rag": 0.8, "lean_retrieval": 0.8}


@pytest.fixture(scope="module")
def counter():
    backend, counter = rag_support.start_counter()
    yield counter
    backend.stop()


@pytest.mark.slow
@pytest.mark.parametrize("name", ["rag", "lean_retrieval"])
def test_rag_gold_evidence_recall_at_4096(name, counter, tmp_path):
    items = rag_support.longmemeval_items("s", ITEMS)
    strategy = rag_support.strategy(name, vector_store=rag_support.shared_store())
    hits = []
    for item in items:
        strategy.reset()
        context = rag_support.context(item, BUDGET, counter, tmp_path)
        prompt = strategy.apply(item.history, BUDGET, context)
        assert counter.count(prompt) <= BUDGET
        hit = rag_support.gold_turn_in_prompt(item, prompt)
        if hit is not None:
            hits.append(hit)
    recall = sum(hits) / len(hits)
    print(f"{name}: gold evidence in the {BUDGET}-token prompt for {sum(hits)}/{len(hits)} questions ({recall:.0%})")
    assert len(hits) >= min(ITEMS, 49) - 1
    assert recall >= FLOORS[name]
