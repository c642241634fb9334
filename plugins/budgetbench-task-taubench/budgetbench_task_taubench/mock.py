"""The mock domain (a tiny task list, upstream's fast test domain) and its user-side inbox.

The ``assert_*`` and ``add_notification`` methods are not tools: tasks call them from
``initial_state.initialization_actions`` and ``evaluation_criteria.env_assertions``.
"""

from __future__ import annotations

from . import generic
from .models import MockDB, MockUserDB, Notification, Task
from .toolkit import READ, WRITE, Toolkit, tool


class MockTools(Toolkit):
    db: MockDB

    @tool(
        WRITE,
        "Create a new task for a user.",
        {
            "user_id": "The ID of the user creating the task",
            "title": "The title of the task",
            "description": "Optional description of the task",
        },
    )
    def create_task(self, user_id: str, title: str, description: str = None) -> Task:
        if user_id not in self.db.users:
            raise ValueError(f"User {user_id} not found")
        task_id = f"task_{len(self.db.tasks) + 1}"
        task = Task(task_id=task_id, title=title, description=description, status="pending")
        self.db.tasks[task_id] = task
        self.db.users[user_id].tasks.append(task_id)
        return task

    @tool(READ, "Get all users in the database.")
    def get_users(self):
        return list(self.db.users.values())

    @tool(
        WRITE,
        "Update the status of a task.",
        {"task_id": "The ID of the task to update", "status": "The new status of the task: 'pending' or 'completed'"},
    )
    def update_task_status(self, task_id: str, status: str) -> Task:
        if task_id not in self.db.tasks:
            raise ValueError(f"Task {task_id} not found")
        task = self.db.tasks[task_id]
        task.status = status
        return task

    transfer_to_human_agents = generic.transfer_to_human_agents

    def assert_number_of_tasks(self, user_id: str, expected_number: int) -> bool:
        if user_id not in self.db.users:
            raise ValueError(f"User {user_id} not found")
        return len(self.db.users[user_id].tasks) == expected_number

    def assert_task_status(self, task_id: str, expected_status: str) -> bool:
        if task_id not in self.db.tasks:
            raise ValueError(f"Task {task_id} not found")
        return self.db.tasks[task_id].status == expected_status


class MockUserTools(Toolkit):
    db: MockUserDB

    @tool(READ, "Check all notifications in the user's inbox.")
    def check_notifications(self):
        return list(self.db.notifications.values())

    @tool(
        WRITE, "Dismiss (mark as read) a notification.", {"notification_id": "The ID of the notification to dismiss."}
    )
    def dismiss_notification(self, notification_id: str) -> str:
        if notification_id not in self.db.notifications:
            raise ValueError(f"Notification {notification_id} not found")
        self.db.notifications[notification_id].status = "read"
        return f"Notification {notification_id} dismissed"

    def add_notification(self, notification_id: str, message: str, task_id: str | None = None) -> Notification:
        notification = Notification(notification_id=notification_id, message=message, task_id=task_id)
        self.db.notifications[notification_id] = notification
        return notification

    def assert_notification_status(self, notification_id: str, expected_status: str) -> bool:
        if notification_id not in self.db.notifications:
            raise ValueError(f"Notification {notification_id} not found")
        return self.db.notifications[notification_id].status == expected_status
