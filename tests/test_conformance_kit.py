"""The conformance kit: every built-in passes it, and each check fails on a plugin that breaks its rule."""

from __future__ import annotations

import functools
import os
import random
import time

import pytest
from click.testing import CliRunner

from budgetbench_core import (
    IngestFailure,
    IngestReport,
    MemoryStrategy,
    MemorySystem,
    Message,
    Regime,
    RetrievedItem,
)
from budgetbench_core.builtin import strategies as builtin
from budgetbench_core.plugin_commands import check_plugin
from budgetbench_core.testing import ConformanceKit, KitError, open_kit, standard_items


@pytest.fixture(scope="module")
def kit():
    with open_kit() as conformance:
        yield conformance


def statuses(results) -> dict[str, str]:
    return {r.check: r.status for r in results}


# ----------------------------------------------------------------- built-ins pass


@pytest.mark.parametrize("strategy", [builtin.Truncation, builtin.Recency, builtin.Checkpoint, builtin.FullContext])
def test_builtin_strategies_pass(kit, strategy):
    results = kit.assert_conforms(strategy)
    expected = {
        check: "pass" for check in ("declared", "valid-output", "budget", "no-mutation", "deterministic", "reset")
    }
    if strategy is builtin.FullContext:
        expected["budget"] = "skip"  # the ceiling arm declares enforces_budget = False
    assert statuses(results) == expected


@pytest.mark.slow
def test_summary_buffer_passes_with_real_auxiliary_calls(kit):
    """The auxiliary-model strategy, on the embedded model; a smaller kit keeps the model calls few."""
    items = [item for item in standard_items() if item.id in ("kit-long", "kit-giant")]
    small = ConformanceKit(kit.counter, kit.model, budgets=(256,), items=items)
    started = time.perf_counter()
    results = small.assert_conforms(functools.partial(builtin.SummaryBuffer, max_calls=1))
    print(f"summary_buffer: {small.aux_calls} auxiliary calls, {time.perf_counter() - started:.1f} s")
    assert small.aux_calls > 0
    assert all(r.status == "pass" for r in results), results


def test_standard_items_exceed_and_fit_the_budgets(kit):
    """The long items must not fit the largest standard budget, and the short one must fit the smallest."""
    sizes = {item.id: kit.counter.count(item.frame(list(item.history))) for item in kit.items}
    assert sizes["kit-long"] > max(kit.budgets) and sizes["kit-giant"] > max(kit.budgets)
    assert sizes["kit-empty"] < min(kit.budgets)
    assert any(item.system is None for item in kit.items)


# ----------------------------------------------------------------- each check can fail


class Base(MemoryStrategy):
    regime = Regime.LOCAL_ONLY

    def keep(self, history, budget, context):
        return builtin.Truncation().apply(history, budget, context)


class Mutates(Base):
    """Edits a message of the history it was given in place, past its frozen dataclass: a run
    refuses the cell, and the kit says so."""

    name = "mutates"

    def apply(self, history, budget, context):
        if history:
            object.__setattr__(history[0], "content", history[0].content + " (edited)")
        return self.keep(history, budget, context)


class PopsHistory(Base):
    """Tries to edit its history as a list: a run gives a tuple, so ``apply`` raises, and the
    kit reports what a run records (an error), not a check of its own."""

    name = "pops-history"

    def apply(self, history, budget, context):
        if history:
            history.pop(0)
        return self.keep(history, budget, context)


def test_the_kit_records_what_a_run_records_for_an_edit_it_cannot_make(kit):
    results = {r.check: r for r in kit.run_checks(PopsHistory)}
    assert results["valid-output"].status == "fail"
    assert "AttributeError" in results["valid-output"].detail and "pop" in results["valid-output"].detail
    assert results["no-mutation"].status == "pass"


class Leaks(Base):
    """Counts the items it has seen and says so in the prompt: reset() does not clear the count."""

    name = "leaks"

    def __init__(self, **params):
        super().__init__(**params)
        self.seen: set[str] = set()

    def apply(self, history, budget, context):
        self.seen.add(context.item.id)
        prompt = self.keep(history, budget, context)
        return [*prompt[:-1], Message("user", f"items seen: {len(self.seen)}"), prompt[-1]]


class Random(Base):
    name = "random"

    def apply(self, history, budget, context):
        kept = [m for m in history if random.SystemRandom().random() < 0.5]
        return self.keep(kept, budget, context)


class OverBudget(Base):
    name = "over-budget"

    def apply(self, history, budget, context):
        return context.frame(list(history))


class DropsQuery(Base):
    name = "drops-query"

    def apply(self, history, budget, context):
        return self.keep(history, budget, context)[:-1]


class NoRegime(Base):
    name = "no-regime"
    regime = "local"  # a string, not a Regime

    def apply(self, history, budget, context):
        return self.keep(history, budget, context)


class ForgetsParams(Base):
    """Takes a parameter but never calls ``super().__init__(**params)``."""

    name = "forgets-params"

    def __init__(self, window: int = 3) -> None:
        self.window = window

    def apply(self, history, budget, context):
        return self.keep(history, budget, context)


def test_a_strategy_that_forgets_super_init_is_told_the_fix(kit):
    """Old message: "object has no attribute 'params'", with no hint."""
    (declared,) = [r for r in kit.run_checks(ForgetsParams) if r.check == "declared"]
    assert declared.status == "fail" and "super().__init__(**params)" in declared.detail


@pytest.mark.parametrize(
    "strategy, check",
    [
        (Mutates, "no-mutation"),
        (Leaks, "reset"),
        (Random, "deterministic"),
        (OverBudget, "budget"),
        (DropsQuery, "valid-output"),
        (NoRegime, "declared"),
    ],
)
def test_each_check_fails_on_a_strategy_that_breaks_it(kit, strategy, check):
    results = kit.run_checks(strategy)
    failed = {r.check for r in results if r.status == "fail"}
    assert check in failed, results
    with pytest.raises(AssertionError, match=check):
        kit.assert_conforms(strategy)


# ----------------------------------------------------------------- memory systems


class Words(MemorySystem):
    """A memory system with a switch for each way of getting ingest wrong."""

    name = "words"
    regime = Regime.PERSISTENT_STATEFUL

    def __init__(self, failure_mode: str = "report", clear_on_reset: bool = True, **params):
        super().__init__(failure_mode=failure_mode, clear_on_reset=clear_on_reset, **params)
        self.failure_mode, self.clear_on_reset = failure_mode, clear_on_reset
        self.texts: list[tuple[str, str]] = []

    def reset(self):
        if self.clear_on_reset:
            self.texts = []

    def ingest(self, sessions, context):
        failures = []
        for session in sessions:
            try:
                self.texts.append((session.id, " ".join(m.content for m in session.messages)))
            except Exception as exc:
                if self.failure_mode == "raise":
                    raise
                if self.failure_mode == "report":
                    failures.append(IngestFailure(session.id, str(exc)))
        return IngestReport(len(sessions), len(sessions) - len(failures), failures)

    def retrieve(self, query, context):
        terms = set(query.lower().split())
        scores = [len(terms & set(text.lower().split())) for _, text in self.texts]
        ranked = sorted(range(len(self.texts)), key=lambda i: (-scores[i], i))[:10]
        return [RetrievedItem(self.texts[i][1], float(scores[i]), self.texts[i][0]) for i in ranked if scores[i] > 0]


def test_memory_system_that_reports_failures_passes(kit):
    results = kit.assert_conforms(Words)
    assert statuses(results)["ingest-failures"] == "pass"


@pytest.mark.parametrize("mode, phrase", [("swallow", "lost silently"), ("raise", "raised instead of reporting")])
def test_ingest_failures_check_catches_swallowed_and_raised_errors(kit, mode, phrase):
    results = {r.check: r for r in kit.run_checks(functools.partial(Words, failure_mode=mode))}
    assert results["ingest-failures"].status == "fail"
    assert phrase in results["ingest-failures"].detail


def test_memory_system_reset_check(kit):
    results = statuses(kit.run_checks(functools.partial(Words, clear_on_reset=False)))
    assert results["reset"] == "fail"


# ----------------------------------------------------------------- the command


@pytest.mark.slow
def test_check_plugin_command_prints_the_table():
    result = CliRunner().invoke(check_plugin, ["recency"])
    assert result.exit_code == 0, result.output
    assert "conformance: recency" in result.output and "PASS" in result.output and "FAIL" not in result.output


def test_check_plugin_in_process_when_asked():
    result = CliRunner().invoke(check_plugin, ["truncation", "--isolation", "none", "--json", "-b", "256"])
    assert result.exit_code == 0, result.output
    assert '"check": "no-mutation"' in result.output and '"fail"' not in result.output


def test_check_plugin_unknown_name_lists_strategies():
    result = CliRunner().invoke(check_plugin, ["no-such-strategy"])
    assert result.exit_code != 0
    assert "truncation" in str(result.exception)


class Peeks(MemoryStrategy):
    """Records what it was shown of the item: the kit must show what a run shows."""

    name = "peeks"
    regime = Regime.LOCAL_ONLY
    seen: list = []

    def apply(self, history, budget, context):
        item = context.item
        Peeks.seen.append((item.answer, item.category, dict(item.metadata), [dict(m.metadata) for m in history]))
        return context.counter.fit([*([item.system] if item.system else []), item.query], budget)


def test_the_kit_shows_a_strategy_the_view_a_run_shows(kit):
    from budgetbench_core import EVIDENCE_KEY, Item
    from budgetbench_core.testing import strategy_context

    Peeks.seen.clear()
    in_process = ConformanceKit(kit.counter, kit.model, isolation="none")  # Peeks.seen lives in this process
    in_process.run_checks(Peeks)
    assert Peeks.seen and all(
        answer is None and category is None and meta == {} for answer, category, meta, _ in Peeks.seen
    )
    marked = Item(
        "x",
        (Message("user", "my dog is Rex", {EVIDENCE_KEY: True, "session_id": "a"}),),
        Message("user", "dog?"),
        "Rex",
        category="pets",
        metadata={"gold": "Rex"},
    )
    context = strategy_context(marked, 512, kit.counter, ".")
    assert context.item.answer is None and context.item.category is None and dict(context.item.metadata) == {}
    assert dict(context.item.history[0].metadata) == {"session_id": "a"}


class ExitsInApply(Base):
    """Ends its own process in ``apply``: in a run's worker that is an error row, not a dead run."""

    name = "exits-in-apply"

    def apply(self, history, budget, context):
        os._exit(3)


def test_the_kit_runs_the_plugin_in_a_worker_as_a_run_does(kit):
    # one item at one budget: every apply ends its worker, so each cell starts a new one
    items = [item for item in standard_items() if item.id == "kit-short"]
    small = ConformanceKit(kit.counter, kit.model, budgets=(256,), items=items)
    results = {r.check: r for r in small.run_checks(ExitsInApply)}
    assert results["declared"].status == "pass"  # inspected here; apply ran in a worker of the host
    assert results["valid-output"].status == "fail"
    assert "exits-in-apply" in results["valid-output"].detail and "exit" in results["valid-output"].detail
    print(results["valid-output"].detail)


def test_a_factory_a_worker_cannot_create_is_refused_by_name(kit):
    with pytest.raises(KitError, match="not a class"):
        kit.run_checks(lambda: builtin.Truncation())
