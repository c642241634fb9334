"""Agent episodes: the docs/episodes.md example on the embedded model, violations, resume, exchanges."""

from __future__ import annotations

import json
import re
import types
from pathlib import Path

import pytest

from budgetbench_core import Message, RunConfig, final_rows, keep_exchanges, run
from budgetbench_core.episodes import split_exchange
from budgetbench_core.testing import registry_with

DOCS = Path(__file__).resolve().parents[1] / "docs" / "episodes.md"


def doc_example() -> types.ModuleType:
    code = re.search(r"```python\n(.*?)```", DOCS.read_text(encoding="utf-8"), flags=re.S).group(1)
    module = types.ModuleType("episodes_doc_example")
    exec(compile(code, str(DOCS), "exec"), module.__dict__)  # noqa: S102 - our own documentation
    return module


def audits(run_dir: Path) -> list[dict]:
    return [row for path in sorted((run_dir / "cells").rglob("*.jsonl"))
            for row in map(json.loads, path.read_text().splitlines()) if row["event"] == "prompt_audit"]


@pytest.mark.slow
def test_doc_example_runs_every_call_through_the_gate(tmp_path):
    registry = registry_with(doc_example())
    common = dict(task="countdown", model="local", limit=2, max_concurrency=1, timeout_s=900)
    first = run(RunConfig(strategies=["full_context"], budgets=[1000], out=tmp_path / "wide", **common),
                registry=registry)
    assert first.results == 2 and first.model_calls == 6
    rows = final_rows(tmp_path / "wide")
    for row in rows.values():
        episode = row["episode"]
        assert episode["end_reason"] == "done" and episode["turns"] == episode["calls"] == 3
        assert episode["served_counts_match"] is True and row["served_count_matches"] is True
        assert row["quality"] == episode["reward"] == row["verdict"]["reward"]
    calls = audits(tmp_path / "wide")
    assert sorted(a["call"] for a in calls) == [0, 0, 1, 1, 2, 2]
    for row in rows.values():
        mine = [a["prompt_tokens"] for a in calls if a["item_id"] == row["item_id"]]
        assert row["episode"]["peak_prompt_tokens"] == max(mine) == row["prompt_tokens"]
        assert row["episode"]["total_prompt_tokens"] == sum(mine)
        assert mine == sorted(mine) and mine[0] < mine[-1]  # the history grows every turn

    # A budget that holds the second call of the everything-strategy but not the third:
    # the episode stops at that turn as a violation (reward 0); truncation keeps fitting.
    budget = max(a["prompt_tokens"] for a in calls if a["call"] == 1)
    narrow = tmp_path / "narrow"
    config = RunConfig(strategies=["full_context", "truncation"], budgets=[budget], out=narrow, **common)
    summary = run(config, registry=registry)
    assert summary.errors == 0
    rows = final_rows(narrow)
    for key, row in rows.items():
        sent = [a for a in audits(narrow) if (a["strategy"], a["item_id"]) == (key[1], key[4])]
        assert all(a["prompt_tokens"] <= budget for a in sent[:-1])
        if key[1] == "truncation":
            assert row["event"] == "result" and row["episode"]["calls"] == 3
            assert all(a["prompt_tokens"] <= budget for a in sent)
        elif row["event"] == "violation":
            assert row["episode"]["end_reason"] == "violation" and row["episode"]["reward"] == 0.0
            assert row["episode"]["calls"] == len(sent) - 1 and sent[-1]["prompt_tokens"] > budget
    assert any(row["event"] == "violation" for key, row in rows.items() if key[1] == "full_context")

    again = run(config, registry=registry)  # resume: finished episodes make no call
    assert again.model_calls == 0 and again.cells_skipped == 4
    assert (narrow / "episodes.jsonl").read_text().count('"event": "episode_turn"') == sum(
        row["episode"]["calls"] for row in rows.values())


def marked(role, text, exchange=None, part=None):
    return Message(role, text, {"exchange": exchange, "exchange_part": part} if exchange else {})


def test_keep_exchanges_never_leaves_half_an_exchange():
    call, result = marked("assistant", "call", "e1", "call"), marked("user", "result", "e1", "result")
    talk, reply = marked("assistant", "hello"), marked("user", "hi")
    call2, result2 = marked("assistant", "call2", "e2", "call"), marked("user", "result2", "e2", "result")
    history = [talk, call, result, reply, call2]
    assert keep_exchanges([result, reply, call2], history, result2) == [reply, call2]  # orphan result dropped
    assert keep_exchanges([talk, call], history[:2], reply) == [talk]  # call without its result dropped
    assert keep_exchanges([reply], history, result2) == [reply, call2]  # the query's call is always kept
    assert split_exchange([talk, call, result, reply, call2, result2]) is None
    assert "without the call" in split_exchange([talk, result, reply])
    assert "without its result" in split_exchange([call, reply])


def test_report_summarises_episodes_per_cell():
    from budgetbench_core.report.tables import episode_columns

    def row(event, reward, turns, peak, end):
        return {"event": event, "episode": {"reward": reward, "turns": turns, "calls": turns, "peak_prompt_tokens": peak,
                                            "tool_errors": 1, "end_reason": end}}

    columns = episode_columns([row("result", 1.0, 4, 900, "done"), row("violation", 0.0, 2, 1100, "violation"),
                               row("error", 0.0, 1, 500, "error")])
    assert columns == {"episodes": 3, "reward_mean": 0.5, "turns_mean": 3.0, "calls_mean": 3.0,
                       "peak_prompt_tokens_max": 1100.0, "tool_errors_mean": 1.0,
                       "end_reasons": "done 1; error 1; violation 1"}
    assert episode_columns([{"event": "result", "quality": 1.0}]) == {}
