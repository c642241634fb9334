"""Playing an episode back from its turn log (no model): the same reward, upstream's messages.

The turn log here is what a run writes for the gold agent on retail task 0 (its replies, done
flags and records); the playback must grade it 1 again, give upstream's message shapes (each
tool result right after the call it answers, same id), and refuse a log it cannot follow.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import jsonschema
import pytest
from budgetbench_task_taubench.actions import respond
from budgetbench_task_taubench.leaderboard import _simulation
from budgetbench_task_taubench.replay import RecordedUser, ReplayError, play
from budgetbench_task_taubench.task import TauBench

sys.path.insert(0, str(Path(__file__).resolve().parent))
from taubench_support import DATA, needs_data  # noqa: E402

pytestmark = needs_data
SCHEMA = (
    Path(__file__).resolve().parents[1] / "budgetbench_task_taubench" / "data" / "leaderboard_trajectories.schema.json"
)
KEY = ("tau-bench", "full_context", 32768, 0, "0")


@pytest.fixture(scope="module")
def logged():
    """The task, its items and the turn log of the gold agent on retail task 0, as a run writes it."""
    task = TauBench(domain="retail", split="base", path=str(DATA / "retail"), user="scripted")
    items = {item.id: item for item in task.load(None, 0)}
    record = task.domain.task("0")
    replies = [json.dumps({"name": a.name, "arguments": a.arguments}) for a in record.actions]
    replies.append(respond("Your exchange is requested."))
    episode = task.episode(items["0"], None)
    episode.opening()
    turns = []
    for number, reply in enumerate(replies):
        step = episode.step(reply)
        turns.append({"turn": number, "reply": reply, "done": step.done, "record": step.record, "user_calls": []})
        if step.done:
            break
    reward = episode.outcome("done")["reward"]
    row = {
        "event": "result",
        "quality": reward,
        "time": "2026-01-01T00:00:10.000+00:00",
        "latency_s": 10.0,
        "cost": None,
        "episode": {"end_reason": "done"},
    }
    return task, items, turns, row


def test_playback_grades_the_gold_agent_1_again_with_upstreams_messages(logged):
    task, items, turns, row = logged
    assert row["quality"] == 1.0
    played = play(task, items, KEY, row, turns)
    assert played.outcome["reward"] == 1.0 and played.outcome["ended"] == "user_stop"
    simulation = _simulation(played)
    jsonschema.validate({"info": _info(), "tasks": [], "simulations": [simulation]}, json.loads(SCHEMA.read_text()))
    messages = simulation["messages"]
    calls = [m for m in messages if m.get("tool_calls")]
    assert [c["tool_calls"][0]["name"] for c in calls] == [a.name for a in task.domain.task("0").actions]
    for index, message in enumerate(messages):
        if message["role"] == "tool":
            call = messages[index - 1]["tool_calls"][0]
            assert call["id"] == message["id"] and call["requestor"] == message["requestor"] == "assistant"
    assert messages[-2] == {
        "role": "assistant",
        "content": "Your exchange is requested.",
        "tool_calls": None,
        "turn_idx": len(messages) - 2,
    }
    assert (
        simulation["termination_reason"] == "user_stop" and simulation["start_time"] == "2026-01-01T00:00:00.000+00:00"
    )


def _info():
    party = {"implementation": "x", "llm": None, "llm_args": None}
    return {
        "git_commit": "a2c0247",
        "num_trials": 1,
        "max_steps": 200,
        "max_errors": 10,
        "user_info": party,
        "agent_info": party,
        "environment_info": {"domain_name": "retail", "policy": "p"},
    }


def test_playback_refuses_a_log_it_cannot_follow(logged):
    task, items, turns, row = logged
    early = [dict(turns[0], done=True), *turns[1:]]
    with pytest.raises(ReplayError, match="turn 0 does not end the playback"):
        play(task, items, KEY, row, early)
    with pytest.raises(ReplayError, match="not in the 'base' split"):
        play(task, items, KEY[:4] + ("no-such-task",), row, turns)
    user = RecordedUser(["hello"], "somewhere")
    assert user.complete([], 10) == "hello"
    with pytest.raises(ReplayError, match="somewhere: the playback asks the user more often than the run did"):
        user.complete([], 10)


def test_a_violation_before_the_first_turn_plays_back_with_no_outcome(logged):
    task, items, _, row = logged
    llm_task = TauBench(domain="retail", split="base", path=str(DATA / "retail"), user="llm")
    violation = {**row, "event": "violation", "quality": 0, "episode": {"end_reason": "violation"}}
    played = play(llm_task, items, KEY, violation, [])  # its opening user call was never logged
    assert played.outcome is None and played.turns == []
    simulation = _simulation(played)
    assert simulation["termination_reason"] == "context_window_exceeded"
    assert simulation["reward_info"]["reward"] == 0.0


def test_telecom_playback_keeps_the_users_tool_calls_on_the_phone():
    """Dual control: the LLM user's completions (a tool call on its phone, then words) come back
    in order, so the playback runs the same user tool and the trajectory shows it as the user's."""
    task = TauBench(domain="telecom", split="base", path=str(DATA / "telecom"), user="llm")
    items = {item.id: item for item in task.load(None, 0)}
    item = next(iter(items))
    said = [
        "My phone has no mobile data.",
        json.dumps({"name": "toggle_airplane_mode", "arguments": {}}),
        "I toggled airplane mode. ###STOP###",
    ]
    live = RecordedUser(said, "live")
    episode = task.episode(items[item], live)
    episode.opening()
    step = episode.step(respond("Please toggle airplane mode."))
    assert step.done and live.used == 3
    turns = [{"turn": 0, "reply": respond("Please toggle airplane mode."), "done": True, "record": step.record}]
    turns[0]["user_calls"] = [{"completion": text} for text in said]
    row = {
        "event": "result",
        "quality": episode.outcome("done")["reward"],
        "time": "2026-01-01T00:00:10.000+00:00",
        "latency_s": 10.0,
        "episode": {"end_reason": "done"},
    }
    played = play(task, items, ("tau-bench", "full_context", 32768, 0, item), row, turns)
    assert played.outcome["reward"] == row["quality"]
    messages = _simulation(played)["messages"]
    user_call = next(m for m in messages if m["role"] == "user" and m["tool_calls"])
    assert user_call["tool_calls"][0]["name"] == "toggle_airplane_mode"
    assert user_call["tool_calls"][0]["requestor"] == "user"
    result = messages[messages.index(user_call) + 1]
    assert (
        result["role"] == "tool" and result["requestor"] == "user" and result["id"] == user_call["tool_calls"][0]["id"]
    )
    assert [m["content"] for m in messages if m["role"] == "user" and not m["tool_calls"]] == [said[0], said[2]]
