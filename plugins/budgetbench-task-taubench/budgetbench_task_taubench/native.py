"""Native tool calling (``tools=native``): the tool schemas as upstream sends them, and the
model's structured tool calls as the episode's actions.

Upstream's ``Tool.openai_schema`` is ``{"type": "function", "function": {name, description,
parameters}}`` where ``parameters`` is the JSON schema of a pydantic model named
``parameters`` built from the tool's signature (types, defaults) and its docstring's argument
texts. The same is built here from each tool method's signature (its ``Literal`` enums and the
models it names) and upstream's texts (``data/native_tool_texts.json``), so the schemas equal
upstream's (a test compares them with upstream's own output).
"""

from __future__ import annotations

import inspect
import json
import typing
from pathlib import Path
from typing import Any

from pydantic import Field, create_model

from budgetbench_core import TOOL_CALL_ID, TOOL_CALLS, Message

from .actions import AGENT_INSTRUCTION, RESPOND, Action, InvalidAction
from .toolkit import Toolkit

# Upstream's texts of each tool (its docstring's description and argument texts), per toolkit
# class; made by benchmarks/taubench_upstream_schemas.py --texts. The JSON mode keeps the
# plugin's own texts, which also spell out the shapes its prompt has no schema for.
NATIVE_TEXTS: dict[str, dict[str, Any]] = json.loads(
    (Path(__file__).parent / "data" / "native_tool_texts.json").read_text(encoding="utf-8")
)


def tool_schemas(toolkit: type[Toolkit]) -> list[dict[str, Any]]:
    """Every tool of ``toolkit`` in OpenAI format, in upstream's order (its toolkit's, as its
    texts list them; name order for a toolkit they do not cover, such as mock's): the types from
    the tool's signature (and the models it names), the texts upstream's (else the plugin's own)."""
    texts = NATIVE_TEXTS.get(toolkit.__name__)
    specs = toolkit.specs()
    order = [name for name in texts if name in specs] if texts is not None else []
    schemas = []
    for name in [*order, *sorted(set(specs) - set(order))]:
        spec = specs[name]
        function = getattr(toolkit, name)
        hints = typing.get_type_hints(function)
        described = (
            texts[name] if texts is not None else {"description": spec.description, "arguments": spec.parameters}
        )
        fields: dict[str, Any] = {}
        for parameter, value in inspect.signature(function).parameters.items():
            if parameter == "self":
                continue
            default = ... if value.default is inspect.Parameter.empty else value.default
            if parameter in described["arguments"]:
                default = Field(default, description=described["arguments"][parameter])
            fields[parameter] = (hints.get(parameter, Any), default)
        parameters = create_model("parameters", **fields).model_json_schema()
        schemas.append(
            {
                "type": "function",
                "function": {"name": name, "description": described["description"], "parameters": parameters},
            }
        )
    return schemas


def native_system_prompt(policy: str) -> str:
    """Upstream's agent system prompt: the instruction and the policy (the tools go natively)."""
    return f"<instructions>\n{AGENT_INSTRUCTION}\n</instructions>\n<policy>\n{policy}\n</policy>"


def native_actions(reply: str, tool_calls: list[dict[str, Any]]) -> tuple[Action, ...]:
    """The tool calls, in order, when there are any (text beside them is not sent, as upstream
    sends an agent message either to the environment or to the user); else the text is a
    message to the user. Arguments that are not a JSON object make the reply invalid."""
    if tool_calls:
        actions = []
        for call in tool_calls:
            try:
                arguments = json.loads(call["arguments"] or "{}")
            except json.JSONDecodeError:
                raise InvalidAction(f"the arguments of tool call {call['name']!r} are not valid JSON") from None
            if not isinstance(arguments, dict):
                raise InvalidAction(f"the arguments of tool call {call['name']!r} are not a JSON object")
            actions.append(Action(call["name"], arguments))
        return tuple(actions)
    if not reply.strip():
        raise InvalidAction("the reply was empty")
    return (Action(RESPOND, {"content": reply}),)


def call_ids(tool_calls: list[dict[str, Any]], turn: int) -> list[str]:
    """Each call's id: the model's (the backend's), else one made from the turn and position."""
    return [str(call.get("id") or f"call_{turn}_{index}") for index, call in enumerate(tool_calls)]


def native_exchange(
    mark: dict[str, Any], reply: str, calls: list[tuple[str, str, str]], results: list[tuple[str, bool]]
) -> tuple[Message, ...]:
    """One tool exchange as upstream sends it (``to_litellm_messages``): the assistant message
    with its text and ``tool_calls`` (``{"id", "name", "function": {"name", "arguments"}, "type":
    "function"}``, arguments as JSON text), then one ``tool`` message per call with its
    ``tool_call_id`` and result. ``calls`` are (id, name, arguments text), ``results`` (content,
    error) in the same order. The exchange mark keeps them together under every strategy."""
    wire = [
        {"id": id_, "name": name, "function": {"name": name, "arguments": arguments}, "type": "function"}
        for id_, name, arguments in calls
    ]
    head = Message(
        "assistant", reply, {**mark, "exchange_part": "call", TOOL_CALLS: json.dumps(wire, ensure_ascii=False)}
    )
    tails = [
        Message("tool", content, {**mark, "exchange_part": "result", "error": error, TOOL_CALL_ID: id_})
        for (id_, _, _), (content, error) in zip(calls, results, strict=True)
    ]
    return (head, *tails)


def arguments_text(arguments: dict[str, Any]) -> str:
    """A call's arguments as upstream re-sends them: ``json.dumps`` with its defaults."""
    return json.dumps(arguments)
