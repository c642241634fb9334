"""A grader's judge calls are charged to their cell (``metered.judge`` on the terminal row), so
"tokens per question, end to end" includes the judge."""

from __future__ import annotations

import types

from budgetbench_core import Grader, Message, PromptCounter, RunConfig, Verdict, final_rows, hookimpl, run
from budgetbench_core.testing import FaultServer, registry_with, tokenizer_for


class AskTheJudge(Grader):
    """Asks the run's judge once per answer (the reply does not matter here)."""

    name = "ask-the-judge"
    binary = True

    def grade(self, item, prediction, context):
        context.judge([Message("user", f"Is {prediction[:40]!r} an answer to the question?")], 4)
        return Verdict(0.0)


PLUGIN = types.SimpleNamespace(register_graders=hookimpl(lambda register: register(AskTheJudge)))


def test_each_judge_call_is_on_its_cells_row_with_its_exact_tokens(tmp_path):
    with FaultServer() as server:
        summary = run(
            RunConfig(
                task="synthetic-memory",
                strategies=["truncation"],
                budgets=[400],
                out=tmp_path / "run",
                model="openai/fault-model",
                api_base=server.url,
                tokenizer="tiktoken:cl100k_base",
                grader="ask-the-judge",
                retries=0,
                task_options={"items": 3, "history_tokens": 600},
            ),
            registry=registry_with(PLUGIN, distribution="judge-test"),
        )
        requests = len(server.requests)
    counter = PromptCounter(tokenizer_for("tiktoken:cl100k_base"))
    rows = [r for r in final_rows(tmp_path / "run").values() if r["event"] == "result"]
    assert len(rows) == 3 and requests == summary.model_calls == 6  # an answer and a judge call each
    for row in rows:
        judge = row["metered"]["judge"]
        asked = [Message("user", f"Is {row['prediction'][:40]!r} an answer to the question?")]
        assert judge["calls"] == 1 and judge["input_tokens"] == counter.count(asked)
