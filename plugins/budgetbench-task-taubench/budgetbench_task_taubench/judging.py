"""NL assertions judged by the run's judge (``--judge-model``), reported apart from the reward.

Modelled on tau2-bench's NL-assertions evaluator (the judge reads the conversation and says,
per expected outcome, whether the agent met it, with a short reasoning), with two changes:
one judge call per assertion (a verdict per assertion even from a small judge), and a strict
parse: the reply must be one JSON object ``{"reasoning": str, "metExpectation": true|false}``
(alone, or alone inside one code fence); anything else is recorded as ``unparseable``, never
guessed. A judge call that fails or does not fit the judge's context is recorded as
``error``. Without a judge the outcome's ``nl_assertions`` is null: not judged, never 0.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any

from budgetbench_core import JudgeChannel, Message

PROMPT_VERSION = "1"
MAX_TOKENS = 256
SYSTEM = """You grade a recorded customer-service conversation between an agent and a customer.
You are given the conversation and one expected outcome. Decide whether the agent satisfied
the expected outcome in this conversation.

Reply with one JSON object and nothing else:
{"reasoning": "<a short explanation>", "metExpectation": <true or false>}"""
FENCE = re.compile(r"```(?:json)?\s*\n?(.*?)\n?\s*```", re.DOTALL)


def conversation(events: Sequence[dict[str, Any]]) -> str:
    """The episode's trajectory as ``role: content`` lines (tool calls and results included)."""
    lines = []
    for event in events:
        if "tool_call" in event:
            call = event["tool_call"]
            lines.append(f"{event['role']}: [tool call] {json.dumps(call, ensure_ascii=False)}")
        elif event.get("role") == "tool":
            lines.append(f"tool: {event['content']}")
        else:
            lines.append(f"{event['role']}: {event['content']}")
    return "\n".join(lines)


def parse_verdict(reply: str) -> tuple[bool, str] | None:
    """``(met, reasoning)`` from a well-formed judge reply, or None."""
    text = reply.strip()
    fenced = FENCE.fullmatch(text)
    if fenced:
        text = fenced.group(1).strip()
    try:
        data = json.loads(text)
    except json.JSONDecodeError:
        return None
    if not isinstance(data, dict) or not isinstance(data.get("metExpectation"), bool):
        return None
    reasoning = data.get("reasoning", "")
    if not isinstance(reasoning, str):
        return None
    return data["metExpectation"], reasoning


def judge_assertions(assertions: Sequence[str], events: Sequence[dict[str, Any]], judge: JudgeChannel) -> dict:
    """The ``nl_assertions`` figure: ``met`` of ``total``, and one verdict per assertion."""
    talk = conversation(events)
    checks = []
    for assertion in assertions:
        messages = [
            Message("system", SYSTEM),
            Message("user", f"conversation:\n{talk}\n\nexpectedOutcome:\n{assertion}"),
        ]
        check: dict[str, Any] = {"assertion": assertion, "met": None}
        try:
            reply = judge.complete(messages, MAX_TOKENS)
        except Exception as exc:  # a failed or oversized judge call: recorded, the reward stands
            checks.append({**check, "verdict": "error", "error": f"{type(exc).__name__}: {exc}"})
            continue
        call = judge.calls[-1]
        parsed = parse_verdict(reply)
        checks.append(
            {
                **check,
                "verdict": "unparseable" if parsed is None else ("met" if parsed[0] else "not met"),
                "met": None if parsed is None else parsed[0],
                "reasoning": None if parsed is None else parsed[1],
                "raw": reply,
                "prompt_tokens": call["prompt_tokens"],
                "completion_tokens": call["completion_tokens"],
                "cached": call["cached"],
            }
        )
    return {
        "met": sum(c["met"] is True for c in checks),
        "total": len(checks),
        "unparseable": sum(c["verdict"] == "unparseable" for c in checks),
        "errors": sum(c["verdict"] == "error" for c in checks),
        "judge_model": judge.model,
        "prompt_version": PROMPT_VERSION,
        "assertions": checks,
    }
