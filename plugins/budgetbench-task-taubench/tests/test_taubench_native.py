"""Native tool calling (``tools=native``): upstream-style schemas, tool calls as actions, and an
episode on the embedded model whose every agent call is counted exactly, tool block included."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from budgetbench_task_taubench.actions import RESPOND, InvalidAction
from budgetbench_task_taubench.domain import DOMAINS
from budgetbench_task_taubench.native import native_actions, tool_schemas
from budgetbench_task_taubench.task import TauBench

from budgetbench_core import Message, final_rows, keep_exchanges, split_exchange
from budgetbench_core.testing import invoke_cli

sys.path.insert(0, str(Path(__file__).resolve().parent))
from taubench_support import DATA, needs_data  # noqa: E402


@pytest.mark.parametrize("domain", sorted(DOMAINS))
def test_every_tool_is_an_openai_function_with_its_signatures_schema(domain):
    toolkit = DOMAINS[domain][1]
    schemas = {s["function"]["name"]: s for s in tool_schemas(toolkit)}
    assert sorted(schemas) == sorted(toolkit.specs())  # every tool once (in upstream's order: below)
    for name, spec in toolkit.specs().items():
        schema = schemas[name]
        parameters = schema["function"]["parameters"]
        assert schema["type"] == "function" and schema["function"]["description"]
        assert parameters["type"] == "object" and parameters["title"] == "parameters"
        assert tuple(parameters.get("required", ())) == spec.required
        assert set(parameters["properties"]) == set(spec.parameters)


UPSTREAM = json.loads((Path(__file__).resolve().parent / "data" / "upstream_tool_schemas.json").read_text())


def _toolkits():
    from budgetbench_task_taubench.telecom_user import TelecomUserTools

    return {**{d: DOMAINS[d][1] for d in ("retail", "airline", "telecom")}, "telecom_user": TelecomUserTools}


def _untexted(parameters):
    """``parameters`` without the arguments' own descriptions (their types, enums, defaults and
    the nested models in ``$defs``, texts included, are kept)."""
    out = dict(parameters)
    out["properties"] = {
        name: {k: v for k, v in value.items() if k != "description"} for name, value in parameters["properties"].items()
    }
    return out


@pytest.mark.parametrize("toolkit", ["retail", "airline", "telecom", "telecom_user"])
def test_the_schemas_have_upstreams_tools_types_enums_and_nested_models(toolkit):
    """Against upstream's own ``Tool.openai_schema`` output at the pinned commit (fixture made by
    benchmarks/taubench_upstream_schemas.py): the same tools, and each one's parameters equal to
    upstream's, key order included, but for the tool's and its arguments' description texts
    (docs/plugins/taubench.md lists those still worded differently)."""
    upstream = UPSTREAM[toolkit]
    ours = {s["function"]["name"]: s for s in tool_schemas(_toolkits()[toolkit])}
    assert list(ours) == list(upstream) and len(upstream) >= 13  # the same tools, sent in upstream's order
    for name, schema in upstream.items():
        theirs, mine = schema["function"]["parameters"], ours[name]["function"]["parameters"]
        assert json.dumps(_untexted(mine)) == json.dumps(_untexted(theirs)), name  # types, whatever the texts
        assert json.dumps(ours[name]) == json.dumps(schema), name  # and texts: the whole schema as sent
        assert list(ours[name]) == ["type", "function"] and list(ours[name]["function"]) == list(schema["function"])
    if toolkit == "airline":  # the example upstream's types were missing from: enums and arrays of models
        booking = ours["book_reservation"]["function"]["parameters"]
        assert booking["properties"]["cabin"]["enum"] == ["business", "economy", "basic_economy"]
        assert set(booking["$defs"]) == {"FlightInfo", "Passenger", "Payment"}


def test_tool_calls_are_the_actions_and_text_alone_is_a_message():
    calls = [
        {"id": "a", "name": "get_user_details", "arguments": '{"user_id": "u1"}'},
        {"id": "b", "name": "list_all_product_types", "arguments": ""},
    ]
    actions = native_actions("ignored text", calls)
    assert [(a.name, a.arguments) for a in actions] == [
        ("get_user_details", {"user_id": "u1"}),
        ("list_all_product_types", {}),
    ]
    (message,) = native_actions("How can I help?", [])
    assert (message.name, message.arguments) == (RESPOND, {"content": "How can I help?"})
    for bad in ('{"user_id": ', '["u1"]'):
        with pytest.raises(InvalidAction, match="get_user_details"):
            native_actions("", [{"id": None, "name": "get_user_details", "arguments": bad}])
    with pytest.raises(InvalidAction, match="empty"):
        native_actions("  ", [])


@needs_data
def test_a_native_episode_runs_the_calls_and_keeps_them_for_playback():
    task = TauBench(domain="retail", split="base", path=str(DATA / "retail"), user="scripted", tools="native")
    assert task.native_tools() and task.manifest_notes()["tools_mode"] == "native"
    item = next(i for i in task.load(None, 0) if i.id == "0")
    assert "<action_format>" not in item.system.content and item.history[0].content.startswith("Hi!")
    episode = task.episode(item, user=None)
    assert episode.tools == task.tool_schemas()
    episode.opening()
    gold = task.domain.task("0").actions[0]
    call = {"id": "c1", "name": gold.name, "arguments": json.dumps(gold.arguments)}
    step = episode.step("", [call])
    assert step.record["kind"] == "tool" and step.record["tool_calls"] == [call]
    head, tail = step.messages  # as upstream's to_litellm_messages: tool_calls, then a tool message per call
    assert head.to_chat() == {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {
                "id": "c1",
                "name": gold.name,
                "function": {"name": gold.name, "arguments": json.dumps(gold.arguments)},
                "type": "function",
            }
        ],
    }
    assert tail.to_chat() == {"role": "tool", "content": step.record["calls"][0]["content"], "tool_call_id": "c1"}
    said = episode.step("Thank you, one moment.", [])
    assert said.record["kind"] == "message" and said.messages[0].content == "Thank you, one moment."


@needs_data
def test_several_calls_in_one_reply_are_one_exchange_kept_whole_or_not_at_all():
    task = TauBench(domain="retail", split="base", path=str(DATA / "retail"), user="scripted", tools="native")
    item = next(i for i in task.load(None, 0) if i.id == "0")
    episode = task.episode(item, user=None)
    opening = episode.opening()
    calls = [
        {"id": "", "name": "list_all_product_types", "arguments": "{}"},
        {"id": "x", "name": "find_user_id_by_email", "arguments": '{"email": "nobody@example.com"}'},
    ]
    step = episode.step("Let me look.", calls)
    head, *results = step.messages
    assert [m.role for m in results] == ["tool", "tool"] and step.tool_error  # the second call found no user
    ids = [c["id"] for c in head.to_chat()["tool_calls"]]
    assert ids == [r.metadata["tool_call_id"] for r in results] and ids[0].startswith("call_") and ids[1] == "x"
    assert head.to_chat()["content"] == "Let me look." and results[1].to_chat()["tool_call_id"] == "x"
    history = [*opening, head, results[0]]  # the next query is the last result
    query = results[1]
    assert keep_exchanges(history, history, query) == history
    assert keep_exchanges(history[:-1], history, query) == history  # the exchange is completed before its query
    assert keep_exchanges([m for m in history if m is not head], history, query)[-2:] == [head, results[0]]
    later = [*history, query, Message("assistant", "Done.")]
    assert keep_exchanges([m for m in later if m is not results[0]], later, Message("user", "ok")) == [
        *opening,
        later[-1],
    ]  # a call with one of its two results is dropped whole
    assert split_exchange([*opening, head, results[0], later[-1]]) and split_exchange([*opening, results[1]])
    assert split_exchange([*opening, head, *results, later[-1]]) is None


@needs_data
def test_native_invalid_arguments_are_answered_in_each_calls_tool_message():
    task = TauBench(domain="retail", split="base", path=str(DATA / "retail"), user="scripted", tools="native")
    episode = task.episode(next(i for i in task.load(None, 0) if i.id == "0"), user=None)
    episode.opening()
    step = episode.step("", [{"id": "k", "name": "get_user_details", "arguments": '{"user_id": '}])
    head, tail = step.messages
    assert step.tool_error and step.record["kind"] == "invalid_action"
    assert head.to_chat()["tool_calls"][0]["function"]["arguments"] == '{"user_id": '
    assert tail.role == "tool" and tail.to_chat()["tool_call_id"] == "k" and "not valid JSON" in tail.content


@needs_data
@pytest.mark.slow
def test_native_history_with_tool_calls_is_counted_as_served(tmp_path):
    """The mock task whose history holds a tool call and its result: every agent prompt carries an
    assistant message with ``tool_calls`` and a ``tool`` message, counted as the server counts them."""
    data = tmp_path / "mock"
    data.mkdir()
    for name in ("db.json", "policy.md"):
        (data / name).write_text((DATA / "mock" / name).read_text())
    wanted = "update_task_with_message_history"
    tasks = [t for t in json.loads((DATA / "mock" / "tasks.json").read_text()) if t["id"] == wanted]
    (data / "tasks.json").write_text(json.dumps(tasks))
    (data / "split_tasks.json").write_text(json.dumps({"base": [wanted]}))
    out = tmp_path / "run"
    result = invoke_cli(
        "run",
        "-t",
        "tau-bench",
        *("--task-option", "domain=mock", "--task-option", "user=scripted", "--task-option", "tools=native"),
        *("--task-option", f"path={data}", "--task-option", "max_turns=2"),
        *("-s", "truncation", "-b", "2048", "-n", "1", "--max-output-tokens", "48", "--timeout", "900"),
        *("--out", str(out)),
    )
    assert result.exit_code == 0, result.output
    (row,) = final_rows(out).values()
    assert row["event"] == "result" and row["episode"]["served_counts_match"] is True
    turns = [json.loads(line) for line in (out / "episodes.jsonl").read_text().splitlines()]
    assert turns and all(t["served_prompt_tokens"] == t["prompt_tokens"] for t in turns)
    audits = [json.loads(line) for path in (out / "cells").rglob("*.jsonl") for line in path.read_text().splitlines()]
    prompts = [a for a in audits if a["event"] == "prompt_audit"]
    first = prompts[0]
    # the tool block's share of every counted prompt: the same block each call, a part of the whole
    schemas = sum(len(json.dumps(s)) for s in TauBench(domain="mock", path=str(data), tools="native").tool_schemas())
    assert all(a["tools_tokens"] == first["tools_tokens"] for a in prompts)
    assert schemas // 8 < first["tools_tokens"] < first["prompt_tokens"]
    roles = [m["role"] for m in first["messages"]]
    assert "tool" in roles and roles[roles.index("tool") - 1] == "assistant"
    assert json.loads(first["messages"][roles.index("tool") - 1]["metadata"]["tool_calls"])[0]["name"] == "create_task"


@needs_data
@pytest.mark.slow
def test_native_episode_on_the_embedded_model_counts_the_tool_block_exactly(tmp_path):
    out = tmp_path / "run"
    result = invoke_cli(
        "run",
        "-t",
        "tau-bench",
        "--task-option",
        "domain=mock",
        "--task-option",
        "user=scripted",
        "--task-option",
        "tools=native",
        "--task-option",
        f"path={DATA / 'mock'}",
        "--task-option",
        "max_turns=3",
        "-s",
        "truncation",
        "-b",
        "2048",
        "-n",
        "1",
        "--max-output-tokens",
        "48",
        "--timeout",
        "900",
        "--out",
        str(out),
    )
    assert result.exit_code == 0, result.output
    (row,) = final_rows(out).values()
    assert row["event"] == "result" and row["episode"]["served_counts_match"] is True
    turns = [json.loads(line) for line in (out / "episodes.jsonl").read_text().splitlines()]
    assert len(turns) == row["episode"]["calls"] >= 1
    assert all(t["served_prompt_tokens"] == t["prompt_tokens"] for t in turns)  # tool block included
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["task"]["tools_mode"] == "native"
    audits = [json.loads(line) for path in (out / "cells").rglob("*.jsonl") for line in path.read_text().splitlines()]
    system = next(a for a in audits if a["event"] == "prompt_audit")["messages"][0]["content"]
    assert system.startswith("<instructions>") and "<tools>" not in system  # the schemas go natively
