"""The program a plugin worker runs: one strategy (or memory system) in a process of its own.

Started by ``remote.WorkerProcess`` as ``python -m budgetbench_core.host.worker FD``; it reads
frames from the socket ``FD`` (``wire``), confines itself (``landlock``) before it loads the
entry point that registers its strategy, narrows that once the strategy is created, and then
serves ``reset``, ``describe`` and ``apply``. While ``apply`` runs, the strategy's token counts and auxiliary model calls are
requests back to the harness: the worker holds no tokenizer, no model client, no item with
its grading key, no run directory and no cache, only the strategy's view and its scratch
folder. Whatever it does to its own memory changes nothing the harness counts or records.
"""

from __future__ import annotations

import gc
import os
import signal
import socket
import sys
import time
import traceback
from collections.abc import Sequence
from dataclasses import asdict, replace
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from ..messages import Message
from ..tokenizers import PromptCounter, Tokenizer, TokenizerInfo, _stored_fields
from . import guard, quotas, wire


class HarnessRefused(RuntimeError):
    """The harness refused an auxiliary call (closed cell, passed deadline, bad arguments)."""


class Harness:
    """This worker's side of the channel: requests to the harness, answered in order."""

    def __init__(self, conn: Connection) -> None:
        self.conn = conn

    def ask(self, request: dict[str, Any]) -> Any:
        wire.send(self.conn, request)
        reply = wire.receive_from_harness(self.conn)
        if "error" in reply:
            error = reply["error"]
            if error.get("kind") == "auxiliary_budget":
                from ..gate import AuxiliaryBudgetError

                raise AuxiliaryBudgetError(error["message"], int(error.get("prompt_tokens") or 0))
            raise HarnessRefused(error["message"])
        return reply["ok"]


# The history text counted in one request (about 4K tokens): at most this much is counted needlessly.
HISTORY_BLOCK_CHARS = 16_384


class HarnessTokenizer(Tokenizer):
    """The run's tokenizer, asked through the harness: the worker never holds its own, so
    what a strategy does here can only mislead the strategy, never the gate."""

    def __init__(self, harness: Harness, info: dict[str, Any]) -> None:
        self.harness = harness
        self.info = TokenizerInfo(**info)
        self.history: list[tuple[str, str]] = []  # this item's history messages, in order
        self.position: dict[tuple[str, str], int] = {}
        self.known: dict[tuple[str, str], int] = {}  # counts the harness gave for them
        self.messages: Sequence[Message] = ()  # the view's own message objects (kept alive: ...
        self.history_at: dict[int, int] = {}  # ... their ids are the keys here), sent as references
        self.counted_at: dict[tuple[str, str, str], int] = {}  # what a count reads of each, the same
        self.block_of: list[tuple[int, int]] = []  # per history message, its block (start, stop)

    def learn_history(self, history: Sequence[Message]) -> None:
        """A new item: its history messages are counted a block at a time, when a strategy
        first needs one of the block. Not one round trip per message, and not the whole
        history either: a strategy that keeps the newest messages of a 115K-token history at a
        2K budget would have the harness count all of it. Blocks are cut from the newest
        message back, each of at least ``HISTORY_BLOCK_CHARS`` characters (the count's cost
        follows the text, not the number of messages), so what is counted beyond what the
        strategy reads is less than one block."""
        self.history = [(m.role, m.content) for m in history]
        self.position = {key: index for index, key in enumerate(self.history)}
        self.known = {}
        self.messages = history
        self.history_at = {id(m): index for index, m in enumerate(history)}
        self.counted_at = {fields: index for index, fields in enumerate(_stored_fields(history))}
        self.block_of = [(0, 0)] * len(history)
        stop, chars = len(history), 0
        for index in range(len(history) - 1, -1, -1):
            chars += len(self.history[index][1])
            if chars >= HISTORY_BLOCK_CHARS or index == 0:
                self.block_of[index:stop] = [(index, stop)] * (stop - index)
                stop, chars = index, 0

    def to_wire(self, messages: Sequence[Message]) -> list[dict[str, Any]]:
        return wire.prompt_to_wire(messages, self.history_at)

    def _counted_to_wire(self, messages: Sequence[Message]) -> list[dict[str, Any]]:
        """Messages to count or render (``PromptCounter`` rebuilt them from what a count reads:
        role, content, tool-call field), a history message's as a reference."""
        at = self.counted_at
        return [
            {"history": at[fields]} if fields in at else m.to_dict()
            for m, fields in zip(messages, _stored_fields(messages))
        ]

    def _count_block_of(self, index: int) -> None:
        """Count the block of history messages holding ``index``."""
        start, stop = self.block_of[index]
        counts = self.harness.ask({"req": "count_history", "start": start, "stop": stop})
        self.known.update((key, int(n)) for key, n in zip(self.history[start:stop], counts))

    def render(self, messages: Sequence[Message]) -> str:
        return str(self.harness.ask({"req": "render", "messages": self._counted_to_wire(messages)}))

    def count_text(self, text: str) -> int:
        return int(self.harness.ask({"req": "count_text", "text": text}))

    def count_texts(self, texts: Sequence[str]) -> list[int]:
        counts = self.harness.ask({"req": "count_texts", "texts": list(texts)})
        return [int(n) for n in counts]

    def count(self, messages: Sequence[Message]) -> int:
        return int(self.harness.ask({"req": "count", "messages": self._counted_to_wire(messages)}))

    def count_rendered(self, prompt: str) -> int:
        return int(self.harness.ask({"req": "count_rendered", "text": prompt}))

    def count_in_message(self, role: str, content: str) -> int:
        key = (role, content)
        if key not in self.known and key in self.position:
            self._count_block_of(self.position[key])
        known = self.known.get(key)
        if known is not None:
            return known
        return int(self.harness.ask({"req": "count_in_message", "role": role, "content": content}))


class CpuClock:
    """This worker's own CPU seconds (every thread of it), split by the phase it was in: the
    harness measures the total from outside and takes only the split from here."""

    def __init__(self) -> None:
        self.phase = "apply"
        self.mark = time.process_time()
        self.spent: dict[str, float] = {}

    def switch(self, phase: str | None) -> None:
        """Charge the CPU since the last switch to the phase that ends; ``None``: the rest of ``apply``."""
        now = time.process_time()
        self.spent[self.phase] = self.spent.get(self.phase, 0.0) + now - self.mark
        self.phase, self.mark = phase or "apply", now

    def take(self) -> dict[str, float]:
        """What was spent since the last ``take`` (or ``restart``), by phase."""
        self.switch(None)
        spent, self.spent = self.spent, {}
        return {phase: round(seconds, 6) for phase, seconds in spent.items()}

    def restart(self) -> None:
        """Forget what was spent so far (the worker's start: no cell's cost)."""
        self.switch(None)
        self.spent = {}


class Host:
    """The strategy instance this worker serves, created by the first frame."""

    def __init__(self, conn: Connection) -> None:
        self.harness = Harness(conn)
        self.conn = conn
        self.strategy: Any = None
        self.tokenizer: HarnessTokenizer | None = None
        self.counter: PromptCounter | None = None
        self.scratch = Path(".")
        self.view: Any = None  # the item being served: sent once, reused by every budget tier
        self.clock = CpuClock()  # reset, describe and idle time go to the next apply's cell

    def create(self, frame: dict[str, Any]) -> dict[str, Any]:
        from ..memory_systems import MemorySystem
        from ..plugins import Registry

        self.scratch = Path(frame["scratch"])
        source = frame.get("source") or {}
        if "module" in source:  # registered in the harness by code, not by an entry point (tests, notebooks)
            cls, plugin = _load_class(source), source
        else:
            registry = Registry.discover()
            if source.get("entry_points"):  # the harness's index named them: no index built here
                registry.load(set(source["entry_points"]))
            registered = registry.get("strategy", frame["name"])
            cls, plugin = (
                registered.obj,
                {"distribution": registered.plugin.distribution, "version": registered.plugin.version},
            )
        params = frame.get("params") or {}
        self.strategy = cls(**params)
        self.tokenizer = HarnessTokenizer(self.harness, frame["tokenizer"])
        self.counter = PromptCounter(self.tokenizer)
        from ..strategies import resets_nothing
        from .proxy import parse_hosts

        memory_system = isinstance(self.strategy, MemorySystem)
        declared = self.strategy.read_paths()
        if not isinstance(declared, (list, tuple)) or not all(isinstance(p, str) for p in declared):
            raise TypeError(f"read_paths() must return list[str], got {declared!r:.200}")
        return {
            "distribution": plugin["distribution"],
            "version": plugin["version"],
            "memory_system": memory_system,  # driven by ingest and retrieve, its prompt filled by the harness
            "resets_nothing": False if memory_system else resets_nothing(self.strategy),
            "read_paths": [os.path.realpath(p) for p in declared],
            "network_hosts": parse_hosts(self.strategy.network_hosts(), f"strategy {frame['name']!r}"),
        }

    def confine(self, frame: dict[str, Any]) -> dict[str, Any]:
        from .landlock import confine

        return {"sandbox": confine(frame["policy"])}

    def describe(self, frame: dict[str, Any]) -> Any:
        from ..sandbox import json_safe_or_empty

        return json_safe_or_empty(self.strategy.describe())

    def reset(self, frame: dict[str, Any]) -> None:
        self.strategy.reset()

    def apply(self, frame: dict[str, Any]) -> dict[str, Any]:
        from ..memory_systems import MemorySystem
        from ..sandbox import canonical_prompt, json_safe_or_empty

        if isinstance(self.strategy, MemorySystem):
            raise ValueError("a memory system is driven by ingest and retrieve, not apply")
        context = self._context(frame)
        returned = self.strategy.apply(context.item.history, context.budget, context)
        prompt = canonical_prompt(returned)  # a malformed prompt is named here, where the plugin is
        self._check_view()
        assert self.tokenizer is not None
        # a message the strategy kept from the history goes as a reference (canonical_prompt copied it)
        kept = [o if id(o) in self.tokenizer.history_at else m for o, m in zip(list.__iter__(returned), prompt)]
        return {"prompt": self.tokenizer.to_wire(kept), "audit": json_safe_or_empty(context.audit)}

    def ingest(self, frame: dict[str, Any]) -> dict[str, Any]:
        """A memory system stores an item's history: its view has no question (``ingest_view``)."""
        from ..memory_systems import IngestReport
        from ..sandbox import json_safe_or_empty

        context = self._context(frame)
        self.clock.switch("ingest")
        report = self.strategy.ingest(context.item.sessions(), context)
        self.clock.switch(None)
        if not isinstance(report, IngestReport):
            raise TypeError(f"ingest returned {type(report).__name__}, not IngestReport")
        self._check_view()
        return {"report": report.to_dict(), "audit": json_safe_or_empty(context.audit)}

    def retrieve(self, frame: dict[str, Any]) -> dict[str, Any]:
        """The memories for the item's question, ranked: the harness decides what fits the budget."""
        from ..memory_systems import RetrievedItem, _plain_retrieved
        from ..sandbox import PrivateView, json_safe_or_empty

        if self.view is None:
            raise ValueError("retrieve before ingest")
        query = wire.message_from_wire(frame["query"])
        self.view = PrivateView(replace(self.view.item, query=query))  # the item's question, now
        context = self._context(frame)
        self.clock.switch("retrieve")
        ranked = self.strategy.retrieve(query.content, context)
        self.clock.switch(None)
        if not isinstance(ranked, list) or not all(isinstance(r, RetrievedItem) for r in ranked):
            raise TypeError("retrieve must return list[RetrievedItem]")
        self._check_view()
        return {"ranked": [asdict(_plain_retrieved(r)) for r in ranked], "audit": json_safe_or_empty(context.audit)}

    def _context(self, frame: dict[str, Any]) -> Any:
        """The plugin's context for one operation; a frame with a view starts a new item."""
        from ..sandbox import PrivateView
        from ..strategies import StrategyContext

        if frame.get("view") is not None:  # checked after every operation, as for an in-process strategy
            self.view = PrivateView(wire.view_from_wire(frame["view"]))
            assert self.tokenizer is not None
            self.tokenizer.learn_history(self.view.item.history)
        if self.view is None:
            raise ValueError(f"{frame.get('op')} without a view")
        harness = self.harness

        def complete(messages: Sequence[Message], max_tokens: int, purpose: str) -> str:
            plain = [m.to_dict() if isinstance(m, Message) else m for m in messages]
            return str(
                harness.ask({"req": "complete", "messages": plain, "max_tokens": max_tokens, "purpose": purpose})
            )

        assert self.counter is not None
        return StrategyContext(
            item=self.view.item,
            budget=int(frame["budget"]),
            counter=self.counter,
            complete=complete,
            seed=int(frame["seed"]),
            scratch_dir=self.scratch,
        )

    def _check_view(self) -> None:
        """The contract holds in a worker too, though no harness object is reachable from it."""
        from ..sandbox import HISTORY_MUTATED, PromptError

        if self.view is not None and not self.view.intact():
            raise PromptError(HISTORY_MUTATED)


def _load_class(source: dict[str, Any]) -> Any:
    """A strategy class by module and qualified name; by the module's file when the module is
    not importable by name here (a test file)."""
    import importlib
    import importlib.util

    try:
        module = importlib.import_module(source["module"])
    except ImportError:
        if not source.get("file"):
            raise
        spec = importlib.util.spec_from_file_location(source["module"], source["file"])
        if spec is None or spec.loader is None:
            raise ImportError(f"cannot load {source['file']}") from None
        module = importlib.util.module_from_spec(spec)
        sys.modules[source["module"]] = module
        spec.loader.exec_module(module)
    value: Any = module
    for part in source["qualname"].split("."):
        value = getattr(value, part)
    return value


def _failure(exc: BaseException, phase: str | None) -> dict[str, Any]:
    from ..gate import AuxiliaryBudgetError
    from ..memory_systems import IngestLossError
    from ..sandbox import PhaseError, PromptError, describe_exception

    if isinstance(exc, PhaseError):
        phase, exc = exc.phase, exc.original
    kinds = ((AuxiliaryBudgetError, "auxiliary_budget"), (IngestLossError, "ingest_loss"), (PromptError, "prompt"))
    kind = next((name for cls, name in kinds if isinstance(exc, cls)), "plugin")
    return {
        "kind": kind,
        "message": describe_exception(exc),
        "phase": phase,
        "traceback": "".join(traceback.format_exception(exc))[-4000:],
    }


def serve(conn: Connection) -> None:
    host = Host(conn)
    operations = {
        "create": host.create,
        "confine": host.confine,
        "describe": host.describe,
        "reset": host.reset,
        "apply": host.apply,
        "ingest": host.ingest,
        "retrieve": host.retrieve,
    }
    metered = ("apply", "ingest", "retrieve")  # a cell's operations: their CPU is the cell's
    while True:
        try:
            frame = wire.receive_from_harness(conn)
        except EOFError:
            return
        op = frame.get("op", "")
        operation = operations.get(op)
        try:
            if operation is None:
                raise ValueError(f"unknown operation {op!r}")
            done = operation(frame)
            if op in ("create", "confine"):
                host.clock.restart()
                # the plugin's imports and set-up stay out of the cyclic collector's full passes:
                # each would charge a whole heap's scan (torch's: tenths of a second) to one cell
                gc.freeze()
            wire.send(conn, {"done": done, "cpu_s": host.clock.take()} if op in metered else {"done": done})
        except (EOFError, BrokenPipeError):
            return
        except BaseException as exc:  # noqa: BLE001 - any failure of plugin code is the cell's error row
            failed = _failure(exc, op)
            wire.send(conn, {"failed": failed, "cpu_s": host.clock.take()} if op in metered else {"failed": failed})


def main() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the harness's to handle: it stops us
    sock = socket.socket(fileno=int(sys.argv[1]))
    conn = Connection(os.dup(sock.fileno()))
    sock.close()
    # from here on, this is the worker: its guard ends whatever it leaves behind
    guard.stand(conn, quotas.Quota.from_argv(sys.argv[2:]))
    serve(conn)
    os._exit(0)  # plugin threads left running must not keep the worker alive


if __name__ == "__main__":
    main()
