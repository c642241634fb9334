"""Telecom: the gold replay of every task, the do-nothing baseline, and the dual-control plumbing
(user tools on the phone, upstream's sync between the carrier and the phone).

Figures are the ones in docs/plugins/taubench.md. The tool semantics were also compared with
upstream's own code on 3,000 random calls over 40 base tasks (outputs, state and assertions
equal except the VPN details, a deliberate difference documented in ``telecom_user``).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from budgetbench_task_taubench.grading import grade, initial_environment, initial_events

sys.path.insert(0, str(Path(__file__).resolve().parent))
from taubench_support import domain, needs_data  # noqa: E402

pytestmark = needs_data


def gold_grade(task):
    dom = domain("telecom")
    env = initial_environment(dom, task)
    events = initial_events(task)
    for action in task.actions or ():
        events.append(
            {"role": action.requestor, "tool_call": {"name": action.name, "arguments": dict(action.arguments)}}
        )
        result = env.call(action.name, dict(action.arguments), action.requestor)
        assert not result.error, (task.id, action.name, result.content)
        events.append({"role": "tool", "content": result.content, "error": result.error})
    return grade(dom, task, env, events, "user_stop")


def test_every_base_task_gold_replay_gives_1_and_doing_nothing_gives_0():
    dom = domain("telecom")
    base = dom.split("base")
    assert len(base) == 114
    assert {t.reward_basis for t in base} == {("ENV_ASSERTION",), ("ENV_ASSERTION", "ACTION")}
    assert [t.id for t in base if gold_grade(t)["reward"] != 1.0] == []
    nothing = [grade(dom, t, initial_environment(dom, t), initial_events(t), "agent_stop")["reward"] for t in base]
    assert nothing == [0.0] * 114  # every base task starts broken: an assertion fails until the phone is fixed


def test_split_sizes_are_upstreams():
    splits = domain("telecom").splits
    assert {name: len(ids) for name, ids in splits.items()} == {
        "small": 20,
        "train": 74,
        "test": 40,
        "full": 2285,
        "base": 114,
    }


def test_the_policy_joins_the_main_policy_and_the_tech_support_manual():
    policy = domain("telecom").policy
    assert policy.startswith("<main_policy>\n") and policy.endswith("\n</tech_support_policy>")
    assert "</main_policy>\n<tech_support_policy>\n" in policy


def test_user_tools_act_on_the_phone_and_the_agent_cannot_use_them():
    dom = domain("telecom")
    task = dom.task("[mobile_data_issue]airplane_mode_on|user_abroad_roaming_enabled_off[PERSONA:None]")
    env = initial_environment(dom, task)
    assert env.call("check_status_bar", {}, "user").content == "Status Bar: ✈️ Airplane Mode | 🔋 80%"
    wrong = env.call("toggle_airplane_mode", {}, "assistant")
    assert wrong.error and wrong.content == "Error: Tool 'toggle_airplane_mode' not found."
    on = env.call("toggle_airplane_mode", {}, "user").content
    assert on == "Airplane Mode is now OFF.\nStatus Bar: 📶⁴ Excellent | 5G | 📱 Data Enabled | 🔋 80%"
    assert env.call("run_speed_test", {}, "user").content == "Speed test failed: No Connection."  # roaming off abroad
    env.call("toggle_roaming", {}, "user")
    assert env.call("run_speed_test", {}, "user").content == (
        "Speed Test Result: 275.00 Mbps (Excellent). Connection is very fast."
    )
    assert grade(dom, task, env, [], "user_stop")["reward"] == 1.0  # the phone is fixed; ENV_ASSERTION only


def test_sync_carries_the_carriers_state_to_the_phone_and_a_payment_back():
    """A suspended line shows no service; the agent's payment request reaches the phone; paying it
    marks the bill paid (upstream's sync_tools, run after every tool call)."""
    dom = domain("telecom")
    task = next(t for t in dom.split("base") if any(a.name == "make_payment" for a in t.actions or ()))
    env = initial_environment(dom, task)
    assert env.call("check_network_status", {}, "user").content.splitlines()[2] == "Cellular Connection: no_service"
    assert env.call("check_payment_request", {}, "user").content == "No payment request has been made."
    request = next(a for a in task.actions if a.name == "send_payment_request")
    assert not env.call(request.name, dict(request.arguments)).error
    bill = request.arguments["bill_id"]
    assert env.call("check_payment_request", {}, "user").content.startswith(
        f"You have a payment request for bill {bill} of "
    )
    assert env.call("make_payment", {}, "user").content.startswith("Payment of ")
    assert env.run_function("assistant", "assert_no_overdue_bill", {"overdue_bill_id": bill}) is True
    assert env.call("check_payment_request", {}, "user").content == "No payment request has been made."


@pytest.mark.slow  # 2,285 tasks: ~4 s
def test_every_task_of_the_full_set_gold_replays_to_1():
    dom = domain("telecom")
    assert [t.id for t in dom.tasks if gold_grade(t)["reward"] != 1.0] == []
