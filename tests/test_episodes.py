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
    return [
        row
        for path in sorted((run_dir / "cells").rglob("*.jsonl"))
        for row in map(json.loads, path.read_text().splitlines())
        if row["event"] == "prompt_audit"
    ]


@pytest.mark.slow
def test_doc_example_runs_every_call_through_the_gate(tmp_path):
    registry = registry_with(doc_example())
    common = dict(task="countdown", model="local", limit=2, max_concurrency=1, timeout_s=900)
    first = run(
        RunConfig(strategies=["full_context"], budgets=[1000], out=tmp_path / "wide", **common), registry=registry
    )
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
        row["episode"]["calls"] for row in rows.values()
    )

    # (A run killed mid-episode used to be simulated here by cutting lines out of the middle of the
    # cell file; a sealed run directory now refuses any such edit, so that is a tampering case:
    # tests/test_tamper.py. A real kill -9 and resume is tests/reliability/test_reliability_resume.py.)
    report_shows_episodes(narrow, final_rows(narrow))


def report_shows_episodes(run_dir: Path, rows: dict) -> None:
    """The report (Markdown, HTML, JSON) shows each episodic cell's reward with its interval,
    turns, calls, peak prompt tokens, tool errors and end reasons, computed from the rows."""
    from budgetbench_core.report.stats import estimate
    from budgetbench_core.report.writer import write_report

    paths = write_report(run_dir)
    binary = json.loads((run_dir / "manifest.json").read_text())["grader"]["binary"]
    report = json.loads(paths["json"].read_text())
    html, markdown = paths["html"].read_text(), paths["md"].read_text()
    assert 'id="episodes"' in html and "## Agent episodes per cell" in markdown
    section = markdown.split("## Agent episodes per cell")[1].split("\n## ")[0]
    assert html.split('id="episodes"')[1].split("</table>")[0].count("<tr>") == len(report["summary"]) + 1
    for cell in report["summary"]:
        mine = [r for k, r in rows.items() if (k[1], k[2]) == (cell["strategy"], cell["budget"])]
        episodes = [r["episode"] for r in mine]
        want = estimate([r["episode"]["reward"] for r in mine], binary)
        assert cell["episodes"] == len(mine) == cell["reward_n"]
        assert (cell["reward"], cell["reward_low"], cell["reward_high"]) == pytest.approx(
            (want.mean, want.low, want.high)
        )
        assert cell["turns_mean"] == pytest.approx(sum(e["turns"] for e in episodes) / len(mine))
        assert cell["calls_mean"] == pytest.approx(sum(e["calls"] for e in episodes) / len(mine))
        assert cell["peak_prompt_tokens_max"] == max(e["peak_prompt_tokens"] for e in episodes)
        assert cell["tool_errors_mean"] == 0
        ends = [e["end_reason"] for e in episodes]
        assert [cell[f"end_{r}"] for r in ("done", "max_turns", "violation", "error")] == [
            ends.count(r) for r in ("done", "max_turns", "violation", "error")
        ]
        line = next(
            x
            for x in section.splitlines()
            if x.startswith(f"| countdown | {cell['strategy']} | {cell['budget']} | {cell['episodes']} | ")
        )
        assert f"| {cell['reward']:.3f} | {cell['reward_low']:.3f} | {cell['reward_high']:.3f} |" in line
        assert (
            f"| {cell['end_done']} | {cell['end_max_turns']} | {cell['end_violation']} | {cell['end_error']} |" in line
        )
    truncation = next(c for c in report["summary"] if c["strategy"] == "truncation")
    full = next(c for c in report["summary"] if c["strategy"] == "full_context")
    assert truncation["end_done"] == 2 and full["end_violation"] >= 1  # the table tells them apart


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
    from budgetbench_core.report.stats import estimate
    from budgetbench_core.report.tables import episode_columns

    def row(event, reward, turns, peak, end, item):
        return {
            "event": event,
            "item_id": item,
            "episode": {
                "reward": reward,
                "turns": turns,
                "calls": turns,
                "peak_prompt_tokens": peak,
                "tool_errors": 1,
                "end_reason": end,
            },
        }

    columns = episode_columns(
        [
            row("result", 1.0, 4, 900, "done", "a"),
            row("result", 0.0, 4, 900, "max_turns", "a"),
            row("violation", 0.0, 2, 1100, "violation", "b"),
            row("error", 0.0, 1, 500, "error", "c"),
        ],
        binary=True,
    )
    reward = estimate([0.5, 0.0], binary=True)  # per item, over repeats; the error is left out
    assert reward.method == "bounded-t"
    assert columns == {
        "episodes": 4,
        "reward": 0.25,
        "reward_low": reward.low,
        "reward_high": reward.high,
        "reward_n": 2,
        "turns_mean": 10 / 3,
        "calls_mean": 10 / 3,
        "peak_prompt_tokens_max": 1100.0,
        "tool_errors_mean": 1.0,
        "end_done": 1,
        "end_max_turns": 1,
        "end_violation": 1,
        "end_error": 1,
        "end_reasons": "done 1; error 1; max_turns 1; violation 1",
    }
    assert episode_columns([{"event": "result", "quality": 1.0}], binary=True) == {}


class _ToolRoleEpisode:
    """An episode whose step answers with a message of a role the harness does not send (``function``, the
    OpenAI chat form's old name of ``tool``)."""

    system = None

    def __init__(self, opening_role="user"):
        self.opening_role = opening_role

    def opening(self):
        return [Message(self.opening_role, "what the tool said before"), Message("user", "10")]

    def step(self, reply):
        from budgetbench_core import Step

        return Step((Message("assistant", reply), Message("function", "result of the tool")))

    def outcome(self, end_reason):
        return {"reward": 1.0}


def test_a_message_the_harness_cannot_use_ends_the_episode_as_the_tasks_error(tmp_path):
    """The strategy's view is read from the messages' stored fields: a turn holding a message of
    an unknown role is an error row naming the task (phase episode), never a crashed run."""
    from budgetbench_core import EpisodicTask, Item, hookimpl
    from budgetbench_core.testing import FaultServer

    class ToolRoleTask(EpisodicTask):
        name, default_grader, max_output_tokens = "tool-role", "exact-match", 8

        def load(self, limit, seed):
            yield Item(id="in-a-step", history=(), query=Message("user", "10"), answer="9")
            yield Item(id="in-the-opening", history=(), query=Message("user", "10"), answer="9")

        def episode(self, item, user):
            return _ToolRoleEpisode("function" if item.id == "in-the-opening" else "user")

    plugin = types.SimpleNamespace(register_tasks=hookimpl(lambda register: register(ToolRoleTask)))
    with FaultServer() as server:
        summary = run(
            RunConfig(
                task="tool-role",
                strategies=["truncation"],
                budgets=[500],
                out=tmp_path / "run",
                model="openai/fault-model",
                api_base=server.url,
                tokenizer="tiktoken:cl100k_base",
                retries=0,
            ),
            registry=registry_with(plugin, distribution="tool-role-test"),
        )
    rows = {key[4]: row for key, row in final_rows(tmp_path / "run").items()}
    assert summary.errors == 2 and summary.results == 0
    for row in rows.values():
        assert (row["event"], row["phase"], row["plugin"], row["distribution"]) == (
            "error",
            "episode",
            "tool-role",
            "tool-role-test",
        )
    assert "unknown roles ['function']" in rows["in-a-step"]["cause"] and "turn 0" in rows["in-a-step"]["cause"]
    assert "unknown role 'function'" in rows["in-the-opening"]["cause"] and "turn 0" in rows["in-the-opening"]["cause"]
