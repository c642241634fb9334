"""One cell's event stream and its model-call channel.

``CellLog`` writes a cell's events and, once its terminal row is written, nothing more:
the same lock orders "close" before the terminal row, so an event that arrives later (a
strategy thread left behind by a timeout) is refused and recorded in ``late_calls.jsonl``.
``AuxChannel`` is ``context.complete``: every auxiliary call goes through the same gate as
answer prompts, with the cell's deadline, and is refused once the cell has ended.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from .backends import GenerationParams
from .events import AuxCall, CellEvent, Error, RefusedCall, Terminal, Warning
from .gate import AuxiliaryBudgetError, gate, served_over_budget
from .messages import Message
from .model_calls import CallOutcome, ModelCaller
from .runlog import EventLog
from .sandbox import Deadline, PluginRef
from .tokenizers import PromptCounter

LATE_CALLS = "late_calls.jsonl"


class CellClosed(RuntimeError):
    """A call through a cell's ``complete`` after the cell ended (or after its deadline)."""


@dataclass(frozen=True)
class CellStamp:
    """What every row of one cell carries: its ``events.CellKey`` fields and the run's stamps."""

    task: str
    strategy: str
    budget: int
    repeat: int
    item_id: str
    category: str | None
    run_key: str
    tokenizer: dict[str, Any] | None

    def fields(self) -> dict[str, Any]:
        return dict(self.__dict__)


class CellLog:
    """The events of one cell, in order, ending with exactly one terminal row."""

    def __init__(
        self, log: EventLog, key: CellStamp, on_terminal: Callable[[str, dict[str, Any]], None] | None = None
    ) -> None:
        self.log = log
        self.key = key
        self.on_terminal = on_terminal
        self._lock = threading.Lock()
        self.closed = False  # the auxiliary-call channel: closed when the strategy's part ends
        self.finished = False  # the terminal row is written: nothing follows it
        self.terminal: str | None = None
        self.strategy_s: float | None = None
        self.aux = {"aux_calls": 0, "aux_prompt_tokens": 0, "aux_completion_tokens": 0, "aux_latency_s": 0.0}
        self.served_violation: str | None = None  # an auxiliary call the server counted over the budget
        self.evidence: dict[str, Any] | None = None  # evidence recall of the gated prompt, on the terminal row
        self.metered: dict[str, dict[str, Any]] = {}  # gateway calls per phase (host.metering), on the terminal row

    def make(self, cls: type[CellEvent], **fields: Any) -> CellEvent:
        extra = {**self.aux, "metered": self.metered, "evidence": self.evidence} if issubclass(cls, Terminal) else {}
        return cls(**self.key.fields(), **{**extra, **fields})

    def emit(self, cls: type[CellEvent], channel: bool = False, **fields: Any) -> bool:
        """Write a non-terminal event; refused (returns False) after the terminal row, or,
        for ``channel`` events (auxiliary calls), once the channel is closed."""
        event = self.make(cls, **fields)
        with self._lock:
            if self.finished or (channel and self.closed):
                self.late(
                    getattr(event, "purpose", cls.EVENT),
                    f"{cls.EVENT} event after the cell {'ended' if self.finished else 'closed its channel'}",
                )
                return False
            self.log.append(event.row())
            return True

    def finish(self, cls: type[Terminal], **fields: Any) -> bool:
        """Close the cell and write its terminal row (only the first call writes)."""
        event = self.make(cls, **fields)
        with self._lock:
            if self.finished:
                return False
            self.closed = self.finished = True
            self.terminal = cls.EVENT
            row = event.row()
            self.log.append(row)
        if self.on_terminal:
            self.on_terminal(cls.EVENT, row)
        return True

    def fail(self, phase: str, ref: PluginRef, cause: str, **fields: Any) -> bool:
        """The cell's error row for a plugin's failure: ``ref`` names the plugin and its distribution."""
        return self.finish(Error, phase=phase, plugin=ref.name, distribution=ref.distribution, cause=cause, **fields)

    def close(self) -> None:
        with self._lock:
            self.closed = True

    def late(self, purpose: str, reason: str) -> None:
        row = RefusedCall(**self.key.fields(), purpose=purpose, reason=reason).row()
        self.log.append(row, self.log.run_dir / LATE_CALLS)


class AuxChannel:
    """``context.complete(messages, max_tokens, purpose)`` for one cell."""

    def __init__(
        self, cell: CellLog, counter: PromptCounter, caller: ModelCaller, seed: int, deadline: Deadline
    ) -> None:
        self.cell = cell
        self.counter = counter
        self.caller = caller
        self.seed = seed
        self.deadline = deadline

    def _refuse(self, purpose: str, reason: str) -> CellClosed:
        self.cell.late(purpose, reason)
        return CellClosed(f"auxiliary call {purpose!r} refused: {reason}")

    def __call__(self, messages: Sequence[Message], max_tokens: int, purpose: str) -> str:
        purpose = purpose if isinstance(purpose, str) else type(purpose).__name__
        if self.cell.closed:
            raise self._refuse(purpose, "the cell had already ended")
        if self.deadline.expired():
            raise self._refuse(purpose, "the cell's deadline had passed")
        if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens <= 0:
            raise ValueError(f"auxiliary call {purpose!r}: max_tokens must be a positive int, got {max_tokens!r}")
        budget = self.cell.key.budget
        gated = gate(messages, budget, self.counter)
        common = dict(
            purpose=purpose, prompt_hash=gated.prompt_hash, prompt_tokens=gated.tokens, messages=gated.messages()
        )
        if not gated.admitted:
            self.cell.emit(AuxCall, channel=True, sent=False, **common)
            raise AuxiliaryBudgetError(
                f"auxiliary call {purpose!r} has {gated.tokens} prompt tokens, over the budget of {budget}",
                gated.tokens,
            )
        if self.cell.closed:
            raise self._refuse(purpose, "the cell had already ended")
        outcome: CallOutcome = self.caller.call(
            gated.prompt, GenerationParams(int(max_tokens), 0.0, self.seed), self.deadline, chat_json=gated.chat_json
        )
        completion = outcome.completion
        for warning in outcome.warnings:
            self.cell.emit(Warning, kind="cache_corrupt", detail=warning)
        if not self.cell.emit(
            AuxCall,
            channel=True,
            sent=True,
            served_prompt_tokens=completion.prompt_tokens,
            completion_tokens=completion.completion_tokens,
            latency_s=completion.latency_s,
            cached=outcome.cached,
            completion=completion.text,
            **common,
        ):
            raise CellClosed(f"auxiliary call {purpose!r}: the cell ended while it was in flight")
        aux = self.cell.aux
        aux["aux_calls"] += 1
        aux["aux_prompt_tokens"] += gated.tokens
        aux["aux_completion_tokens"] += completion.completion_tokens or 0
        aux["aux_latency_s"] += completion.latency_s
        if served_over_budget(completion.prompt_tokens, budget) and self.cell.served_violation is None:
            self.cell.served_violation = (
                f"auxiliary call {purpose!r}: the server counted {completion.prompt_tokens} "
                f"prompt tokens, over the budget of {budget} (we counted {gated.tokens})"
            )
        return completion.text
