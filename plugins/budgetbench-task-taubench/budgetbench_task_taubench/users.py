"""The simulated users: a scripted one for deterministic tests and smoke runs, and an LLM one.

Both see only the conversation (never tool calls or results) and end it with upstream's
tokens: ``###STOP###`` (goal reached or nothing more to say), ``###TRANSFER###`` (after a
transfer to a human agent) or ``###OUT-OF-SCOPE###``.

The **scripted** user opens with the task's reason for calling and the known information,
answers "yes" to a request for confirmation, repeats the known information once when asked
a question, and stops when it is asked nothing (or asked the same thing again). It measures
plumbing and budgets cheaply; it cannot negotiate, so claims about agents need the LLM user.

The **LLM** user follows upstream's prompt (the simulation guidelines, then the scenario),
answers at temperature 0 through the harness, and sees the newest conversation that fits the
served context (its tokens are logged, never budgeted).
"""

from __future__ import annotations

import re
import textwrap
from typing import Any

from budgetbench_core import Message

STOP, TRANSFER, OUT_OF_SCOPE = "###STOP###", "###TRANSFER###", "###OUT-OF-SCOPE###"
STOP_TOKENS = (STOP, TRANSFER, OUT_OF_SCOPE)
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
    """Upstream's user simulator prompt, answered by the served model through ``channel``."""

    def __init__(self, scenario: dict[str, Any], guidelines: str, channel: Any, max_tokens: int = 256) -> None:
        self.system = Message(
            "system",
            f"{guidelines.replace('<PERSONA_GUIDELINES>', '')}\n\n<scenario>\n{scenario_text(scenario)}\n</scenario>",
        )
        self.channel = channel
        self.max_tokens = max_tokens
        self.turns: list[Message] = []  # the conversation from the user's side: its own turns are "assistant"

    def _answer(self) -> str:
        kept = list(self.turns)
        room = self.channel.limit - self.max_tokens
        while len(kept) > 1 and self.channel.count([self.system, *kept]) > room:
            kept.pop(0)
        return self.channel.complete([self.system, *kept], self.max_tokens).strip()

    def opening(self, greeting: str) -> str:
        self.turns.append(Message("user", greeting))
        text = self._answer()
        self.turns.append(Message("assistant", text))
        return text

    def reply(self, agent_message: str, transferred: bool) -> str:
        self.turns.append(Message("user", agent_message))
        text = self._answer()
        self.turns.append(Message("assistant", text))
        return text
