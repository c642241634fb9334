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
- ``no-mutation``: the history (and the item) are unchanged after ``apply``;
- ``deterministic``: two fresh instances under the same seed give the same prompts;
- ``reset``: after ``reset()`` an instance gives what a fresh instance gives;
- ``ingest-failures`` (memory systems): ``ingest`` returns an ``IngestReport`` that names
  a session that could not be read, with its cause, instead of raising or losing it.

Auxiliary model calls go to a real model (the embedded one by default) and are
memoised within a kit, so the determinism and reset checks test the strategy and
not the sampler.

``budgetbench_core.testing`` re-exports the kit's public names (plugins import it from there);
this module imports neither the CLI nor ``testing``, so ``check-plugin`` uses it without a cycle.
"""

from __future__ import annotations

import contextlib
import functools
import json
import operator
import random
import tempfile
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .backends import Backend, GenerationParams
from .gate import AuxiliaryBudgetError, gate
from .memory_systems import IngestReport, MemorySystem, MemorySystemStrategy
from .messages import Item, Message, Session
from .sandbox import (
    Deadline,
    PluginFailure,
    PluginRef,
    PrivateView,
    PromptError,
    canonical_prompt,
    contained,
    fingerprint,
    validate_prompt,
)
from .strategies import MemoryStrategy, Regime, StrategyContext
from .tokenizers import PromptCounter

STANDARD_BUDGETS = (256, 512, 1024)
KIT_TIMEOUT_S = 600.0  # per apply call: generous for auxiliary calls on a busy CPU
STRATEGY_CHECKS = ("declared", "valid-output", "budget", "no-mutation", "deterministic", "reset")
MEMORY_SYSTEM_CHECKS = (*STRATEGY_CHECKS, "ingest-failures")

Factory = Callable[[], "MemoryStrategy | MemorySystem"]
ModelCall = Callable[[list[Message], int], str]

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


def _fingerprint(messages: Sequence[Message]) -> tuple:
    """The runner's fingerprint (stored fields, JSON-safe metadata): hostile metadata cannot break it."""
    return fingerprint(messages)


def _describe_error(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


@dataclass
class _Cell:
    prompt: list[Message] | None = None
    error: BaseException | None = None
    mutated: bool = False


# ----------------------------------------------------------------- the kit


class ConformanceKit:
    """Runs the checks with one exact counter and (optionally) one model for auxiliary calls.

    ``factory`` is a strategy or memory-system class, or any zero-argument callable that
    returns an instance (``functools.partial(MyStrategy, top_k=3)``).
    """

    def __init__(
        self,
        counter: PromptCounter,
        model: ModelCall | None = None,
        budgets: Sequence[int] = STANDARD_BUDGETS,
        items: Sequence[Item] | None = None,
        seed: int = 0,
    ) -> None:
        self.counter = counter
        self.model = model
        self.budgets = tuple(budgets)
        self.items = list(items) if items is not None else standard_items(seed)
        self.seed = seed
        self._aux_cache: dict[tuple, str] = {}
        self.aux_calls = 0

    # ------------------------------------------------------------- running

    def _complete(self, budget: int) -> Callable[[Sequence[Message], int, str], str]:
        def complete(messages: Sequence[Message], max_tokens: int, purpose: str) -> str:
            gated = gate(messages, budget, self.counter)  # the runner's gate: canonical prompt, exact count
            if not gated.admitted:
                raise AuxiliaryBudgetError(
                    f"auxiliary call {purpose!r} has {gated.tokens} prompt tokens, over the budget of {budget}",
                    gated.tokens,
                )
            if self.model is None:
                raise RuntimeError("this conformance kit has no model for auxiliary calls")
            key = (tuple((m.role, m.content) for m in gated.prompt), max_tokens)
            if key not in self._aux_cache:
                self._aux_cache[key] = self.model(list(gated.prompt), max_tokens)
                self.aux_calls += 1
            return self._aux_cache[key]

        return complete

    @staticmethod
    def _as_strategy(instance: Any) -> MemoryStrategy:
        if isinstance(instance, MemorySystem):
            return MemorySystemStrategy(instance)
        if not isinstance(instance, MemoryStrategy):
            raise TypeError(f"the factory returned {type(instance).__name__}, not a MemoryStrategy or MemorySystem")
        return instance

    def _pass(self, factory: Factory, items: Sequence[Item]) -> dict[tuple[str, int], _Cell]:
        """One fresh instance over ``items`` (reset before each), every budget; its own run dir."""
        cells: dict[tuple[str, int], _Cell] = {}
        strategy = self._as_strategy(factory())
        with tempfile.TemporaryDirectory(prefix="budgetbench-kit-") as run_dir:
            for item in items:
                strategy.reset()
                view = PrivateView(item)  # what the runner gives a strategy: no grading key, checked after each call
                for budget in self.budgets:
                    cell = cells[(item.id, budget)] = _Cell()
                    history = list(view.item.history)  # a list, so an in-place edit of it is seen too
                    context = StrategyContext(
                        item=view.item,
                        budget=budget,
                        counter=self.counter,
                        complete=self._complete(budget),
                        seed=self.seed,
                        scratch_dir=Path(run_dir),
                    )
                    try:  # contained as in the runner: SystemExit or a hang in apply is a failed cell
                        cell.prompt = contained(
                            "strategy",
                            PluginRef("strategy", str(getattr(strategy, "name", "?"))),
                            # bound now: a call that outlives its deadline keeps its own cell
                            functools.partial(strategy.apply, history, budget, context),
                            Deadline(KIT_TIMEOUT_S),
                        )
                    except PluginFailure as failure:
                        cell.error = failure.original if failure.original is not None else failure
                    given = view.item.history
                    cell.mutated = (
                        not view.intact() or len(history) != len(given) or any(map(operator.is_not, history, given))
                    )
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

    def _validate(self, item: Item, prompt: Any) -> str | None:
        """The runner's own validation (``sandbox``): canonical prompt, roles, system first, query last."""
        try:
            validate_prompt(item, canonical_prompt(prompt))
        except PromptError as exc:
            return str(exc)
        return None

    def check_valid_output(self, cells: dict[tuple[str, int], _Cell]) -> CheckResult:
        problems = []
        for (item_id, budget), cell in cells.items():
            item = self._item(item_id)
            if isinstance(cell.error, AuxiliaryBudgetError):
                continue  # reported by the budget check
            if cell.error is not None:
                problems.append(f"{item_id}@{budget}: raised {_describe_error(cell.error)}")
                continue
            problem = self._validate(item, cell.prompt)
            if problem:
                problems.append(f"{item_id}@{budget}: {problem}")
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
            item = self._item(item_id)
            if isinstance(cell.error, AuxiliaryBudgetError):
                problems.append(f"{item_id}@{budget}: {cell.error}")
                continue
            if cell.error is not None or self._validate(item, cell.prompt):
                continue
            tokens = gate(cell.prompt, budget, self.counter).tokens  # counted as the runner counts: canonical
            if tokens > budget and self.counter.count(item.frame([])) <= budget:
                problems.append(f"{item_id}@{budget}: {tokens} tokens")
            checked += 1
            worst = max(worst, tokens / budget)
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
        item = PrivateView(max(self.items, key=lambda i: len(i.sessions()))).item
        sessions = item.sessions()
        bad = sessions[1]
        given = list(sessions)
        given[1] = unreadable_session(bad)
        with tempfile.TemporaryDirectory(prefix="budgetbench-kit-") as run_dir:
            context = StrategyContext(
                item=item,
                budget=max(self.budgets),
                counter=self.counter,
                complete=self._complete(max(self.budgets)),
                seed=self.seed,
                scratch_dir=Path(run_dir),
            )
            system.reset()
            try:
                report = system.ingest(given, context)
            except Exception as exc:
                return CheckResult(
                    "ingest-failures",
                    "fail",
                    f"ingest raised instead of reporting the failed session: {_describe_error(exc)}",
                )
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
        if a.error is not None or b.error is not None:
            return (type(a.error), str(a.error)) == (type(b.error), str(b.error))
        return _fingerprint(a.prompt or []) == _fingerprint(b.prompt or [])

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

        def call(messages: list[Message], max_tokens: int) -> str:
            return backend.complete(messages, GenerationParams(max_tokens, 0.0, seed)).text

        yield ConformanceKit(counter, call, budgets=budgets, seed=seed)
    finally:
        backend.stop()
