"""Hostile plugins: each misbehaviour becomes a clear row (or error) naming the plugin and
the item, and the rest of the run carries on unharmed.

Test plugins are registered on a real registry with ``Registry.add_plugin`` (no
distribution installed); the plugin that fails to import is a throwaway entry point made
visible through a ``.dist-info`` folder on ``sys.path``, which is how importlib.metadata
finds installed distributions.
"""

from __future__ import annotations

import os
import threading
import types

import pytest

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

from budgetbench_core import MemoryStrategy, Message, Regime, RunConfig, Task, hookimpl, run  # noqa: E402
from budgetbench_core.plugins import PluginError, PluginInfo, load_registry  # noqa: E402
from budgetbench_core.runlog import final_rows, read_manifest  # noqa: E402
from budgetbench_core.testing import FaultServer  # noqa: E402

RELEASE = threading.Event()  # lets the hanging strategy's thread end when the test is over


class Raises(MemoryStrategy):
    name, regime = "hostile-raises", Regime.LOCAL_ONLY

    def apply(self, history, budget, context):
        raise RuntimeError("hostile strategy exploded")


class WrongType(MemoryStrategy):
    name, regime = "hostile-wrong-type", Regime.LOCAL_ONLY

    def apply(self, history, budget, context):
        return {"prompt": "not a list of messages"}


class OverBudget(MemoryStrategy):
    name, regime = "hostile-over-budget", Regime.LOCAL_ONLY

    def apply(self, history, budget, context):
        return context.frame([*history, Message("user", "pad " * (budget * 2))])


class Mutates(MemoryStrategy):
    name, regime = "hostile-mutates", Regime.LOCAL_ONLY

    def apply(self, history, budget, context):
        object.__setattr__(history[0], "content", "overwritten by a hostile strategy")  # defeats frozen
        return context.frame(list(history))


class Hangs(MemoryStrategy):
    name, regime = "hostile-hangs", Regime.LOCAL_ONLY

    def apply(self, history, budget, context):
        RELEASE.wait(60)
        return context.frame([])


class UnknownRole(MemoryStrategy):
    name, regime = "hostile-unknown-role", Regime.LOCAL_ONLY

    def apply(self, history, budget, context):
        return context.frame([Message("function", '{"result": 42}'), *history[-2:]])


class LoaderRaises(Task):
    name, default_grader = "hostile-loader", "exact-match"

    def load(self, limit, seed):
        raise OSError("disk on fire while reading items")
        yield  # a generator, like real loaders


@hookimpl
def register_strategies(register):
    for strategy in (Raises, WrongType, OverBudget, Mutates, Hangs, UnknownRole):
        register(strategy)


@hookimpl
def register_tasks(register):
    register(LoaderRaises)


def hostile_registry():
    registry = load_registry()
    module = types.ModuleType("hostile_reliability_plugins")
    module.register_strategies = register_strategies
    module.register_tasks = register_tasks
    registry.add_plugin(module, PluginInfo("hostile", "budgetbench-hostile-test", "0.0.1"))
    assert "hostile" not in {p.name for p in registry.failures}
    return registry


EXPECTED = {  # strategy -> (event, phase, words the cause must contain)
    "hostile-raises": ("error", "strategy", "RuntimeError: hostile strategy exploded"),
    "hostile-wrong-type": ("error", "strategy", "must return list[Message], got dict"),
    "hostile-mutates": ("error", "strategy", "mutated the history"),
    "hostile-hangs": ("error", "strategy", "did not return within 2 s"),
    "hostile-unknown-role": ("error", "strategy", "unknown roles ['function']"),
    "hostile-over-budget": ("violation", "prompt", None),
}
SETTINGS = dict(
    task="synthetic-memory",
    budgets=[300, 1000],
    model="openai/fault-model",
    tokenizer="tiktoken:cl100k_base",
    task_options={"items": 4, "history_tokens": 600},
    max_concurrency=4,
    item_timeout_s=2.0,
    retries=0,
    timeout_s=10.0,
)


@pytest.mark.slow
def test_hostile_strategies_are_recorded_and_isolated(tmp_path):
    registry = hostile_registry()
    try:
        with FaultServer() as server:
            clean = run(
                RunConfig(
                    strategies=["truncation", "checkpoint"], out=tmp_path / "clean", api_base=server.url, **SETTINGS
                ),
                registry=registry,
            )
            hostile = run(
                RunConfig(
                    strategies=["truncation", "checkpoint", *EXPECTED],
                    out=tmp_path / "hostile",
                    api_base=server.url,
                    **SETTINGS,
                ),
                registry=registry,
            )
    finally:
        RELEASE.set()
    assert clean.errors == 0
    rows = final_rows(tmp_path / "hostile")
    assert len(rows) == hostile.cells_total == 4 * 2 * (2 + len(EXPECTED))
    for (_, strategy, budget, _, item_id), row in rows.items():
        if strategy in EXPECTED:
            event, phase, words = EXPECTED[strategy]
            assert (row["event"], row["phase"]) == (event, phase), row
            assert "prediction" not in row
            if event == "error":
                assert row["plugin"] == strategy
                assert f"strategy {strategy!r} failed on item {item_id!r}" in row["cause"] and words in row["cause"]
            else:
                assert row["prompt_tokens"] > budget and row["quality"] == 0
    # The well-behaved strategies are untouched by their neighbours, mutation included.
    reference = final_rows(tmp_path / "clean")
    for key, row in reference.items():
        assert row["event"] == "result"
        got = rows[key]
        assert (got["event"], got["prompt_tokens"], got["prediction"]) == (
            "result",
            row["prompt_tokens"],
            row["prediction"],
        ), key


def test_task_loader_that_raises_names_the_task(tmp_path):
    registry = hostile_registry()
    with pytest.raises(PluginError, match=r"task 'hostile-loader' \(budgetbench-hostile-test\).*disk on fire"):
        run(
            RunConfig(
                task="hostile-loader",
                strategies=["truncation"],
                budgets=[500],
                out=tmp_path / "run",
                tokenizer="tiktoken:cl100k_base",
                model="openai/unused",
                api_base="http://127.0.0.1:9/v1",
            ),
            registry=registry,
        )


BROKEN_ENTRY_POINT = "reliability-broken"


@pytest.fixture
def broken_plugin_on_path(tmp_path, monkeypatch):
    """A distribution whose entry point module raises on import, visible only to this process."""
    site = tmp_path / "site"
    (site / "budgetbench_reliability_broken.py").parent.mkdir(parents=True)
    (site / "budgetbench_reliability_broken.py").write_text("raise ImportError('missing dependency: frobnicate')\n")
    info = site / "budgetbench_reliability_broken-0.0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: budgetbench-reliability-broken\nVersion: 0.0.1\n")
    (info / "entry_points.txt").write_text(f"[budgetbench]\n{BROKEN_ENTRY_POINT} = budgetbench_reliability_broken\n")
    monkeypatch.syspath_prepend(str(site))
    return site


def test_plugin_that_fails_to_import_is_reported_and_the_rest_runs(tmp_path, broken_plugin_on_path):
    registry = load_registry()
    failed = {p.name: p for p in registry.failures}
    assert BROKEN_ENTRY_POINT in failed
    assert failed[BROKEN_ENTRY_POINT].distribution == "budgetbench-reliability-broken"
    assert "missing dependency: frobnicate" in failed[BROKEN_ENTRY_POINT].error
    assert "truncation" in registry.names("strategy")  # the others still loaded
    with FaultServer() as server:
        summary = run(
            RunConfig(
                strategies=["truncation"],
                out=tmp_path / "run",
                api_base=server.url,
                **{**SETTINGS, "task_options": {"items": 2, "history_tokens": 300}},
            ),
            registry=registry,
        )
    assert summary.results == 4
    recorded = {p["name"]: p for p in read_manifest(tmp_path / "run")["plugin_failures"]}
    assert recorded[BROKEN_ENTRY_POINT]["distribution"] == "budgetbench-reliability-broken"
    assert "frobnicate" in recorded[BROKEN_ENTRY_POINT]["error"]
