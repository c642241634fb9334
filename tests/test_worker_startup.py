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
