"""The conformance kit: checks every strategy and memory-system plugin must pass.

Plugin authors use it from their own tests (through ``budgetbench_core.testing``, a pytest
plugin whose fixture ``budgetbench_kit`` starts the embedded model once per session) and users run the same
checks with ``budgetbench check-plugin NAME``. The checks run the plugin on a standard
set of items and budgets and count every prompt exactly with the served model's
tokenizer:

- ``declared``: ``name``, ``regime`` (a ``Regime``) and a JSON-serialisable ``describe()``;
- ``valid-output``: ``apply`` returns ``list[Message]`` with known roles, ``item.system``
  first and ``item.query`` unchanged last, and does not raise on standard input;
- ``budget``: the exact count never exceeds the budget (unless system prompt and query
  alone do), and no auxiliary call is left over budget; skipped for a strategy that
  declares ``enforces_budget = False`` (a ceiling arm such as ``full_context``);
- ``no-mutation``: the history (its messages and their metadata) and the item are unchanged
  after ``apply``;
- ``deterministic``: two fresh instances under the same seed give the same prompts;
- ``reset``: after ``reset()`` an instance gives what a fresh instance gives;
- ``ingest-failures`` (memory systems): ``ingest`` returns an ``IngestReport`` that names
  a session that could not be read, with its cause, instead of raising or losing it.

The kit has no pipeline of its own: every prompt goes through the engine's
``build_prompt`` (contained, canonical, validated, counted and audited into a run record
of the kit's own, as in a run), and the checks read that record back, so a plugin that
passes here meets the same step in a run. Auxiliary model calls go through the engine's
caller to a real model (the embedded one by default) with a response cache for the
kit's lifetime, so the determinism and reset checks test the strategy and not the sampler.

``budgetbench_core.testing`` re-exports the kit's public names (plugins import it from there);
this module imports neither the CLI nor ``testing``, so ``check-plugin`` uses it without a cycle.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import random
import tempfile
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

from .backends import Backend
from .cache import ResponseCache
from .engine.pipeline import build_prompt, strategy_context
from .engine.services import CellSettings, PromptServices
from .engine.units import reset_for_item
from .host.metering import Metering
from .host.pool import PluginHost, PluginHostError, Source, strategy_source
from .host.remote import RemoteStrategy
from .memory_systems import IngestReport, MemorySystem, MemorySystemStrategy
from .messages import Item, Message, Session
from .model_calls import ModelCaller
from .runlog import EventLog, iter_events
from .sandbox import HISTORY_MUTATED, Deadline, PluginRef, PrivateView, opaque_id
from .strategies import MemoryStrategy, Regime
from .tokenizers import PromptCounter

STANDARD_BUDGETS = (256, 512, 1024)
KIT_TIMEOUT_S = 600.0  # per apply call: generous for auxiliary calls on a busy CPU
KIT_TASK = "conformance-kit"  # the task name on the kit's own run record
STRATEGY_CHECKS = ("declared", "valid-output", "budget", "no-mutation", "deterministic", "reset")
MEMORY_SYSTEM_CHECKS = (*STRATEGY_CHECKS, "ingest-failures")

Factory = Callable[[], "MemoryStrategy | MemorySystem"]

SYSTEM = "You are a helpful assistant with a long memory. Answer the last question in a few words."
_TOPICS = [
    "my garden",
    "the train to work",
    "a birthday present",
    "our flat's heating",
    "a recipe for soup",
    "the football match",
    "my tax return",
    "learning Portuguese",
    "the new laptop",
    "a hiking trip",
]
_NAMES = ["Amara", "Bruno", "Chiara", "Dmitri", "Elif", "Farid", "Greta", "Hiro"]
_UNICODE = [
    "Привет, как дела? Я переехал в Казань.",
    "東京の天気はどうですか。明日は雨です。",
    "مرحبا، أين أقرب صيدلية؟",
    "Ça coûte 12,50 € — trop cher ! 🍕🚲",
    "ελληνικά: καλημέρα σας",
    "हिंदी में एक वाक्य लिखिए।",
    "Emoji run: 👩‍👩‍👧‍👦🏳️‍🌈🤖✨",
    "Zero\u200bwidth and tabs\tand\nnewlines",
]


# ----------------------------------------------------------------- standard items


def _session(rng: random.Random, index: int, day: int, turns: int, long_turn: str | None = None) -> list[Message]:
    meta = {"session_id": f"s{index:03d}", "timestamp": f"2024-03-{day:02d}"}
    messages = []
    for turn in range(turns):
        topic, name = rng.choice(_TOPICS), rng.choice(_NAMES)
        user = f"[2024-03-{day:02d}] Let us talk about {topic}. {name} said it took {rng.randint(2, 99)} minutes."
        if long_turn is not None and turn == 0:
            user = long_turn
        messages.append(Message("user", user, meta))
        messages.append(Message("assistant", f"Noted: {topic}, {name}, and the time it took. Anything else?", meta))
    return messages


def standard_items(seed: int = 0) -> list[Item]:
    """Six items that exercise the edges: no history, a short one, a long one, one giant
    message, mixed scripts and emoji, and no system prompt. The long histories exceed
    every standard budget, the short one fits all of them."""
    rng = random.Random(f"budgetbench-kit:{seed}")
    system = Message("system", SYSTEM)

    def history(sessions: int, turns: int = 2, giant_at: int | None = None) -> tuple[Message, ...]:
        out: list[Message] = []
        for index in range(sessions):
            giant = None
            if index == giant_at:
                giant = " ".join(f"Line {n}: the inventory lists {rng.choice(_TOPICS)}." for n in range(160))
            out += _session(rng, index, 1 + index % 28, turns, giant)
        return tuple(out)

    def query(text: str) -> Message:
        return Message("user", text)

    unicode_history = tuple(
        Message(role, f"{_UNICODE[i % len(_UNICODE)]} ({i})", {"session_id": f"u{i // 4}"})
        for i, role in zip(range(24), ["user", "assistant"] * 12)
    )
    return [
        Item("kit-empty", (), query("What did I tell you yesterday?"), "unknown", system, "edge"),
        Item("kit-short", history(2), query("Who said it took the longest?"), "unknown", system, "short"),
        Item("kit-long", history(24), query("What did Greta say about my garden?"), "unknown", system, "long"),
        Item(
            "kit-giant",
            history(5, giant_at=2),
            query("What does the inventory list on line 7?"),
            "unknown",
            system,
            "giant-message",
        ),
        Item("kit-unicode", unicode_history, query("Где я живу сейчас? 🤔"), "Казань", system, "unicode"),
        Item("kit-no-system", history(9), query("What did Hiro say about the laptop?"), "unknown", None, "no-system"),
    ]


# ----------------------------------------------------------------- results


@dataclass
class CheckResult:
    """One check of one plugin: ``status`` is ``pass``, ``fail`` or ``skip``."""

    check: str
    status: str
    detail: str = ""

    def to_dict(self) -> dict[str, str]:
        return {"check": self.check, "status": self.status, "detail": self.detail}


class _Unreadable(Message):
    """A message whose content raises when read: the kit's injected ingest failure."""

    def __getattribute__(self, name: str) -> Any:
        if name == "content":
            raise InjectedIngestError("injected failure: this session's content cannot be read (conformance kit)")
        return super().__getattribute__(name)

    def __hash__(self) -> int:
        return id(self)


class InjectedIngestError(RuntimeError):
    """Raised by the kit's unreadable session; a memory system must report it, not raise it."""


def unreadable_session(session: Session) -> Session:
    """A copy of ``session`` whose every message raises ``InjectedIngestError`` on ``.content``."""
    messages = []
    for message in session.messages:
        copy = Message(message.role, message.content, message.metadata)
        object.__setattr__(copy, "__class__", _Unreadable)
        messages.append(copy)
    return Session(session.id, tuple(messages), session.date)


def _describe_error(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


@dataclass
class _Cell:
    """What the run record says of one (item, budget) cell: its audited prompt and, when the
    engine ended the cell there (an error or a violation), its terminal row."""

    prompt: list[dict[str, Any]] | None = None  # the canonical prompt as audited: {role, content, metadata}
    tokens: int | None = None
    end: dict[str, Any] | None = None

    def ended(self, event: str, phase: str | None = None) -> bool:
        return self.end is not None and self.end["event"] == event and phase in (None, self.end.get("phase"))

    @property
    def mutated(self) -> bool:
        return self.ended("error") and HISTORY_MUTATED in str(self.end and self.end.get("cause"))


class KitError(ValueError):
    """The kit cannot run the plugin as given (e.g. a factory a worker process cannot create)."""


def _worker_source(factory: Factory) -> tuple[str, dict[str, Any], Source]:
    """What a worker needs to create ``factory``'s plugin: its name, parameters and where to
    import its class from. Only a class, or a ``functools.partial`` of one with keyword
    arguments, can cross a process boundary."""
    cls, params = factory, {}
    if isinstance(factory, functools.partial) and not factory.args:
        cls, params = factory.func, dict(factory.keywords)
    if not isinstance(cls, type):
        raise KitError(
            f"{factory!r} is not a class or a functools.partial of one with keyword arguments: a worker "
            f"process cannot create it; give the class (or isolation='none' while debugging)"
        )
    top = cls.__module__.split(".")[0]
    found = metadata.packages_distributions().get(top) or []
    distribution = found[0] if found else "unregistered"
    version = metadata.version(distribution) if found else "0"
    return str(getattr(cls, "name", cls.__name__)), params, strategy_source(cls, distribution, version)


class _KitStrategies:
    """The pool of a kit pass: one plugin, one instance at a time, in a confined worker of the
    plugin host as in a run (or in this process with ``isolation='none'``); a timed-out
    instance is dropped (its worker killed) and the next cell gets a fresh one."""

    def __init__(self, factory: Factory, as_strategy: Callable[[Any], MemoryStrategy], host: PluginHost | None) -> None:
        self.factory = factory
        self.as_strategy = as_strategy
        self.host = host
        self.instance: MemoryStrategy | None = None

    def get(self, name: str = "") -> MemoryStrategy:
        if isinstance(self.instance, RemoteStrategy) and not self.instance.worker.alive():
            self.discard()  # it exited or was killed: a new one, as the run's host does
        if self.instance is None:
            if self.host is None:
                self.instance = self.as_strategy(self.factory())
            else:
                name, params, source = _worker_source(self.factory)
                try:
                    self.instance = self.host.new_strategy(name, params, 0.0, source)
                except PluginHostError as exc:
                    raise KitError(f"the plugin could not be created in a worker: {exc}") from None
        return self.instance

    def ref(self, name: str) -> PluginRef:
        return PluginRef("strategy", name)

    def release(self, name: str = "") -> None:
        """The kit keeps its one instance for the whole pass."""

    def discard(self, name: str = "") -> None:
        if isinstance(self.instance, RemoteStrategy):
            self.instance.close()
        self.instance = None


# ----------------------------------------------------------------- the kit


class ConformanceKit:
    """Runs the checks with one exact counter and (optionally) one model for auxiliary calls.

    ``factory`` is a strategy or memory-system class, or any zero-argument callable that
    returns an instance (``functools.partial(MyStrategy, top_k=3)``). Every prompt goes
    through the engine's own ``build_prompt`` (the step a run takes: contained, canonical,
    validated, counted, audited into a run record) and the checks read that record back.
    ``model`` is the engine's ``ModelCaller`` for auxiliary calls (``open_kit`` builds one
    with a response cache, so repeated passes ask the model once per prompt). With
    ``isolation='process'`` (the default, as in a run) the plugin's passes run in a confined
    worker of the plugin host, its own SDK's model calls through a metering gateway; the
    ``declared`` and ``ingest-failures`` checks inspect an instance in this process.
    """

    def __init__(
        self,
        counter: PromptCounter,
        model: ModelCaller | None = None,
        budgets: Sequence[int] = STANDARD_BUDGETS,
        items: Sequence[Item] | None = None,
        seed: int = 0,
        isolation: str = "process",
    ) -> None:
        if isolation not in ("process", "none"):
            raise KitError(f"isolation must be 'process' or 'none', not {isolation!r}")
        self.isolation = isolation
        self.counter = counter
        self.model = model
        self.budgets = tuple(budgets)
        self.items = list(items) if items is not None else standard_items(seed)
        self.seed = seed

    @property
    def aux_calls(self) -> int:
        """Auxiliary calls that reached the model (cache hits not counted)."""
        return self.model.calls_made if self.model is not None else 0

    # ------------------------------------------------------------- running

    def _services(self, run_dir: Path, strategies: _KitStrategies) -> PromptServices:
        """The engine's prompt services for one pass, built as a run builds them (no model:
        auxiliary calls are refused, as in a prompts-only run)."""
        info = self.counter.info
        settings = CellSettings(
            task=KIT_TASK,
            run_key="conformance-kit",
            tokenizer=info.to_dict(),
            seed=self.seed,
            temperature=0.0,
            max_output_tokens=0,
            item_timeout_s=KIT_TIMEOUT_S,
            timeout_s=KIT_TIMEOUT_S,
            prompts_only=self.model is None,
            model="",
            judge_model=None,
            user_context=max(self.budgets),
            judge_context=max(self.budgets),
            view_key=os.urandom(32),
        )
        scratch = run_dir / "scratch"
        scratch.mkdir()
        return PromptServices(
            settings=settings,
            counter=self.counter,
            tokenizer_ref=PluginRef("tokenizer", info.id),
            caller=self.model,
            log=EventLog(run_dir / "run"),
            run_dir=run_dir / "run",
            scratch_dir=scratch,
            strategies=strategies,
            evidence={},
            tally=None,
        )

    @staticmethod
    def _as_strategy(instance: Any) -> MemoryStrategy:
        if isinstance(instance, MemorySystem):
            return MemorySystemStrategy(instance)
        if not isinstance(instance, MemoryStrategy):
            raise TypeError(f"the factory returned {type(instance).__name__}, not a MemoryStrategy or MemorySystem")
        return instance

    def _pass(self, factory: Factory, items: Sequence[Item]) -> dict[tuple[str, int], _Cell]:
        """One fresh instance over ``items`` (reset before each), every budget, through the
        engine's ``build_prompt`` into a run record of its own; the cells as that record says."""
        with tempfile.TemporaryDirectory(prefix="budgetbench-kit-") as run_dir:
            host, metering = self._host(Path(run_dir))
            strategies = _KitStrategies(factory, self._as_strategy, host)
            try:
                name = str(getattr(strategies.get(), "name", "?"))
                services = self._services(Path(run_dir), strategies)
                for item in items:
                    if reset_for_item(services, name, item, [(budget, 0) for budget in self.budgets]) is None:
                        continue
                    # what the runner gives a strategy: no grading key, an opaque id, checked after each call
                    view = PrivateView(item, view_id=opaque_id(services.settings.view_key, item.id))
                    for budget in self.budgets:
                        cell = services.cell(name, item, budget, 0)
                        deadline = Deadline(KIT_TIMEOUT_S)
                        context = strategy_context(services, cell, view, budget, 0, deadline)
                        build_prompt(services, cell, strategies.get(), item, view, budget, context, deadline)
                        cell.close()
                services.log.close()
                return self._cells(iter_events(services.run_dir))
            finally:
                strategies.discard()
                if host is not None:
                    host.close()
                if metering is not None:
                    metering.stop()

    def _host(self, run_dir: Path) -> tuple[PluginHost | None, Metering | None]:
        """The plugin host of one pass (none with ``isolation='none'``), with a metering gateway
        for the plugin's own SDK when the kit has a model; the pass's run record is guarded."""
        if self.isolation == "none":
            return None, None
        host = PluginHost(self.counter.info.to_dict(), run_dir / "workers")
        host.guarded = [run_dir / "run"]
        metering = None
        if self.model is not None:
            metering = Metering(self.model, self.counter, self.seed)
            metering.start()
            host.meter_with(metering)
        return host, metering

    @staticmethod
    def _cells(rows: Iterable[dict[str, Any]]) -> dict[tuple[str, int], _Cell]:
        cells: dict[tuple[str, int], _Cell] = {}
        for row in rows:
            cell = cells.setdefault((row["item_id"], row["budget"]), _Cell())
            if row["event"] == "prompt_audit":
                cell.prompt, cell.tokens = row["messages"], row["prompt_tokens"]
            elif row["event"] in ("error", "violation"):
                cell.end = row
        return cells

    # ------------------------------------------------------------- checks

    def check_declared(self, instance: Any) -> CheckResult:
        problems = []
        name = getattr(instance, "name", None)
        if not isinstance(name, str) or not name:
            problems.append("no 'name'")
        regime = getattr(instance, "regime", None)
        if not isinstance(regime, Regime):
            problems.append(f"regime is {regime!r}, not a Regime ({', '.join(r.value for r in Regime)})")
        try:
            object.__getattribute__(instance, "params")
        except AttributeError:
            problems.append(
                "no 'params': a strategy with parameters must call super().__init__(**params) in its __init__ "
                "(MemoryStrategy records them for the manifest and the run identity)"
            )
        else:
            try:
                json.dumps(instance.describe())
            except Exception as exc:
                problems.append(f"describe() is not JSON-serialisable: {_describe_error(exc)}")
        if problems:
            return CheckResult("declared", "fail", "; ".join(problems))
        return CheckResult("declared", "pass", f"{name}: {Regime(regime).value}")

    def check_valid_output(self, cells: dict[tuple[str, int], _Cell]) -> CheckResult:
        """Every cell the engine ended with an error (``apply`` raised, hung, or returned what
        the runner's validation refuses), except a changed history: ``no-mutation`` reports it."""
        problems = [
            f"{item_id}@{budget}: {cell.end['cause']}"
            for (item_id, budget), cell in cells.items()
            if cell.end is not None and cell.ended("error") and not cell.mutated
        ]
        return self._result("valid-output", problems, f"{len(cells)} prompts well formed")

    def check_budget(self, cells: dict[tuple[str, int], _Cell], enforces_budget: bool = True) -> CheckResult:
        if not enforces_budget:
            return CheckResult(
                "budget",
                "skip",
                "declares enforces_budget = False (a ceiling arm: the runner "
                "records its over-budget cells as violations)",
            )
        problems = []
        checked = 0
        worst = 0.0
        for (item_id, budget), cell in cells.items():
            if cell.end is not None and (cell.ended("violation", "auxiliary") or cell.ended("violation", "served")):
                problems.append(f"{item_id}@{budget}: {cell.end['cause']}")
                continue
            if cell.tokens is None or cell.ended("error"):
                continue
            frame = self.counter.count(self._item(item_id).frame([]))  # system prompt and query alone
            if cell.tokens > budget and frame <= budget:
                problems.append(f"{item_id}@{budget}: {cell.tokens} tokens")
            checked += 1
            worst = max(worst, cell.tokens / budget)
        if not checked and not problems:
            return CheckResult("budget", "skip", "no valid prompt to count")
        return self._result(
            "budget", problems, f"{checked} prompts within budget (max utilisation {worst:.2f}), {self.counter.info.id}"
        )

    def check_no_mutation(self, cells: dict[tuple[str, int], _Cell]) -> CheckResult:
        problems = [f"{item_id}@{budget}" for (item_id, budget), cell in cells.items() if cell.mutated]
        return self._result(
            "no-mutation",
            problems and [f"history or item changed by apply: {', '.join(problems)}"],
            "history and items unchanged",
        )

    def check_deterministic(self, first: dict, second: dict) -> CheckResult:
        problems = [f"{key[0]}@{key[1]}" for key in first if not self._same(first[key], second[key])]
        return self._result(
            "deterministic",
            problems and [f"different prompts under the same seed: {', '.join(problems)}"],
            f"same prompts under seed {self.seed}",
        )

    def check_reset(self, reference: dict, after_reset: dict) -> CheckResult:
        problems = [f"{key[0]}@{key[1]}" for key in reference if not self._same(reference[key], after_reset[key])]
        return self._result(
            "reset",
            problems
            and [
                f"after reset() the prompts differ from a fresh instance's (state leaked across items): {', '.join(problems)}"
            ],
            "reset() forgets the previous item",
        )

    def check_ingest_failures(self, factory: Factory) -> CheckResult:
        """Ingest an item whose second session cannot be read: it must be reported, not raised or lost."""
        system = factory()
        if not isinstance(system, MemorySystem):
            return CheckResult("ingest-failures", "skip", "not a memory system")
        full = max(self.items, key=lambda i: len(i.sessions()))
        view = PrivateView(full)
        sessions = view.item.sessions()
        bad = sessions[1]
        given = list(sessions)
        given[1] = unreadable_session(bad)
        budget = max(self.budgets)
        with tempfile.TemporaryDirectory(prefix="budgetbench-kit-") as run_dir:
            services = self._services(Path(run_dir), _KitStrategies(lambda: system, self._as_strategy, None))
            cell = services.cell(str(system.name), full, budget, 0)
            context = strategy_context(services, cell, view, budget, 0, Deadline(KIT_TIMEOUT_S))
            system.reset()
            try:
                report = system.ingest(given, context)
            except Exception as exc:
                return CheckResult(
                    "ingest-failures",
                    "fail",
                    f"ingest raised instead of reporting the failed session: {_describe_error(exc)}",
                )
            finally:
                services.log.close()
        if not isinstance(report, IngestReport):
            return CheckResult("ingest-failures", "fail", f"ingest returned {type(report).__name__}, not IngestReport")
        problems = []
        if report.sessions != len(given):
            problems.append(f"report.sessions is {report.sessions}, {len(given)} were given")
        ids = {s.id for s in given}
        failed = {f.session_id for f in report.failures}
        if bad.id not in failed:
            problems.append(f"the unreadable session {bad.id!r} is not in report.failures (lost silently)")
        if failed - ids:
            problems.append(f"failures name unknown sessions {sorted(failed - ids)}")
        if any(not isinstance(f.cause, str) or not f.cause.strip() for f in report.failures):
            problems.append("a failure has no cause")
        return self._result(
            "ingest-failures",
            problems,
            f"{len(report.failures)} of {report.sessions} sessions reported failed, with causes",
        )

    # ------------------------------------------------------------- driver

    def run_checks(self, factory: Factory) -> list[CheckResult]:
        """Every applicable check, in order; a failed ``declared`` check stops the rest."""
        try:
            probe = factory()
        except Exception as exc:
            return [CheckResult("declared", "fail", f"could not create an instance: {_describe_error(exc)}")]
        declared = self.check_declared(probe)
        if declared.status == "fail":
            return [declared]
        first = self._pass(factory, self.items)
        second = self._pass(factory, self.items)
        enforces = getattr(probe, "enforces_budget", True)  # memory systems: the harness fills
        results = [
            declared,
            self.check_valid_output(first),
            self.check_budget(first, enforces),
            self.check_no_mutation(first),
            self.check_deterministic(first, second),
        ]
        if results[-1].status == "pass":
            results.append(self.check_reset(first, self._pass(factory, list(reversed(self.items)))))
        else:
            results.append(CheckResult("reset", "skip", "not deterministic, so reset cannot be compared"))
        if isinstance(probe, MemorySystem):
            results.append(self.check_ingest_failures(factory))
        return results

    def assert_conforms(self, factory: Factory) -> list[CheckResult]:
        """Run every check; raise AssertionError listing the failures (for plugin authors' tests)."""
        results = self.run_checks(factory)
        failed = [r for r in results if r.status == "fail"]
        if failed:
            raise AssertionError("conformance checks failed:\n" + "\n".join(f"- {r.check}: {r.detail}" for r in failed))
        return results

    # ------------------------------------------------------------- helpers

    def _item(self, item_id: str) -> Item:
        return next(item for item in self.items if item.id == item_id)

    @staticmethod
    def _same(a: _Cell, b: _Cell) -> bool:
        """Same ending (event, phase and cause) or, for prompts the engine admitted, the same
        audited prompt, message by message."""
        if a.end is not None or b.end is not None:
            ends = [(c.end or {}) for c in (a, b)]
            return len({(e.get("event"), e.get("phase"), e.get("cause")) for e in ends}) == 1
        return a.prompt == b.prompt

    @staticmethod
    def _result(check: str, problems: list[str], ok: str) -> CheckResult:
        if problems:
            shown = "; ".join(problems[:5]) + (f"; and {len(problems) - 5} more" if len(problems) > 5 else "")
            return CheckResult(check, "fail", shown)
        return CheckResult(check, "pass", ok)


# ----------------------------------------------------------------- building a kit


@contextlib.contextmanager
def open_kit(
    model: str = "local",
    tokenizer: str | None = None,
    api_base: str | None = None,
    budgets: Sequence[int] = STANDARD_BUDGETS,
    seed: int = 0,
    timeout_s: float = 600.0,
    isolation: str = "process",
) -> Iterator[ConformanceKit]:
    """A kit on a started backend: ``model`` as in ``budgetbench run`` (default the embedded
    model), ``tokenizer`` a spec (default the backend's exact tokenizer). The generous
    per-call timeout is for auxiliary calls on a busy CPU."""
    from .plugins import get_registry

    registry = get_registry()
    backend_class = registry.resolve_backend(model).obj
    backend: Backend = backend_class(
        model, api_base=api_base, max_context=max(budgets) + 512, max_concurrency=1, timeout_s=timeout_s
    )
    backend.start()
    try:
        spec = tokenizer or backend.default_tokenizer()
        if not spec:
            raise ValueError(f"model {model!r} has no default tokenizer: give a tokenizer spec")
        counter = PromptCounter(registry.resolve_tokenizer(spec, backend))
        with tempfile.TemporaryDirectory(prefix="budgetbench-kit-cache-") as cache_dir:
            cache = ResponseCache(Path(cache_dir) / "cache.sqlite", os.urandom(32))  # the kit's own, for this session
            try:
                caller = ModelCaller(backend, cache, 1, timeout_s=timeout_s, plugin=PluginRef("backend", model))
                yield ConformanceKit(counter, caller, budgets=budgets, seed=seed, isolation=isolation)
            finally:
                cache.close()
    finally:
        backend.stop()
