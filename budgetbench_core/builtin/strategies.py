"""Built-in strategies: truncation, full_context, recency, summary_buffer and checkpoint.

They use only the public API, exactly as a third-party plugin would. Each picks what to
keep with the cached per-message estimate, then confirms with the exact count
(``PromptCounter.fit``), so the prompt never exceeds the budget unless even the system
prompt and query alone do (the runner then records a violation). In agent episodes each
keeps tool calls and their results together (``keep_exchanges``).
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Sequence

from budgetbench_core import (
    AuxiliaryBudgetError,
    MemoryStrategy,
    Message,
    Param,
    Regime,
    StrategyContext,
    hookimpl,
    keep_exchanges,
)


def newest_that_fit(history: Sequence[Message], room: int, context: StrategyContext) -> list[Message]:
    """The longest suffix of ``history`` whose estimated size is at most ``room``."""
    kept: list[Message] = []
    used = 0
    for message in reversed(history):
        cost = context.counter.message_tokens(message)
        if used + cost > room:
            break
        kept.append(message)
        used += cost
    kept.reverse()
    return kept


def room_for_history(budget: int, context: StrategyContext) -> int:
    """Budget left after the system prompt, the query and the template's fixed tokens."""
    return budget - context.counter.estimate(context.frame([]))


class Truncation(MemoryStrategy):
    """The system prompt and the newest messages that fit the budget; older ones are dropped."""

    name = "truncation"
    regime = Regime.LOCAL_ONLY
    description = "System prompt and the newest messages that fit."

    def apply(self, history, budget, context):
        kept = newest_that_fit(history, room_for_history(budget, context), context)
        kept, _ = context.counter.fit(context.frame, kept, budget, drop_index=0)
        kept = keep_exchanges(kept, history, context.item.query)  # agent episodes: never split a tool call
        return context.frame(kept)


class FullContext(MemoryStrategy):
    """The whole history unchanged, whatever the budget: the ceiling arm. A cell where it does
    not fit is a violation (scored 0), never trimmed."""

    name = "full_context"
    regime = Regime.LOCAL_ONLY
    description = "The whole history unchanged; cells where it does not fit are violations."
    enforces_budget = False  # the ceiling arm; the conformance kit skips its budget check

    def apply(self, history, budget, context):
        return context.frame(list(history))


class Recency(MemoryStrategy):
    """The no-memory control: the newest whole sessions that fit, older ones forgotten."""

    name = "recency"
    regime = Regime.LOCAL_ONLY
    description = "Newest whole sessions that fit (no memory mechanism); a control arm."

    def apply(self, history, budget, context):
        room = room_for_history(budget, context)
        kept: list[Message] = []
        used = 0
        for session in reversed(context.item.sessions()):
            cost = sum(context.counter.message_tokens(m) for m in session.messages)
            if used + cost > room:
                break
            kept[:0] = session.messages
            used += cost
        kept, _ = context.counter.fit(context.frame, kept, budget, drop_index=0)
        kept = keep_exchanges(kept, history, context.item.query)  # agent episodes: never split a tool call
        return context.frame(kept)


SUMMARY_INSTRUCTION = (
    "Summarise the conversation below for your own later use. Keep every concrete fact: names, "
    "numbers, dates, places, preferences, and any fact that was later changed (say which is current). "
    "Write plain sentences, no preamble."
)


class SummaryBuffer(MemoryStrategy):
    """Newest messages verbatim; the evicted ones summarised by the same model.

    ``summary_share`` of the room is reserved for the summary. Evicted messages are
    summarised newest first, in chunks whose prompts fit the budget, folding the running
    summary into each call, for at most ``max_calls`` calls (older history beyond that is
    dropped and the audit says how much). Every call goes through the harness, so its
    prompt is budget-checked and its tokens and latency are logged.
    """

    name = "summary_buffer"
    regime = Regime.AUXILIARY_MODEL
    description = "Recent messages verbatim plus a model-written summary of evicted ones."

    def __init__(self, summary_share: float = 0.25, max_calls: int = 2, **params):
        super().__init__(summary_share=summary_share, max_calls=max_calls, **params)
        self.summary_share = float(summary_share)
        self.max_calls = int(max_calls)

    def apply(self, history, budget, context):
        room = room_for_history(budget, context)
        summary_tokens = max(16, int(room * self.summary_share))
        recent = newest_that_fit(history, room - summary_tokens, context)
        evicted = list(history[: len(history) - len(recent)])
        summary = self._summarise(evicted, budget, summary_tokens, context) if evicted else ""
        kept = (
            [Message("user", f"Summary of the earlier conversation:\n{summary}", {"source_id": "summary"})]
            if summary
            else []
        ) + recent
        kept, _ = context.counter.fit(context.frame, kept, budget, drop_index=-1 if not summary else 1)
        kept = keep_exchanges(kept, history, context.item.query)  # agent episodes: never split a tool call
        return context.frame(kept)

    def _summarise(self, evicted, budget, summary_tokens, context) -> str:
        summary = ""
        remaining = list(evicted)
        calls = 0
        while remaining and calls < self.max_calls:
            head = [Message("system", SUMMARY_INSTRUCTION)]
            carry = [Message("user", f"Summary so far:\n{summary}")] if summary else []
            fixed = context.counter.estimate(head + carry + [Message("user", "")])
            room = budget - fixed
            chunk: list[Message] = []
            used = 0
            while remaining and used + context.counter.content_tokens(remaining[-1].content) + 8 <= room:
                message = remaining.pop()
                chunk.insert(0, message)
                used += context.counter.content_tokens(message.content) + 8
            if not chunk:
                break
            transcript = "\n".join(f"{m.role}: {m.content}" for m in chunk)
            try:
                summary = context.complete(
                    head + carry + [Message("user", transcript)], summary_tokens, "summary"
                ).strip()
            except AuxiliaryBudgetError:
                break  # estimate was off for this template: keep what we have
            calls += 1
        context.audit["summary"] = {
            "calls": calls,
            "evicted_messages": len(evicted),
            "unsummarised_messages": len(remaining),
        }
        return summary


_WORD = re.compile(r"[a-z0-9]+")
_STOP = frozenset(
    "a an and are as at be by did do does for from had has have i in is it me my of on or "
    "that the this to was were what when where which who why will with you your".split()
)


def _terms(text: str) -> list[str]:
    return [w for w in _WORD.findall(text.lower()) if w not in _STOP]


class Checkpoint(MemoryStrategy):
    """An extractive checkpoint, query-relevant evidence and the recent tail.

    Budget split (of the room left after system prompt and query): ``tail_share`` for the
    newest messages, the rest for older messages that share the most rare words with the
    query (evidence), and whatever then remains for a checkpoint made of the first
    sentence of each remaining older user message. Everything is whole messages or
    whole sentences; the final prompt is confirmed with the exact count.
    """

    name = "checkpoint"
    regime = Regime.LOCAL_ONLY
    description = "Extractive checkpoint + recent tail + query-relevant evidence."

    parameters = {
        "tail_share": Param(
            0.4, "share of the room for the newest messages (0 to 1)", type=float, minimum=0.0, maximum=1.0
        )
    }

    def __init__(self, tail_share: float = 0.4, **params):
        problem = self.parameters["tail_share"].problem(tail_share)
        if problem:  # also when built directly, not through a run's parameter check
            raise ValueError(f"{self.name}: parameter tail_share {problem}")
        super().__init__(tail_share=tail_share, **params)
        self.tail_share = float(tail_share)

    def apply(self, history, budget, context):
        room = room_for_history(budget, context)
        tail = newest_that_fit(history, int(room * self.tail_share), context)
        older = list(history[: len(history) - len(tail)])
        used = sum(context.counter.message_tokens(m) for m in tail)
        evidence, used = self._evidence(older, context, room, used)
        rest = [m for i, m in enumerate(older) if i not in evidence and m.role == "user"]
        checkpoint = self._checkpoint(rest, room - used, context)
        kept = ([checkpoint] if checkpoint else []) + [older[i] for i in sorted(evidence)] + tail
        kept, _ = context.counter.fit(context.frame, kept, budget, drop_index=0)
        kept = keep_exchanges(kept, history, context.item.query)  # agent episodes: never split a tool call
        context.audit["checkpoint"] = {"tail": len(tail), "evidence": sorted(evidence), "checkpoint": bool(checkpoint)}
        return context.frame(kept)

    def _evidence(self, older, context, room, used):
        query_terms = set(_terms(context.item.query.content))
        documents = [Counter(_terms(m.content)) for m in older]
        frequency = Counter(t for d in documents for t in d)
        n = len(documents) or 1
        scores = [sum(math.log(1 + n / frequency[t]) for t in query_terms if t in d) for d in documents]
        chosen: set[int] = set()
        for index in sorted(range(len(older)), key=lambda i: (-scores[i], -i)):
            if scores[index] <= 0:
                break
            cost = context.counter.message_tokens(older[index])
            if used + cost <= room:
                chosen.add(index)
                used += cost
        return chosen, used

    def _checkpoint(self, messages, room, context) -> Message | None:
        header = "Checkpoint of earlier user messages (first sentences):"
        lines: list[str] = []
        used = context.counter.message_tokens(Message("user", header))
        sentences = [re.split(r"(?<=[.!?])\s", m.content.strip(), maxsplit=1)[0] for m in messages]
        costs = context.counter.contents_tokens(["\n- " + sentence for sentence in sentences])
        for sentence, cost in zip(sentences, costs):
            if used + cost <= room:
                lines.append(sentence)
                used += cost
        if not lines:
            return None
        return Message("user", header + "".join("\n- " + s for s in lines), {"source_id": "checkpoint"})


@hookimpl
def register_strategies(register):
    for strategy in (Truncation, FullContext, Recency, SummaryBuffer, Checkpoint):
        register(strategy)
