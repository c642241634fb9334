"""The runner on the real embedded model: budget enforcement, violations, resume."""

from __future__ import annotations

import gc
import json

import pytest

from budgetbench_core.runlog import final_rows, iter_events, read_manifest
from budgetbench_core.runner import RunConfig, RunConfigError, run

SMALL = {"items": 3, "history_tokens": 1200}


def config(tmp_path, **overrides):
    settings = dict(
        task="synthetic-memory",
        strategies=["truncation", "full_context"],
        budgets=[256, 512],
        limit=2,
        out=tmp_path,
        task_options=SMALL,
        max_concurrency=2,
    )
    settings.update(overrides)
    return RunConfig(**settings)


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("run")
    summary = run(config(out))
    return out, summary


def test_every_cell_ends_in_a_row_and_none_is_over_budget(finished_run):
    out, summary = finished_run
    rows = final_rows(out)
    assert len(rows) == summary.cells_total == 2 * 2 * 2
    for (_task, _strategy, budget, _repeat, _item), row in rows.items():
        if row["event"] == "result":
            assert row["prompt_tokens"] <= budget
            assert row["served_prompt_tokens"] == row["prompt_tokens"]
        elif row["event"] == "violation":
            assert row["prompt_tokens"] > budget and row["quality"] == 0
        else:
            pytest.fail(f"unexpected error row: {row}")


def test_full_context_over_budget_is_a_violation_and_never_sent(finished_run):
    out, summary = finished_run
    violations = [r for r in final_rows(out).values() if r["event"] == "violation"]
    assert violations and all(r["strategy"] == "full_context" for r in violations)
    # model calls are made for admitted prompts only (retries under load are counted as attempts)
    attempts = sum(r["attempts"] for r in final_rows(out).values() if r["event"] == "result")
    assert summary.model_calls == attempts >= summary.results


def test_manifest_records_versions_model_and_tokenizer(finished_run):
    out, _ = finished_run
    manifest = read_manifest(out)
    assert manifest["schema_version"] == "4" and manifest["run_key"]
    assert manifest["tokenizer"]["exact"] is True and manifest["tokenizer"]["backend"] == "llama.cpp-server"
    assert manifest["versions"]["budgetbench"]
    assert manifest["plugins_used"]["strategy:truncation"]["distribution"] == "budgetbench"
    assert manifest["model"]["backend"] == "local"
    assert manifest["strategies"]["truncation"]["regime"] == "local-only"


def test_resume_makes_no_model_call_and_keeps_rows(finished_run):
    out, _ = finished_run
    before = {k: (r["event"], r.get("prediction")) for k, r in final_rows(out).items()}
    summary = run(config(out))
    assert summary.model_calls == 0
    assert summary.cells_skipped == summary.cells_total
    assert {k: (r["event"], r.get("prediction")) for k, r in final_rows(out).items()} == before


def test_torn_last_line_is_ignored_and_repaired(finished_run, tmp_path):
    out, _ = finished_run
    cell = next((out / "cells").rglob("r0.jsonl"))
    with open(cell, "a", encoding="utf-8") as handle:
        handle.write('{"event": "result", "task": "synth')  # a write cut short by kill -9
    rows_before = len(final_rows(out))
    summary = run(config(out))
    assert summary.model_calls == 0 and len(final_rows(out)) == rows_before
    assert cell.read_text(encoding="utf-8").endswith("\n")
    json.loads(cell.read_text(encoding="utf-8").splitlines()[-1])


def test_changed_identity_is_refused(finished_run):
    out, _ = finished_run
    with pytest.raises(RunConfigError, match="seed"):
        run(config(out, seed=1))


def test_budget_below_system_and_query_is_a_violation(tmp_path):
    summary = run(config(tmp_path, strategies=["truncation"], budgets=[20], limit=1))
    assert summary.violations == 1 and summary.model_calls == 0


def test_budget_over_local_context_is_refused(tmp_path):
    with pytest.raises(ValueError, match="8192-token context"):
        run(config(tmp_path, budgets=[16384]))


def test_prompt_audit_precedes_every_decision(finished_run):
    out, _ = finished_run
    audits = {(e["strategy"], e["budget"], e["item_id"]) for e in iter_events(out) if e["event"] == "prompt_audit"}
    decided = {(k[1], k[2], k[4]) for k in final_rows(out)}
    assert decided <= audits


def test_response_cache_survives_a_new_server_port(tmp_path):
    """A reply that arrived before a crash is reused after restart, though the port changed."""
    first = run(config(tmp_path, strategies=["truncation"], budgets=[256], limit=1))
    assert first.model_calls == 1
    import shutil

    # As if the process died after the call, before any row or seal: the run's key was made
    # before its first call (the cache's entries are MAC'd under it), so integrity.json is there.
    record = json.loads((tmp_path / "integrity.json").read_text())
    for path in tmp_path.iterdir():
        if not path.name.startswith("cache.sqlite"):
            shutil.rmtree(path) if path.is_dir() else path.unlink()
    (tmp_path / "integrity.json").write_text(json.dumps({k: v for k, v in record.items() if k != "sealed"}))
    second = run(config(tmp_path, strategies=["truncation"], budgets=[256], limit=1))
    assert second.model_calls == 0
    (row,) = final_rows(tmp_path).values()
    assert row["event"] == "result" and row["cached"] is True


def test_the_start_up_heap_is_frozen_while_cells_run_and_only_then(tmp_path):
    """The objects made before the cells stay out of the collector's full passes (each cost
    ~220 ms of one cell's CPU on LongMemEval_S), and are handed back to it when the run ends."""
    frozen_during: list[int] = []
    assert gc.get_freeze_count() == 0
    summary = run(
        config(tmp_path, prompts_only=True, strategies=["truncation"]),
        progress=lambda name, n: frozen_during.append(gc.get_freeze_count()),
    )
    assert summary.cells_total == len(frozen_during) == 4
    assert min(frozen_during) > 10_000  # the imports alone hold tens of thousands
    assert gc.get_freeze_count() == 0
