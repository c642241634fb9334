"""Mock tools (agent and user side), initial states, hashes and the domain loader."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest
from budgetbench_task_taubench.domain import load_domain
from budgetbench_task_taubench.environment import dict_hash
from budgetbench_task_taubench.grading import initial_environment

from budgetbench_core import TaskDataError

sys.path.insert(0, str(Path(__file__).resolve().parent))
from taubench_support import DATA, domain, needs_data  # noqa: E402

pytestmark = needs_data


def test_mock_tools_succeed_and_refuse():
    env = domain("mock").environment()
    created = json.loads(env.call("create_task", {"user_id": "user_1", "title": "Important Meeting"}).content)
    assert created == {"task_id": "task_2", "title": "Important Meeting", "description": None, "status": "pending"}
    assert env.call("create_task", {"user_id": "user_9", "title": "x"}).content == "Error: User user_9 not found"
    bad = env.call("create_task", {"user_id": "user_1", "title": 5})
    assert bad.error and bad.content.startswith("Error: 1 validation error for Task\ntitle\n")
    assert (
        json.loads(env.call("update_task_status", {"task_id": "task_2", "status": "completed"}).content)["status"]
        == "completed"
    )
    assert (
        env.call("update_task_status", {"task_id": "task_9", "status": "completed"}).content
        == "Error: Task task_9 not found"
    )
    assert json.loads(env.call("get_users", {}).content) == [
        {"user_id": "user_1", "name": "Test User", "tasks": ["task_1", "task_2"]}
    ]
    assert (
        env.call("assert_task_status", {"task_id": "task_2", "expected_status": "completed"}).content
        == "Error: Tool 'assert_task_status' not found."
    )  # assertions are not tools
    assert env.call("check_notifications", {}, "user").content.startswith('[{"notification_id": "notif_1"')
    assert (
        env.call("dismiss_notification", {"notification_id": "notif_1"}, "user").content
        == "Notification notif_1 dismissed"
    )
    assert (
        env.call("dismiss_notification", {"notification_id": "n"}, "user").content == "Error: Notification n not found"
    )
    assert domain("retail").environment().call("get_users", {}, "user").content == "Error: User tools not available"


def test_hash_is_upstreams_and_moves_with_every_write():
    env = domain("mock").environment()
    raw = json.loads((DATA / "mock" / "db.json").read_text())
    assert env.db_hash() == dict_hash(raw)  # the file already has upstream's field order and types
    before = env.snapshot()
    env.call("get_users", {})
    assert env.snapshot() == before
    env.call("update_task_status", {"task_id": "task_1", "status": "completed"})
    assert env.snapshot()[0] != before[0] and env.snapshot()[1] == before[1]
    env.call("dismiss_notification", {"notification_id": "notif_1"}, "user")
    assert env.snapshot()[1] != before[1]
    assert domain("mock").environment().snapshot() == before


def test_initial_states_apply_data_actions_and_history():
    mock = domain("mock")
    merged = initial_environment(mock, mock.task("update_task_with_initialization_data")).tools.db
    assert merged.users["user_1"].tasks == ["task_1", "task_2"] and merged.tasks["task_2"].title == "Project Review"
    acted = initial_environment(mock, mock.task("update_task_with_initialization_actions")).tools.db
    assert acted.tasks["task_2"].description == "Review Q4 project status"
    replayed = initial_environment(mock, mock.task("update_task_with_message_history")).tools.db
    assert replayed.tasks["task_2"].status == "pending"
    inbox = initial_environment(mock, mock.task("update_task_with_user_tools")).user_tools.db
    assert inbox.notifications["notif_1"].status == "unread"


def test_loader_reads_every_split_and_names_bad_data(tmp_path):
    retail = domain("retail")
    assert len(retail.tasks) == 114 and {k: len(v) for k, v in retail.splits.items()} == {
        "train": 74,
        "test": 40,
        "base": 114,
    }
    assert [t.id for t in retail.split("test")] == [t.id for t in retail.tasks if t.id in set(retail.splits["test"])]
    assert domain("mock").task("create_task_1").reward_basis == ("DB", "COMMUNICATE")  # upstream's default
    with pytest.raises(TaskDataError, match="no split 'dev'"):
        retail.split("dev")
    folder = tmp_path / "mock"
    shutil.copytree(DATA / "mock", folder)
    for path in folder.iterdir():
        path.chmod(0o644)
    rows = json.loads((folder / "tasks.json").read_text())
    rows[1]["evaluation_criteria"]["reward_basis"] = ["DB", "VIBES"]
    (folder / "tasks.json").write_text(json.dumps(rows))
    with pytest.raises(TaskDataError, match=r"task 'create_task_1_with_env_assertions'.*unknown entries \['VIBES'\]"):
        load_domain("mock", folder)
    (folder / "db.json").unlink()
    with pytest.raises(TaskDataError, match=r"lacks db.json \(or db.toml\)"):
        load_domain("mock", folder)
    with pytest.raises(TaskDataError, match="unknown domain 'banking'"):
        load_domain("banking", folder)
    with pytest.raises(
        TaskDataError,
        match=r"lacks db.json \(or db.toml\), main_policy.md, tech_support_manual.md, user_db.toml\. Run `budgetbench data fetch tau-bench`.*github.com/sierra-research/tau2-bench",
    ):
        load_domain("telecom", folder)
