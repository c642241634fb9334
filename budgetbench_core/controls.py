"""The two harness controls of a budget curve (issue 29): reference lines, never strategies.

A control is run by the harness, not by a plugin, because it needs what strategies never
see (the evidence marks of the full item). Its rows are those of a strategy named after
it (``control:no_memory``, ``control:evidence_only``), so every table shows them, marked
as controls and never ranked (``is_control``).

- ``control:no_memory``: the item's frame with no history at all, the system prompt and
  the query. An item it answers correctly at a tier says nothing about memory there: the
  report flags it "answerable without memory" and shows every strategy's score on the
  other items too.
- ``control:evidence_only``: only the history messages the task marks as evidence
  (``EVIDENCE_KEY`` in their metadata, see ``budgetbench_core.evidence``), whole, in their
  order in the history, fitted to the budget: the newest first, each kept when the framed
  prompt with it still fits by the exact count (a message that does not fit is skipped and
  older, smaller ones are still tried). The ceiling a memory strategy can reach at that
  budget with this model. An item without marks gets the no-memory prompt.

Both return the prompt as ``list[Message]``; the runner gates and counts it like any other
prompt, so when the system prompt and query alone exceed the budget the row is a violation.
"""

from __future__ import annotations

from collections.abc import Sequence

from .evidence import EVIDENCE_KEY
from .messages import Item, Message
from .strategies import MemoryStrategy, Regime, StrategyContext
from .tokenizers import PromptCounter

NO_MEMORY = "control:no_memory"
EVIDENCE_ONLY = "control:evidence_only"
CONTROLS = (NO_MEMORY, EVIDENCE_ONLY)
PREFIX = "control:"


def is_control(strategy: str) -> bool:
    """A harness control: a reference line, never a strategy to rank."""
    return strategy.startswith(PREFIX)


class HarnessControl(MemoryStrategy):
    """A control in the engine's strategy slot. The engine builds its prompt with
    ``control_prompt`` from the full item (which no strategy is given); ``apply`` is never called."""

    regime = Regime.LOCAL_ONLY

    def __init__(self, name: str) -> None:
        if name not in CONTROLS:
            raise ValueError(f"unknown control {name!r}; controls: {', '.join(CONTROLS)}")
        super().__init__()
        self.name = name  # type: ignore[misc]

    def apply(self, history: Sequence[Message], budget: int, context: StrategyContext) -> list[Message]:
        raise RuntimeError(f"{self.name} is built by the engine from the full item (controls.control_prompt)")


def is_evidence(message: Message) -> bool:
    """A history message the task marks as (holding) evidence."""
    value = message.metadata.get(EVIDENCE_KEY)
    return value is not None and value is not False


def evidence_that_fits(item: Item, budget: int, counter: PromptCounter) -> list[Message]:
    """The marked evidence messages kept by ``control:evidence_only``, in history order."""
    kept: list[Message] = []
    for message in reversed([m for m in item.history if is_evidence(m)]):
        candidate = [message, *kept]
        if counter.count(item.frame(candidate)) <= budget:
            kept = candidate
    return kept


def control_prompt(name: str, item: Item, budget: int, counter: PromptCounter) -> list[Message]:
    """The prompt of control ``name`` (one of ``CONTROLS``) for the FULL ``item`` at ``budget``."""
    if name == NO_MEMORY:
        return item.frame([])
    if name == EVIDENCE_ONLY:
        return item.frame(evidence_that_fits(item, budget, counter))
    raise ValueError(f"unknown control {name!r}; controls: {', '.join(CONTROLS)}")
