"""The harness's side of the plugin host: a strategy proxy bound to one worker process.

``RemoteStrategy`` is a ``MemoryStrategy`` to the engine, so a cell runs the same steps
whether the strategy is here (``--isolation none``) or in its worker. Its ``apply`` sends the
strategy's view, budget and seed, then answers the worker's requests in order: token counts
with the run's own counter, auxiliary calls through the cell's gated channel (which runs
here, so every call is counted, gated, logged and refused after the cell ends), until the
worker returns its prompt. The engine canonicalises, validates and counts that prompt again
as for any strategy. Killing the worker (``close``) ends whatever the plugin was doing.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
from collections.abc import Sequence
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from ..cell import CellLog
from ..gate import AuxiliaryBudgetError
from ..memory_systems import IngestLossError
from ..messages import Message
from ..sandbox import PhaseError, PluginRaised, PromptError, describe_exception
from ..strategies import MemoryStrategy, Regime, StrategyContext
from . import wire
from .metering import Metering, charge_cpu, cpu_by_phase, process_cpu_clock, reported_cpu
from .proxy import OutsideProxy


class WorkerGone(RuntimeError):
    """The worker exited or was killed while the harness waited for it."""


class WorkerProcess:
    """One spawned worker: ``python -m budgetbench_core.host.worker``, its own session (Ctrl-C
    is the harness's to handle), stdout and stderr to ``log``, talking over a socket pair."""

    def __init__(self, env: dict[str, str], log: Path, cwd: Path) -> None:
        ours, theirs = socket.socketpair()
        with open(log, "ab") as output:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "budgetbench_core.host.worker", str(theirs.fileno())],
                pass_fds=[theirs.fileno()],
                stdin=subprocess.DEVNULL,
                stdout=output,
                stderr=output,
                env=env,
                cwd=cwd,
                start_new_session=True,
            )
        theirs.close()
        self.conn = Connection(os.dup(ours.fileno()))
        ours.close()

    def exchange(self, frame: dict[str, Any]) -> dict[str, Any]:
        try:
            wire.send(self.conn, frame)
        except OSError:
            return self.receive()  # gone: says so with its exit code
        return self.receive()

    def receive(self) -> dict[str, Any]:
        try:
            return wire.receive(self.conn)
        except (EOFError, OSError):
            try:
                code: int | None = self.process.wait(timeout=2)
            except subprocess.TimeoutExpired:
                code = None
            raise WorkerGone(f"the plugin's worker process ended (exit code {code})") from None

    def alive(self) -> bool:
        return self.process.poll() is None and not self.conn.closed

    def kill(self) -> None:
        """End the worker and everything it started (its own session), at once."""
        try:
            os.killpg(self.process.pid, 9)
        except (ProcessLookupError, PermissionError):
            pass
        self.process.wait()
        self.conn.close()


class RemoteStrategy(MemoryStrategy):
    """A strategy running in its own worker process (see the module docstring)."""

    def __init__(
        self,
        name: str,
        worker: WorkerProcess,
        created: dict[str, Any],
        metering: Metering | None = None,
        token: str | None = None,
        proxy: OutsideProxy | None = None,
        proxy_token: str | None = None,
    ) -> None:
        self.params = {}
        self.name = name  # type: ignore[misc]
        self.worker = worker
        self.created = created
        self.current_phase: str | None = None  # a memory system's ingest or retrieve while one runs
        self.saved_retrieval: dict[str, Any] | None = None  # what the engine kept from a previous invocation
        self.new_retrieval: dict[str, Any] | None = None  # what the worker retrieved: the engine saves it
        self.metering, self.token = metering, token  # the worker's gateway token, live only during apply
        self.proxy, self.proxy_token = proxy, proxy_token  # its outside proxy credentials, live only during apply
        self.cell: CellLog | None = None  # set by the engine before apply: whom the gateway's calls are charged to
        self._sent_view: Any = None  # the view the worker holds (the engine's object for this item)
        self._cpu_clock = process_cpu_clock(worker.process.pid)  # the worker's CPU time, read from here
        self._cpu_mark = self._cpu_clock() if self._cpu_clock is not None else None
        self._reported_cpu: Any = None  # the worker's own split of its last apply's CPU, by phase
        self._fresh = True  # no apply since the worker started or was reset
        self._phases_left: list[str] = []  # the phases this apply may still enter, in order
        self._lock = threading.Lock()
        self.regime = Regime.LOCAL_ONLY  # type: ignore[misc]  # the worker's describe() says the real one

    @property
    def distribution(self) -> str:
        return str(self.created.get("distribution", "unknown"))

    def resets_nothing(self) -> bool:
        return bool(self.created.get("resets_nothing"))

    def describe(self) -> dict[str, Any]:
        return self._call({"op": "describe"}) or {}

    def reset(self) -> None:
        self._call({"op": "reset"})
        self._fresh = True

    def apply(self, history: Sequence[Message], budget: int, context: StrategyContext) -> list[Message]:
        frame = {
            "op": "apply",
            # the view crosses once per item: every budget tier of it reuses the worker's copy
            "view": None if self._sent_view is context.item else wire.view_to_wire(context.item),
            "budget": budget,
            "seed": context.seed,
            "saved_retrieval": self.saved_retrieval,
        }
        self._bind(None)
        if self.proxy is not None and self.proxy_token is not None:
            self.proxy.bind(self.proxy_token, self.cell)
        self._reported_cpu = None
        # A memory system ingests and retrieves in the first apply of an item, once each and in
        # that order: a phase the worker reports elsewhere would relabel its calls (a write is
        # amortised and not budgeted), so it ends the worker and fails the cell.
        self._phases_left = ["ingest", "retrieve"] if self._fresh or frame["view"] is not None else []
        self._fresh = False
        try:
            done = self._call(frame, context)
        finally:
            self._phases_left = []
            self._charge_cpu()
            self.cell = None  # the next cell sets its own
            if self.metering is not None and self.token is not None:
                self.metering.unbind(self.token)
            if self.proxy is not None and self.proxy_token is not None:
                self.proxy.unbind(self.proxy_token)  # its tunnels closed, their bytes on the cell's row
        self._sent_view = context.item
        audit = done.get("audit")
        if isinstance(audit, dict):
            context.audit.update(audit)
        self.new_retrieval = done.get("retrieval") if isinstance(done.get("retrieval"), dict) else None
        prompt = done.get("prompt")
        if not isinstance(prompt, list) or not all(isinstance(m, dict) for m in prompt):
            raise PromptError(f"apply must return list[Message], got {type(prompt).__name__}")
        try:
            return [wire.message_from_wire(m) for m in prompt]
        except (KeyError, TypeError, wire.WireError) as exc:
            raise PromptError(f"apply returned a malformed message: {describe_exception(exc)}") from None

    def close(self) -> None:
        self.worker.kill()

    def _enter(self, phase: str | None) -> None:
        """Accept the phase the worker says it entered, or end the worker (see ``apply``)."""
        if phase is None:
            return
        if phase not in self._phases_left:
            self.worker.kill()
            raise PluginRaised(
                f"its worker reported entering phase {phase!r} where no such phase can begin (a memory system "
                f"ingests, then retrieves, once each in the first apply of an item): the worker was ended"
            )
        del self._phases_left[: self._phases_left.index(phase) + 1]

    def _charge_cpu(self) -> None:
        """Charge the cell with the worker's CPU since the last apply ended (its reset, and any
        thread it left running, included), measured by the harness where it can."""
        if self.cell is None:
            return
        if self._cpu_clock is None:  # no clock for another process here: the worker's own word
            charge_cpu(self.cell, reported_cpu(self._reported_cpu))
            return
        now = self._cpu_clock()
        if now is None or self._cpu_mark is None:
            return  # the worker is gone: its last seconds cannot be read
        measured, self._cpu_mark = max(0.0, now - self._cpu_mark), now
        charge_cpu(self.cell, cpu_by_phase(self._reported_cpu, measured))

    def _bind(self, phase: str | None) -> None:
        """Charge the worker's gateway calls to this cell and ``phase`` from now on."""
        if self.metering is not None and self.token is not None and self.cell is not None:
            self.metering.bind(self.token, self.cell, phase)

    # ------------------------------------------------------------- the exchange

    def _call(self, frame: dict[str, Any], context: StrategyContext | None = None) -> Any:
        """Send ``frame``, answer the worker's requests, return its result or raise its failure."""
        with self._lock:
            aux_refusal: AuxiliaryBudgetError | None = None
            reply = self.worker.exchange(frame)
            while True:
                if "done" in reply or "failed" in reply:
                    self._reported_cpu = reply.get("cpu_s")
                if "done" in reply:
                    return reply["done"]
                if "failed" in reply:
                    retrieval = reply["failed"].get("retrieval")
                    self.new_retrieval = retrieval if isinstance(retrieval, dict) else None
                    raise self._failure(reply["failed"], aux_refusal)
                if "phase" in reply:
                    self.current_phase = reply["phase"] if isinstance(reply["phase"], str) else None
                    self._enter(self.current_phase)
                    self._bind(self.current_phase)
                    reply = self.worker.receive()
                    continue
                if context is None:
                    raise WorkerGone(f"the worker asked {reply.get('req')!r} outside apply")
                try:
                    answer: dict[str, Any] = {"ok": self._answer(reply, context)}
                except AuxiliaryBudgetError as exc:
                    aux_refusal = exc
                    answer = {
                        "error": {"kind": "auxiliary_budget", "message": str(exc), "prompt_tokens": exc.prompt_tokens}
                    }
                except Exception as exc:  # noqa: BLE001 - refused: the plugin sees why, the cell goes on
                    answer = {"error": {"kind": "refused", "message": describe_exception(exc)}}
                reply = self.worker.exchange(answer)

    @staticmethod
    def _answer(request: dict[str, Any], context: StrategyContext) -> Any:
        kind = request.get("req")
        tokenizer = context.counter.tokenizer
        if kind == "count_history":  # the view's history, in order: what the strategy was sent
            return [tokenizer.count_in_message(m.role, m.content) for m in context.item.history]
        if kind == "count_in_message":
            return context.counter.tokenizer.count_in_message(str(request["role"]), str(request["content"]))
        if kind == "count_text":
            return tokenizer.count_text(str(request["text"]))
        if kind == "count_rendered":
            return tokenizer.count_rendered(str(request["text"]))
        if kind in ("count", "render"):
            messages = [wire.message_from_wire(m) for m in request["messages"]]
            return context.counter.count(messages) if kind == "count" else tokenizer.render(messages)
        if kind == "complete":
            messages = [wire.message_from_wire(m) for m in request["messages"]]
            return context.complete(messages, request["max_tokens"], request.get("purpose", "auxiliary"))
        raise ValueError(f"unknown request {kind!r}")

    def _failure(self, failed: dict[str, Any], aux_refusal: AuxiliaryBudgetError | None) -> BaseException:
        kind, message = failed.get("kind"), str(failed.get("message", ""))
        phase = failed.get("phase") if isinstance(failed.get("phase"), str) else None
        if kind == "auxiliary_budget" and aux_refusal is not None:
            return aux_refusal  # only a refusal the harness itself made is a violation
        if kind == "ingest_loss":
            return IngestLossError(message)
        if kind == "prompt":
            return PromptError(message)
        raised = PluginRaised(message, str(failed.get("traceback", "")))
        return PhaseError(phase, raised) if phase in ("ingest", "retrieve") else raised
