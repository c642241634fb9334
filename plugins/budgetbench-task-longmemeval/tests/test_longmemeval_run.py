"""End to end on the embedded model: the real runner, the official judge, ingest loss, export.

One small run serves every test here (CPU is shared): LongMemEval oracle, two questions,
budget 512, three arms: ``truncation``, ``full_context`` (over budget: violations) and a
small real memory system that refuses one chosen session of the first question.
"""

import json
from pathlib import Path

import pytest
from budgetbench_task_longmemeval.judge_prompts import PROMPT_VERSION, read_verdict
from budgetbench_task_longmemeval.task import LongMemEval

from budgetbench_core import (
    IngestFailure,
    IngestReport,
    MemorySystem,
    Regime,
    RetrievedItem,
    RunConfig,
    final_rows,
    hookimpl,
    run,
)
from budgetbench_core.testing import invoke_cli, registry_with

DATA = Path(__file__).resolve().parents[3] / ".." / "shared" / "data" / "longmemeval"
ORACLE = DATA / "longmemeval_oracle.json"
pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(2400),
    pytest.mark.skipif(not ORACLE.is_file(), reason=f"LongMemEval data not found in {DATA}"),
]

ARM = "lme-test-word-memory"
BUDGET = 512  # small: prompt processing on a shared 2-core machine is slow


class WordMemory(MemorySystem):
    """Stores each message; retrieves by shared words. Refuses ``fail_session`` of the question
    whose first message is ``fail_item`` like a layer whose write failed (session ids are per
    question: s1, s2, ...)."""

    name = ARM
    regime = Regime.RESET_PER_ITEM

    def __init__(self, fail_item: str | None = None, fail_session: str | None = None, **params):
        super().__init__(fail_item=fail_item, fail_session=fail_session, **params)
        self.fail_item = fail_item
        self.fail_session = fail_session
        self.stored: list[tuple[str, str]] = []

    def reset(self):
        self.stored = []

    def ingest(self, sessions, context):
        failures = []
        for session in sessions:
            if sessions[0].messages[0].content == self.fail_item and session.id == self.fail_session:
                failures.append(IngestFailure(session.id, "write rejected by the store (test fault)", attempts=3))
                continue
            self.stored += [(session.id, m.content) for m in session.messages]
        return IngestReport(len(sessions), len(sessions) - len(failures), failures)

    def retrieve(self, query, context):
        words = set(query.lower().split())
        scored = sorted(
            ((len(words & set(text.lower().split())), sid, text) for sid, text in self.stored), key=lambda s: -s[0]
        )
        return [RetrievedItem(text, float(score), sid) for score, sid, text in scored[:40]]


class WordMemoryPlugin:
    @hookimpl
    def register_strategies(self, register):
        register(WordMemory)


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    items = list(LongMemEval(path=str(ORACLE)).load(2, 0))
    lost_question, kept_question = items[0].id, items[1].id
    lost_text = items[0].history[0].content  # how the arm knows the item at ingest: its view's id is opaque
    fail_session = items[0].sessions()[0].id
    registry = registry_with(WordMemoryPlugin(), distribution="lme-test-memory")
    out = tmp_path_factory.mktemp("lme-run")
    config = RunConfig(
        task="longmemeval",
        strategies=["truncation", "full_context", ARM],
        out=out,
        budgets=[BUDGET],
        task_options={"path": str(ORACLE)},
        strategy_params={ARM: {"fail_item": lost_text, "fail_session": fail_session}},
        limit=2,
        max_concurrency=1,
        timeout_s=600,
        retries=1,
    )
    summary = run(config, registry=registry)
    return {
        "out": out,
        "summary": summary,
        "rows": final_rows(out),
        "lost": lost_question,
        "kept": kept_question,
        "fail_session": fail_session,
    }


def row(finished, strategy, question):
    return finished["rows"][("longmemeval", strategy, BUDGET, 0, question)]


def test_arm_that_loses_a_session_on_ingest_errors_on_that_question_only(finished_run):
    lost = row(finished_run, ARM, finished_run["lost"])
    assert lost["event"] == "error" and lost["phase"] == "ingest"
    assert finished_run["fail_session"] in lost["cause"] and "write rejected" in lost["cause"]
    assert row(finished_run, ARM, finished_run["kept"])["event"] == "result"
    for question in (finished_run["lost"], finished_run["kept"]):
        assert row(finished_run, "truncation", question)["event"] == "result"
        assert row(finished_run, "full_context", question)["event"] == "violation"


def test_retrieval_is_saved_once_per_arm_and_question(finished_run):
    folder = finished_run["out"] / "retrievals" / ARM
    saved = {p.stem: json.loads(p.read_text()) for p in folder.glob("*.json")}
    assert set(saved) == {finished_run["lost"], finished_run["kept"]}
    lost = saved[finished_run["lost"]]
    assert [f["session_id"] for f in lost["ingest"]["failures"]] == [finished_run["fail_session"]]
    assert lost["ranked"] == []  # nothing retrieved from a store known to be incomplete
    assert saved[finished_run["kept"]]["ingest"]["failures"] == [] and saved[finished_run["kept"]]["ranked"]


def test_judge_rows_record_judge_model_prompt_version_and_raw_verdict(finished_run):
    results = [r for r in finished_run["rows"].values() if r["event"] == "result"]
    assert len(results) == 3
    for result in results:
        verdict = result["verdict"]
        assert result["grader"] == {"name": "longmemeval-judge", "version": PROMPT_VERSION}
        assert verdict["judge_model"] == "local" and verdict["prompt_version"] == PROMPT_VERSION
        assert verdict["prompt"] == result["category"]  # neither question is an abstention question
        if result["prediction"].strip():
            assert isinstance(verdict["raw_verdict"], str)
            assert result["quality"] == float(read_verdict(verdict["raw_verdict"]))
        else:
            assert result["quality"] == 0.0 and verdict["raw_verdict"] is None


def test_export_drops_the_lost_question_for_every_arm_and_lists_it(finished_run, tmp_path):
    outcome = invoke_cli("longmemeval", "export", str(finished_run["out"]), "--out", str(tmp_path))
    assert outcome.exit_code == 0, outcome.output
    assert f"dropped for every arm (ingest loss): {finished_run['lost']}" in outcome.output
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert list(summary["dropped_for_ingest_loss"]) == [finished_run["lost"]]
    assert summary["dropped_for_ingest_loss"][finished_run["lost"]][0]["strategy"] == ARM
    for arm in ("truncation", "full_context", ARM):
        lines = [
            json.loads(line)
            for line in (tmp_path / "hypotheses" / arm / str(BUDGET) / "r0.jsonl").read_text().splitlines()
        ]
        assert [set(line) for line in lines] == [{"question_id", "hypothesis"}]  # the official shape
        assert [line["question_id"] for line in lines] == [finished_run["kept"]]
        expected = "" if arm == "full_context" else row(finished_run, arm, finished_run["kept"])["prediction"]
        assert lines[0]["hypothesis"] == expected
    cells = {c["strategy"]: c for c in summary["cells"]}
    assert cells["full_context"]["ceiling"] and cells["full_context"]["violations"] == 1
    assert cells["full_context"]["overall"] == {
        "correct": 0,
        "n": 1,
        "accuracy": 0.0,
        "low": 0.0,
        "high": pytest.approx(0.9487, abs=1e-4),
    }  # Wilson, boundary fix
    quality = row(finished_run, "truncation", finished_run["kept"])["quality"]
    assert cells["truncation"]["overall"]["correct"] == quality


def test_core_report_lists_the_question_dropped_for_ingest_loss(finished_run):
    report = pytest.importorskip("budgetbench_core.report", reason="the core report is not installed")
    paths = report.write_report(finished_run["out"], formats=("json",))
    data = json.loads(Path(paths["json"]).read_text())
    lost = [entry["item_id"] for entry in data["ingest_lost"]]
    assert lost == [finished_run["lost"]]
