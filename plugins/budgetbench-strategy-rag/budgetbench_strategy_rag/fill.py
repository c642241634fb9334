"""Filling a budget with ranked units.

Whole units in rank order; a unit that does not fit is skipped and filling goes on with the
next one, so a long unit never blocks shorter, lower-ranked ones. The chosen units are put
back in chronological order between the system prompt and the query, and the prompt is
confirmed with the exact count of the rendered prompt; should the per-message estimate
have been short (a template that is not additive), the lowest-ranked units are dropped
until the exact count fits.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from budgetbench_core import Message, StrategyContext, keep_exchanges

from .units import Unit, assemble, unit_message


@dataclass
class Fill:
    messages: list[Message]
    chosen: list[int]
    """Positions in the ranking of the units kept, best first."""
    skipped: int
    """Units ranked above the last kept one that were passed over because they did not fit."""
    exact_tokens: int


def fill_budget(
    ranking: Sequence[int], units: Sequence[Unit], history: Sequence[Message], budget: int, context: StrategyContext
) -> Fill:
    counter = context.counter
    used = counter.estimate(context.frame([]))
    smallest = 1 + min(counter.message_tokens(Message(role, "")) for role in {m.role for m in history} or {"user"})
    chosen: list[int] = []
    for position, unit_index in enumerate(ranking):
        if budget - used < smallest:
            break  # not even an empty message fits any more
        cost = counter.message_tokens(unit_message(units[unit_index], history))
        if used + cost <= budget:
            chosen.append(position)
            used += cost
    while True:
        kept = keep_exchanges(assemble([units[ranking[p]] for p in chosen], history), history, context.item.query)
        messages = context.frame(kept)  # agent episodes: a tool call and its result stay together
        exact = counter.count(messages)
        if exact <= budget or not chosen:
            skipped = chosen[-1] + 1 - len(chosen) if chosen else 0
            return Fill(messages, chosen, skipped, exact)
        chosen.pop()
