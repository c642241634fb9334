"""rag does not depend on the grading key the harness withholds: in a real run its view has no
answer, no question type and no ``has_answer`` / official session ids, and it builds exactly
the prompts it builds when handed the whole item (LongMemEval oracle, prompts only, no model)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from budgetbench_core import PromptCounter, RunConfig, iter_events, run
from budgetbench_core.testing import shared_data, tokenizer_for

sys.path.insert(0, str(Path(__file__).resolve().parent))
import rag_support  # noqa: E402

SPEC, BUDGET, LIMIT = "tiktoken:cl100k_base", 1024, 3


@pytest.mark.parametrize("name", ["rag", "lean_retrieval"])
def test_rag_builds_the_same_prompts_from_the_view_as_from_the_whole_item(name, tmp_path):
    oracle = shared_data("longmemeval/longmemeval_oracle.json")
    out = tmp_path / "run"
    params = {name: {"vector_store": rag_support.shared_store()}}  # for the direct instance: the run's
    # worker process builds its own index in its scratch folder (it may write nothing else)
    config = RunConfig(
        task="longmemeval",
        strategies=[name],
        budgets=[BUDGET],
        out=out,
        tokenizer=SPEC,
        task_options={"path": str(oracle)},
        limit=LIMIT,
        prompts_only=True,
    )
    run(config)
    audits = {e["item_id"]: e for e in iter_events(out) if e["event"] == "prompt_audit"}
    counter = PromptCounter(tokenizer_for(SPEC))
    strategy = rag_support.strategy(name, **params[name])
    items = rag_support.longmemeval_items("oracle", LIMIT)
    assert set(audits) == {item.id for item in items}
    for item in items:
        strategy.reset()
        direct = strategy.apply(item.history, BUDGET, rag_support.context(item, BUDGET, counter, tmp_path))
        sent = audits[item.id]["messages"]
        assert [(m["role"], m["content"]) for m in sent] == [(m.role, m.content) for m in direct]
        assert not any({"has_answer", "official_session_id", "evidence"} & set(m.get("metadata", {})) for m in sent)
