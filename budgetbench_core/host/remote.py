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
import select
import shutil
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Sequence
from multiprocessing.connection import Connection
from operator import index
from pathlib import Path
from typing import Any

from ..cell import CellLog
from ..gate import AuxiliaryBudgetError
from ..memory_systems import IngestLossError, IngestReport, MemorySystem, MemorySystemStrategy, RetrievedItem
from ..messages import Message, Session
from ..sandbox import PhaseError, PluginRaised, PromptError, describe_exception
from ..strategies import MemoryStrategy, Regime, StrategyContext
from . import wire
from .cpu_clock import worker_cpu_clock
from .metering import Metering, charge_cpu, cpu_by_phase, reported_cpu
from .proxy import OutsideProxy
from .quotas import Quota, describe_exit


class WorkerGone(RuntimeError):
    """The worker exited or was killed while the harness waited for it."""


class WorkerProcess:
    """One spawned worker: ``python -m budgetbench_core.host.worker FD`` starts as the worker's
    guard (``guard``: its own session, Ctrl-C is the harness's to handle), which forks the worker
    and names it in its first frame; stdout and stderr to ``log``, frames over a socket pair."""

    def __init__(self, env: dict[str, str], log: Path, cwd: Path, quota: Quota) -> None:
        ours, theirs = socket.socketpair()
        self.scratch, self.quota = cwd, quota
        with open(log, "ab") as output:
            self.process = subprocess.Popen(  # the guard
                [sys.executable, "-m", "budgetbench_core.host.worker", str(theirs.fileno()), *quota.to_argv()],
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
        self.pid: int | None = None  # the worker's, once its guard has named it
        self.shared_memory: str | None = None  # its /dev/shm, as its guard names it with the pid
        self.largest_sent = 0  # bytes: what the worker sends back is bounded by it (``wire.reply_limit``)
        self._pidfd: int | None = None  # the worker's, to signal it (never a reused pid) and see it end

    def exchange(self, frame: dict[str, Any]) -> dict[str, Any]:
        if self.pid is None:
            self._learn_pid()
        try:
            self.largest_sent = max(self.largest_sent, wire.send_to_worker(self.conn, frame))
        except OSError:
            return self.receive()  # gone: says so with its exit code
        return self.receive()

    def _learn_pid(self) -> None:
        """The guard's first frame, sent before any plugin code runs: the worker's pid."""
        frame = self.receive()
        named = frame.get("worker_pid")
        if not isinstance(named, int) or isinstance(named, bool):
            self.kill()
            raise WorkerGone(f"the worker's guard sent {named!r}, not a pid")
        self.pid = named
        self.shared_memory = str(frame.get("shared_memory"))  # "private", or "shared: why" (manifest)
        try:
            self._pidfd = os.pidfd_open(named)
        except (AttributeError, OSError):  # no pidfd here (not Linux 5.3+): signalled by pid
            self._pidfd = None

    def receive(self) -> dict[str, Any]:
        try:
            return wire.receive(self.conn, wire.reply_limit(self.largest_sent))
        except wire.FrameTooLarge as exc:
            self.kill()
            raise WorkerGone(
                f"the plugin's worker sent {exc}, the largest it was sent times "
                f"{wire.REPLY_FRAME_FACTOR}: the worker was ended"
            ) from None
        except (EOFError, OSError):
            try:
                code: int | None = self.process.wait(timeout=2)  # the guard exits as the worker did
            except subprocess.TimeoutExpired:
                code = None
            over = describe_exit(code, self.quota)
            if over is not None:
                raise WorkerGone(f"the plugin's worker {over}: its guard ended it") from None
            raise WorkerGone(f"the plugin's worker process ended (exit code {code})") from None

    def alive(self) -> bool:
        if self.process.poll() is not None or self.conn.closed:
            return False
        if self._pidfd is None:
            return True
        ready = select.poll()  # not select(): a pidfd may be numbered past FD_SETSIZE in a long process
        ready.register(self._pidfd, select.POLLIN)
        return not ready.poll(0)  # readable once the worker has exited

    def kill(self) -> None:
        """End the worker and everything it started, at once: the worker is killed here, its
        guard then kills every process the worker left (``guard``) and exits."""
        if self.pid is not None and self.process.poll() is None:
            try:
                if self._pidfd is not None:
                    signal.pidfd_send_signal(self._pidfd, signal.SIGKILL)
                else:
                    os.kill(self.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            try:
                self.process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
        try:  # before the worker was named, or a guard that did not end in time
            os.killpg(self.process.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        self.process.wait()
        self.conn.close()
        if self._pidfd is not None:
            os.close(self._pidfd)
            self._pidfd = None
        shutil.rmtree(self.scratch, ignore_errors=True)  # nothing runs there now: its space comes back at once


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
        max_ingest_loss: float = 0.0,
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
        self._view_text: tuple[Any, Any] = (None, None)  # (view, its wire.ViewText): what its prompts may stand for
        # the worker's CPU time and its child processes', read from here (its pid is known once it has been created)
        self._cpu_clock = worker_cpu_clock(worker.process.pid, worker.pid) if worker.pid is not None else None
        self._cpu_mark = self._cpu_clock() if self._cpu_clock is not None else None
        self._reported_cpu: dict[str, float] = {}  # the worker's own split of this apply's CPU, by phase
        self._lock = threading.Lock()
        self.regime = Regime.LOCAL_ONLY  # type: ignore[misc]  # the worker's describe() says the real one
        # A memory system is driven from here: its worker ingests a view without the question,
        # then retrieves for the question; filling the budget happens here (MemorySystemStrategy).
        self.memory = (
            MemorySystemStrategy(_WorkerSystem(self), max_ingest_loss) if created.get("memory_system") else None
        )

    @property
    def distribution(self) -> str:
        return str(self.created.get("distribution", "unknown"))

    def resets_nothing(self) -> bool:
        return bool(self.created.get("resets_nothing"))

    def describe(self) -> dict[str, Any]:
        described = self._call({"op": "describe"}) or {}
        if self.memory is not None and isinstance(described, dict):
            described = {**described, "max_ingest_loss": self.memory.max_ingest_loss}
        return described

    def reset(self) -> None:
        if self.memory is not None:
            self.memory.reset()  # forgets the item here, and resets the system in its worker
        else:
            self._call({"op": "reset"})

    def apply(self, history: Sequence[Message], budget: int, context: StrategyContext) -> list[Message]:
        self.current_phase = None
        self._bind(None)
        if self.proxy is not None and self.proxy_token is not None:
            self.proxy.bind(self.proxy_token, self.cell)
        self._reported_cpu = {}
        try:
            if self.memory is not None:
                return self._apply_memory(history, budget, context)
            frame = {
                "op": "apply",
                # the view crosses once per item: every budget tier of it reuses the worker's copy
                "view": None if self._sent_view is context.item else wire.view_to_wire(context.item),
                "budget": index(budget),
                "seed": index(context.seed),
            }
            done = self._call(frame, context)
        finally:
            self._charge_cpu()
            self.cell = None  # the next cell sets its own
            if self.metering is not None and self.token is not None:
                self.metering.unbind(self.token)
            if self.proxy is not None and self.proxy_token is not None:
                self.proxy.unbind(self.proxy_token)  # its tunnels closed, their bytes on the cell's row
        self._sent_view = context.item
        _take_audit(done, context)
        prompt = done.get("prompt")
        if not isinstance(prompt, list) or not all(isinstance(m, dict) for m in prompt):
            raise PromptError(f"apply must return list[Message], got {type(prompt).__name__}")
        try:
            return wire.prompt_from_wire(prompt, context.item.history, self._text_of(context.item))
        except (KeyError, TypeError, wire.WireError) as exc:
            raise PromptError(f"apply returned a malformed message: {describe_exception(exc)}") from None

    def close(self) -> None:
        self.worker.kill()

    def _apply_memory(self, history: Sequence[Message], budget: int, context: StrategyContext) -> list[Message]:
        """Ingest and retrieve in the worker (once per item, or the saved retrieval), fill here."""
        assert self.memory is not None
        self.memory.saved_retrieval = self.saved_retrieval
        self.memory.on_phase = self._enter
        try:
            return self.memory.apply(history, budget, context)
        finally:
            self.new_retrieval = self.memory.new_retrieval

    def _enter(self, phase: str | None) -> None:
        """The phase the harness drives the memory system into: its own SDK's calls are charged to it."""
        self.current_phase = phase
        self._bind(phase)

    def _ingest(self, context: StrategyContext) -> IngestReport:
        self._sent_view = None  # the worker now holds the ingest view, without the question
        done = self._operation({"op": "ingest", "view": wire.view_to_wire(context.item)}, context)
        return wire.ingest_report_from_wire(done.get("report"))

    def _retrieve(self, context: StrategyContext) -> list[RetrievedItem]:
        done = self._operation({"op": "retrieve", "query": wire.message_to_wire(context.item.query)}, context)
        return wire.ranked_from_wire(done.get("ranked"))

    def _operation(self, frame: dict[str, Any], context: StrategyContext) -> dict[str, Any]:
        """One of a memory system's operations; its failure is raised as the plugin's own
        (``MemorySystemStrategy`` tags it with the phase)."""
        try:
            done = self._call({**frame, "budget": index(context.budget), "seed": index(context.seed)}, context)
        except PhaseError as exc:
            raise exc.original from None
        if not isinstance(done, dict):
            raise wire.WireError(f"{frame['op']} returned {type(done).__name__}, not an object")
        _take_audit(done, context)
        return done

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
                    for phase, seconds in reported_cpu(reply.get("cpu_s")).items():
                        self._reported_cpu[phase] = self._reported_cpu.get(phase, 0.0) + seconds
                if "done" in reply:
                    return reply["done"]
                if "failed" in reply:
                    raise self._failure(reply["failed"], aux_refusal)
                if "req" not in reply:  # outside the protocol (a forged phase, say): the worker is ended
                    self.worker.kill()
                    raise PluginRaised(
                        f"its worker sent a frame that is not a request ({sorted(reply)[:5]}): the worker was ended"
                    )
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

    def _text_of(self, view: Any) -> wire.ViewText:
        """``view``'s text (``wire.ViewText``), worked out once per view."""
        if self._view_text[0] is not view:
            self._view_text = (view, wire.ViewText(view))
        return self._view_text[1]

    def _answer(self, request: dict[str, Any], context: StrategyContext) -> Any:
        """What the worker asked for, as plain data (a frame to a worker holds nothing else: a
        tokenizer's numpy or other int-like count crosses as an int)."""
        kind = request.get("req")
        tokenizer = context.counter.tokenizer
        if kind == "count_history":  # a span of the view's history: what the strategy was sent
            history = context.item.history
            start, stop = request.get("start"), request.get("stop")
            if type(start) is not int or type(stop) is not int or not 0 <= start <= stop <= len(history):
                raise ValueError(f"count_history needs 0 <= start <= stop <= {len(history)}, got {start!r}, {stop!r}")
            return [index(tokenizer.count_in_message(m.role, m.content)) for m in history[start:stop]]
        if kind == "count_in_message":
            return index(tokenizer.count_in_message(str(request["role"]), str(request["content"])))
        if kind == "count_text":
            return index(tokenizer.count_text(str(request["text"])))
        if kind == "count_texts":
            texts = request.get("texts")
            if not isinstance(texts, list) or not all(isinstance(t, str) for t in texts):
                raise ValueError("count_texts needs a list of strings")
            return [index(n) for n in tokenizer.count_texts(texts)]
        if kind == "count_rendered":
            return index(tokenizer.count_rendered(str(request["text"])))
        if kind in ("count", "render"):
            messages = wire.prompt_from_wire(request["messages"], context.item.history, self._text_of(context.item))
            return index(context.counter.count(messages)) if kind == "count" else str(tokenizer.render(messages))
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


def _take_audit(done: dict[str, Any], context: StrategyContext) -> None:
    audit = done.get("audit")
    if isinstance(audit, dict):
        context.audit.update(audit)


class _WorkerSystem(MemorySystem):
    """The memory system in a worker, as the harness's ``MemorySystemStrategy`` sees it."""

    name = "worker"  # the strategy's name is the RemoteStrategy's

    def __init__(self, remote: RemoteStrategy) -> None:
        super().__init__()
        self.remote = remote

    def reset(self) -> None:
        self.remote._call({"op": "reset"})

    def ingest(self, sessions: Sequence[Session], context: StrategyContext) -> IngestReport:
        return self.remote._ingest(context)  # the sessions are those of the view it sends

    def retrieve(self, query: str, context: StrategyContext) -> list[RetrievedItem]:
        return self.remote._retrieve(context)
