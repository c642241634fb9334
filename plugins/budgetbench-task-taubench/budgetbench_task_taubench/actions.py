"""The agent's action format: tools described in the system prompt, one JSON action per reply.

Every chat model can follow it and every tokenizer counts it exactly (it is plain text):
the act format of the tau-bench paper. A reply must be exactly one JSON object
``{"name": <tool or "respond">, "arguments": {...}}``, with nothing around it but
whitespace. Anything else is an invalid action: the agent sees the reason as a tool error
and the episode goes on.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from .toolkit import ToolSpec

RESPOND = "respond"

AGENT_INSTRUCTION = """You are a customer service agent that helps the user according to the <policy> provided below.
In each turn you can either:
- Send a message to the user.
- Make a tool call.
You cannot do both at the same time.

Try to be helpful and always follow the policy."""

ACTION_FORMAT = """Reply with exactly one JSON object and nothing else, in one of two forms:
{"name": "<tool name>", "arguments": {<the tool's arguments>}} to call a tool, or
{"name": "respond", "arguments": {"content": "<your message to the user>"}} to send a message to the user.
The result of a tool call comes back in the next message."""


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
    """The reply is not one JSON action; the message is what the agent is told."""


def parse_action(reply: str) -> Action:
    """The action in ``reply``, parsed strictly (see the module doc)."""
    text = reply.strip()
    if not text:
        raise InvalidAction("the reply was empty")
    try:
        value, end = json.JSONDecoder().raw_decode(text)
    except json.JSONDecodeError as exc:
        raise InvalidAction(f"the reply is not a JSON object ({exc.msg} at character {exc.pos})") from None
    if text[end:].strip():
        raise InvalidAction("the reply has text after the JSON object; send exactly one action")
    if not isinstance(value, dict):
        raise InvalidAction(f"the reply is a JSON {type(value).__name__}, not an object")
    if set(value) != {"name", "arguments"}:
        raise InvalidAction(f"the action must have exactly the keys 'name' and 'arguments', got {sorted(value)}")
    if not isinstance(value["name"], str) or not value["name"]:
        raise InvalidAction("'name' must be a non-empty string")
    if not isinstance(value["arguments"], dict):
        raise InvalidAction("'arguments' must be a JSON object")
    if value["name"] == RESPOND and (
        set(value["arguments"]) != {"content"} or not isinstance(value["arguments"]["content"], str)
    ):
        raise InvalidAction("'respond' takes exactly one argument, 'content', a string")
    return Action(value["name"], value["arguments"])


def respond(content: str) -> str:
    """The reply text of a message to the user, in the action format."""
    return json.dumps({"name": RESPOND, "arguments": {"content": content}}, ensure_ascii=False)
