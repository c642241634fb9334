"""Runs that repeat: no server prompt reuse by default, the selection recorded, missing items seen.

On llama.cpp a greedy reply depends on the prompt cache: the same prompt answered on a
fresh slot and again with its prefix cached gave different replies (issue 20). The harness
asks for no reuse (``cache_prompt: false``) unless ``--server-prompt-cache``.
"""

from __future__ import annotations

import json

import pytest

from budgetbench_core import GenerationParams, Message, RunConfig, run
from budgetbench_core.builtin.local_backend import LocalBackend
from budgetbench_core.report import write_report
from budgetbench_core.runlog import final_rows

pytestmark = pytest.mark.slow

HISTORY = "A long conversation. " + " ".join(
    f"On day {i} the user said they like colour number {i * 7 % 13}." for i in range(40)
)
PROMPT = [Message("system", "Answer briefly."), Message("user", HISTORY + " Did the user mention blue? yes or no.")]


@pytest.mark.parametrize("reuse", [False, True])
def test_the_embedded_server_reuses_no_prompt_unless_asked(reuse):
    backend = LocalBackend("local", max_concurrency=1, server_prompt_cache=reuse)
    backend.start()
    try:
        first, again = (backend.complete(PROMPT, GenerationParams(8, 0.0, 0)) for _ in range(2))
    finally:
        backend.stop()
    assert backend.describe()["server_prompt_cache"] is reuse
    if reuse:  # the second call starts from the cached prefix (and its reply may differ)
        assert again.cached_tokens and again.cached_tokens > 500
    else:
        assert (first.cached_tokens, again.cached_tokens) == (0, 0) and first.text == again.text
        assert backend.describe()["cache_prompt_sent"] is False


def _config(out, strategies) -> RunConfig:
    return RunConfig(
        task="synthetic-memory",
        strategies=strategies,
        budgets=[256],
        out=out,
        limit=3,
        max_concurrency=1,
        max_output_tokens=12,
        task_options={"items": 3, "history_tokens": 400},
    )


def _run(out, strategies):
    run(_config(out, strategies))
    return {key: row for key, row in final_rows(out).items()}


def test_two_fresh_runs_give_identical_predictions_and_record_the_selection(tmp_path):
    """The second run takes the cells in another order, so a reused prefix would differ."""
    first = _run(tmp_path / "a", ["truncation", "recency"])
    second = _run(tmp_path / "b", ["recency", "truncation"])
    assert set(first) == set(second) and len(first) == 6
    for key, row in first.items():
        assert row["event"] == "result", row
        assert (row["prediction"], row["quality"]) == (second[key]["prediction"], second[key]["quality"]), key
        assert not row.get("served_cached_tokens"), row  # no prefix was reused
    manifest = json.loads((tmp_path / "a" / "manifest.json").read_text())
    assert manifest["model"]["server_prompt_cache"] is False
    selected = manifest["selected_items"]["synthetic-memory"]
    assert sorted(selected["ids"]) == sorted({k[4] for k in first}) and selected.get("count", 3) == 3


def test_an_item_without_any_row_is_reported_missing(tmp_path):
    """A run stopped before its last item: that item has no row in any cell, only the manifest names it."""
    done: list[str] = []

    def stop_after_two(strategy, cells):
        done.append(strategy)
        if len(done) == 2:
            raise KeyboardInterrupt  # Ctrl-C after the second item's cell

    config = _config(tmp_path, ["truncation"])
    with pytest.raises(KeyboardInterrupt):
        run(config, progress=stop_after_two)
    rows = final_rows(tmp_path)
    selected = json.loads((tmp_path / "manifest.json").read_text())["selected_items"]["synthetic-memory"]["ids"]
    (last,) = set(selected) - {k[4] for k in rows}
    write_report(tmp_path, formats=["json"])
    findings = json.loads((tmp_path / "report" / "report.json").read_text())["findings"]
    assert f"synthetic-memory: 1 of the 3 selected items have no row at all (missing): {last}." in findings
