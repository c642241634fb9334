"""The simulated users: a scripted one for deterministic tests and smoke runs, and an LLM one.

Both see only the conversation (never tool calls or results) and end it with upstream's
tokens: ``###STOP###`` (goal reached or nothing more to say), ``###TRANSFER###`` (after a
transfer to a human agent) or ``###OUT-OF-SCOPE###``.

The **scripted** user opens with the task's reason for calling and the known information,
answers "yes" to a request for confirmation, repeats the known information once when asked
a question, and stops when it is asked nothing (or asked the same thing again). It measures
plumbing and budgets cheaply; it cannot negotiate, so claims about agents need the LLM user.

The **LLM** user follows upstream's prompt (the simulation guidelines, then the scenario),
answers at temperature 0 through the harness, and sees the whole conversation, as upstream
(its tokens are logged, never budgeted). Where the domain gives the user tools (telecom's
phone, mock's inbox) it gets upstream's tool guidelines and calls them in the agent's JSON
format (upstream passes native tool schemas).
"""

from __future__ import annotations

import re
import textwrap
from typing import Any

from budgetbench_core import Message

STOP, TRANSFER, OUT_OF_SCOPE = "###STOP###", "###TRANSFER###", "###OUT-OF-SCOPE###"
STOP_TOKENS = (STOP, TRANSFER, OUT_OF_SCOPE)
USER_TOOL_FORMAT = """To perform an action on your device, reply with exactly one JSON object and nothing else:
{"name": "<tool name>", "arguments": {<the tool's arguments>}}
The result comes back in the next message; the agent does not see it. Any other reply is sent to the agent."""
CONFIRMATION = re.compile(
    r"\b(confirm|proceed|yes/no|shall i|should i|would you like me to|do you want me to|"
    r"is that correct|is this correct)\b",
    re.IGNORECASE,
)


def scenario_text(scenario: dict[str, Any]) -> str:
    """The scenario as upstream renders it for its user simulator (persona, then instructions)."""
    instructions = scenario.get("instructions")
    if isinstance(instructions, dict):
        parts = [
            f"Domain: {instructions.get('domain')}",
            f"Reason for call:\n{textwrap.indent(instructions.get('reason_for_call') or '', chr(9))}",
        ]
        if instructions.get("known_info") is not None:
            parts.append(f"Known info:\n{textwrap.indent(instructions['known_info'], chr(9))}")
        if instructions.get("unknown_info") is not None:
            parts.append(f"Unknown info:\n{textwrap.indent(instructions['unknown_info'], chr(9))}")
        parts.append(f"Task instructions:\n{textwrap.indent(instructions.get('task_instructions') or '', chr(9))}")
        instructions = "\n".join(parts)
    lines = []
    if scenario.get("persona") is not None:
        lines += ["Persona:", textwrap.indent(scenario["persona"], "\t")]
    lines += ["Instructions:", textwrap.indent(str(instructions), "\t")]
    return "\n".join(lines)


class ScriptedUser:
    def __init__(self, scenario: dict[str, Any]) -> None:
        instructions = scenario.get("instructions")
        if isinstance(instructions, dict):
            self.reason = " ".join(str(instructions.get("reason_for_call") or "").split())
            self.known = " ".join(str(instructions.get("known_info") or "").split())
        else:
            self.reason, self.known = " ".join(str(instructions).split()), ""
        self.asked: set[str] = set()

    def opening(self, greeting: str) -> str:
        return " ".join(part for part in (self.reason, self.known) if part)

    def reply(self, agent_message: str, transferred: bool) -> str:
        if transferred:
            return TRANSFER
        key = " ".join(agent_message.lower().split())
        if key in self.asked:
            return STOP
        self.asked.add(key)
        if CONFIRMATION.search(agent_message):
            return "Yes, please go ahead."
        if "?" in agent_message:
            return f"Here is what I know: {self.known}" if self.known else "I do not know that."
        return STOP


class LLMUser:
    """Upstream's user simulator prompt (guidelines, then the scenario), answered by the served
    model through ``channel``: the whole conversation every time (no trimming, as upstream),
    replies capped only by ``max_tokens``. With ``tools`` (telecom, mock) the prompt lists the
    user's tools and their JSON format; the episode runs the calls and feeds the results back."""

    def __init__(
        self, scenario: dict[str, Any], guidelines: str, channel: Any, max_tokens: int, tools: str | None = None
    ) -> None:
        prompt = (
            f"{guidelines.replace('<PERSONA_GUIDELINES>', '')}\n\n<scenario>\n{scenario_text(scenario)}\n</scenario>"
        )
        if tools is not None:
            prompt += f"\n<tools>\n{tools}\n</tools>\n<tool_call_format>\n{USER_TOOL_FORMAT}\n</tool_call_format>"
        self.system = Message("system", prompt)
        self.channel = channel
        self.max_tokens = max_tokens
        self.turns: list[Message] = []  # the conversation from the user's side: its own turns are "assistant"

    def _answer(self, incoming: str) -> str:
        """The user's next reply to ``incoming``; ``ValueError`` when the prompt outgrows the served context."""
        self.turns.append(Message("user", incoming))
        text = self.channel.complete([self.system, *self.turns], self.max_tokens).strip()
        self.turns.append(Message("assistant", text))
        return text

    def opening(self, greeting: str) -> str:
        return self._answer(greeting)

    def reply(self, agent_message: str, transferred: bool) -> str:
        return self._answer(agent_message)

    def tool_result(self, name: str, content: str) -> str:
        return self._answer(f"Tool {name} returned:\n{content}")
