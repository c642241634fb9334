"""Gold replay of every task of retail, airline and mock, and the do-nothing baseline.

An agent that performs exactly the gold actions (and says the ``communicate_info`` strings)
gets reward 1; gold actions that fail on purpose fail with upstream's error text; an agent
that does nothing gets reward 1 exactly where the gold actions leave the database unchanged
and nothing else is required. The figures are the ones in docs/plugins/taubench.md.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from budgetbench_task_taubench.grading import gold_replay, grade, initial_environment, initial_events

sys.path.insert(0, str(Path(__file__).resolve().parent))
from taubench_support import domain, needs_data  # noqa: E402

pytestmark = needs_data


def gold_episode(name: str, task, extra=()):
    """Run the gold actions as an agent would, then say the strings the task wants said."""
    dom = domain(name)
    env = initial_environment(dom, task)
    events = initial_events(task)
    outputs = []
    for action in (*(task.actions or ()), *extra):
        events.append(
            {"role": action.requestor, "tool_call": {"name": action.name, "arguments": dict(action.arguments)}}
        )
        result = env.call(action.name, dict(action.arguments), action.requestor)
        events.append({"role": "tool", "content": result.content, "error": result.error})
        outputs.append((action.name, result))
    events.extend({"role": "assistant", "content": info} for info in task.communicate_info)
    return grade(dom, task, env, events, "user_stop"), outputs


@pytest.fixture(scope="module")
def outcomes():
    """Per domain and task: the gold episode's grade, its failing calls, and the do-nothing grade."""
    out = {}
    for name in ("retail", "airline", "mock"):
        dom = domain(name)
        for task in dom.tasks:
            graded, outputs = gold_episode(name, task)
            failures = [(call, result.content) for call, result in outputs if result.error]
            init = initial_environment(dom, task)
            nothing = grade(dom, task, init, initial_events(task), "agent_stop")
            writes = graded["db"].get("gold_hash", init.snapshot()[0]) != init.snapshot()[0]
            out[(name, task.id)] = {
                "reward": graded["reward"],
                "failures": failures,
                "nothing": nothing["reward"],
                "writes": writes,
                "graded": graded,
            }
    return out


# Gold actions that fail on purpose (a lookup of an unknown user, an exchange of a pending order, ...).
FAILING_GOLD = {
    ("retail", "2"): [("get_product_details", "Error: Product not found")],
    ("retail", "3"): [("get_product_details", "Error: Product not found")],
    ("retail", "4"): [("get_product_details", "Error: Product not found")],
    ("retail", "35"): [("find_user_id_by_email", "Error: User not found")],
    ("retail", "37"): [("find_user_id_by_email", "Error: User not found")],
    ("retail", "38"): [("find_user_id_by_email", "Error: User not found")],
    ("retail", "39"): [("find_user_id_by_name_zip", "Error: User not found")],
    ("retail", "46"): [("get_order_details", "Error: Order not found")] * 2,
    ("retail", "47"): [("get_order_details", "Error: Order not found")] * 2,
    ("retail", "54"): [("find_user_id_by_email", "Error: User not found")],
    ("retail", "55"): [("find_user_id_by_email", "Error: User not found")],
    ("retail", "64"): [("exchange_delivered_order_items", "Error: Non-delivered order cannot be exchanged")],
    ("retail", "67"): [("find_user_id_by_name_zip", "Error: User not found")] * 2,
    ("retail", "68"): [("find_user_id_by_name_zip", "Error: User not found")],
    ("retail", "105"): [
        ("exchange_delivered_order_items", "Error: Insufficient gift card balance to pay for the price difference")
    ],
}
# The two mock tasks whose criteria need more than their gold actions: one asserts a task
# status but lists no action, one asserts the user dismissed a notification (a user tool).
MOCK_INCOMPLETE = {"update_task_with_history_and_env_assertions", "update_task_with_user_tools"}


@pytest.mark.slow  # every task of three domains: ~30 s of CPU
def test_every_gold_sequence_gives_reward_1(outcomes):
    zero = sorted(key for key, o in outcomes.items() if o["reward"] != 1.0)
    assert zero == sorted(("mock", t) for t in MOCK_INCOMPLETE)
    assert sum(1 for key in outcomes if key[0] == "retail") == 114
    assert sum(1 for key in outcomes if key[0] == "airline") == 50
    for task_id in MOCK_INCOMPLETE:  # they fail only on the assertion, as upstream
        assert outcomes[("mock", task_id)]["graded"]["breakdown"]["ENV_ASSERTION"] == 0.0


def test_the_incomplete_mock_tasks_pass_with_their_missing_step():
    from budgetbench_task_taubench.domain import Action

    mock = domain("mock")
    missing = {
        "update_task_with_history_and_env_assertions": Action(
            "x", "update_task_status", {"task_id": "task_2", "status": "completed"}
        ),
        "update_task_with_user_tools": Action(
            "x", "dismiss_notification", {"notification_id": "notif_1"}, requestor="user"
        ),
    }
    for task_id, action in missing.items():
        graded, outputs = gold_episode("mock", mock.task(task_id), extra=(action,))
        assert not outputs[-1][1].error
        if task_id == "update_task_with_user_tools":
            assert graded["reward"] == 0.0 and graded["breakdown"]["DB"] == 0.0  # the user's inbox changed
            continue
        assert graded["reward"] == 1.0


@pytest.mark.slow
def test_failing_gold_actions_fail_with_the_upstream_error_text(outcomes):
    failing = {key: o["failures"] for key, o in outcomes.items() if o["failures"]}
    assert failing == FAILING_GOLD


def test_gold_replay_is_deterministic_and_leaves_a_fresh_database_untouched():
    retail = domain("retail")
    task = retail.task("0")
    pristine = retail.environment().db_hash()
    first, _ = gold_replay(retail, task)
    second, _ = gold_replay(retail, task)
    assert first.db_hash() == second.db_hash() != pristine
    assert retail.environment().db_hash() == pristine


# Do-nothing baseline per split: (tasks, tasks whose gold actions write nothing, do-nothing reward 1).
DO_NOTHING = {
    ("retail", "train"): (74, 7, 7),
    ("retail", "test"): (40, 4, 4),
    ("retail", "base"): (114, 11, 11),
    ("airline", "train"): (30, 17, 16),
    ("airline", "test"): (20, 7, 7),
    ("airline", "base"): (50, 24, 23),
    ("mock", "base"): (10, 3, 1),
}
# Writes nothing but still needs the agent: airline 3 must communicate a fact; mock
# impossible_task_1 needs a transfer_to_human_agents call (ACTION), and
# update_task_with_history_and_env_assertions needs a status change nobody listed.
NO_WRITE_BUT_FAILS = {
    ("airline", "3"),
    ("mock", "impossible_task_1"),
    ("mock", "update_task_with_history_and_env_assertions"),
}


@pytest.mark.slow
def test_do_nothing_baseline_per_split(outcomes):
    figures = {}
    for name, split in DO_NOTHING:
        ids = set(domain(name).splits[split])
        rows = [o for (n, t), o in outcomes.items() if n == name and t in ids]
        figures[(name, split)] = (len(rows), sum(not o["writes"] for o in rows), sum(o["nothing"] == 1.0 for o in rows))
    assert figures == DO_NOTHING


@pytest.mark.slow
def test_do_nothing_passes_exactly_where_nothing_is_written_or_required(outcomes):
    passes = {key for key, o in outcomes.items() if o["nothing"] == 1.0}
    no_write = {key for key, o in outcomes.items() if not o["writes"]}
    assert passes == no_write - NO_WRITE_BUT_FAILS
    assert all(o["nothing"] in (0.0, 1.0) for o in outcomes.values())


def test_an_episode_that_did_not_end_by_a_stop_gets_0():
    retail = domain("retail")
    task = retail.task("0")
    env, _ = gold_replay(retail, task)
    for ended in ("max_turns", "violation", "error"):
        assert grade(retail, task, env, [], ended)["reward"] == 0.0
    assert grade(retail, task, env, [], "agent_stop")["reward"] == 1.0
