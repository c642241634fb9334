"""NL assertions: judged with --judge-model (strict verdicts, apart from the reward), null without."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest
from budgetbench_task_taubench.judging import conversation, parse_verdict

from budgetbench_core import final_rows
from budgetbench_core.testing import FaultServer, invoke_cli

sys.path.insert(0, str(Path(__file__).resolve().parent))
from taubench_support import DATA, needs_data  # noqa: E402

TASK = "create_task_1_nl_eval"  # two NL assertions


def test_verdicts_are_parsed_strictly():
    assert parse_verdict('{"reasoning": "it did", "metExpectation": true}') == (True, "it did")
    assert parse_verdict('```json\n{"metExpectation": false, "reasoning": "no"}\n```') == (False, "no")
    for reply in (
        "Yes, the agent met it.",
        'Sure: {"reasoning": "x", "metExpectation": true}',  # text around the object
        '{"reasoning": "x", "metExpectation": "true"}',  # a string, not a boolean
        '{"reasoning": "x"}',
        '{"reasoning": 3, "metExpectation": true}',
        '[{"metExpectation": true}]',
        "",
    ):
        assert parse_verdict(reply) is None, reply


def test_the_conversation_shows_messages_tool_calls_and_results():
    text = conversation(
        [
            {"role": "user", "content": "make a task"},
            {"role": "assistant", "tool_call": {"name": "create_task", "arguments": {"title": "t"}}},
            {"role": "tool", "content": '{"task_id": "task_2"}', "error": False},
            {"role": "assistant", "content": "Done."},
        ]
    )
    assert text.splitlines() == [
        "user: make a task",
        'assistant: [tool call] {"name": "create_task", "arguments": {"title": "t"}}',
        'tool: {"task_id": "task_2"}',
        "assistant: Done.",
    ]


def _one_task(tmp_path: Path) -> tuple[Path, list[str]]:
    """A copy of the mock domain whose only task is ``TASK``, and that task's assertions."""
    folder = tmp_path / "mock"
    shutil.copytree(DATA / "mock", folder)
    (folder / "split_tasks.json").write_text(json.dumps({"base": [TASK]}))
    task = next(t for t in json.loads((folder / "tasks.json").read_text()) if t["id"] == TASK)
    return folder, task["evaluation_criteria"]["nl_assertions"]


def _loopback_reply(messages: list[dict]) -> str:
    """The agent ends at once; the judge meets the first assertion and mumbles on the second."""
    if not messages[0]["content"].startswith("You grade"):
        return json.dumps({"name": "respond", "arguments": {"content": "Bye ###STOP###"}})
    if messages[-1]["content"].endswith("The task is created successfully"):
        return '{"reasoning": "it was", "metExpectation": true}'
    return "I think the user was complimented."


@needs_data
def test_loopback_judge_verdicts_are_recorded_apart_from_the_reward(tmp_path):
    folder, assertions = _one_task(tmp_path)
    model = ["--model", "openai/fault-model", "--tokenizer", "tiktoken:cl100k_base"]
    with FaultServer(reply=_loopback_reply) as server:
        judged = _run(folder, tmp_path / "judged", *model, "--api-base", server.url, "--judge-model", model[1])
        assert server.completions() == 3  # the agent's one call, then one judge call per assertion
        plain = _run(folder, tmp_path / "plain", *model, "--api-base", server.url)
        assert server.completions() == 4
    figure = judged["episode"]["outcome"]["nl_assertions"]
    assert [(c["assertion"], c["verdict"], c["met"]) for c in figure["assertions"]] == [
        (assertions[0], "met", True),
        (assertions[1], "unparseable", None),
    ]
    assert figure["assertions"][0]["reasoning"] == "it was"
    assert figure["assertions"][1]["raw"] == "I think the user was complimented."
    assert (figure["met"], figure["total"], figure["unparseable"]) == (1, 2, 1)
    assert plain["episode"]["outcome"]["nl_assertions"] is None
    assert judged["quality"] == plain["quality"] == plain["episode"]["reward"]  # the reward ignores the judge
    assert judged["episode"]["calls"] == plain["episode"]["calls"] == 1


def _run(folder: Path, out: Path, *more: str) -> dict:
    result = invoke_cli(
        "run",
        "-t",
        "tau-bench",
        "--task-option",
        "domain=mock",
        "--task-option",
        "user=scripted",
        "--task-option",
        f"path={folder}",
        "--task-option",
        "max_turns=1",
        "-s",
        "truncation",
        "-b",
        "6144",  # the served context must hold the user simulator's and the judge's prompts
        "--timeout",
        "900",
        *more,
        "--out",
        str(out),
    )
    assert result.exit_code == 0, result.output
    (row,) = final_rows(out).values()
    return row


@needs_data
@pytest.mark.slow
def test_nl_assertions_judged_only_with_a_judge(tmp_path):
    folder, assertions = _one_task(tmp_path)
    judged = _run(folder, tmp_path / "judged", "--judge-model", "local")
    outcome = judged["episode"]["outcome"]
    figure = outcome["nl_assertions"]
    assert figure["total"] == len(assertions) == 2 and figure["judge_model"] == "local"
    assert [c["assertion"] for c in figure["assertions"]] == assertions
    for check in figure["assertions"]:
        assert check["verdict"] in ("met", "not met", "unparseable"), check
        assert isinstance(check["raw"], str) and check["prompt_tokens"] > 0
        assert check["met"] == {"met": True, "not met": False, "unparseable": None}[check["verdict"]]
        assert (check["verdict"] == "unparseable") == (parse_verdict(check["raw"]) is None)
    assert figure["met"] == sum(c["met"] is True for c in figure["assertions"])
    assert figure["unparseable"] == sum(c["verdict"] == "unparseable" for c in figure["assertions"])
    # apart from the reward, and not budgeted: no prompt audit or auxiliary call for the judge
    assert judged["quality"] == judged["episode"]["reward"] == outcome["reward"]
    assert "NL_ASSERTION" not in outcome["breakdown"]
    assert judged["aux_calls"] == 0
    audits = [
        line for path in (tmp_path / "judged" / "cells").rglob("*.jsonl") for line in path.read_text().splitlines()
    ]
    assert sum('"prompt_audit"' in line for line in audits) == judged["episode"]["calls"]

    plain = _run(folder, tmp_path / "plain")
    outcome = plain["episode"]["outcome"]
    assert outcome["nl_assertions"] is None  # not judged, never 0
    assert outcome["nl_assertions_listed"] == assertions
