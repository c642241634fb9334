"""The agent's action format (JSON-action mode): tools described in the system prompt, actions as JSON.

Every chat model can follow it and every tokenizer counts it exactly (it is plain text): the
act format of the tau-bench paper. The canonical reply is one JSON object
``{"name": <tool or "respond">, "arguments": {...}}``. ``parse_reply`` also accepts the shapes
models emit when the intent is unambiguous, and refuses the rest with a reason the agent is
shown as a tool error (the table of shapes is in docs/plugins/taubench.md and the tests):

- the whole reply in one code fence, or in one ``<tool_call>`` wrapper (Qwen-style
  templates; the closing tag may be missing when generation stopped on it);
- several calls (a JSON list, or several ``<tool_call>`` blocks): run in order, as upstream
  runs a message's parallel tool calls;
- ``parameters`` for ``arguments``, arguments as a JSON string, an ``id`` or ``type`` key,
  and OpenAI's ``{"type": "function", "function": {...}}`` envelope;
- a bare ``###STOP###``, and prose with no JSON, fence or tag in it: a message to the user
  (upstream's agent sends text content to the user).

Refused: an empty reply or message, text around JSON, two objects in a row, other extra keys,
a ``respond`` with anything but one string ``content``, ``respond`` among tool calls, and
anything that is not valid JSON.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from .toolkit import ToolSpec

RESPOND = "respond"
AGENT_STOP = "###STOP###"

AGENT_INSTRUCTION = """You are a customer service agent that helps the user according to the <policy> provided below.
In each turn you can either:
- Send a message to the user.
- Make a tool call.
You cannot do both at the same time.

Try to be helpful and always follow the policy. Always make sure you generate valid JSON only."""

ACTION_FORMAT = """Reply with exactly one JSON object and nothing else, in one of two forms:
{"name": "<tool name>", "arguments": {<the tool's arguments>}} to call a tool, or
{"name": "respond", "arguments": {"content": "<your message to the user>"}} to send a message to the user.
The result of a tool call comes back in the next message."""

FENCE = re.compile(r"^```[A-Za-z_]*[ \t]*\n(.*)\n[ \t]*```$", re.DOTALL)
TOOL_CALL = re.compile(r"<tool_call>(.*?)(?:</tool_call>|$)", re.DOTALL)
ENVELOPE_KEYS = {"id", "type"}


def describe_tools(specs: dict[str, ToolSpec]) -> str:
    lines = []
    for spec in specs.values():
        required = set(spec.required)
        lines.append(f"- {spec.name}: {spec.description}")
        for name, text in spec.parameters.items():
            lines.append(f"    {name}{'' if name in required else ' (optional)'}: {text}")
        if not spec.parameters:
            lines.append("    (no arguments)")
    return "\n".join(lines)


def system_prompt(policy: str, specs: dict[str, ToolSpec]) -> str:
    return (
        f"<instructions>\n{AGENT_INSTRUCTION}\n</instructions>\n<policy>\n{policy}\n</policy>\n"
        f"<tools>\n{describe_tools(specs)}\n</tools>\n<action_format>\n{ACTION_FORMAT}\n</action_format>"
    )


@dataclass(frozen=True)
class Action:
    name: str
    arguments: dict[str, Any]


class InvalidAction(ValueError):
    """The reply is not an action; the message is what the agent is told."""


def _unwrap(text: str) -> tuple[str, bool]:
    """The reply without a whole-reply fence; ``True`` when it was wrapped."""
    fenced = FENCE.match(text)
    return (fenced.group(1).strip(), True) if fenced else (text, False)


def _loads_one(text: str) -> Any:
    try:
        value, end = json.JSONDecoder().raw_decode(text)
    except json.JSONDecodeError as exc:
        raise InvalidAction(f"the reply is not valid JSON ({exc.msg} at character {exc.pos})") from None
    rest = text[end:].strip()
    if rest.startswith("{"):
        raise InvalidAction("the reply has two JSON objects in a row; send one action (or a JSON list of tool calls)")
    if rest:
        raise InvalidAction("the reply has text after the JSON; send exactly one action")
    return value


def _call(value: Any) -> Action:
    if not isinstance(value, dict):
        raise InvalidAction(f"an action must be a JSON object, got a JSON {type(value).__name__}")
    if value.get("type") == "function" and isinstance(value.get("function"), dict):
        value = {**value["function"], **{k: v for k, v in value.items() if k not in ("function", "type")}}
    if "parameters" in value and "arguments" not in value:
        value = {**value, "arguments": value["parameters"]}
        del value["parameters"]
    extra = sorted(set(value) - {"name", "arguments"} - ENVELOPE_KEYS)
    if "name" not in value or "arguments" not in value or extra:
        raise InvalidAction(f"an action has the keys 'name' and 'arguments', got {sorted(value)}")
    name, arguments = value["name"], value["arguments"]
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except json.JSONDecodeError:
            raise InvalidAction("'arguments' is a string that is not a JSON object") from None
    if not isinstance(name, str) or not name:
        raise InvalidAction("'name' must be a non-empty string")
    if not isinstance(arguments, dict):
        raise InvalidAction("'arguments' must be a JSON object")
    if name == RESPOND:
        if set(arguments) != {"content"} or not isinstance(arguments["content"], str):
            raise InvalidAction("'respond' takes exactly one argument, 'content', a string")
        if not arguments["content"].strip():
            raise InvalidAction("the message to the user is empty")
    return Action(name, arguments)


def parse_reply(reply: str) -> tuple[Action, ...]:
    """The actions in ``reply`` (one ``respond``, or one or more tool calls); see the module doc."""
    text = reply.strip()
    if not text:
        raise InvalidAction("the reply was empty")
    if text == AGENT_STOP:
        return (Action(RESPOND, {"content": AGENT_STOP}),)
    if "<tool_call>" in text:
        if not text.startswith("<tool_call>"):
            raise InvalidAction("the reply has text before <tool_call>; send only the tool call")
        blocks = TOOL_CALL.findall(text)
        if TOOL_CALL.sub("", text).strip():
            raise InvalidAction("the reply has text outside the <tool_call> blocks")
        actions = tuple(_call(_loads_one(_unwrap(b.strip())[0])) for b in blocks)
    else:
        body, fenced = _unwrap(text)
        if not fenced and "```" not in text and not body.lstrip().startswith(("{", "[")) and "{" not in text:
            return (Action(RESPOND, {"content": text}),)  # prose: a message to the user
        if not body.startswith(("{", "[")):
            raise InvalidAction("the reply mixes text and JSON; send exactly one action")
        value = _loads_one(body)
        if isinstance(value, list):
            if not value:
                raise InvalidAction("the reply is an empty list of tool calls")
            actions = tuple(_call(v) for v in value)
        else:
            actions = (_call(value),)
    if len(actions) > 1 and any(a.name == RESPOND for a in actions):
        raise InvalidAction("'respond' cannot be sent together with tool calls")
    return actions


def respond(content: str) -> str:
    """The reply text of a message to the user, in the action format."""
    return json.dumps({"name": RESPOND, "arguments": {"content": content}}, ensure_ascii=False)


def user_action(reply: str, tools: set[str]) -> Action | None:
    """A simulated user's tool call (the same format, a tool of its own), or None for a message to the agent."""
    try:
        actions = parse_reply(reply)
    except InvalidAction:
        return None
    if len(actions) == 1 and actions[0].name in tools:
        return actions[0]
    return None
