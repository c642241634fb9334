"""A strategy never sees the grading key: the answer, the category, the item's metadata, the
evidence marks and a task's grading-only message metadata (``Task.hidden_metadata``).

Vendors benchmark their own memory layer, so a strategy that could read ``item.answer`` or the
evidence marks could put the answer in the prompt or keep exactly the evidence. These run the
real runner on ``synthetic-memory`` (the LongMemEval sample is checked in the plugin's tests,
``plugins/budgetbench-task-longmemeval/tests/test_longmemeval_grading_key.py``) with a spy strategy,
and check that grading, evidence recall and the report still use the runner's own copy.
"""

from __future__ import annotations

import types
from pathlib import Path

import pytest

from budgetbench_core import (
    EVIDENCE_ID_KEY,
    EVIDENCE_KEY,
    Episode,
    EpisodicTask,
    Item,
    Message,
    RunConfig,
    Step,
    Task,
    hookimpl,
    run,
    sandbox,
)
from budgetbench_core.builtin.strategies import Truncation
from budgetbench_core.builtin.synthetic_memory import SyntheticMemory
from budgetbench_core.engine.intake import canonical_item
from budgetbench_core.host import wire
from budgetbench_core.plugins import PluginError
from budgetbench_core.report import write_report
from budgetbench_core.runlog import final_rows, iter_events
from budgetbench_core.testing import FaultServer, registry_with


def seen_by_spy(out: Path) -> list[dict]:
    """What the spy reported it could see, per prompt it built (from its own process, via its audit)."""
    return [
        e["strategy_audit"]["seen"]
        for e in iter_events(out)
        if e["event"] == "prompt_audit" and e["strategy"] == "trust-key-spy"
    ]


TASK_OPTIONS = {"items": 5, "history_tokens": 400}  # one item per category
BUDGET = 4000  # the whole history fits: truncation keeps every evidence message


def visible(item: Item, history) -> dict:
    """Everything grading-related a strategy could read from its arguments."""
    messages = [*history, *item.history, item.query, *([item.system] if item.system else [])]
    return {
        "id": item.id,
        "answer": item.answer,
        "category": item.category,
        "metadata": dict(item.metadata),
        "message_keys": sorted({key for m in messages for key in m.metadata}),
        "session_ids": sorted({str(m.metadata.get("session_id")) for m in messages}),
    }


class KeySpy(Truncation):
    """Truncation that records what it could have used to cheat."""

    name = "trust-key-spy"

    def apply(self, history, budget, context):
        context.audit["seen"] = visible(context.item, history)  # reported back: it runs in its own process
        return super().apply(history, budget, context)


class LeakyTask(SyntheticMemory):
    """synthetic-memory with a grading-only message key of its own."""

    name = "trust-leaky-task"
    hidden_metadata = frozenset({"gold_turn"})

    def _item(self, index, category, rng):
        item = super()._item(index, category, rng)
        history = tuple(
            Message(m.role, m.content, {**m.metadata, "gold_turn": EVIDENCE_KEY in m.metadata, "kept": 1})
            for m in item.history
        )
        return Item(item.id, history, item.query, item.answer, item.system, item.category, item.metadata)


class BadDeclaration(SyntheticMemory):
    name = "trust-bad-hidden"
    hidden_metadata = "has_answer"  # a str, not a set of keys


class Plugin:
    @hookimpl
    def register_strategies(self, register):
        register(KeySpy)

    @hookimpl
    def register_tasks(self, register):
        for task in (LeakyTask, BadDeclaration):
            register(task)


@pytest.fixture(scope="module")
def registry():
    return registry_with(Plugin(), distribution="budgetbench-grading-key-test")


def gold_reply(task: Task):
    """A 'model' that knows the answers: every cell is correct if and only if grading reads the gold."""
    answers = {item.query.content: str(item.answer) for item in task.load(None, 0)}
    return lambda messages: answers.get(messages[-1]["content"], "no idea")


def spy_run(tmp_path: Path, registry, task: str) -> tuple[Path, dict]:
    out = tmp_path / "run"
    with FaultServer(reply=gold_reply(SyntheticMemory(**TASK_OPTIONS))) as server:
        run(
            RunConfig(
                task=task,
                strategies=["trust-key-spy", "truncation"],
                budgets=[BUDGET],
                out=out,
                api_base=server.url,
                model="openai/fault-model",
                tokenizer="tiktoken:cl100k_base",
                task_options=TASK_OPTIONS,
                max_concurrency=1,
                retries=0,
                timeout_s=30.0,
            ),
            registry=registry,
        )
    return out, final_rows(out)


def test_a_spy_strategy_sees_no_grading_key_and_grading_still_uses_it(tmp_path, registry):
    """Old code: the spy read every answer, category, the item's evidence list and the marks."""
    out, rows = spy_run(tmp_path, registry, "synthetic-memory")
    assert len(seen_by_spy(out)) == 5
    for seen in seen_by_spy(out):
        assert (seen["answer"], seen["category"], seen["metadata"]) == (None, None, {}), seen
        assert EVIDENCE_KEY not in seen["message_keys"] and EVIDENCE_ID_KEY not in seen["message_keys"]
        assert {"session_id", "timestamp"} <= set(seen["message_keys"])  # the rest is still there
    results = [r for r in rows.values() if r["event"] == "result"]
    assert len(results) == 10 and all(r["quality"] == 1.0 for r in results)  # graded on the runner's gold
    assert {r["category"] for r in results} == {
        "single-session",
        "knowledge-update",
        "temporal",
        "preference",
        "abstention",
    }
    audits = {(e["strategy"], e["item_id"]): e for e in iter_events(out) if e["event"] == "prompt_audit"}
    for (_, item_id), audit in audits.items():
        honest = audits[("truncation", item_id)]
        assert audit["prompt_hash"] == honest["prompt_hash"]  # nothing to leak: the spy's prompt is truncation's
        if item_id.endswith("abstention"):
            assert audit["evidence"] is None
        else:  # evidence recall is measured on the runner's marks
            assert audit["evidence"]["marked"] >= 1 and audit["evidence"]["dropped"] == []
    assert "single-session" in write_report(out, formats=["md"])["md"].read_text()


def test_an_honest_strategy_builds_the_same_prompt_as_on_the_whole_item(tmp_path, registry):
    """The audit of an honest strategy is what it would build from the runner's own item."""
    out, _ = spy_run(tmp_path, registry, "synthetic-memory")
    audits = [e for e in iter_events(out) if e["event"] == "prompt_audit" and e["strategy"] == "truncation"]
    items = {i.id: i for i in SyntheticMemory(**TASK_OPTIONS).load(None, 0)}
    for audit in audits:
        item = items[audit["item_id"]]
        assert [(m["role"], m["content"]) for m in audit["messages"]] == [
            (m.role, m.content) for m in item.frame(list(item.history))
        ]


def test_a_task_declares_its_own_grading_only_message_keys(tmp_path, registry):
    """Old code: ``gold_turn`` (and the evidence marks) reached the strategy."""
    out, rows = spy_run(tmp_path, registry, "trust-leaky-task")
    assert len(seen_by_spy(out)) == 5
    for seen in seen_by_spy(out):
        assert "gold_turn" not in seen["message_keys"] and "kept" in seen["message_keys"]
    assert all(r["event"] == "result" and r["quality"] == 1.0 for r in rows.values())


def test_a_malformed_declaration_is_a_clear_error_before_the_run(tmp_path, registry):
    with pytest.raises(PluginError, match=r"'trust-bad-hidden': hidden_metadata must be a frozenset.*got str"):
        spy_run(tmp_path, registry, "trust-bad-hidden")
    assert not (tmp_path / "run" / "cells").exists()


def test_the_view_withholds_the_key_and_still_catches_mutation():
    meta = {"session_id": "s1", EVIDENCE_KEY: True, EVIDENCE_ID_KEY: "e1", "gold": 1, "nested": {"a": [1]}}
    item = Item(
        "i",
        (Message("user", "the fact", meta), Message("assistant", "ok", {"gold": 2})),
        Message("user", "q?", {"gold": 3}),
        "the answer",
        system=Message("system", "sys", {"gold": 4}),
        category="single-session",
        metadata={"evidence": ["the fact"]},
    )
    view = sandbox.PrivateView(item, frozenset({"gold"}))
    shown = view.item
    assert (shown.answer, shown.category, dict(shown.metadata)) == (None, None, {})
    assert [dict(m.metadata) for m in (*shown.history, shown.query, shown.system)] == [
        {"session_id": "s1", "nested": {"a": [1]}},
        {},
        {},
        {},
    ]
    assert item.answer == "the answer" and dict(item.history[0].metadata) == meta  # the runner's copy is whole
    assert view.intact()
    shown.history[0].metadata["nested"]["a"].append(2)
    assert not view.intact()


def test_the_sealed_view_of_an_isolated_strategy_withholds_the_same_keys():
    """What crosses to a worker is made from ``SealedView``: the same fields as ``PrivateView``
    withholds, without copying the messages that carry none of them."""
    meta = {"session_id": "s1", EVIDENCE_KEY: True, EVIDENCE_ID_KEY: "e1", "gold": 1}
    plain = Message("assistant", "ok", {"session_id": "s1"})
    item = canonical_item(
        "t",
        Item(
            "i",
            (Message("user", "the fact", meta), plain),
            Message("user", "q?", {"gold": 3}),
            "the answer",
            system=Message("system", "sys", {"gold": 4}),
            category="single-session",
            metadata={"evidence": ["the fact"]},
        ),
    )
    sealed = sandbox.SealedView(item, frozenset({"gold"}), "item-0123")
    private = sandbox.PrivateView(item, frozenset({"gold"}), "item-0123")
    assert wire.view_to_wire(sealed.item) == wire.view_to_wire(private.item)
    shown = sealed.item
    assert (shown.id, shown.answer, shown.category, dict(shown.metadata)) == ("item-0123", None, None, {})
    assert dict(shown.history[0].metadata) == {"session_id": "s1"} and shown.history[1] is item.history[1]
    assert dict(item.history[0].metadata) == meta and item.answer == "the answer"  # the runner's copy is whole


class _GoldEpisode(Episode):
    """Two turns; every message the task makes carries grading-only metadata."""

    def opening(self):
        return [Message("assistant", "Hello.", {"gold": "9", EVIDENCE_KEY: True}), Message("user", "10 minus 1?")]

    def step(self, reply):
        done = "again" in reply
        return Step((Message("assistant", reply, {"gold": "9"}), Message("user", "again?", {"gold": "9"})), done=done)

    def outcome(self, end_reason):
        return {"reward": 1.0}


class GoldEpisodes(EpisodicTask):
    name, default_grader, max_output_tokens = "trust-gold-episodes", "exact-match", 8
    hidden_metadata = frozenset({"gold"})

    def load(self, limit, seed):
        yield Item(id="episode", history=(), query=Message("user", "10"), answer="9", category="arithmetic")

    def episode(self, item, user):
        return _GoldEpisode()


def test_an_agent_episodes_turns_hold_no_grading_key(tmp_path):
    """Old code: every turn's view showed the answer, the category, ``gold`` and the evidence mark."""
    plugin = types.SimpleNamespace(
        register_tasks=hookimpl(lambda register: register(GoldEpisodes)),
        register_strategies=hookimpl(lambda register: register(KeySpy)),
    )
    with FaultServer(reply=lambda messages: "9 again" if len(messages) > 3 else "9") as server:
        run(
            RunConfig(
                task="trust-gold-episodes",
                strategies=["trust-key-spy"],
                budgets=[500],
                out=tmp_path / "run",
                model="openai/fault-model",
                api_base=server.url,
                tokenizer="tiktoken:cl100k_base",
                retries=0,
            ),
            registry=registry_with(plugin, distribution="gold-episodes-test"),
        )
    (row,) = final_rows(tmp_path / "run").values()
    assert row["event"] == "result" and row["episode"]["turns"] >= 2
    assert len(seen_by_spy(tmp_path / "run")) == row["episode"]["turns"]
    for seen in seen_by_spy(tmp_path / "run"):
        assert (seen["answer"], seen["category"], seen["metadata"]) == (None, None, {})
        assert not {"gold", EVIDENCE_KEY} & set(seen["message_keys"]), seen["message_keys"]
