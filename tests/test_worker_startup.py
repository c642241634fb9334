"""A plugin worker imports only the entry points the harness names for it.

A worker's HOME is a fresh scratch folder, so a worker that looked its strategy up the way the
harness does would build the plugin index again (a child process importing every installed
plugin) and write it under that HOME. Told its entry points, it imports those and builds none.
"""

from __future__ import annotations

from budgetbench_core.host.pool import PluginHost
from budgetbench_core.plugins import Registry
from budgetbench_core.testing import tokenizer_for


def built_indexes(scratch_root) -> list:
    return sorted(scratch_root.rglob("plugin-index-*.json"))


def test_the_harness_names_a_strategys_entry_point_and_its_worker_builds_no_index(tmp_path):
    entry_points = Registry.discover().entry_points_for("strategy", "truncation")
    assert entry_points is not None and "builtin-strategies" in entry_points
    assert Registry.discover().entry_points_for("strategy", "no-such-strategy") is None

    scratch = tmp_path / "workers"
    host = PluginHost(tokenizer_for("tiktoken:cl100k_base").info.to_dict(), scratch)
    try:
        named = host.new_strategy("truncation", {}, 0.0, {"entry_points": entry_points})
        assert named.worker.alive()
        assert built_indexes(scratch) == []

        looked_up = host.new_strategy("truncation", {}, 0.0, None)  # no names: the worker indexes for itself
        assert looked_up.worker.alive()
        assert len(built_indexes(scratch)) == 1
    finally:
        host.close()


PROBE = """
import gc
import sys

from budgetbench_core import MemoryStrategy, Regime


class Probe(MemoryStrategy):
    name = "probe"
    regime = Regime.LOCAL_ONLY

    def apply(self, history, budget, context):
        return [context.item.query]

    def describe(self):
        return {"modules": sorted(sys.modules), "frozen": gc.get_freeze_count()}
"""

# The harness's machinery: a worker that imports any of these pays for it at every start.
HARNESS_ONLY = ("budgetbench_core.runner", "budgetbench_core.model_calls", "budgetbench_core.cache",
                "budgetbench_core.host.pool", "budgetbench_core.report", "litellm", "scipy", "httpx")  # fmt: skip


def test_a_worker_imports_its_plugin_and_the_contracts_it_uses_not_the_harness(tmp_path):
    """``budgetbench_core`` imports a public name's module on first use: a worker starts without the
    runner, the report, the reply cache or a model client (each start used to import them all)."""
    (tmp_path / "probe_strategy.py").write_text(PROBE)
    source = {"module": "probe_strategy", "qualname": "Probe", "file": str(tmp_path / "probe_strategy.py"),
              "distribution": "tests", "version": "0"}  # fmt: skip
    host = PluginHost(tokenizer_for("tiktoken:cl100k_base").info.to_dict(), tmp_path / "workers")
    try:
        described = host.new_strategy("probe", {}, 0.0, source).describe()
    finally:
        host.close()
    modules = described["modules"]
    assert "budgetbench_core.strategies" in modules and "probe_strategy" in modules
    assert [m for m in modules if m.startswith(HARNESS_ONLY)] == []
    # its start-up's objects are out of the collector's full passes, which would charge one cell
    # with a scan of the plugin's whole heap
    assert described["frozen"] > 10_000
