"""A memory system's ingest sees an item's history and nothing of its question.

Ingest is a write: its cost is amortised over the item's questions and its calls are not
budgeted. A system that saw the question while ingesting could answer it there, with the whole
history in one unbudgeted call, and hand the answer back as a "memory" at retrieve: a
question's work charged as a write. The harness drives ingest and retrieve itself (in the
plugin's worker, or in-process with ``--isolation none``) and gives ingest a view without the
question or the system prompt; the question arrives at ``retrieve``.
"""

from __future__ import annotations

import types

import pytest

from budgetbench_core import MemorySystem, Regime, RunConfig, hookimpl, run
from budgetbench_core.memory_systems import IngestReport, RetrievedItem
from budgetbench_core.runlog import final_rows, iter_events
from budgetbench_core.testing import FaultServer, registry_with

ITEMS = 3


class QuestionPeeker(MemorySystem):
    """Writes into its audit what its ingest and its retrieve could see of the item."""

    name = "question-peeker"
    regime = Regime.PERSISTENT_STATEFUL

    def reset(self):
        self.sessions = []

    def ingest(self, sessions, context):
        self.sessions = list(sessions)
        item = context.item
        context.audit["ingest_saw"] = {
            "query": item.query.content,
            "system": None if item.system is None else item.system.content,
            "history": len(item.history),
        }
        return IngestReport(len(sessions), len(sessions), [])

    def retrieve(self, query, context):
        context.audit["retrieve_saw"] = {"query": query, "item_query": context.item.query.content}
        return [RetrievedItem(m.content, 1.0) for s in self.sessions for m in s.messages][:3]


PLUGIN = types.SimpleNamespace(register_strategies=hookimpl(lambda register: register(QuestionPeeker)))


@pytest.mark.parametrize("isolation", ["process", "none"])
def test_ingest_sees_the_history_and_not_the_question(tmp_path, isolation):
    """Old code: ingest was given the item's view with its question (in both isolation modes)."""
    out = tmp_path / "run"
    with FaultServer() as server:
        run(
            RunConfig(
                task="synthetic-memory",
                strategies=["question-peeker"],
                budgets=[300, 2000],
                out=out,
                api_base=server.url,
                model="openai/fault-model",
                tokenizer="tiktoken:cl100k_base",
                task_options={"items": ITEMS, "history_tokens": 400},
                max_concurrency=1,
                retries=0,
                timeout_s=30.0,
                isolation=isolation,
            ),
            registry=registry_with(PLUGIN, distribution="question-peeker"),
        )
    assert all(row["event"] == "result" for row in final_rows(out).values())
    audits = [e for e in iter_events(out) if e["event"] == "prompt_audit"]
    ingested = [a for a in audits if "ingest_saw" in a["strategy_audit"]]
    assert len(ingested) == ITEMS  # once per item, whichever tier ran first
    for audit in ingested:
        saw, question = audit["strategy_audit"]["ingest_saw"], audit["messages"][-1]["content"]
        assert question and saw["history"] > 0
        assert saw["query"] == "" and saw["system"] is None
        retrieved = audit["strategy_audit"]["retrieve_saw"]
        assert retrieved["query"] == retrieved["item_query"] == question
