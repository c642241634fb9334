"""No prompt over budget at any tier from 512 to 32768, on real LongMemEval histories.

Counted exactly by the embedded llama.cpp server's tokenizer (SmolLM2's chat template).
Oracle items have a few thousand tokens, so the larger tiers hold everything; the
LongMemEval_S item has ~115K tokens, so every tier has to choose.
"""

from __future__ import annotations

import random
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import rag_support  # noqa: E402

TIERS = [512, 1024, 2048, 4096, 8192, 16384, 32768]


@pytest.fixture(scope="module")
def oracle_items():
    return rag_support.longmemeval_items("oracle", 6)


@pytest.fixture(scope="module")
def long_item():
    return rag_support.longmemeval_items("s", 1)[0]


def position_of(item):
    index = {(m.metadata["session_id"], m.metadata["turn"]): i for i, m in enumerate(item.history)}
    return lambda message: index[(message.metadata["session_id"], message.metadata["turn"])]


def check_sweep(strategy, item, counter, tmp_path, whole_messages: bool):
    strategy.reset()
    position = position_of(item)
    tiers = TIERS[:]
    random.Random(item.id).shuffle(tiers)  # the runner shuffles tiers too
    units_seen = set()
    for budget in tiers:
        context = rag_support.context(item, budget, counter, tmp_path)
        prompt = strategy.apply(item.history, budget, context)
        tokens = counter.count(prompt)
        assert tokens <= budget, f"{item.id} at {budget}: {tokens} tokens"
        assert prompt[0] == item.system and prompt[-1] == item.query
        kept = prompt[1:-1]
        positions = [position(m) for m in kept]
        assert positions == sorted(positions), "kept history is not in chronological order"
        audit = context.audit["retrieval"]
        units_seen.add(audit["units"])
        assert len(audit["chosen"]) >= len(kept) and [c["rank"] for c in audit["chosen"]] == sorted(
            c["rank"] for c in audit["chosen"]
        )
        if whole_messages:
            assert all(m is item.history[position(m)] for m in kept), "a message was altered or cut"
            room = budget - tokens
            left_out = [m for i, m in enumerate(item.history) if i not in set(positions)]
            assert all(counter.message_tokens(m) > room for m in left_out), "a unit that fits was left out"
        else:
            assert all(m.content in item.history[position(m)].content for m in kept)
    assert len(units_seen) == 1, "the units changed with the budget tier"


@pytest.mark.parametrize(("name", "params"), [("rag", {}), ("lean_retrieval", {}), ("rag", {"chunk_tokens": 128})])
def test_rag_oracle_prompts_within_budget_at_every_tier(name, params, oracle_items, counter, tmp_path):
    strategy = rag_support.strategy(name, **params)
    for item in oracle_items:
        check_sweep(strategy, item, counter, tmp_path, whole_messages=not params)


@pytest.mark.parametrize("name", ["rag", "lean_retrieval"])
def test_rag_longmemeval_s_prompts_within_budget_at_every_tier(name, long_item, counter, tmp_path):
    strategy = rag_support.strategy(name, vector_store=rag_support.shared_store())
    assert sum(counter.message_tokens(m) for m in long_item.history) > 100_000
    check_sweep(strategy, long_item, counter, tmp_path, whole_messages=True)


def test_rag_budget_below_system_and_query_returns_them_alone(oracle_items, counter, tmp_path):
    item = oracle_items[0]
    strategy = rag_support.strategy("rag")
    context = rag_support.context(item, 20, counter, tmp_path)
    assert strategy.apply(item.history, 20, context) == [item.system, item.query]
    assert context.audit["retrieval"]["chosen"] == []
