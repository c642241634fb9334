"""The run's metering gateway, bound to cells: every call a plugin's own SDK makes is a row.

Each plugin worker gets one gateway token for its life (in ``OPENAI_API_KEY`` and
``OPENAI_BASE_URL``: an SDK keeps the key it was built with). The token is live only while
that worker's ``apply`` runs, bound to the cell and the phase the worker is in (``write``
while a memory system ingests, ``read`` while it retrieves, ``aux`` otherwise); ``aux``
prompts are budget-checked against the cell's budget, ``write`` and ``read`` are metered but
not budgeted (the budget is what one call of the agent may present). Outside ``apply`` the
token is refused: a call from a thread the plugin left running never reaches a server, and is
recorded in ``late_calls.jsonl`` against the cell the worker last served.
"""

from __future__ import annotations

import math
import secrets
import threading
from typing import Any

from ..backends import Completion, GenerationParams
from ..cell import CellLog
from ..events import MeteredCall
from ..messages import Message
from ..model_calls import ModelCaller
from ..tokenizers import PromptCounter
from .gateway import CallRecord, MeteringGateway

PHASE_OF = {"ingest": "write", "retrieve": "read"}  # a memory system's phase -> the ledger's


class Metering:
    """Starts the gateway in front of the run's model caller; binds worker tokens to cells."""

    def __init__(self, caller: ModelCaller, counter: PromptCounter, seed: int) -> None:
        self.caller = caller
        self.seed = seed
        self.gateway = MeteringGateway(
            self._forward, counter.count, self._record, count_text=counter.tokenizer.count_text
        )
        self._lock = threading.Lock()
        self._cells: dict[str, CellLog] = {}  # token -> the cell it is bound to now, or served last

    def start(self) -> None:
        self.gateway.start()

    def stop(self) -> None:
        self.gateway.stop()

    @property
    def port(self) -> int:
        return int(self.gateway.base_url.rsplit(":", 1)[1])

    def new_token(self) -> str:
        """A worker's token: not live until ``bind``."""
        return secrets.token_urlsafe(24)

    def environment(self, token: str) -> dict[str, str]:
        """What a worker's SDKs read: OpenAI's variables, and ours for plugins that configure a client."""
        url = self.gateway.url_for(token)
        return {"OPENAI_BASE_URL": url, "OPENAI_API_KEY": token, "BUDGETBENCH_GATEWAY_URL": url}

    def bind(self, token: str, cell: CellLog, phase: str | None) -> None:
        phase = PHASE_OF.get(phase or "", "aux")
        budget = cell.key.budget if phase == "aux" else None
        with self._lock:
            self._cells[token] = cell
        self.gateway.grant(_label(cell), phase, budget, token=token)

    def unbind(self, token: str) -> None:
        self.gateway.revoke(token)

    def _forward(self, messages: tuple[Message, ...], params: GenerationParams) -> Completion:
        return self.caller.call(messages, GenerationParams(params.max_tokens, params.temperature, self.seed)).completion

    def _record(self, record: CallRecord) -> None:
        with self._lock:
            cell = self._cells.get(record.token or "")
        if cell is None:
            return  # a token no worker holds: nothing was forwarded, and no cell to charge
        if record.kind == "refused" or record.phase is None:
            cell.late(f"gateway {record.endpoint}", f"refused by the metering gateway: {record.error}")
            return
        fields: dict[str, Any] = dict(
            phase=record.phase,
            endpoint=record.endpoint,
            kind=record.kind,
            model=record.model,
            input_tokens=record.input_tokens,
            served_prompt_tokens=record.served_prompt_tokens,
            completion_tokens=record.completion_tokens,
            latency_s=round(record.latency_s, 6),
            ok=record.ok,
            status=record.status,
            error=record.error,
        )
        if cell.emit(MeteredCall, channel=True, **fields) and record.kind == "call" and record.ok:
            _add(cell, record)


def _label(cell: CellLog) -> str:
    key = cell.key
    return f"{key.task}/{key.strategy}/{key.budget}/r{key.repeat}/{key.item_id}"


def _totals(cell: CellLog, phase: str) -> dict[str, Any]:
    """The cell's running totals of ``phase`` (ledger phases: write, read, aux), on its terminal row."""
    return cell.metered.setdefault(
        phase, {"calls": 0, "input_tokens": 0, "completion_tokens": 0, "latency_s": 0.0, "cpu_s": 0.0}
    )


def reported_cpu(reported: Any) -> dict[str, float]:
    """The usable part of what a worker reported of its CPU seconds by phase."""
    if not isinstance(reported, dict):
        return {}
    return {
        str(phase): float(seconds)
        for phase, seconds in reported.items()
        if type(seconds) in (int, float) and math.isfinite(seconds) and seconds >= 0
    }


def cpu_by_phase(reported: Any, measured: float) -> dict[str, float]:
    """``measured`` seconds split by the phases the worker reported: the worker knows when its
    plugin ingests or retrieves, only the harness's clock says how much in all. Each named phase
    gets what the worker reported of it and ``apply`` the rest, where the few microseconds
    between the worker's clock and the harness's reading fall (scaled down only if the named
    phases claim more than was measured). Reporting less, or nothing, moves seconds between
    phases at most, never changes the total."""
    parts = reported_cpu(reported)
    named = {phase: seconds for phase, seconds in parts.items() if phase != "apply"}
    claimed = sum(named.values())
    if claimed > measured:
        return {phase: measured * seconds / claimed for phase, seconds in named.items()}
    return {**named, "apply": measured - claimed}


def charge_cpu(cell: CellLog, spent: dict[str, float]) -> None:
    """Add a worker's CPU seconds during the cell's ``apply`` (by the worker's phase: ingest,
    retrieve, the rest) to the cell's totals of write, read and aux."""
    for phase, seconds in spent.items():
        totals = _totals(cell, PHASE_OF.get(str(phase), "aux"))
        totals["cpu_s"] = round(totals["cpu_s"] + seconds, 6)


def _add(cell: CellLog, record: CallRecord) -> None:
    """The cell's per-phase totals for its terminal row (a missing count stays missing)."""
    charge(cell, str(record.phase), record.input_tokens, record.completion_tokens, record.latency_s)


def charge(
    cell: CellLog, phase: str, input_tokens: int | None, completion_tokens: int | None, latency_s: float
) -> None:
    """One call on ``cell``'s ``metered[phase]`` totals: once a count is missing, the sum stays
    missing (never a silent 0)."""
    totals = _totals(cell, phase)
    totals["calls"] += 1
    for name, value in (("input_tokens", input_tokens), ("completion_tokens", completion_tokens)):
        if totals[name] is not None:
            totals[name] = None if value is None else totals[name] + value
    totals["latency_s"] = round(totals["latency_s"] + latency_s, 6)
