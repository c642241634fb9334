"""No arm can find LongMemEval's evidence by its labels: the real runner on the LongMemEval_S
sample, a spy strategy and a spy memory system, a loopback 'model' that knows the answers.

Upstream, the evidence sessions are named ``answer_...`` and the evidence turns carry
``has_answer``. A strategy (or a vendor's memory layer) sees neither, nor the answer, the
question type, ``answer_session_ids`` or the evidence marks; grading, evidence recall (on the
official ids), the core report and ``longmemeval export`` still read the runner's own copy.
"""

import json
from pathlib import Path

import pytest
from budgetbench_task_longmemeval.task import LongMemEval

from budgetbench_core import (
    EVIDENCE_ID_KEY,
    EVIDENCE_KEY,
    IngestReport,
    MemoryStrategy,
    MemorySystem,
    Regime,
    RetrievedItem,
    RunConfig,
    final_rows,
    hookimpl,
    iter_events,
    run,
)
from budgetbench_core.testing import FaultServer, invoke_cli, registered, registry_with

DATA = Path(__file__).resolve().parents[3] / ".." / "shared" / "data" / "longmemeval"
SAMPLE = DATA / "longmemeval_s_sample.json"
pytestmark = pytest.mark.skipif(not SAMPLE.is_file(), reason=f"LongMemEval data not found in {DATA}")

LIMIT, BUDGET = 6, 2048
GRADING_ONLY = {"has_answer", "official_session_id", EVIDENCE_KEY, EVIDENCE_ID_KEY}


def record(where, item, messages, context):
    """What the spy could see, reported in its audit (it runs in a worker process of its own)."""
    context.audit.setdefault("seen", []).append(
        {
            "where": where,
            "answer": item.answer,
            "category": item.category,
            "metadata": dict(item.metadata),
            "keys": sorted({key for m in messages for key in m.metadata}),
            "session_ids": sorted(
                {str(m.metadata.get("session_id")) for m in messages} | {s.id for s in item.sessions()}
            ),
        }
    )


def seen_in(out) -> list[dict]:
    """Every spy's reports, from the prompt audits of the run."""
    reports = [
        report
        for e in iter_events(out)
        if e["event"] == "prompt_audit" and e["strategy"] != "truncation"
        for report in e["strategy_audit"].get("seen", [])
    ]
    return [r | {"keys": set(r["keys"]), "session_ids": set(r["session_ids"])} for r in reports]


class Spy(MemoryStrategy):
    """The built-in truncation, recording what it could have used to cheat."""

    name, regime = "lme-key-spy", Regime.LOCAL_ONLY

    def __init__(self, **params):
        super().__init__(**params)
        self.truncation = registered("strategy", "truncation").obj()

    def apply(self, history, budget, context):
        record("strategy", context.item, [*history, *context.item.history], context)
        return self.truncation.apply(history, budget, context)


class SpyMemory(MemorySystem):
    """A memory layer that would keep the labelled evidence if it could see it."""

    name = "lme-key-spy-memory"
    regime = Regime.RESET_PER_ITEM

    def reset(self):
        self.stored = []

    def ingest(self, sessions, context):
        messages = [m for s in sessions for m in s.messages]
        record("memory", context.item, messages, context)
        self.stored = [(s.id, m) for s in sessions for m in s.messages]
        return IngestReport(len(sessions), len(sessions), [])

    def retrieve(self, query, context):
        labelled = [(sid, m) for sid, m in self.stored if m.metadata.get("has_answer") or sid.startswith("answer_")]
        chosen = labelled or self.stored[-20:]
        return [RetrievedItem(m.content, 1.0, sid) for sid, m in chosen]


class Plugin:
    @hookimpl
    def register_strategies(self, register):
        register(Spy)
        register(SpyMemory)


@pytest.fixture(scope="module")
def spied(tmp_path_factory):
    items = list(LongMemEval(path=str(SAMPLE)).load(LIMIT, 0))
    answers = {item.query.content: str(item.answer) for item in items}
    out = tmp_path_factory.mktemp("lme-key") / "run"
    with FaultServer(reply=lambda messages: answers.get(messages[-1]["content"], "no idea")) as server:
        run(
            RunConfig(
                task="longmemeval",
                strategies=["lme-key-spy", "lme-key-spy-memory", "truncation"],
                budgets=[BUDGET],
                out=out,
                api_base=server.url,
                model="openai/fault-model",
                tokenizer="tiktoken:cl100k_base",
                grader="longmemeval-match",
                task_options={"path": str(SAMPLE)},
                limit=LIMIT,
                max_concurrency=1,
                retries=0,
                timeout_s=60.0,
            ),
            registry=registry_with(Plugin(), distribution="lme-key-spy"),
        )
    return {"out": out, "items": items, "rows": final_rows(out), "seen": seen_in(out)}


def test_no_arm_sees_answer_labels_or_official_session_ids(spied):
    """Old code: the spies read every answer, question type, answer_session_ids, has_answer and answer_ ids."""
    assert {s["where"] for s in spied["seen"]} == {"strategy", "memory"} and len(spied["seen"]) == 2 * LIMIT
    for seen in spied["seen"]:
        assert (seen["answer"], seen["category"], seen["metadata"]) == (None, None, {})
        assert not seen["keys"] & GRADING_ONLY, seen["keys"] & GRADING_ONLY
        assert {"session_id", "timestamp", "session_number", "turn"} <= seen["keys"]
        assert all(sid.startswith("s") and sid[1:].isdigit() for sid in seen["session_ids"]), seen["session_ids"]
    # the runner's copy keeps the official ids, evidence sessions named answer_... among them
    assert any(m.metadata["official_session_id"].startswith("answer_") for i in spied["items"] for m in i.history)


def test_grading_evidence_recall_report_and_export_use_the_runners_copy(spied, tmp_path):
    rows = [r for r in spied["rows"].values() if r["event"] == "result"]
    assert len(rows) == 3 * LIMIT
    gradable = [r for r in rows if r["verdict"]["applicable"] and not r["verdict"]["abstention"]]
    assert gradable and all(r["quality"] == 1.0 for r in gradable)  # the gold answer reached the grader
    assert {r["category"] for r in rows} == {i.category for i in spied["items"]}
    audits = [e for e in iter_events(spied["out"]) if e["event"] == "prompt_audit"]
    marked = [a["evidence"] for a in audits if a["evidence"]]
    assert marked  # evidence recall is measured, under the official ids
    assert all(p.startswith("answer_") for e in marked for p in e["kept"] + e["dropped"])
    honest = {a["item_id"]: a["prompt_hash"] for a in audits if a["strategy"] == "truncation"}
    assert {a["item_id"]: a["prompt_hash"] for a in audits if a["strategy"] == "lme-key-spy"} == honest
    report = invoke_cli("report", str(spied["out"]), "--format", "md")
    assert report.exit_code == 0, report.output
    assert all(i.category in (spied["out"] / "report" / "report.md").read_text() for i in spied["items"])
    outcome = invoke_cli("longmemeval", "export", str(spied["out"]), "--out", str(tmp_path))
    assert outcome.exit_code == 0, outcome.output
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert {c["strategy"] for c in summary["cells"]} == {"lme-key-spy", "lme-key-spy-memory", "truncation"}
