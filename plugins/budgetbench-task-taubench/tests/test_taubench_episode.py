"""A tau-bench episode driven by scripted agent replies (no model): actions, users, reward."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from budgetbench_task_taubench.actions import respond
from budgetbench_task_taubench.task import TauBench
from budgetbench_task_taubench.users import STOP, ScriptedUser

sys.path.insert(0, str(Path(__file__).resolve().parent))
from taubench_support import DATA, needs_data  # noqa: E402

pytestmark = needs_data


def call(name, **arguments):
    return json.dumps({"name": name, "arguments": arguments})


def test_scripted_user_confirms_answers_once_and_stops():
    user = ScriptedUser(
        {
            "instructions": {
                "reason_for_call": "Return my lamp.",
                "known_info": "I am Ann, zip 12345.",
                "task_instructions": "x",
                "domain": "retail",
            }
        }
    )
    assert user.opening("Hi!") == "Return my lamp. I am Ann, zip 12345."
    assert user.reply("What is your zip code?", False) == "Here is what I know: I am Ann, zip 12345."
    assert user.reply("Do you confirm the return (yes/no)?", False) == "Yes, please go ahead."
    assert user.reply("What is your zip code?", False) == STOP  # asked the same again
    assert user.reply("Your return is requested.", False) == STOP
    assert user.reply("Anything else?", True) == "###TRANSFER###"


def play(domain, task_id, replies, user="scripted"):
    task = TauBench(domain=domain, split="base", path=str(DATA / domain), user=user)
    item = next(i for i in task.load(None, 0) if i.id == task_id)
    episode = task.episode(item, user=None)
    history = episode.opening()
    steps = []
    for reply in replies:
        step = episode.step(reply)
        steps.append(step)
        history.extend(step.messages)
        if step.done:
            return episode.outcome("done"), history, steps
    return episode.outcome("max_turns"), history, steps


def test_gold_agent_through_the_action_format_gets_reward_1():
    task = TauBench(domain="retail", path=str(DATA / "retail"), user="scripted").domain.task("0")
    replies = [call(a.name, **a.arguments) for a in task.actions] + [respond("Your exchange is requested.")]
    graded, history, steps = play("retail", "0", replies)
    assert graded["reward"] == 1.0 and graded["ended"] == "user_stop"
    assert history[0].role == "assistant" and json.loads(history[0].content)["arguments"]["content"].startswith("Hi!")
    assert "#W2378156" in history[1].content and history[1].role == "user"
    call_message, result = history[2], history[3]
    assert call_message.metadata["exchange_part"] == "call" and result.metadata["exchange_part"] == "result"
    assert call_message.metadata["exchange"] == result.metadata["exchange"]
    assert result.content.startswith("Tool find_user_id_by_name_zip returned:\nyusuf_rossi_9620")
    assert steps[-1].messages[-1].content == STOP


def test_a_malformed_action_is_a_tool_error_the_agent_sees_and_not_a_crash():
    mixed = 'Let me look: {"name": "find_user_id_by_email", "arguments": {}}'
    graded, history, steps = play("retail", "0", [mixed, respond("Goodbye.")])
    assert steps[0].tool_error and not steps[0].done
    assert (
        steps[0].messages[1].content == "Error: invalid action: the reply mixes text and JSON; send exactly one action"
    )
    assert graded["reward"] == 0.0 and graded["tool_errors"] == 1  # nothing was done, and task 0 needs an exchange


def test_unfinished_episode_scores_0_and_ten_errors_end_it():
    graded, _, steps = play("retail", "0", ["{oops"] * 12)
    assert len(steps) == 10 and steps[-1].done and graded["ended"] == "too_many_errors" and graded["reward"] == 0.0
    assert graded["steps"] == 1 + 2 * 10  # the user's opening, then each reply and its error (upstream's count)
    graded, _, _ = play("retail", "0", [call("get_user_details", user_id="yusuf_rossi_9620")])
    assert graded["ended"] == "max_turns" and graded["reward"] == 0.0


def test_communicate_info_is_checked_in_the_agent_messages():
    task = TauBench(domain="airline", path=str(DATA / "airline"), user="scripted").domain
    record = next(
        t
        for t in task.tasks
        if t.communicate_info
        and not any(
            a.name
            in (
                "book_reservation",
                "cancel_reservation",
                "send_certificate",
                "update_reservation_baggages",
                "update_reservation_flights",
                "update_reservation_passengers",
            )
            for a in t.actions or ()
        )
    )
    silent, _, _ = play("airline", record.id, [respond("I cannot help with that.")])
    told, _, _ = play("airline", record.id, [respond("Here you go: " + ", ".join(record.communicate_info) + ".")])
    assert silent["reward"] == 0.0 and silent["breakdown"]["COMMUNICATE"] == 0.0
    assert told["reward"] == 1.0


def test_the_step_limit_ends_an_episode_as_upstreams_max_steps():
    task = TauBench(domain="retail", split="base", path=str(DATA / "retail"), user="scripted", max_steps=7)
    item = next(i for i in task.load(None, 0) if i.id == "0")
    episode = task.episode(item, user=None)
    episode.opening()  # step 1: the user's first message
    lookup = call("find_user_id_by_name_zip", first_name="Yusuf", last_name="Rossi", zip="19122")
    assert [episode.step(lookup).done for _ in range(3)] == [False, False, True]  # 2 steps each
    graded = episode.outcome("done")
    assert graded["ended"] == "max_steps" and graded["steps"] == 7 and graded["reward"] == 0.0


def test_several_tool_calls_in_one_reply_run_in_order_as_one_exchange():
    lookup = call("find_user_id_by_name_zip", first_name="Yusuf", last_name="Rossi", zip="19122")
    details = call("get_user_details", user_id="yusuf_rossi_9620")
    _, history, steps = play("retail", "0", [f"[{lookup}, {details}]"])
    assert [c["name"] for c in steps[0].record["calls"]] == ["find_user_id_by_name_zip", "get_user_details"]
    result = steps[0].messages[1].content
    assert result.startswith(
        "Tool find_user_id_by_name_zip returned:\nyusuf_rossi_9620\n\nTool get_user_details returned:"
    )
