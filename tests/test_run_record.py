"""The run record read as written: every row kind comes back from disk as its ``events`` class,
and a row or run the classes do not describe is refused, naming the file and line."""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import pytest

from budgetbench_core import events, run_manifest
from budgetbench_core.events import CellKey, SchemaError
from budgetbench_core.report.data import ReportError, load_run
from budgetbench_core.run_manifest import Manifest
from budgetbench_core.runlog import (
    EventLog,
    final_rows,
    iter_rows,
    load_manifest,
    read_manifest,
    read_rows,
    write_json_atomic,
)

FIXTURE = Path(__file__).resolve().parent / "data" / "schema3-run"
CELL = dict(task="t", strategy="s", budget=200, repeat=0, item_id="i1", run_key="k")
TERMINAL = dict(aux_calls=1, aux_prompt_tokens=5, metered={"read": {"calls": 1}}, evidence={"marked": 1})


def one_of_each() -> list[events.CellEvent | events.ItemRecord]:
    result = events.Result(
        **CELL,
        **TERMINAL,
        prediction="p",
        completion="c",
        answer=["a"],
        quality=1.0,
        verdict={},
        grader={"name": "g", "version": "1"},
        prompt_tokens=9,
        served_prompt_tokens=None,
        served_count_matches=None,
        completion_tokens=None,
        utilisation=0.045,
        latency_s=0.5,
        attempts=1,
        cached=False,
    )
    result.episode = {"reward": 1.0, "end_reason": "done", "turns": 2}
    return [
        events.PromptAudit(**CELL, prompt_hash="h", prompt_tokens=9, messages=[{"role": "user", "content": "q"}]),
        events.AuxCall(**CELL, purpose="summary", sent=True, prompt_hash="h", prompt_tokens=3),
        events.MeteredCall(**CELL, phase="read", endpoint="embeddings", kind="call", ok=True, status=200),
        events.Warning(**CELL, kind="cache_corrupt", detail="dropped"),
        result,
        events.Violation(**CELL, phase="prompt", prompt_tokens=900),
        events.Admitted(**CELL, prompt_tokens=9, prompt_hash="h", utilisation=0.045),
        events.Error(**CELL, phase="model", cause="down"),
        events.RefusedCall(**CELL, purpose="summary", reason="late"),
        events.EpisodeTurn(
            **CELL,
            turn=0,
            prompt_tokens=9,
            served_prompt_tokens=9,
            reply="r",
            done=True,
            tool_error=False,
            record={},
            appended=[],
            user_calls=[],
        ),
        events.ItemRecord(item_id="i1", run_key="k", digest="d", parts={"query": "q"}),
    ]


def written(tmp_path: Path, rows: list[dict]) -> Path:
    """``rows`` appended through the run's own log to one file of a new run directory."""
    log = EventLog(tmp_path / "run")
    path = tmp_path / "run" / "rows.jsonl"
    for row in rows:
        log.append(row, path)
    log.close()
    return path


def test_a_row_of_every_kind_reads_back_as_its_class(tmp_path):
    written_events = one_of_each()
    assert {type(e) for e in written_events} == set(events.ALL_EVENTS)
    path = written(tmp_path, [e.row() for e in written_events])
    read = list(read_rows(path))
    assert [type(e) for e in read] == [type(e) for e in written_events]
    for before, after in zip(written_events, read):
        assert after.time and after.row() == {**before.row(), "time": after.time}
    assert read[4].episode == {"reward": 1.0, "end_reason": "done", "turns": 2}
    assert read[0].key == CellKey("t", "s", 200, 0, "i1") and read[4].key[1:3] == ("s", 200)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"event": "resultt"}, "unknown event kind 'resultt'"),
        ({"verdikt": {}}, "field(s) ['verdikt'] that schema_version 4 lacks"),
        ({"episode": {"rewards": 1}}, "not an episode summary"),
    ],
)
def test_a_row_the_classes_do_not_describe_is_refused_naming_file_and_line(tmp_path, change, message):
    rows = [e.row() for e in one_of_each()]
    rows[4] = {**rows[4], **change}
    path = written(tmp_path, rows)
    with pytest.raises(SchemaError, match=rf"{path}: line 5: .*") as refused:
        list(read_rows(path))
    assert message in str(refused.value)


def test_a_row_missing_a_field_is_refused(tmp_path):
    row = one_of_each()[7].row()
    del row["cause"]
    with pytest.raises(SchemaError, match=r"line 1: error row lacks its field\(s\) \['cause'\]"):
        list(read_rows(written(tmp_path, [row])))


def test_a_run_of_an_unknown_or_newer_schema_is_refused_and_an_older_one_migrated(tmp_path):
    path = written(tmp_path, [e.row() for e in one_of_each()])
    with pytest.raises(SchemaError, match=rf"{path}: schema_version '5' is newer .* upgrade budgetbench"):
        list(read_rows(path, "5"))
    with pytest.raises(SchemaError, match=r"schema_version '1' cannot be read \(this budgetbench reads 2, 3, 4\)"):
        list(read_rows(path, "1"))
    assert [e.row() for e in read_rows(path, "2")] == [e.row() for e in read_rows(path)]
    assert [e.row() for e in read_rows(path, "3")] == [e.row() for e in read_rows(path)]
    audit = events.PromptAudit(**CELL, prompt_hash="h", prompt_tokens=9, messages=[], tools_tokens=4).row()
    assert audit["tools_tokens"] == 4
    del audit["tools_tokens"]  # as a version 3 run wrote it
    (read,) = read_rows(written(tmp_path / "v3", [audit]), "3")
    assert isinstance(read, events.PromptAudit) and read.tools_tokens is None


def test_the_schema3_run_reads_typed_and_a_newer_manifest_is_refused_by_the_report(tmp_path):
    run_dir = tmp_path / "run"
    shutil.copytree(FIXTURE / "run", run_dir)
    typed = {row.key: row for row in iter_rows(run_dir) if isinstance(row, events.Terminal)}
    assert {key: event.row() for key, event in typed.items()} == final_rows(run_dir)
    assert all(isinstance(event, events.Result) for event in typed.values()) and len(typed) == 12
    manifest = json.loads((run_dir / "manifest.json").read_text())
    (run_dir / "manifest.json").write_text(json.dumps({**manifest, "schema_version": "9"}))
    with pytest.raises(ReportError, match=r"schema_version '9' is newer"):
        load_run(run_dir, force=True)


# ----------------------------------------------------------------- the manifest


def test_a_manifest_round_trips_through_its_file(tmp_path):
    manifest = Manifest(
        schema_version=events.SCHEMA_VERSION,
        run_key="k",
        identity={"task": "t"},
        config={"task": "t", "shard": None},
        started="2026-01-01T00:00:00.000+00:00",
        judge=None,
        invocations=[{"started": "s", "finished": None, "calls_made": None}],
        selected_items={"t": {"count": 1, "ids": ["i1"], "complete": True}},
    )
    written = manifest.to_dict()
    assert "calls_made" not in written and "shards" not in written, "late fields only once set"
    assert written["judge"] is None and list(written)[:3] == ["schema_version", "run_key", "identity"]
    write_json_atomic(tmp_path / "manifest.json", written)
    assert load_manifest(tmp_path) == manifest and read_manifest(tmp_path) == written


def test_the_schema3_manifest_reads_typed_as_written():
    original = read_manifest(FIXTURE / "run")
    manifest = load_manifest(FIXTURE / "run")
    assert manifest is not None and manifest.run_key == original["run_key"] and manifest.calls_made == 10
    assert {k: v for k, v in manifest.to_dict().items() if k in original} == original


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"schema_version": "5"}, r"schema_version '5' is newer than this budgetbench reads \(4\)"),
        ({"schema_version": "zz"}, r"schema_version 'zz' cannot be read"),
        ({"colour": "red"}, r"field\(s\) \['colour'\] that a manifest of schema_version 4 lacks"),
    ],
)
def test_a_manifest_of_a_newer_schema_or_an_unknown_field_is_refused_naming_it(tmp_path, change, message):
    write_json_atomic(tmp_path / "manifest.json", {**read_manifest(FIXTURE / "run"), **change})
    with pytest.raises(SchemaError, match=rf"{tmp_path / 'manifest.json'}: {message}"):
        load_manifest(tmp_path)


def test_the_manifest_page_is_generated_from_the_class():
    page = Path(__file__).resolve().parents[1] / "docs" / "manifest.md"
    assert page.read_text(encoding="utf-8") == run_manifest.render_markdown()
    assert all(f"| `{item.name}` |" in page.read_text() for item in dataclasses.fields(Manifest))


def test_the_report_refuses_a_row_with_a_field_the_schema_lacks_naming_file_and_line(tmp_path):
    run_dir = tmp_path / "run"
    shutil.copytree(FIXTURE / "run", run_dir)
    path = sorted((run_dir / "cells").rglob("*.jsonl"))[0]
    lines = path.read_text().splitlines()
    lines[1] = json.dumps({**json.loads(lines[1]), "mood": "sunny"})
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(ReportError, match=rf"{path}: line 2: \w+ row has field\(s\) \['mood'\]"):
        load_run(run_dir, force=True)
