"""tau-bench through the real CLI on the embedded model (mock domain: a short policy)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from budgetbench_core import final_rows
from budgetbench_core.testing import invoke_cli

sys.path.insert(0, str(Path(__file__).resolve().parent))
from taubench_support import DATA, needs_data  # noqa: E402

pytestmark = needs_data


@pytest.mark.slow
def test_mock_episodes_on_the_embedded_model(tmp_path):
    out = tmp_path / "run"
    args = [
        "run",
        "-t",
        "tau-bench",
        "--task-option",
        "domain=mock",
        "--task-option",
        "user=scripted",
        "--task-option",
        f"path={DATA / 'mock'}",
        "--task-option",
        "max_turns=3",
        "-s",
        "truncation",
        "-b",
        "1024 2048",
        "-n",
        "2",
        "--timeout",
        "900",
        "--out",
        str(out),
    ]
    result = invoke_cli(*args)
    assert result.exit_code == 0, result.output
    rows = final_rows(out)
    assert len(rows) == 4
    audits = [json.loads(line) for path in (out / "cells").rglob("*.jsonl") for line in path.read_text().splitlines()]
    audits = [a for a in audits if a["event"] == "prompt_audit"]
    for row in rows.values():
        episode = row["episode"]
        assert row["event"] in ("result", "violation"), row
        mine = [a for a in audits if (a["item_id"], a["budget"]) == (row["item_id"], row["budget"])]
        assert [a["call"] for a in mine] == list(range(len(mine)))
        sent = mine if row["event"] == "result" else mine[:-1]
        assert all(a["prompt_tokens"] <= row["budget"] for a in sent) and episode["calls"] == len(sent)
        assert mine[0]["messages"][0]["content"].startswith("<instructions>")
        if row["event"] == "result":
            assert 1 <= episode["turns"] <= 3 and episode["end_reason"] in ("done", "max_turns")
            assert episode["served_counts_match"] is True
            assert row["quality"] == episode["reward"] == episode["outcome"]["reward"]
            assert episode["user_calls"] == 0  # the scripted user calls no model
    turns = [json.loads(line) for line in (out / "episodes.jsonl").read_text().splitlines()]
    assert len(turns) == sum(row["episode"]["calls"] for row in rows.values())
    assert all(t["record"]["kind"] in ("tool", "message", "invalid_action", "agent_stop") for t in turns)
    again = invoke_cli(*args)  # resume: nothing left to do, no model call
    assert again.exit_code == 0 and "0 model calls" in again.output


@pytest.mark.slow
def test_llm_user_calls_are_logged_apart_and_not_budgeted(tmp_path):
    out = tmp_path / "run"
    result = invoke_cli(
        "run",
        "-t",
        "tau-bench",
        "--task-option",
        "domain=mock",
        "--task-option",
        "user=llm",
        "--task-option",
        f"path={DATA / 'mock'}",
        "--task-option",
        "max_turns=1",
        "--task-option",
        f"guidelines={DATA / 'simulation_guidelines.md'}",
        "-s",
        "truncation",
        "-b",
        "6144",  # the served context must hold the user simulator's ~4.3K-token prompt (upstream's, untrimmed)
        "-n",
        "1",
        "--max-output-tokens",
        "32",
        "--timeout",
        "900",
        "--out",
        str(out),
    )
    assert result.exit_code == 0, result.output
    (row,) = final_rows(out).values()
    episode = row["episode"]
    turns = [json.loads(line) for line in (out / "episodes.jsonl").read_text().splitlines()]
    user_calls = [call for turn in turns for call in turn["user_calls"]]
    assert episode["user_calls"] == len(user_calls) >= 1  # at least the customer's opening message
    assert episode["user_prompt_tokens"] == sum(c["prompt_tokens"] for c in user_calls)
    assert all(c["served_prompt_tokens"] == c["prompt_tokens"] for c in user_calls)
    assert row["aux_calls"] == 0  # the user's calls are not the strategy's
    opening = user_calls[0]["completion"].strip()
    audit = next(
        json.loads(line)
        for path in (out / "cells").rglob("*.jsonl")
        for line in path.read_text().splitlines()
        if '"prompt_audit"' in line
    )
    assert audit["messages"][-1]["content"] == opening  # the agent's first query is what the user said
