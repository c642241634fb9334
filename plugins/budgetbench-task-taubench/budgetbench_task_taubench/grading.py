"""Upstream's reward: database state against the gold replay, plus the other bases.

A trajectory is a list of events, oldest first:
``{"role": "user"|"assistant", "content": text}``, ``{"role": "assistant"|"user",
"tool_call": {"name", "arguments"}}`` and ``{"role": "tool", "content", "error"}``.

``grade`` follows tau2-bench's ``evaluate_simulation`` (evaluation type ``all``): an episode
that did not end by the agent or the user stopping gets 0; otherwise the reward is the
product of the components named in the task's ``reward_basis``:

- DB: hash of the agent's (and, in mock, the user's) database after the episode equals the
  hash after replaying the gold actions on a fresh environment (failing gold actions fail
  there too, with whatever they changed before failing);
- ENV_ASSERTION: every assertion of the task holds on the episode's environment;
- ACTION: every gold action is matched by a tool call of the episode;
- COMMUNICATE: every ``communicate_info`` string occurs, case-insensitively, in an agent
  message with commas removed.

NL_ASSERTION (LLM-judged) is **not** part of ``reward``: ``nl_assertions`` is null here (not
judged) and filled in by the run's judge, if any (see ``judging``); the texts are listed in
``nl_assertions_listed``. A task without criteria, or without
gold actions and assertions, passes its environment check, as upstream.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from .domain import Domain, TaskRecord
from .environment import Environment

ENDED_OK = ("agent_stop", "user_stop")


def _loads(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def history_events(messages: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """An upstream ``message_history`` as trajectory events (tool calls paired with their results)."""
    events: list[dict[str, Any]] = []
    for message in messages:
        role = message.get("role")
        if role == "tool":
            events.append(
                {
                    "role": "tool",
                    "content": message.get("content") or "",
                    "error": bool(message.get("error")),
                    "id": message.get("id"),
                }
            )
            continue
        for call in message.get("tool_calls") or []:
            events.append(
                {
                    "role": role,
                    "tool_call": {"name": call["name"], "arguments": call.get("arguments") or {}},
                    "id": call.get("id"),
                }
            )
        if message.get("content"):
            events.append({"role": role, "content": message["content"]})
    return events


def _replay_history(env: Environment, messages: Sequence[dict[str, Any]], where: str) -> None:
    """Upstream ``set_state``: re-run the write tool calls of the history; their outputs must
    equal the recorded ones (compared as parsed JSON)."""
    pending: list[tuple[dict[str, Any], str]] = []
    results: dict[str, dict[str, Any]] = {m["id"]: m for m in messages if m.get("role") == "tool"}
    for message in messages:
        for call in message.get("tool_calls") or []:
            pending.append((call, message.get("role", "assistant")))
    for call, role in pending:
        name = call["name"]
        if not env.has_tool(name) or not env.is_write(name):
            continue
        requestor = call.get("requestor") or ("user" if role == "user" else "assistant")
        result = env.call(name, call.get("arguments") or {}, requestor)
        expected = results.get(call.get("id"))
        if expected is None:
            raise ValueError(f"{where}: tool call {call.get('id')!r} in message_history has no tool message")
        if _loads(result.content) != _loads(expected.get("content") or ""):
            raise ValueError(
                f"{where}: replaying {name} from message_history returned {result.content!r}, "
                f"recorded {expected.get('content')!r}"
            )


def initial_environment(domain: Domain, task: TaskRecord) -> Environment:
    """A fresh environment with the task's ``initial_state`` applied, as upstream ``set_state``."""
    env = domain.environment()
    state = task.initial_state or {}
    data = state.get("initialization_data") or {}
    if data.get("agent_data") is not None:
        env.update_db("agent", data["agent_data"])
    if data.get("user_data") is not None:
        env.update_db("user", data["user_data"])
    for action in state.get("initialization_actions") or []:
        env.run_function(action["env_type"], action["func_name"], action.get("arguments") or {})
    _replay_history(env, state.get("message_history") or [], f"task {task.id!r}")
    env.sync()
    return env


def initial_events(task: TaskRecord) -> list[dict[str, Any]]:
    return history_events((task.initial_state or {}).get("message_history") or [])


def gold_replay(domain: Domain, task: TaskRecord) -> tuple[Environment, list[dict[str, Any]]]:
    """The gold environment and, per gold action, what it returned (errors included)."""
    env = initial_environment(domain, task)
    outputs = []
    for action in task.actions or ():
        result = env.call(action.name, dict(action.arguments), action.requestor)
        outputs.append(
            {"action_id": action.action_id, "name": action.name, "content": result.content, "error": result.error}
        )
    return env, outputs


def _assertions(env: Environment, task: TaskRecord) -> list[dict[str, Any]]:
    checks = []
    for assertion in task.env_assertions or []:
        try:
            value = env.run_function(assertion["env_type"], assertion["func_name"], assertion.get("arguments") or {})
            met = value == assertion.get("assert_value", True)
            note = None
        except Exception as exc:  # a failing assertion function counts as not met
            met, note = False, f"{type(exc).__name__}: {exc}"
        checks.append(
            {
                "func_name": assertion["func_name"],
                "arguments": assertion.get("arguments") or {},
                "met": met,
                **({"error": note} if note else {}),
            }
        )
    return checks


def _communicated(events: Sequence[dict[str, Any]], info: Sequence[str]) -> list[dict[str, Any]]:
    texts = [e["content"] for e in events if e.get("role") == "assistant" and e.get("content")]
    return [{"info": s, "met": any(s.lower() in t.lower().replace(",", "") for t in texts)} for s in info]


def _actions(events: Sequence[dict[str, Any]], task: TaskRecord) -> list[dict[str, Any]]:
    calls = [e["tool_call"] for e in events if "tool_call" in e]
    return [
        {"action_id": a.action_id, "name": a.name, "met": any(a.matches(c["name"], c["arguments"]) for c in calls)}
        for a in task.actions or ()
    ]


def grade(
    domain: Domain, task: TaskRecord, env: Environment, events: Sequence[dict[str, Any]], ended: str
) -> dict[str, Any]:
    """The reward of an episode that left ``env`` in its final state; ``ended`` is why it stopped."""
    nl = {"nl_assertions": None, "nl_assertions_listed": task.nl_assertions}  # None: not judged
    if ended not in ENDED_OK:
        return {"reward": 0.0, "breakdown": {}, "note": f"episode ended prematurely ({ended})", **nl}
    if task.criteria is None:
        return {"reward": 1.0, "breakdown": {}, "note": "no evaluation criteria", **nl}
    breakdown: dict[str, float] = {}
    detail: dict[str, Any] = {}
    if task.actions is None and task.env_assertions is None:
        db_reward, assertion_reward = 1.0, 1.0
        detail["db"] = {"match": True, "note": "no gold actions or assertions"}
    else:
        if task.id not in domain.gold_cache:  # deterministic: computed once per task and process
            gold, outputs = gold_replay(domain, task)
            domain.gold_cache[task.id] = (gold.snapshot(), outputs)
        gold_hash, outputs = domain.gold_cache[task.id]
        got_hash = env.snapshot()
        db_reward = float(gold_hash == got_hash)
        detail["db"] = {
            "match": bool(db_reward),
            "gold_hash": gold_hash[0],
            "hash": got_hash[0],
            "gold_user_hash": gold_hash[1],
            "user_hash": got_hash[1],
        }
        detail["gold_errors"] = [o for o in outputs if o["error"]]
        checks = _assertions(env, task)
        detail["env_assertions"] = checks
        assertion_reward = float(all(c["met"] for c in checks))
    communicate = _communicated(events, task.communicate_info)
    actions = _actions(events, task)
    detail["communicate"] = communicate
    detail["actions"] = actions
    components = {
        "DB": db_reward,
        "ENV_ASSERTION": assertion_reward,
        "ACTION": float(all(c["met"] for c in actions)),
        "COMMUNICATE": float(all(c["met"] for c in communicate)),
    }
    reward = 1.0
    for basis in task.reward_basis:
        if basis in components:
            breakdown[basis] = components[basis]
            reward *= components[basis]
    return {"reward": reward, "breakdown": breakdown, **nl, **detail}
