"""The JSON-action parser on the reply shapes models really emit: what each one becomes.

Each row: a label, the reply, and either the actions it parses to (name and arguments) or
``refused: <the reason's start>``. The same table is in docs/plugins/taubench.md; a test
checks that they agree.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from budgetbench_task_taubench.actions import InvalidAction, parse_reply, user_action

GET = '{"name": "get_user_details", "arguments": {"user_id": "u1"}}'
ORDER = '{"name": "get_order_details", "arguments": {"order_id": "#W1"}}'
SAY = '{"name": "respond", "arguments": {"content": "Hello"}}'
G = ("get_user_details", {"user_id": "u1"})
ORD = ("get_order_details", {"order_id": "#W1"})
H = ("respond", {"content": "Hello"})

SHAPES = [
    ("canonical tool call", GET, [G]),
    ("canonical message", SAY, [H]),
    ("surrounding whitespace", f"\n  {GET}  \n", [G]),
    ("pretty-printed JSON", '{\n  "name": "get_user_details",\n  "arguments": {\n    "user_id": "u1"\n  }\n}', [G]),
    ("json code fence", f"```json\n{GET}\n```", [G]),
    ("bare code fence", f"```\n{SAY}\n```", [H]),
    ("Qwen <tool_call> wrapper", f"<tool_call>\n{GET}\n</tool_call>", [G]),
    ("<tool_call> without its closing tag", f"<tool_call>\n{GET}", [G]),
    ("two <tool_call> blocks", f"<tool_call>\n{GET}\n</tool_call>\n<tool_call>\n{ORDER}\n</tool_call>", [G, ORD]),
    ("JSON list of two calls", f"[{GET}, {ORDER}]", [G, ORD]),
    ("fenced JSON list", f"```json\n[{GET}]\n```", [G]),
    ("'parameters' for 'arguments'", '{"name": "get_user_details", "parameters": {"user_id": "u1"}}', [G]),
    ("arguments as a JSON string", '{"name": "get_user_details", "arguments": "{\\"user_id\\": \\"u1\\"}"}', [G]),
    ("an id key", '{"id": "call_1", "name": "get_user_details", "arguments": {"user_id": "u1"}}', [G]),
    (
        "OpenAI function envelope",
        '{"type": "function", "function": {"name": "get_user_details", "arguments": "{\\"user_id\\": \\"u1\\"}"}}',
        [G],
    ),
    ("bare stop token", "###STOP###", [("respond", {"content": "###STOP###"})]),
    (
        "stop token in a message",
        '{"name": "respond", "arguments": {"content": "Bye ###STOP###"}}',
        [("respond", {"content": "Bye ###STOP###"})],
    ),
    ("plain prose", "Could you give me your email?", [("respond", {"content": "Could you give me your email?"})]),
    ("tool with no arguments", '{"name": "list_all_airports", "arguments": {}}', [("list_all_airports", {})]),
    ("empty reply", "   ", "refused: the reply was empty"),
    ("prose before JSON", f"Let me check. {GET}", "refused: the reply mixes text and JSON"),
    ("prose after JSON", f"{GET} Let me know.", "refused: the reply has text after the JSON"),
    ("prose before a fence", f"Here:\n```json\n{GET}\n```", "refused: the reply mixes text and JSON"),
    (
        "prose before <tool_call>",
        f"Sure.\n<tool_call>\n{GET}\n</tool_call>",
        "refused: the reply has text before <tool_call>",
    ),
    (
        "prose after </tool_call>",
        f"<tool_call>\n{GET}\n</tool_call>\nDone.",
        "refused: the reply has text outside the <tool_call> blocks",
    ),
    ("two objects in a row", f"{GET}\n{ORDER}", "refused: the reply has two JSON objects in a row"),
    ("missing arguments", '{"name": "get_user_details"}', "refused: an action has the keys 'name' and 'arguments'"),
    (
        "extra key",
        '{"name": "get_user_details", "arguments": {"user_id": "u1"}, "thought": "x"}',
        "refused: an action has the keys",
    ),
    (
        "arguments a list",
        '{"name": "get_user_details", "arguments": ["u1"]}',
        "refused: 'arguments' must be a JSON object",
    ),
    (
        "arguments a non-JSON string",
        '{"name": "get_user_details", "arguments": "u1"}',
        "refused: 'arguments' is a string that is not a JSON object",
    ),
    ("name not a string", '{"name": 3, "arguments": {}}', "refused: 'name' must be a non-empty string"),
    (
        "respond with another key",
        '{"name": "respond", "arguments": {"text": "hi"}}',
        "refused: 'respond' takes exactly one argument",
    ),
    (
        "respond with empty content",
        '{"name": "respond", "arguments": {"content": "  "}}',
        "refused: the message to the user is empty",
    ),
    ("respond among tool calls", f"[{GET}, {SAY}]", "refused: 'respond' cannot be sent together with tool calls"),
    ("empty list", "[]", "refused: the reply is an empty list of tool calls"),
    (
        "truncated JSON",
        '{"name": "get_user_details", "arguments": {"user_id": "u1"',
        "refused: the reply is not valid JSON",
    ),
    (
        "Python dict quotes",
        "{'name': 'get_user_details', 'arguments': {'user_id': 'u1'}}",
        "refused: the reply is not valid JSON",
    ),
    ("a quoted string (no braces: prose)", '"hello"', [("respond", {"content": '"hello"'})]),
    ("bad JSON in a fence", "```json\n{name: get_user_details}\n```", "refused: the reply is not valid JSON"),
]


def outcome(reply: str):
    try:
        return [(a.name, a.arguments) for a in parse_reply(reply)]
    except InvalidAction as exc:
        return f"refused: {exc}"


@pytest.mark.parametrize(("label", "reply", "expected"), SHAPES, ids=[s[0] for s in SHAPES])
def test_reply_shape(label, reply, expected):
    got = outcome(reply)
    if isinstance(expected, str):
        assert isinstance(got, str) and got.startswith(expected), (label, got)
    else:
        assert got == expected, label


def test_the_table_has_at_least_30_shapes_and_the_docs_list_every_one():
    assert len(SHAPES) >= 30
    docs = (Path(__file__).resolve().parents[3] / "docs" / "plugins" / "taubench.md").read_text(encoding="utf-8")
    rows = set(re.findall(r"^\| ([^|]+?) \|", docs, re.MULTILINE))
    assert [label for label, _, _ in SHAPES if label not in rows] == []


def test_a_simulated_users_reply_is_a_tool_call_only_when_it_names_one_of_its_tools():
    tools = {"toggle_airplane_mode", "run_speed_test"}
    assert user_action('{"name": "run_speed_test", "arguments": {}}', tools).name == "run_speed_test"
    assert user_action(f"<tool_call>\n{GET}\n</tool_call>", tools) is None  # not its tool: said to the agent
    assert user_action("My phone shows no signal.", tools) is None
    assert user_action('{"name": "run_speed_test"', tools) is None
