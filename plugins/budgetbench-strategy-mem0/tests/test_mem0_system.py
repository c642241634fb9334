"""mem0 on the embedded stack: real mem0ai 2.2.1, embedded qdrant, all-MiniLM-L6-v2 from its wheel.

``infer=False`` throughout except where a loopback fault-injection server stands in for
a broken LLM (the 135M embedded model's context is too small for mem0's extraction
prompt). Prompts are counted by the embedded llama.cpp server.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from budgetbench_strategy_mem0 import Mem0

from budgetbench_core import Item, Message, PromptCounter, RunConfig, StrategyContext, fill_budget, run
from budgetbench_core.testing import FaultServer, invoke_cli, network_confined, shared_data, strategy_context


@pytest.fixture(autouse=True)
def offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


@pytest.fixture(scope="module")
def oracle_item() -> Item:
    """The smallest LongMemEval oracle question with at least two sessions and twelve messages."""
    data = shared_data("longmemeval/longmemeval_oracle.json")
    records = [
        r
        for r in json.loads(data.read_text(encoding="utf-8"))
        if len(r["haystack_sessions"]) >= 2 and sum(map(len, r["haystack_sessions"])) >= 12
    ]
    record = min(records, key=lambda r: sum(len(m["content"]) for s in r["haystack_sessions"] for m in s))
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
        system=Message("system", "Answer from the memories."),
    )


def context_for(item: Item, run_dir: Path, counter: PromptCounter | None = None, budget: int = 0) -> StrategyContext:
    """mem0 makes no harness model calls: the context refuses them."""
    return strategy_context(item, budget, counter, run_dir)


@pytest.fixture(scope="module")
def ingested(oracle_item, tmp_path_factory):
    system = Mem0(top_k=5)
    context = context_for(oracle_item, tmp_path_factory.mktemp("run"))
    report = system.ingest(oracle_item.sessions(), context)
    return system, report, context


def test_mem0_is_listed_as_a_memory_system():
    result = invoke_cli("list-plugins", "--json")
    assert result.exit_code == 0, result.output
    row = next(r for r in json.loads(result.output) if r["kind"] == "strategy" and r["name"] == "mem0")
    assert row["regime"] == "persistent-stateful"
    assert row["distribution"] == "budgetbench-strategy-mem0"


def test_mem0_ingests_every_session_of_an_oracle_question(ingested, oracle_item):
    system, report, context = ingested
    assert report.failures == [] and report.loss == 0
    assert report.sessions == report.stored == len(oracle_item.sessions())
    assert context.audit["mem0"]["memories_stored"] == len(oracle_item.history)  # infer=False: one per message
    store = Path(context.audit["mem0"]["store"])
    assert store.is_relative_to(context.scratch_dir) and (store / "qdrant").is_dir()
    # MEM0_DIR is read once per process, at mem0's import: here the first run's directory.
    assert Path(context.audit["mem0"]["mem0_dir"]) == context.scratch_dir / "mem0"
    assert (context.scratch_dir / "mem0" / "config.json").is_file()


def test_defect_13_mem0_search_returns_the_requested_count(ingested, oracle_item):
    system, _, context = ingested
    assert len(oracle_item.history) > 12
    for top_k in (5, 12):
        system.top_k = top_k
        ranked = system.retrieve(oracle_item.query.content, context)
        assert len(ranked) == top_k
        assert [r.score for r in ranked] == sorted((r.score for r in ranked), reverse=True)
        assert {r.source_id for r in ranked} <= {s.id for s in oracle_item.sessions()}
    # Why top_k: mem0 2.2.1 silently ignores ``limit`` and returns its default of 20.
    ignored = system.memory.search(
        oracle_item.query.content, limit=3, threshold=0.0, filters={"user_id": system.user_id(context.item.id)}
    )["results"]
    assert len(ignored) == min(20, len(oracle_item.history)) != 3


def test_mem0_search_is_scoped_to_the_item(ingested, oracle_item):
    system, _, context = ingested
    other = Item("another-question", (), Message("user", oracle_item.query.content), "x")
    assert system.retrieve(oracle_item.query.content, context_for(other, context.scratch_dir)) == []


@pytest.mark.parametrize("budget", [256, 512, 1024])
def test_harness_fills_the_budget_with_whole_mem0_memories(ingested, oracle_item, budgetbench_counter, budget):
    system, _, context = ingested
    system.top_k = 30
    ranked = system.retrieve(oracle_item.query.content, context)
    fill = fill_budget(oracle_item, ranked, budget, budgetbench_counter)

    assert budgetbench_counter.count(fill.messages) == fill.used_tokens <= budget
    assert fill.included, "nothing fit"
    assert fill.included == sorted(fill.included)
    body = fill.messages[1].content
    assert all(ranked[i].text in body for i in fill.included)  # whole memories, never cut
    assert sorted(fill.included + fill.dropped) == list(range(len(ranked)))


FAULT_MODES = {
    "reject": {"rate": 1.0, "faults": ("400",)},  # the LLM refuses every call
    "garbage": {"reply": lambda messages: "this is not JSON"},
}  # a reply mem0 cannot parse


@pytest.fixture
def faulty_llm(monkeypatch, request):
    """A loopback OpenAI-compatible LLM in the mode the test is parametrised with."""
    monkeypatch.setenv("OPENAI_API_KEY", "test-placeholder")
    monkeypatch.delenv("OPENROUTER_API_KEY", raising=False)
    with FaultServer(**FAULT_MODES[getattr(request, "param", "reject")]) as server:
        yield server, {"provider": "openai", "config": {"model": "faulty", "openai_base_url": server.url}}


def two_session_item() -> Item:
    history = [
        Message("user", f"In session {s} I said my {thing} is {value}.", {"session_id": f"s{s}"})
        for s, (thing, value) in enumerate([("bike", "red"), ("cat", "Miso")], 1)
    ]
    return Item("faulty-item", tuple(history), Message("user", "What colour is my bike?"), "red")


@pytest.mark.parametrize(
    "faulty_llm, cause", [("reject", "injected 400"), ("garbage", "mem0 logged errors")], indirect=["faulty_llm"]
)
def test_defect_07_failed_adds_are_retried_then_reported_with_their_cause(faulty_llm, tmp_path, cause):
    server, llm = faulty_llm
    item = two_session_item()
    report = Mem0(infer=True, llm=llm, retries=1).ingest(item.sessions(), context_for(item, tmp_path))

    assert report.stored == 0 and report.loss == 1.0
    assert [f.session_id for f in report.failures] == ["s1", "s2"]
    assert all(f.attempts == 2 and cause in f.cause for f in report.failures), report.failures
    assert len(server.requests) == 4  # two sessions, two attempts each


@pytest.mark.slow
@pytest.mark.parametrize(
    "isolation, cause",
    [
        ("none", "injected 400"),  # in the harness's process: mem0 reaches the faulty endpoint itself
        pytest.param(  # in its confined worker: an undeclared endpoint is refused
            "process",
            "Connection error",
            marks=pytest.mark.skipif(not network_confined(), reason="needs Landlock ABI 4 (Linux 6.7+)"),
        ),
    ],
)
def test_runner_turns_mem0_ingest_loss_into_an_ingest_error(faulty_llm, tmp_path, isolation, cause):
    _, llm = faulty_llm
    summary = run(
        RunConfig(
            task="synthetic-memory",
            strategies=["mem0"],
            out=tmp_path / "run",
            budgets=[512],
            limit=1,
            max_concurrency=1,
            task_options={"items": 1, "history_tokens": 600},
            strategy_params={"mem0": {"infer": True, "llm": llm, "retries": 0}},
            isolation=isolation,
        )
    )
    assert (summary.results, summary.violations, summary.errors) == (0, 0, 1)
    rows = [json.loads(line) for line in next((tmp_path / "run" / "cells").rglob("r0.jsonl")).read_text().splitlines()]
    error = next(r for r in rows if r["event"] == "error")
    assert error["phase"] == "ingest" and cause in error["cause"]
    saved = json.loads(next((tmp_path / "run" / "retrievals" / "mem0").glob("*.json")).read_text())
    assert saved["ingest"]["failures"] and saved["ranked"] == []


@pytest.mark.slow
def test_mem0_run_end_to_end_has_no_violations(tmp_path):
    summary = run(
        RunConfig(
            task="synthetic-memory",
            strategies=["mem0"],
            out=tmp_path / "run",
            budgets=[256, 512],
            limit=1,
            max_concurrency=1,
            task_options={"items": 1, "history_tokens": 600},
            strategy_params={"mem0": {"top_k": 10}},
        )
    )
    assert (summary.results, summary.violations, summary.errors) == (2, 0, 0)
    saved = list((tmp_path / "run" / "retrievals" / "mem0").glob("*.json"))
    assert len(saved) == 1  # retrieved once, reused by both tiers
    assert len(json.loads(saved[0].read_text())["ranked"]) == 10


def test_mem0_refuses_keys_in_its_config_and_infer_without_an_llm():
    with pytest.raises(ValueError, match="environment variable"):
        Mem0(infer=True, llm={"provider": "openai", "config": {"model": "m", "api_key": "sk-secret"}})
    with pytest.raises(ValueError, match="needs an llm block"):
        Mem0(infer=True)


def test_mem0_passes_the_conformance_kit(budgetbench_kit):
    """The kit every plugin author runs: budget, determinism, reset, ingest failures reported."""
    from budgetbench_strategy_mem0.plugin import Mem0

    budgetbench_kit.assert_conforms(Mem0)
