"""The known defects of the reference harness (DESIGN.md, "Known defects"), one
``test_defect_NN`` each where no other suite holds it; ``test_every_known_defect_has_a_test``
fails when any of the thirteen has none anywhere in the repository.

The runs here use the loopback ``FaultServer`` as the model (a deterministic reply, the
faults a test asks for) and tiktoken counting, so they take seconds; what is checked is
the harness's own behaviour: what it sends, what it records.
"""

from __future__ import annotations

import ast
import inspect
import re
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from budgetbench_core import (
    AuxiliaryBudgetError,
    GradingContext,
    Item,
    MemoryStrategy,
    Message,
    PromptCounter,
    Regime,
    RunConfig,
    hookimpl,
    iter_events,
    run,
)
from budgetbench_core.builtin.strategies import Checkpoint, SummaryBuffer
from budgetbench_core.builtin.tokenizers import TiktokenTokenizer
from budgetbench_core.gate import gate
from budgetbench_core.plugins import PluginInfo, load_registry
from budgetbench_core.testing import FaultServer, strategy_context

ROOT = Path(__file__).resolve().parents[1]
DEFECTS = 13


def served_run(
    tmp_path: Path,
    server: FaultServer,
    strategies: list[str],
    budgets: list[int],
    registry=None,
    items: int = 2,
    history_tokens: int = 1500,
    **options,
) -> Path:
    """A synthetic-memory run against the loopback server, counted with cl100k_base."""
    out = tmp_path / "run"
    run(
        RunConfig(
            task="synthetic-memory",
            strategies=strategies,
            budgets=budgets,
            out=out,
            limit=items,
            model="openai/fault-model",
            api_base=server.url,
            tokenizer="tiktoken:cl100k_base",
            task_options={"items": items, "history_tokens": history_tokens},
            max_concurrency=1,
            **options,
        ),
        registry=registry,
    )
    return out


def final(events: list[dict]) -> list[dict]:
    return [e for e in events if e["event"] in ("result", "violation", "error")]


# ----------------------------------------------------------------- 1: empty predictions


@pytest.mark.parametrize("grader", ["exact-match", "contains-answer"])
@pytest.mark.parametrize(
    "prediction, answer",
    [
        ("", "Lisbon"),
        ("   ", "Lisbon"),
        ("...", "Lisbon"),
        ("the", "the dog"),
        ("Lis", "Lisbon"),
        ("a", "a"),
        ("", ""),
        ("Lisbon", ""),
    ],
)
def test_defect_01_core_graders_never_count_an_empty_or_contained_short_prediction(grader, prediction, answer):
    """An empty prediction (or one that normalises to nothing, or a fragment of the answer)
    is never correct; nor is anything against an empty answer."""
    registry = load_registry()
    item = Item("g", (), Message("user", "Where did I move?"), answer)
    judge = GradingContext(judge=lambda messages, max_tokens: pytest.fail("no judge call"), judge_model=None)
    verdict = registry.get("grader", grader).obj().grade(item, prediction, judge)
    assert verdict.quality == 0.0, (grader, prediction, answer, verdict)


# ----------------------------------------------------------------- 2, 3: tasks never see the budget


def test_defect_02_tasks_cannot_trim_their_prompt_to_the_budget(tmp_path):
    """The Task contract has no budget to trim to, for every installed task; and a run's
    history is the same at every tier (full_context sends it whole, or records a violation)."""
    registry = load_registry()
    for name in registry.names("task"):
        task = registry.get("task", name).obj
        for method in ("__init__", "load", "format") if hasattr(task, "format") else ("__init__", "load"):
            parameters = inspect.signature(getattr(task, method)).parameters
            assert not [p for p in parameters if "budget" in p.lower()], f"task {name}.{method} takes a budget"
    with FaultServer() as server:
        out = served_run(tmp_path, server, ["full_context"], [256, 8192])
    audits = [e for e in iter_events(out) if e["event"] == "prompt_audit"]
    by_item: dict[str, set[int]] = {}
    for audit in audits:
        by_item.setdefault(audit["item_id"], set()).add(audit["prompt_tokens"])
    assert by_item and all(len(sizes) == 1 for sizes in by_item.values()), by_item  # same prompt at both tiers


def test_defect_03_over_budget_full_context_items_stay_in_the_denominator(tmp_path):
    """Items that do not fit are violation rows scored 0, never dropped from the cell."""
    with FaultServer() as server:
        out = served_run(tmp_path, server, ["full_context"], [256], items=3)
        sent = len(server.requests)
    rows = final(list(iter_events(out)))
    assert len(rows) == 3 and {r["event"] for r in rows} == {"violation"}
    assert all(r["quality"] == 0 and r["prompt_tokens"] > 256 for r in rows)
    assert sent == 0  # nothing over budget reached the server


# ----------------------------------------------------------------- 4: failed calls are errors


def test_defect_04_a_connection_failure_is_an_error_row_never_a_graded_answer(tmp_path):
    with FaultServer(rate=1.0, faults=("close",)) as server:
        out = served_run(tmp_path, server, ["truncation"], [2048], retries=1)
        attempts = len(server.requests)
    rows = final(list(iter_events(out)))
    assert len(rows) == 2 and {r["event"] for r in rows} == {"error"}
    assert all(r.get("prediction") in (None, "") and r.get("quality") is None for r in rows), rows
    assert all(r["cause"] for r in rows) and attempts == 4  # two items, two attempts each


# ----------------------------------------------------------------- 6: auxiliary calls are gated


class OverBudgetSummary(MemoryStrategy):
    """Asks for a summary whose own prompt is the whole history: over any small budget."""

    name = "over-budget-summary"
    regime = Regime.AUXILIARY_MODEL

    def apply(self, history, budget, context):
        transcript = "\n".join(m.content for m in history)
        summary = context.complete([Message("user", "Summarise:\n" + transcript)], 32, "summary")
        return context.frame([Message("user", summary)])


def test_defect_06_an_over_budget_auxiliary_call_is_never_sent_and_is_a_violation(tmp_path):
    registry = load_registry()
    registry.add_plugin(
        type("P", (), {"register_strategies": staticmethod(hookimpl(lambda register: register(OverBudgetSummary)))})(),
        PluginInfo("aux", "dist-aux", "0.1"),
    )
    with FaultServer() as server:
        out = served_run(tmp_path, server, ["over-budget-summary"], [300], registry=registry)
        sent = [r.prompt_tokens for r in server.requests]
    rows = final(list(iter_events(out)))
    assert len(rows) == 2 and all(r["event"] == "violation" for r in rows), rows
    assert all(r.get("phase") == "auxiliary" and r["prompt_tokens"] > 300 and r["quality"] == 0 for r in rows)
    assert sent == []  # neither the auxiliary prompt nor an answer reached the server


# ----------------------------------------------------------------- 10: composed prompts fit

WORDS = ["the", "dog", "Lisbon", "moved", "2023-04-01", "favourite", "tea", "Amara", "Привет", "🍕", "\n", "?"]
_text = st.lists(st.sampled_from(WORDS), min_size=1, max_size=30).map(" ".join)
_items = st.builds(
    lambda history, query: Item("prop", tuple(history), Message("user", query), None, Message("system", "Be brief.")),
    st.lists(st.builds(Message, st.sampled_from(["user", "assistant"]), _text), max_size=30),
    _text,
)


@pytest.fixture(scope="module")
def counter():
    return PromptCounter(TiktokenTokenizer("cl100k_base"))


def test_defect_10_minimum_section_sizes_never_push_a_composed_prompt_over_budget(counter, tmp_path):
    """summary_buffer (a summary of at least 16 tokens) and checkpoint (tail, evidence,
    checkpoint) at budgets from just above the floor: the prompt fits whenever system
    prompt and query alone do, and every auxiliary prompt passes the runner's gate. The
    summariser answers with as many tokens as it is allowed: the worst case."""

    def summariser(budget):
        def complete(messages, max_tokens, purpose):
            gated = gate(messages, budget, counter)
            if not gated.admitted:
                raise AuxiliaryBudgetError(f"{purpose}: {gated.tokens} > {budget}", gated.tokens)
            return " ".join(["memo"] * max_tokens)

        return complete

    @settings(
        max_examples=300,
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
    @given(item=_items, extra=st.integers(0, 120), strategy=st.sampled_from([SummaryBuffer, Checkpoint]))
    def check(item, extra, strategy):
        floor = counter.count(item.frame([]))
        budget = floor + extra
        context = strategy_context(item, budget, counter, tmp_path, complete=summariser(budget))
        prompt = strategy().apply(item.history, budget, context)
        assert counter.count(prompt) <= budget, (strategy.name, budget, floor)

    check()


# ----------------------------------------------------------------- the rule


def _test_names() -> set[str]:
    names: set[str] = set()
    for pattern in ("tests/**/test_*.py", "plugins/*/tests/test_*.py"):
        for path in ROOT.glob(pattern):
            tree = ast.parse(path.read_text(encoding="utf-8"))
            names |= {
                node.name
                for node in ast.walk(tree)
                if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name.startswith("test_")
            }
    return names


def test_every_known_defect_has_a_test():
    """Each of the thirteen known defects is proved absent by a ``test_defect_NN_...``."""
    found = {int(m.group(1)) for name in _test_names() if (m := re.match(r"test_defect_(\d\d)_", name))}
    missing = sorted(set(range(1, DEFECTS + 1)) - found)
    assert not missing, f"no test_defect_NN for known defects {missing} (DESIGN.md, 'Known defects')"
    design = ROOT.parent / "shared" / "DESIGN.md"
    if design.is_file():  # the list there is the source; its length must match
        section = design.read_text(encoding="utf-8").split("## Known defects", 1)[1].split("\n## ", 1)[0]
        assert len(re.findall(r"^\d+\. ", section, re.MULTILINE)) == DEFECTS
